// The K-quants' search for one sub-block's factors (q2_k, q3_k, q4_k, q5_k, q6_k quantize with
// it).
#pragma once

#include <algorithm>
#include <cmath>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// Least squares, not a weighted error: n values x onto codes 0..top as value = s · q + b with
// b <= 0 (with_min: q2_k, q4_k, q5_k; s >= 0), or onto codes −(top + 1)..top as value = s · q
// (q3_k, q6_k). Tries 21 scales around the one that maps the range onto the codes, rounds x
// with each, fits s (and b) to those codes by least squares and keeps the fit of least squared
// error.
inline void fit_sub_block(const float* x, int n, int top, bool with_min, float& s,
                          float& b) noexcept {
  float lo = x[0], hi = x[0], extreme = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  }
  s = 0.0f;
  b = 0.0f;
  if (with_min) lo = std::min(lo, 0.0f);
  if (with_min ? hi <= lo : extreme == 0.0f) {
    b = with_min ? lo : 0.0f;
    return;
  }
  double best = INFINITY;
  for (int step = -10; step <= 10; ++step) {
    const float levels = static_cast<float>(top) + 0.1f * static_cast<float>(step);
    // symmetric: the extreme maps to the lowest code −(top + 1) (one more level that side)
    const float inv = with_min ? levels / (hi - lo) : -(levels + 1.0f) / extreme;
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[256];
    for (int i = 0; i < n; ++i) {
      const float t = with_min ? (x[i] - lo) * inv : x[i] * inv;
      q[i] = std::clamp(static_cast<int>(std::nearbyint(t)), with_min ? 0 : -top - 1, top);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sqx += static_cast<double>(q[i]) * x[i];
    }
    double fs, fb = 0.0;
    if (with_min) {
      const double det = n * sqq - sq * sq;
      if (det <= 0) continue;
      fs = (n * sqx - sq * sx) / det;
      fb = (sx - fs * sq) / n;
      if (fb > 0) {  // the min must be <= 0 (stored as a non-negative m)
        fb = 0;
        fs = sqq > 0 ? sqx / sqq : 0;
      }
      if (fs < 0) continue;
    } else {
      if (sqq <= 0) continue;
      fs = sqx / sqq;
    }
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = fs * q[i] + fb - x[i];
      err += e * e;
    }
    if (err < best) {
      best = err;
      s = static_cast<float>(fs);
      b = static_cast<float>(fb);
    }
  }
}

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
