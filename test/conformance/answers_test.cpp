// The suite's record of a probed sequence (Answers, conformance.hpp): every difference is one
// failure naming its call, at the line that recorded it, and none stops the case.
#include "conformance.hpp"

#include <gtest/gtest-spi.h>

#include <string>
#include <vector>

namespace expanse::conformance {
namespace {

TEST(Answers, EachDifferenceIsOneFailureAtItsLineAndNothingStops) {
  ::testing::TestPartResultArray results;
  int map_line = 0;
  int end_line = 0;
  CUresult after = CUDA_ERROR_UNKNOWN;
  std::string transcript;
  {
    ::testing::ScopedFakeTestPartResultReporter catcher(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    Answers a;
    a("cuStreamBeginCapture", CUDA_SUCCESS, CUDA_SUCCESS);
    map_line = __LINE__ + 2;
    const CUresult map =
        a("cuMemMap in a capture", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_SUCCESS);
    end_line = __LINE__ + 1;
    a("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_SUCCESS);
    // The case goes on and can follow the answer it was given.
    after = a("cuMemUnmap", CUDA_SUCCESS, map == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(a.differences(), 2u);
    transcript = a.transcript();
  }  // reported here, by the destructor
  EXPECT_EQ(after, CUDA_SUCCESS);
  ASSERT_EQ(results.size(), 2);
  const ::testing::TestPartResult& map = results.GetTestPartResult(0);
  EXPECT_TRUE(map.nonfatally_failed());
  EXPECT_EQ(map.line_number(), map_line);
  EXPECT_NE(std::string(map.file_name()).find("answers_test.cpp"), std::string::npos);
  EXPECT_NE(std::string(map.message())
                .find("cuMemMap in a capture\n  returned CUDA_SUCCESS (0)\n"
                      "  expected CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)"),
            std::string::npos)
      << map.message();
  EXPECT_EQ(results.GetTestPartResult(1).line_number(), end_line);
  EXPECT_NE(std::string(results.GetTestPartResult(1).message()).find("cuStreamEndCapture"),
            std::string::npos);
  EXPECT_EQ(transcript,
            "  same  cuStreamBeginCapture: CUDA_SUCCESS (0)\n"
            "  DIFF  cuMemMap in a capture: CUDA_SUCCESS (0), the rule says "
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)\n"
            "  DIFF  cuStreamEndCapture: CUDA_SUCCESS (0), the rule says "
            "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)\n"
            "  same  cuMemUnmap: CUDA_SUCCESS (0)\n");
}

}  // namespace
}  // namespace expanse::conformance
