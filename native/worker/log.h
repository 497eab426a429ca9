// The engine's log lines, kept until Python takes them (worker/transport.py logs them): the
// engine runs without the GIL and never calls into Python to log.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace hysync::worker {

class Log {
 public:
  static constexpr int INFO = 20, WARNING = 30, ERROR = 40;
  void operator()(int level, std::string message) {
    if (lines_.size() < 10000) lines_.emplace_back(level, std::move(message));
  }
  std::vector<std::pair<int, std::string>> take() {
    std::vector<std::pair<int, std::string>> out;
    out.swap(lines_);
    return out;
  }

 private:
  std::vector<std::pair<int, std::string>> lines_;
};

}  // namespace hysync::worker
