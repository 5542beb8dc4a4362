// EXPANSE_CONF parsing: sizes, keys, values; every error names what is wrong.
#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "conf/sim_options.hpp"
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

TEST(ConfigParse, ReserveKeys) {
  const size_t GiB = size_t{1} << 30;
  conf::Config c = conf::parse_config("reserve:40GiB,reserve_partial:true,reserve_handle_size:1GiB");
  EXPECT_EQ(c.allocator.reserve_bytes, 40 * GiB);
  EXPECT_FALSE(c.allocator.reserve_free);
  EXPECT_TRUE(c.allocator.reserve_partial);
  EXPECT_EQ(c.allocator.reserve_handle_size, GiB);
  conf::Config f = conf::parse_config("reserve:0.9");
  EXPECT_EQ(conf::options_for_device(f, 10 * GiB).reserve_bytes, 9 * GiB);
  conf::Config all = conf::parse_config("reserve:free,reserve_margin:1GiB");
  EXPECT_TRUE(all.allocator.reserve_free);
  EXPECT_EQ(all.allocator.reserve_margin, GiB);
  EXPECT_EQ(conf::parse_config("").allocator.reserve_margin, size_t{512} << 20);
  EXPECT_EQ(conf::parse_config("").allocator.reserve_bytes, 0u);
  for (const char* bad : {"reserve:1.5", "reserve:0.0", "reserve:most", "reserve_partial:maybe",
                          "reserve_margin:lots"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(conf::parse_config(bad), usage_error);
  }
  try {
    conf::parse_config("reserve:most");
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("'most' is not free, a size, or a fraction"),
              std::string::npos) << e.what();
  }
}

// Thread caches: on by default through EXPANSE_CONF, sized by two keys, 0 turning them off; a bad
// value names the key.
TEST(ConfigParse, ThreadCacheKeys) {
  const conf::Config d = conf::parse_config("");
  EXPECT_EQ(d.allocator.thread_cache_bytes, conf::kDefaultThreadCacheBytes);
  EXPECT_EQ(d.allocator.thread_cache_entries, conf::kDefaultThreadCacheEntries);
  const conf::Config c = conf::parse_config("thread_cache:4MiB,thread_cache_entries:16");
  EXPECT_EQ(c.allocator.thread_cache_bytes, size_t{4} << 20);
  EXPECT_EQ(c.allocator.thread_cache_entries, 16u);
  EXPECT_EQ(conf::parse_config("thread_cache:0").allocator.thread_cache_bytes, 0u);
  EXPECT_EQ(conf::AllocatorOptions{}.thread_cache_bytes, 0u) << "the core's own default: off";
  try {
    conf::parse_config("thread_cache:lots");
    ADD_FAILURE() << "a bad size was accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("thread_cache"), std::string::npos) << e.what();
  }
}

// The sim_* keys: EXPANSE_CONF is checked whole where it is read, so a bad sim value fails
// parse_config with the message the sim itself gives.
TEST(ConfigParse, SimKeys) {
  const conf::SimOptions d = conf::parse_sim_options("");
  EXPECT_EQ(d.devices, 1);
  EXPECT_EQ(d.capacity, size_t{80} << 30);
  EXPECT_EQ(d.granularity, size_t{2} << 20);
  const conf::SimOptions c = conf::parse_sim_options(
      "sim_devices:4,sim_capacity:16GiB,sim_granularity:64KiB,sim_backing:false,"
      "sim_driver_version:12020,sim_peer_access:false,sim_posix_fd:0,sim_rdma:wsl,page_size:2MiB");
  EXPECT_EQ(c.devices, 4);
  EXPECT_EQ(c.capacity, size_t{16} << 30);
  EXPECT_EQ(c.granularity, size_t{64} << 10);
  EXPECT_FALSE(c.backing);
  EXPECT_EQ(c.driver_version, 12020);
  EXPECT_FALSE(c.peer_access);
  EXPECT_FALSE(c.posix_fd);
  EXPECT_TRUE(c.rdma);
  EXPECT_TRUE(c.rdma_wsl);
  const std::pair<const char*, const char*> bad[] = {
      {"sim_devices:65", "EXPANSE_CONF: key 'sim_devices': '65' is not an integer in [0, 64]"},
      {"sim_capacity:0", "EXPANSE_CONF: key 'sim_capacity': '0' must be more than 0"},
      {"sim_capacity:3MiB",
       "EXPANSE_CONF: key 'sim_capacity': 3 MiB is not a multiple of sim_granularity 2 MiB"},
      {"sim_granularity:64GiB",
       "EXPANSE_CONF: key 'sim_capacity': 80 GiB (the default) is not a multiple of "
       "sim_granularity 64 GiB"},
      {"sim_granularity:2KiB",
       "EXPANSE_CONF: key 'sim_granularity': '2KiB' is not a power of two of at least 4096 bytes "
       "(and the host page size)"},
      {"sim_backing:maybe", "EXPANSE_CONF: key 'sim_backing': 'maybe' is not true or false"},
  };
  for (const auto& [text, message] : bad) {
    for (bool whole : {false, true}) {
      try {
        if (whole) {
          conf::parse_config(text);
        } else {
          conf::parse_sim_options(text);
        }
        ADD_FAILURE() << text << " was accepted";
      } catch (const usage_error& e) {
        EXPECT_TRUE(whole) << text;
        EXPECT_EQ(std::string(e.what()), message);
      } catch (const std::invalid_argument& e) {
        EXPECT_FALSE(whole) << text;
        EXPECT_EQ(std::string(e.what()), message);
      }
    }
  }
}

TEST(ConfigParse, FormatSize) {
  EXPECT_EQ(conf::format_size(512), "512 B");
  EXPECT_EQ(conf::format_size(size_t{80} << 30), "80 GiB");
  EXPECT_EQ(conf::format_size(size_t{3} << 29), "1.50 GiB");
}

}  // namespace
}  // namespace expanse
