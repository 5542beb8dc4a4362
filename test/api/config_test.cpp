// EXPANSE_CONF parsing: sizes, keys, values; every error names what is wrong.
#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <gtest/gtest.h>

namespace expanse {
namespace {

TEST(ConfigParse, Sizes) {
  EXPECT_EQ(conf::parse_size("512"), 512u);
  EXPECT_EQ(conf::parse_size("512B"), 512u);
  EXPECT_EQ(conf::parse_size("4KiB"), 4096u);
  EXPECT_EQ(conf::parse_size("2MiB"), size_t{2} << 20);
  EXPECT_EQ(conf::parse_size(" 80GiB "), size_t{80} << 30);
  EXPECT_EQ(conf::parse_size("1TiB"), size_t{1} << 40);
  EXPECT_EQ(conf::parse_size("1.5GiB"), size_t{3} << 29);
  EXPECT_EQ(conf::parse_size("1GB"), size_t{1000000000});
  for (const char* bad : {"", "GiB", "12XB", "1.2.3MiB", "-5", "99999999999999999999", "20000000TiB"}) {
    EXPECT_THROW(conf::parse_size(bad), std::invalid_argument) << bad;
    try {
      conf::parse_size(bad);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ConfigParse, PairsAndKeys) {
  auto p = conf::parse_pairs(" driver : sim , sim_capacity:8GiB,,");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].first, "driver");
  EXPECT_EQ(p[0].second, "sim");
  EXPECT_EQ(p[1].second, "8GiB");
  EXPECT_TRUE(conf::parse_pairs("").empty());
  EXPECT_THROW(conf::parse_pairs("nokey"), std::invalid_argument);
  EXPECT_THROW(conf::parse_pairs("limit:"), std::invalid_argument);
}

TEST(ConfigParse, LibraryOptions) {
  conf::Config c = conf::parse_config(
      "driver:sim,page_size:4MiB,limit:10GiB,release_threshold:1GiB,va_size:1TiB,va_budget:4TiB");
  EXPECT_EQ(c.allocator.page_size, size_t{4} << 20);
  EXPECT_EQ(c.allocator.limit, size_t{10} << 30);
  EXPECT_EQ(c.allocator.release_threshold, size_t{1} << 30);
  EXPECT_EQ(c.allocator.va_size, size_t{1} << 40);
  EXPECT_EQ(c.allocator.va_budget, size_t{4} << 40);
  EXPECT_FALSE(c.allocator.reclaim_before_create);
  EXPECT_TRUE(conf::parse_config("reclaim_first:true").allocator.reclaim_before_create);
  EXPECT_THROW(conf::parse_config("reclaim_first:maybe"), usage_error);
  conf::Config f = conf::parse_config("limit:0.25");
  EXPECT_EQ(conf::options_for_device(f, size_t{8} << 30).limit, size_t{2} << 30);
  EXPECT_THROW(conf::parse_config("page_size:0"), usage_error);
  EXPECT_THROW(conf::parse_config("limit:0.0"), usage_error);
  EXPECT_THROW(conf::parse_config("sim_devices:lots"), usage_error);
}

TEST(ConfigParse, FormatSize) {
  EXPECT_EQ(conf::format_size(512), "512 B");
  EXPECT_EQ(conf::format_size(size_t{80} << 30), "80 GiB");
  EXPECT_EQ(conf::format_size(size_t{3} << 29), "1.50 GiB");
}

}  // namespace
}  // namespace expanse
