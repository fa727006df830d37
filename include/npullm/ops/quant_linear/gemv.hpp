// The quantized GEMV of this build's ISA over W's rows [n0, n1): x's rows in groups of up to 4.
#pragma once

#include "npullm/ops/quant_linear/gemv_avx2.hpp"
#include "npullm/ops/quant_linear/gemv_portable.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

// MR rows of x from row m: the format's kernel, or the decode-based rows for a format without
// kernels of its own (both group rows of x, so each piece is decoded once per group).
template <weight_format F, std::size_t MR>
void gemv_group(const quantized_view& w, const quantized_activations& a, std::size_t m,
                std::size_t n0, std::size_t n1, const float* bias, float* y, std::size_t ldy,
                gemv_scratch& scales) {
  if constexpr (has_kernels(F)) {
    gemv_rows<F, MR>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
  } else {
    gemv_decoded_rows<F, MR>(w, a, m, n0, n1, bias, y + m * ldy, ldy);
  }
}

template <weight_format F>
void gemv(const quantized_view& w, const quantized_activations& a, std::size_t n0, std::size_t n1,
          const float* bias, float* y, std::size_t ldy) {
  thread_local gemv_scratch scales;
  std::size_t m = 0;
  for (; m + 4 <= a.m; m += 4) gemv_group<F, 4>(w, a, m, n0, n1, bias, y, ldy, scales);
  switch (a.m - m) {
    case 1: return gemv_group<F, 1>(w, a, m, n0, n1, bias, y, ldy, scales);
    case 2: return gemv_group<F, 2>(w, a, m, n0, n1, bias, y, ldy, scales);
    case 3: return gemv_group<F, 3>(w, a, m, n0, n1, bias, y, ldy, scales);
    default: return;
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
