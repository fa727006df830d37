// linear's bf16 dot-product kernels (ops/linear.hpp, M > 8 over bf16 weights where the CPU has
// AVX-512 BF16): x rounded to bf16 pairs once; 9..16 rows read W in place as bf16 pairs
// (gemv_bf16_dot), more rows pack W panels as (K/2, 32, 2) pairs for an 8 x 32 vdpbf16ps
// micro-kernel (pack_bf16, gemm_bf16_panel); f32 accumulation. Empty without AVX-512 BF16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

inline constexpr std::size_t micro_rows = 8;   // rows of x per micro-kernel
inline constexpr std::size_t micro_cols = 32;  // columns per micro-kernel (two vectors)

// x2: (M, K/2) pairs of bf16 as 32-bit words; panel: (K/2, 32 columns, 2) bf16 pairs.
template <std::size_t MR>
inline void micro_bf16(const std::uint32_t* x2, std::size_t ldx2, const std::uint32_t* panel,
                       std::size_t pairs, std::size_t cols, const float* bias, float* y,
                       std::size_t ldy) {
  __m512 acc[MR][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  for (std::size_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel + p * micro_cols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + p * micro_cols + simd::lanes);
    for (std::size_t m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(x2[m * ldx2 + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, b0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, b1);
    }
  }
  for (std::size_t m = 0; m < MR; ++m) {
    alignas(64) float out[micro_cols];
    _mm512_store_ps(out, acc[m][0]);
    _mm512_store_ps(out + simd::lanes, acc[m][1]);
    for (std::size_t c = 0; c < cols; ++c) y[m * ldy + c] = out[c] + (bias ? bias[c] : 0.0f);
  }
}

// 9..16 rows without packing: W rows read in place as bf16 pairs (K even), one dot-product
// accumulator per row of x, one reduction tree per row of W. Small batches (decode steps of
// several sequences) stream W once instead of re-packing it every call. (Blocking K so the x
// rows stay in L1 measured slower: the per-block reductions cost more than the L2 reads.)
template <std::size_t M>
void gemv_bf16_dot(const std::uint32_t* x2, std::size_t pairs, const bfloat16* w, std::size_t n0,
                   std::size_t n1, const float* bias, float* y, std::size_t ldy) {
  for (std::size_t n = n0; n < n1; ++n) {
    const std::uint32_t* wr = reinterpret_cast<const std::uint32_t*>(w) + n * pairs;
    simd::f32x16 acc[simd::lanes];
    for (auto& a : acc) a = simd::zero();
    for (std::size_t p = 0; p < pairs; p += simd::lanes) {
      const auto mask =
          static_cast<__mmask16>(pairs - p >= simd::lanes ? 0xffffu : (1u << (pairs - p)) - 1u);
      // the next row's same line, one row (2 K bytes) ahead of the loads
      _mm_prefetch(reinterpret_cast<const char*>(wr + pairs + p), _MM_HINT_T0);
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi32(mask, wr + p);
      for (std::size_t m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi32(mask, x2 + m * pairs + p);
        acc[m].v = _mm512_dpbf16_ps(acc[m].v, xv, wv);
      }
    }
    alignas(64) float out[simd::lanes];
    simd::store(out, simd::reduce_add16(acc));
    for (std::size_t m = 0; m < M; ++m) y[m * ldy + n] = out[m] + (bias ? bias[n] : 0.0f);
  }
}

inline void gemv_bf16_dot(std::size_t m, const std::uint32_t* x2, std::size_t pairs,
                          const bfloat16* w, std::size_t n0, std::size_t n1, const float* bias,
                          float* y, std::size_t ldy) {
  switch (m) {
    case 9: return gemv_bf16_dot<9>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 10: return gemv_bf16_dot<10>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 11: return gemv_bf16_dot<11>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 12: return gemv_bf16_dot<12>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 13: return gemv_bf16_dot<13>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 14: return gemv_bf16_dot<14>(x2, pairs, w, n0, n1, bias, y, ldy);
    case 15: return gemv_bf16_dot<15>(x2, pairs, w, n0, n1, bias, y, ldy);
    default: return gemv_bf16_dot<16>(x2, pairs, w, n0, n1, bias, y, ldy);
  }
}

// Packs W rows [n0, n0 + cols) as (K/2, 32, 2) bf16 pairs, zero-padded (K odd: last pair's
// second half zero).
inline void pack_bf16(const bfloat16* w, std::size_t k_len, std::size_t n0, std::size_t cols,
                      std::uint32_t* panel) {
  const std::size_t pairs = (k_len + 1) / 2;
  for (std::size_t p = 0; p < pairs; ++p) {
    for (std::size_t c = 0; c < micro_cols; ++c) {
      std::uint32_t lo = 0, hi = 0;
      if (c < cols) {
        const bfloat16* row = w + (n0 + c) * k_len;
        lo = row[2 * p].bits();
        hi = 2 * p + 1 < k_len ? row[2 * p + 1].bits() : 0u;
      }
      panel[p * micro_cols + c] = lo | (hi << 16);
    }
  }
}

inline void gemm_bf16_panel(std::size_t m_len, const std::uint32_t* x2, std::size_t ldx2,
                            const bfloat16* w, std::size_t k_len, std::size_t n0, std::size_t n1,
                            const float* bias, float* y, std::size_t ldy,
                            std::vector<std::uint32_t>& panel) {
  const std::size_t pairs = (k_len + 1) / 2;
  panel.resize(pairs * micro_cols);
  for (std::size_t c0 = n0; c0 < n1; c0 += micro_cols) {
    const std::size_t cols = std::min(micro_cols, n1 - c0);
    pack_bf16(w, k_len, c0, cols, panel.data());
    const float* b = bias ? bias + c0 : nullptr;
    std::size_t m = 0;
    for (; m + micro_rows <= m_len; m += micro_rows) {
      micro_bf16<micro_rows>(x2 + m * ldx2, ldx2, panel.data(), pairs, cols, b, y + m * ldy + c0,
                             ldy);
    }
    for (; m < m_len; ++m)
      micro_bf16<1>(x2 + m * ldx2, ldx2, panel.data(), pairs, cols, b, y + m * ldy + c0, ldy);
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
#endif
