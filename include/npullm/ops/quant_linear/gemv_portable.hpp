// The portable quantized GEMV (builds without AVX2): pieces decoded one by one
// (quant_detail::decode_piece), integer dot products, f32 accumulation.
#pragma once

#include "npullm/ops/quant_linear/activations.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

// ---- the decode-based GEMV: pieces decoded one by one, integer dot products ------------------
// The portable build's GEMV, and every build's for a format without kernels of its own
// (has_kernels): x quantized in plain form (no pair split, no bias, no offset terms).
template <weight_format F, std::size_t MR>
void gemv_decoded_rows(const quantized_view& w, const quantized_activations& a, std::size_t m0,
                       std::size_t n0, std::size_t n1, const float* bias, float* y,
                       std::size_t ldy) {
  const std::size_t k = a.k, blocks = a.blocks;
  piece p;
  for (std::size_t n = n0; n < n1; ++n) {
    float acc[MR] = {};
    for (std::size_t j = 0; j < blocks; ++j) {
      decode_piece(w, n, j, p);
      for (std::size_t m = 0; m < MR; ++m) {
        const std::int8_t* xq = a.codes.data() + (m0 + m) * k + 32 * j;
        std::int32_t d0 = 0, d1 = 0;
        for (int i = 0; i < 16; ++i) d0 += static_cast<std::int32_t>(p.q[i]) * xq[i];
        for (int i = 16; i < 32; ++i) d1 += static_cast<std::int32_t>(p.q[i]) * xq[i];
        const float dx = a.d[(m0 + m) * blocks + j];
        acc[m] += dx * (p.scale[0] * static_cast<float>(d0) + p.scale[1] * static_cast<float>(d1));
        if constexpr (piece_layout_of(F).offset) {
          const float* s = a.sums.data() + ((m0 + m) * blocks + j) * 2;
          acc[m] -= p.offset[0] * s[0] + p.offset[1] * s[1];
        }
      }
    }
    for (std::size_t m = 0; m < MR; ++m) y[m * ldy + n] = acc[m] + (bias ? bias[n] : 0.0f);
  }
}

#if !defined(__AVX2__)
struct gemv_scratch {};

template <weight_format F, std::size_t MR>
void gemv_rows(const quantized_view& w, const quantized_activations& a, std::size_t m0,
               std::size_t n0, std::size_t n1, const float* bias, float* y, std::size_t ldy,
               gemv_scratch&) {
  gemv_decoded_rows<F, MR>(w, a, m0, n0, n1, bias, y, ldy);
}
#endif  // !__AVX2__

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
