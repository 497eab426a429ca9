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

namespace {
// The largest float32 not above `x`: a value in float32 must never round up past its int32 limit.
float floor_f32(int64_t x) {
  float f = float(x);
  if (int64_t(f) > x) f = std::nextafter(f, 0.0f);
  return f;
}
}  // namespace

Quantizer::Quantizer(double scale, int members, bool pin_overflow)
    : scale_(scale), scale_f32_(float(scale)), nan_(std::numeric_limits<float>::quiet_NaN()),
      pin_overflow_(pin_overflow) {
  sentinel_f32_ = floor_f32(std::numeric_limits<int32_t>::max() / members);
  sentinel_ = int32_t(sentinel_f32_);
  bound_f32_ = floor_f32((int64_t(sentinel_) - 1) / (2 * int64_t(members) - 1));
  bound_ = int32_t(bound_f32_);
  max_sum_ = int32_t(int64_t(members) * bound_);
}

// Blocks of 256: a first loop without branches checks the range (the compiler vectorizes it),
// then either the fast loop (round half to even by the 2^23 trick, vectorized too) or, for a
// block with a NaN, an infinity or a value beyond the bound, the careful one.
void Quantizer::quantize(const float* values, float* fixed, float* error, std::size_t n,
                         QuantStats& stats) const {
  const float s = scale_f32_, b = bound_f32_;
  float max_err = stats.max_abs_error;
  for (std::size_t done = 0; done < n; done += 256) {
    const std::size_t m = std::min<std::size_t>(256, n - done);
    const float* v = values + done;
    float* f = fixed + done;
    float* e = error + done;
    int in_range = 1;
    for (std::size_t i = 0; i < m; ++i) {
      f[i] = v[i] * s;
      in_range &= (f[i] >= -b) & (f[i] <= b);  // false for NaN
    }
    if (in_range) {
      float block_max = 0.0f;
      for (std::size_t i = 0; i < m; ++i) {
        const float a = std::fabs(f[i]);
        // |x| < 2^23: (|x| + 2^23) - 2^23 rounds to an integer, half to even; above, x is one.
        const float r = std::copysign(a < 8388608.0f ? (a + 8388608.0f) - 8388608.0f : a, f[i]);
        f[i] = r;
        e[i] = v[i] - r / s;
        const float ae = std::fabs(e[i]);
        block_max = ae > block_max ? ae : block_max;
      }
      max_err = std::max(max_err, block_max);
      continue;
    }
    for (std::size_t i = 0; i < m; ++i) {
      const float x = f[i];
      if (x >= -b && x <= b) {
        f[i] = std::nearbyint(x);
        e[i] = v[i] - f[i] / s;
        max_err = std::max(max_err, std::fabs(e[i]));
      } else if (pin_overflow_) {
        ++(std::isfinite(v[i]) ? stats.clipped : stats.nonfinite);
        f[i] = std::isnan(x) ? 0.0f : x > 0 ? b : -b;
        e[i] = std::isfinite(v[i]) ? v[i] - f[i] / s : 0.0f;
      } else {  // NaN, an infinity, or beyond the bound (x * scale may overflow to one)
        ++(std::isfinite(v[i]) ? stats.clipped : stats.nonfinite);
        f[i] = sentinel_f32_;
        e[i] = 0.0f;  // spent: the sentinel carries it, once
      }
    }
  }
  stats.elements += n;
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
