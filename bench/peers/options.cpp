#include "peers/options.hpp"

#include <sstream>
#include <stdexcept>

namespace expanse::peers {
namespace {

double positive_number(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || !(d > 0)) {
    throw std::invalid_argument(flag + " wants a positive number, not '" + v + "'");
  }
  return d;
}

}  // namespace

std::vector<std::string> Options::to_args() const {
  std::vector<std::string> a = {"--seconds", std::to_string(seconds), "--rounds",
                                std::to_string(rounds), "--passes", std::to_string(passes)};
  if (sim) a.push_back("--sim");
  if (!host.empty()) {
    a.push_back("--host");
    a.push_back(host);
  }
  return a;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " wants a value");
      return argv[++i];
    };
    if (a == "--seconds") {
      o.seconds = positive_number(a, value());
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(positive_number(a, value()));
    } else if (a == "--passes") {
      o.passes = static_cast<int>(positive_number(a, value()));
    } else if (a == "--sim") {
      o.sim = true;
    } else if (a == "--host") {
      o.host = value();
    } else if (a == "--only") {
      std::stringstream ss(value());
      for (std::string name; std::getline(ss, name, ',');) o.only.push_back(name);
    } else if (a == "--child") {
      o.child = static_cast<int>(positive_number(a, value())) - 1;
    } else if (!a.empty() && a[0] == '-') {
      throw std::invalid_argument("unknown option '" + a + "'");
    } else {
      o.traces.push_back(a);
    }
  }
  if (o.rounds < 1 || o.passes < 1) throw std::invalid_argument("--rounds and --passes >= 1");
  if (!o.host.empty() && !o.sim) {
    throw std::invalid_argument("--host models how a trace is issued on the sim: it needs --sim "
                                "(on a GPU the program issues it from one thread)");
  }
  return o;
}

}  // namespace expanse::peers
