// gelu_tanh_mul (GeGLU, Gemma 2's MLP): out[m, i] = gelu_tanh(gate[m, i]) * up[m, i], with
//   gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))     (HF "gelu_pytorch_tanh")
// and softcap(v, c) = c tanh(v / c) (Gemma 2's attention and final logit soft-capping).
//   gate, up, out: (M, I) f32; out may alias gate or up.
// tanh(z) = 1 - 2 / (exp(2z) + 1): exp(2z) overflows to inf for large z (tanh -> 1) and goes
// to 0 for very negative z (tanh -> -1), so no branch is needed.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // SIMD code: see core/isa.hpp

namespace detail {
inline constexpr float gelu_c = 0.7978845608028654f;  // sqrt(2 / pi)
}

inline void gelu_tanh_mul(dense_view<const float, 2> gate, dense_view<const float, 2> up,
                          dense_view<float, 2> out) {
  if (gate.extents() != up.extents() || out.extents() != gate.extents()) {
    raise(error_code::invalid_shape, "gelu_tanh_mul: gate ",
          npullm::detail::format_extents(gate.extents()), ", up ",
          npullm::detail::format_extents(up.extents()), ", out ",
          npullm::detail::format_extents(out.extents()));
  }
  const std::size_t n = gate.size();
  const float* g = gate.data_handle();
  const float* u = up.data_handle();
  float* o = out.data_handle();
  std::size_t i = 0;
  alignas(64) float gv[simd::lanes], ev[simd::lanes];
  for (; i + simd::lanes <= n; i += simd::lanes) {
    for (std::size_t j = 0; j < simd::lanes; ++j) {
      const float x = g[i + j];
      gv[j] = 2.0f * detail::gelu_c * (x + 0.044715f * x * x * x);  // 2z
    }
    simd::store(ev, simd::exp(simd::load(gv)));
    for (std::size_t j = 0; j < simd::lanes; ++j) {
      const float t = 1.0f - 2.0f / (ev[j] + 1.0f);
      o[i + j] = 0.5f * g[i + j] * (1.0f + t) * u[i + j];
    }
  }
  for (; i < n; ++i) {
    const float x = g[i];
    o[i] = 0.5f * x * (1.0f + std::tanh(detail::gelu_c * (x + 0.044715f * x * x * x))) * u[i];
  }
}

// v = cap * tanh(v / cap), in place; cap finite and > 0 (an infinite cap would give inf · 0).
inline void softcap(std::span<float> v, float cap) {
  if (!(cap > 0.0f && std::isfinite(cap))) {
    raise(error_code::invalid_argument, "softcap: cap ", cap, " must be finite and > 0");
  }
  for (float& x : v) x = cap * std::tanh(x / cap);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
