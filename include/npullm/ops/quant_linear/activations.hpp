// The quantized kernels' activations (ops/quant_linear.hpp): x's rows quantized to int8 codes
// per block of 32 with an f32 scale, in the forms the GEMV and GEMM paths multiply, and which
// integer dot product this build's ISA gives them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/dequantize.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

// The integer dot-product instruction this build's quantized kernels use.
constexpr std::string_view quant_dot_name() noexcept {
#if defined(NPULLM_QUANT_VNNI512)
  return "avx512-vnni vpdpbusd";
#elif defined(NPULLM_QUANT_VNNI256)
  return "avx-vnni vpdpbusd";
#elif defined(__AVX2__)
  return "avx2 vpmaddubsw+vpmaddwd";
#else
  return "scalar";
#endif
}
// ---- activations: x rows quantized per block of 32 -------------------------------------------

// codes: (M, K) int8 (or u8 = code + 128 when `biased`); d: (M, K/32) scales;
// sums: (M, K/32, 2) dx · Σ codes over values 0..15 and 16..31 of the block (natural order).
// For the SIMD GEMV also: dpad (M, bpad = blocks rounded up to 8, zero-padded) the scales again,
// and corr (M, K / 4) int32: −o · Σ of each 4 consecutive stored codes, the integer offset term
// of a dot product lane (value = s · (u − o)), so that Σ_lane u · x + corr = Σ_lane (u − o) · x.
struct quantized_activations {
  std::size_t m = 0, k = 0, blocks = 0, bpad = 0;
  std::vector<std::int8_t> codes;
  std::vector<float> d, dpad;
  std::vector<float> sums;
  std::vector<float> tot;  // (M, K/32): dx · Σ codes of the block (the two sums added)
  // (M, K/32, 2): Σ codes of values 0..15 and 16..31 (integers: the repacked tiles' offsets)
  std::vector<std::int32_t> qsum;
  std::vector<std::int32_t> corr;
};

// One block of 32 values: its int8 codes c (round half away from zero of x · 127 / absmax, in
// [-127, 127]) stored to q as the kernels read them (pair_split: the 16 even values then the 16
// odd ones; biased: c + 128 as u8), its scale d = absmax / 127 (returned) and the sums of codes
// 0..15 and 16..31. The AVX2 form gives the scalar form's results bit for bit: the same float
// operations (one multiply, one add of ±0.5, truncation) on each value; the maximum is exact.
inline float quantize_block(const float* xb, std::int8_t* q, bool pair_split, bool biased, int& s0,
                            int& s1) noexcept {
#if defined(__AVX2__)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);  // a NaN value is skipped
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float a = _mm_cvtss_f32(m4);
  const float d = a / 127.0f, inv = a > 0.0f ? 127.0f / a : 0.0f;
  const __m256 vinv = _mm256_set1_ps(inv), half = _mm256_set1_ps(0.5f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 t = _mm256_mul_ps(v[i], vinv);
    // t + (t >= 0 ? 0.5 : -0.5): the sign of t on 0.5 (t = -0 gets -0.5: truncates to 0 too).
    const __m256 r = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(sign, t)));
    c[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(r), lo), hi);
  }
  const auto hsum = [](__m256i x) {
    __m128i y = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0x4e));
    y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0xb1));
    return _mm_cvtsi128_si32(y);
  };
  s0 = hsum(_mm256_add_epi32(c[0], c[1]));
  s1 = hsum(_mm256_add_epi32(c[2], c[3]));
  // packs interleave 128-bit lanes: 32-bit groups come out as 0, 2, 4, 6, 1, 3, 5, 7.
  const __m256i b =
      _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  __m256i v8 = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (pair_split) {  // per 128-bit half: evens then odds; then both halves' evens first
    const __m256i evens_odds =
        _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                         12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    v8 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v8, evens_odds), 0xd8);
  }
  if (biased) v8 = _mm256_xor_si256(v8, _mm256_set1_epi8(static_cast<char>(0x80)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v8);
  return d;
#else
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
  const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  s0 = s1 = 0;
  std::int8_t c[32];
  for (int i = 0; i < 32; ++i) {
    // Round half away from zero; |x · inv| <= 127 (inv from the same amax).
    const float v = xb[i] * inv;
    const float r = v + (std::signbit(v) ? -0.5f : 0.5f);
    c[i] = static_cast<std::int8_t>(r >= -127.0f && r <= 127.0f ? static_cast<int>(r)
                                    : r > 0.0f                  ? 127
                                                                : -127);
    (i < 16 ? s0 : s1) += c[i];
  }
  for (int i = 0; i < 32; ++i) {
    const std::int8_t v = c[pair_split ? (i < 16 ? 2 * i : 2 * (i - 16) + 1) : i];
    q[i] = biased ? static_cast<std::int8_t>(static_cast<std::uint8_t>(v) ^ 0x80u) : v;
  }
  return d;
#endif
}

// pair_split: store each block as its 16 even values then its 16 odd ones (int4_sym's nibble
// order, so that GEMV unpacks a byte's two nibbles to positions i and i + 16, as for q4_0).
// gemv_offset: o for corr and dpad (the GEMV's form), or 0: neither.
// Rows are split over the policy's threads when there are many (a prefill step's activations).
template <threading_policy Policy = serial>
void quantize_activations(const float* x, std::size_t ldx, std::size_t m, std::size_t k,
                          bool pair_split, bool biased, quantized_activations& out,
                          int gemv_offset = -1, const Policy& policy = {}) {
  out.m = m;
  out.k = k;
  out.blocks = k / 32;
  out.bpad = (out.blocks + 7) / 8 * 8;
  out.codes.resize(m * k);
  out.d.resize(m * out.blocks);
  out.sums.resize(m * out.blocks * 2 + 16);  // + finite slack that the GEMV's last chunk reads
  out.tot.resize(m * out.blocks);
  out.qsum.resize(m * out.blocks * 2);
  if (gemv_offset >= 0) {
    out.dpad.assign(m * out.bpad, 0.0f);
    out.corr.resize(gemv_offset > 0 ? m * k / 4 : 0);
  }
  const auto rows = [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) {
      for (std::size_t j = 0; j < out.blocks; ++j) {
        int s0 = 0, s1 = 0;
        std::int8_t* dst = out.codes.data() + r * k + 32 * j;
        const float d = quantize_block(x + r * ldx + 32 * j, dst, pair_split, biased, s0, s1);
        out.d[r * out.blocks + j] = d;
        if (gemv_offset >= 0) out.dpad[r * out.bpad + j] = d;
        if (gemv_offset > 0) {
          for (int l = 0; l < 8; ++l) {
            out.corr[(r * k + 32 * j) / 4 + l] =
                -gemv_offset * (dst[4 * l] + dst[4 * l + 1] + dst[4 * l + 2] + dst[4 * l + 3]);
          }
        }
        const float a = d * static_cast<float>(s0), b = d * static_cast<float>(s1);
        out.sums[(r * out.blocks + j) * 2] = a;
        out.sums[(r * out.blocks + j) * 2 + 1] = b;
        out.tot[r * out.blocks + j] = a + b;
        out.qsum[(r * out.blocks + j) * 2] = s0;
        out.qsum[(r * out.blocks + j) * 2 + 1] = s1;
      }
    }
  };
  const std::size_t parts = m >= 64 ? std::min(m / 32, policy.concurrency()) : 1;
  if (parts <= 1) return rows(0, m);
  policy.parallel_for(
      parts, [&](std::size_t p) { rows(chunk_begin(m, parts, p), chunk_begin(m, parts, p + 1)); });
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
