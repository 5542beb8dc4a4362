#include "report/memory_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace expanse::replay {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kWidth = 1000, kHeight = 600;
constexpr double kLeft = 80, kRight = 30, kTop = 50, kPlotBottom = 450;
constexpr size_t kMaxPoints = 1500;  // per line; each point is the largest value it stands for

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A tick step of 1, 2 or 5 x 10^k GiB giving at most 8 ticks up to `top`.
double tick_step(double top) {
  double step = std::pow(10.0, std::floor(std::log10(top > 0 ? top : 1))) / 10;
  for (int i = 0; top / step > 8; ++i) step *= (i % 3 == 1) ? 2.5 : 2;
  return step;
}

std::string gib_label(double v, double step) {
  char buf[32];
  const int decimals = step >= 1 ? 0 : step >= 0.1 ? 1 : 2;
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

std::string memory_plot_svg(const PlotSpec& spec) {
  size_t n = 0;
  uint64_t top = 0;
  for (const PlotLine& l : spec.lines) {
    if (l.bytes == nullptr) continue;
    n = std::max(n, l.bytes->size());
    for (uint64_t v : *l.bytes) top = std::max(top, v);
  }
  // The capacity is drawn when it is on the scale of the memory (else named in the legend).
  const bool capacity_on_scale = spec.capacity && *spec.capacity <= top * 3 / 2 + 1;
  if (capacity_on_scale) top = std::max(top, *spec.capacity);
  const double ymax_gib = std::max(static_cast<double>(top) / kGiB * 1.05, 1.0 / 1024);
  const double step = tick_step(ymax_gib);
  const double ytop = std::ceil(ymax_gib / step) * step;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kPlotBottom - kTop;
  const double xmax = n > 1 ? static_cast<double>(n - 1) : 1;
  auto X = [&](double op) { return kLeft + op / xmax * plot_w; };
  auto Y = [&](double bytes) { return kPlotBottom - bytes / kGiB / ytop * plot_h; };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << kWidth / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
    << escape(spec.title) << "</text>\n";
  // Grid and axes.
  s << "<g class=\"y-axis\">\n";
  for (double v = 0; v <= ytop + step / 2; v += step) {
    const double y = kPlotBottom - v / ytop * plot_h;
    s << "<line x1=\"" << kLeft << "\" y1=\"" << num(y) << "\" x2=\"" << kWidth - kRight
      << "\" y2=\"" << num(y) << "\" stroke=\"#e5e5e5\"/>\n";
    s << "<text x=\"" << kLeft - 8 << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">"
      << gib_label(v, step) << "</text>\n";
  }
  s << "<text transform=\"translate(22," << (kTop + kPlotBottom) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">memory (GiB)</text>\n</g>\n";
  s << "<g class=\"x-axis\">\n";
  const double xstep = tick_step(xmax);
  for (double v = 0; v <= xmax + xstep / 2; v += xstep) {
    s << "<line x1=\"" << num(X(v)) << "\" y1=\"" << kPlotBottom << "\" x2=\"" << num(X(v))
      << "\" y2=\"" << kPlotBottom + 5 << "\" stroke=\"#333\"/>\n";
    s << "<text x=\"" << num(X(v)) << "\" y=\"" << kPlotBottom + 18 << "\" text-anchor=\"middle\">"
      << static_cast<uint64_t>(v) << "</text>\n";
  }
  s << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kPlotBottom + 36
    << "\" text-anchor=\"middle\">" << escape(spec.x_label) << "</text>\n</g>\n";
  s << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
    << plot_h << "\" fill=\"none\" stroke=\"#333\"/>\n";

  // Lines, each downsampled to the largest value per bucket of operations.
  for (const PlotLine& l : spec.lines) {
    if (l.bytes == nullptr || l.bytes->empty()) continue;
    const auto& v = *l.bytes;
    const size_t bucket = (v.size() + kMaxPoints - 1) / kMaxPoints;
    std::ostringstream pts;
    if (l.filled) pts << num(X(0)) << "," << num(Y(0)) << " ";
    for (size_t i = 0; i < v.size(); i += bucket) {
      const size_t end = std::min(v.size(), i + bucket);
      const uint64_t m = *std::max_element(v.begin() + static_cast<std::ptrdiff_t>(i),
                                           v.begin() + static_cast<std::ptrdiff_t>(end));
      pts << num(X(static_cast<double>(i))) << "," << num(Y(static_cast<double>(m))) << " ";
    }
    if (l.filled) pts << num(X(static_cast<double>(v.size() - 1))) << "," << num(Y(0));
    s << "<polyline class=\"series\" data-label=\"" << escape(l.label) << "\" points=\""
      << pts.str() << "\" fill=\"" << (l.filled ? l.color : "none") << "\" fill-opacity=\""
      << (l.filled ? "0.35" : "0") << "\" stroke=\"" << l.color << "\" stroke-width=\""
      << (l.filled ? "1" : "1.8") << "\"" << (l.dashed ? " stroke-dasharray=\"6,4\"" : "")
      << "/>\n";
  }
  if (capacity_on_scale) {
    s << "<line class=\"capacity\" x1=\"" << kLeft << "\" y1=\""
      << num(Y(static_cast<double>(*spec.capacity))) << "\" x2=\"" << kWidth - kRight << "\" y2=\""
      << num(Y(static_cast<double>(*spec.capacity)))
      << "\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"2,3\"/>\n";
  }
  for (const PlotMark& m : spec.marks) {
    const double x = X(static_cast<double>(m.op)), y = Y(static_cast<double>(m.bytes));
    s << "<g class=\"oom\"><path d=\"M" << num(x - 6) << "," << num(y - 6) << " l12,12 M"
      << num(x - 6) << "," << num(y + 6) << " l12,-12\" stroke=\"" << m.color
      << "\" stroke-width=\"2.5\"/><text x=\"" << num(x + 8) << "\" y=\"" << num(y - 8)
      << "\" fill=\"" << m.color << "\">" << escape(m.label) << "</text></g>\n";
  }

  // Legend, two columns under the plot.
  s << "<g class=\"legend\">\n";
  int row = 0;
  auto entry = [&](const std::string& label, const std::string& swatch) {
    const double x = kLeft + (row % 2) * (plot_w / 2);
    const double y = kPlotBottom + 62 + (row / 2) * 20;
    s << "<g transform=\"translate(" << num(x) << "," << num(y) << ")\">" << swatch
      << "<text x=\"34\" y=\"4\">" << escape(label) << "</text></g>\n";
    ++row;
  };
  for (const PlotLine& l : spec.lines) {
    if (l.bytes == nullptr || l.bytes->empty()) continue;
    entry(l.label, "<line x1=\"0\" y1=\"0\" x2=\"26\" y2=\"0\" stroke=\"" + l.color +
                       "\" stroke-width=\"" + (l.filled ? "8" : "2") + "\"" +
                       (l.filled ? " stroke-opacity=\"0.35\"" : "") +
                       (l.dashed ? " stroke-dasharray=\"6,4\"" : "") + "/>");
  }
  if (spec.capacity) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "capacity %.2f GiB%s",
                  static_cast<double>(*spec.capacity) / kGiB,
                  capacity_on_scale ? "" : " (off the scale)");
    entry(buf,
          "<line x1=\"0\" y1=\"0\" x2=\"26\" y2=\"0\" stroke=\"#d62728\" stroke-width=\"1.5\" "
          "stroke-dasharray=\"2,3\"/>");
  }
  if (!spec.marks.empty()) {
    entry("first OOM",
          "<path d=\"M7,-6 l12,12 M7,6 l12,-12\" stroke=\"#d62728\" stroke-width=\"2.5\"/>");
  }
  s << "</g>\n</svg>\n";
  return s.str();
}

