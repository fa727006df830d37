// rms_norm: y[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * (weight_offset + weight[:])
//   x, y (M, D) f32 (y may be x); weight [D] f32, f16 or bf16. Sums in f32.
//   weight_offset: 0 (Qwen2, Llama, ...) or 1 (Gemma 2 stores w - 1 and scales by 1 + w).
#pragma once

#include <cmath>
#include <cstddef>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // SIMD code: see core/isa.hpp

template <storage_type W>
void rms_norm(dense_view<const float, 2> x, dense_view<const W, 1> weight, float eps,
              dense_view<float, 2> y, float weight_offset = 0.0f) {
  if (x.extent(1) != weight.extent(0) || y.extents() != x.extents()) {
    raise(error_code::invalid_shape, "rms_norm: x ", npullm::detail::format_extents(x.extents()),
          ", weight ", npullm::detail::format_extents(weight.extents()), ", y ",
          npullm::detail::format_extents(y.extents()));
  }
  if (!(eps >= 0.0f)) raise(error_code::invalid_argument, "rms_norm: eps ", eps, " must be >= 0");
  const std::size_t d = x.extent(1);
  for (std::size_t m = 0; m < x.extent(0); ++m) {
    const float* in = &x(m, 0);
    float* out = &y(m, 0);
    simd::f32x16 acc = simd::zero();
    std::size_t i = 0;
    for (; i + simd::lanes <= d; i += simd::lanes) {
      const simd::f32x16 v = simd::load(in + i);
      acc = simd::fmadd(v, v, acc);
    }
    float sum = simd::reduce_add(acc);
    for (; i < d; ++i) sum += in[i] * in[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
    for (std::size_t j = 0; j < d; ++j) out[j] = in[j] * inv * (weight_offset + to_float(weight(j)));
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
