// Fixed-point quantization for the switch's int32 adders (the rules of worker/quantize.py):
// round(x * scale) in float32, clipped to the largest float32 not above INT32_MAX / members so
// that the sum of `members` contributions never wraps; NaN is sent as 0 and its error is 0.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hysync::worker {

struct QuantStats {
  uint64_t elements = 0, clipped = 0, nonfinite = 0;
  float max_abs_error = 0.0f;
  void merge(const QuantStats& o);
};

class Quantizer {
 public:
  Quantizer(double scale, int members);
  // values -> fixed (integers held in float32, within +-bound) and error = values - fixed/scale.
  void quantize(const float* values, float* fixed, float* error, std::size_t n,
                QuantStats& stats) const;
  // The same for one chunk, fixed as int32 (what goes on the wire).
  void quantize_lanes(const float* values, int32_t* fixed, float* error, std::size_t n,
                      QuantStats& stats) const;
  float scale_f32() const { return scale_f32_; }
  double scale() const { return scale_; }

 private:
  double scale_;
  float scale_f32_, bound_f32_;
};

}  // namespace hysync::worker