std::string compare_plot_svg(const CompareReport& c, const std::string& title) {
  PlotSpec p;
  p.title = title;
  p.x_label = "trace operation (allocations and frees, in recorded order)";
  p.capacity = c.capacity;
  const auto& s = c.series;
  p.lines.push_back({"live bytes", "#9e9e9e", &s.live, false, true});
  p.lines.push_back({"PyTorch reserved (model)", "#1f77b4", &s.pytorch_reserved, false, false});
  p.lines.push_back({"PyTorch expandable_segments:True (model)", "#ff7f0e", &s.expandable_reserved,
                     false, false});
  p.lines.push_back({"expanse mapped", "#2ca02c", &s.expanse_mapped, false, false});
  // Last, dashed, so that it shows where the model lies exactly on it.
  p.lines.push_back({"PyTorch reserved (recorded)", "#222222", &s.recorded_reserved, true, false});
  auto mark = [&](const CompareRow& r, const std::vector<uint64_t>& v, const std::string& who) {
    if (!r.first_oom_op || v.empty()) return;
    const uint64_t op = std::min<uint64_t>(*r.first_oom_op, v.size() - 1);
    p.marks.push_back({op, v[op], "OOM: " + who, "#d62728"});
  };
  mark(c.pytorch, s.pytorch_reserved, "PyTorch");
  mark(c.pytorch_expandable, s.expandable_reserved, "expandable");
  mark(c.expanse, s.expanse_mapped, "expanse");
  for (const auto& o : c.recorded_ooms) {
    if (s.recorded_reserved.empty()) break;
    const uint64_t op = std::min<uint64_t>(o.op, s.recorded_reserved.size() - 1);
    p.marks.push_back({op, s.recorded_reserved[op], "OOM (recorded)", "#d62728"});
  }
  return memory_plot_svg(p);
}

}  // namespace expanse::replay
