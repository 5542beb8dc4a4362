// Memory over a trace's operations as a plain SVG picture: lines in GiB, a capacity line, OOM
// marks and a legend. Written by hand (no plotting library); `expanse replay --plot`.
#pragma once

#include "report/compare.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace expanse::replay {

struct PlotLine {
  std::string label;
  std::string color;                             // an SVG colour ("#1f77b4")
  const std::vector<uint64_t>* bytes = nullptr;  // one value per operation
  bool dashed = false;
  bool filled = false;  // an area down to zero (live bytes)
};

struct PlotMark {
  uint64_t op = 0;
  uint64_t bytes = 0;
  std::string label;
  std::string color;
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::vector<PlotLine> lines;
  std::optional<uint64_t> capacity;
  std::vector<PlotMark> marks;
};

std::string memory_plot_svg(const PlotSpec& spec);

// The --compare picture: live bytes, PyTorch's recorded reserved, each model's reserved,
// expanse's mapped memory, the capacity and every first OOM.
std::string compare_plot_svg(const CompareReport& c, const std::string& title);

}  // namespace expanse::replay
