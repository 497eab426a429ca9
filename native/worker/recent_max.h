// The largest value added in the last HALF_S to 2 x HALF_S seconds: a memory of recent
// extremes that forgets them within a second or two, in two numbers.
#pragma once

#include <algorithm>

namespace hysync::worker {

class RecentMax {
 public:
  static constexpr double HALF_S = 0.5;

  void add(double value, double now) {
    roll(now);
    current_ = std::max(current_, value);
  }
  double value(double now) {
    roll(now);
    return std::max(current_, previous_);
  }

 private:
  void roll(double now) {
    if (now - since_ < HALF_S) return;
    previous_ = now - since_ < 2 * HALF_S ? current_ : 0.0;  // older than a half: forgotten
    current_ = 0.0;
    since_ = now;
  }

  double current_ = 0.0, previous_ = 0.0, since_ = 0.0;
};

}  // namespace hysync::worker
