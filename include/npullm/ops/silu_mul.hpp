// silu_mul (SwiGLU): out[m, i] = silu(gate[m, i]) * up[m, i], silu(g) = g / (1 + exp(-g)).
//   gate, up, out: (M, I) f32; out may alias gate or up.
#pragma once

#include <cmath>
#include <cstddef>

#include "npullm/core/error.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // SIMD code: see core/isa.hpp

template <class GL, class UL, class OL>
void silu_mul(const tensor_view<const float, dextents<2>, GL>& gate,
              const tensor_view<const float, dextents<2>, UL>& up,
              const tensor_view<float, dextents<2>, OL>& out) {
  if (gate.extents() != up.extents() || out.extents() != gate.extents()) {
    raise(error_code::invalid_shape, "silu_mul: gate ",
          npullm::detail::format_extents(gate.extents()), ", up ",
          npullm::detail::format_extents(up.extents()), ", out ",
          npullm::detail::format_extents(out.extents()));
  }
  const std::size_t n = gate.extent(1);
  for (std::size_t m = 0; m < gate.extent(0); ++m) {
    const float* g = &gate(m, 0);
    const float* u = &up(m, 0);
    float* o = &out(m, 0);
    std::size_t i = 0;
    for (; i + simd::lanes <= n; i += simd::lanes) {
      const simd::f32x16 gv = simd::load(g + i);
      // silu(g) = g / (1 + exp(-g)); exp(-g) overflows to inf for g < -88: silu -> -0, fine.
      // (g / (1 + e)) * u in that order, as the scalar tail computes it.
      const simd::f32x16 e = simd::exp(simd::sub(simd::zero(), gv));
      const simd::f32x16 s = simd::div(gv, simd::add(simd::set1(1.0f), e));
      simd::store(o + i, simd::mul(s, simd::load(u + i)));
    }
    for (; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

inline void silu_mul(dense_view<const float, 2> gate, dense_view<const float, 2> up,
                     dense_view<float, 2> out) {
  silu_mul<layout_right, layout_right, layout_right>(gate, up, out);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
