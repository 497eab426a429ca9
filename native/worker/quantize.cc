#include "worker/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hysync::worker {

void QuantStats::merge(const QuantStats& o) {
  elements += o.elements;
  clipped += o.clipped;
  nonfinite += o.nonfinite;
  max_abs_error = std::max(max_abs_error, o.max_abs_error);
}

Quantizer::Quantizer(double scale, int members)
    : scale_(scale), scale_f32_(float(scale)) {
  const int64_t bound = std::numeric_limits<int32_t>::max() / members;
  float b = float(bound);
  // Clipping in float32 must never round up past the bound, or the int32 sum could wrap.
  if (int64_t(b) > bound) b = std::nextafter(b, 0.0f);
  bound_f32_ = b;
}

// One pass, no branches in the common case: the compiler vectorizes the product, the clip and
// the rounding; a NaN or an out-of-range value takes the slow path for its element only.
void Quantizer::quantize(const float* values, float* fixed, float* error, std::size_t n,
                         QuantStats& stats) const {
  const float s = scale_f32_, b = bound_f32_;
  float max_err = stats.max_abs_error;
  uint64_t clipped = 0, nonfinite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = values[i];
    float f = v * s;
    if (!(f >= -b && f <= b)) {  // NaN or beyond the bound (an overflow is an infinity)
      if (!std::isfinite(v)) ++nonfinite;
      if (std::isnan(f)) {
        f = 0.0f;
      } else {
        ++clipped;
        f = f > 0 ? b : -b;
      }
    }
    f = std::nearbyint(f);
    float e = std::isfinite(v) ? v - f / s : 0.0f;
    fixed[i] = f;
    error[i] = e;
    max_err = std::max(max_err, std::fabs(e));
  }
  stats.elements += n;
  stats.clipped += clipped;
  stats.nonfinite += nonfinite;
  stats.max_abs_error = max_err;
}

void Quantizer::quantize_lanes(const float* values, int32_t* fixed, float* error,
                               std::size_t n, QuantStats& stats) const {
  float f[256];
  for (std::size_t done = 0; done < n; done += 256) {
    const std::size_t m = std::min<std::size_t>(256, n - done);
    quantize(values + done, f, error + done, m, stats);
    for (std::size_t i = 0; i < m; ++i) fixed[done + i] = int32_t(f[i]);
  }
}

}  // namespace hysync::worker
