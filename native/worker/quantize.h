// Fixed-point quantization for the switch's int32 adders (the rules of worker/quantize.py):
// round(x * scale) in float32 within +-bound; an element that is not finite, or beyond the
// bound, is sent as the overflow sentinel, a lane value so far above any sum of in-range
// contributions that a sum holding one is recognisable (docs/protocol.md §9, "Non-finite
// values"). For n members: sentinel = the largest float32 not above INT32_MAX / n (n of them
// cannot wrap), bound = the largest float32 not above (sentinel - 1) / (2n - 1), so one
// sentinel beside n - 1 contributions of -bound still sums above n * bound, the most a sum
// without one can reach. A sum beyond +-n * bound decodes as NaN.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hysync::worker {

struct QuantStats {
  // clipped: finite elements beyond the bound (sent as the sentinel, overflow); nonfinite:
  // NaN and infinities (sent as the sentinel too); max_abs_error over the elements in range.
  uint64_t elements = 0, clipped = 0, nonfinite = 0;
  float max_abs_error = 0.0f;
  void merge(const QuantStats& o);
};

class Quantizer {
 public:
  // pin_overflow (Faults, a simulation only): no sentinel - NaN sent as 0, anything beyond
  // the bound pinned at +-bound, the rest kept as error.
  Quantizer(double scale, int members, bool pin_overflow = false);
  // values -> fixed (integers held in float32: within +-bound, or the sentinel) and
  // error = values - fixed/scale (0 for a sentinel: the element is spent as overflow).
  void quantize(const float* values, float* fixed, float* error, std::size_t n,
                QuantStats& stats) const;
  // The same for one chunk, fixed as int32 (what goes on the wire).
  void quantize_lanes(const float* values, int32_t* fixed, float* error, std::size_t n,
                      QuantStats& stats) const;
  float scale_f32() const { return scale_f32_; }
  double scale() const { return scale_; }
  int32_t sentinel() const { return sentinel_; }
  int32_t bound() const { return bound_; }
  // A sum of at most `members` contributions holds a sentinel (non-finite: decodes as NaN).
  bool overflowed(int32_t sum) const { return sum > max_sum_ || sum < -max_sum_; }
  // One contribution's lane back into residual units: NaN for the sentinel, so that what is
  // carried stays non-finite and is sent as the sentinel once more, never as a finite value.
  float own_value(int32_t lane) const {
    return lane == sentinel_ ? nan_ : float(lane) / scale_f32_;
  }

 private:
  double scale_;
  float scale_f32_, bound_f32_, sentinel_f32_, nan_;
  int32_t sentinel_, bound_, max_sum_;
  bool pin_overflow_;
};

}  // namespace hysync::worker
