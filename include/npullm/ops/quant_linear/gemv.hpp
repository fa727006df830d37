// The quantized GEMV of this build's ISA over W's rows [n0, n1): x's rows in groups of up to 4.
#pragma once

#include "npullm/ops/quant_linear/gemv_avx2.hpp"
#include "npullm/ops/quant_linear/gemv_portable.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

template <weight_format F>
void gemv(const quantized_view& w, const quantized_activations& a, std::size_t n0, std::size_t n1,
          const float* bias, float* y, std::size_t ldy) {
  if constexpr (!has_kernels(F)) {  // one row of x at a time, decoded
    for (std::size_t m = 0; m < a.m; ++m)
      gemv_decoded_rows<F, 1>(w, a, m, n0, n1, bias, y + m * ldy, ldy);
    return;
  }
  thread_local gemv_scratch scales;
  std::size_t m = 0;
  for (; m + 4 <= a.m; m += 4) gemv_rows<F, 4>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
  switch (a.m - m) {
    case 1: return gemv_rows<F, 1>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    case 2: return gemv_rows<F, 2>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    case 3: return gemv_rows<F, 3>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    default: return;
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
