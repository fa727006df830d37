// core/simd.hpp's AVX2 + FMA path (NPULLM_ISA_AVX2, core/isa.hpp; empty on the other paths):
// f32x16 is two ymm registers (lo = lanes 0..7, hi = 8..15), so the kernels keep their 16-key /
// 16-column structure; the AVX-512 path's exp polynomial with 2^k applied by two exponent-field
// multiplications, f16 loads by F16C, bf16 loads by a shift, partial loads by vmaskmovps;
// `native` is the ymm register (16 of them). Include core/simd.hpp, which picks the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

#if defined(NPULLM_ISA_AVX2)
#include <immintrin.h>

namespace npullm::simd {
inline namespace NPULLM_ISA_NAMESPACE {

// The width of f32x16 (core/simd.hpp), the same on every path.
inline constexpr std::size_t lanes = 16;

// Two ymm registers: lanes 0..7 in lo, 8..15 in hi.
struct f32x16 {
  __m256 lo, hi;
};

namespace detail {
// Lanes [0, n) of an 8-lane half set (all ones), the rest clear; n may be negative or > 8.
inline __m256i half_mask(std::ptrdiff_t n) noexcept {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 bf16_to_f32(__m128i b) noexcept {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}
// exp on 8 lanes; see exp() below.
inline __m256 exp8(__m256 x) noexcept {
  const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(88.7f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^k (k in [-150, 128]) as two normal powers of two 2^(k >> 1) * 2^(k - (k >> 1)): the
  // first product is exact, the second rounds once, as vscalefps does (underflow to 0 too).
  const __m256i ki = _mm256_cvtps_epi32(k);
  const __m256i k1 = _mm256_srai_epi32(ki, 1);
  const __m256i k2 = _mm256_sub_epi32(ki, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
// Transposes an 8 x 8 block: out[i] lane j = in[j] lane i.
inline void transpose8(const __m256 (&in)[8], __m256 (&out)[8]) noexcept {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(in[2 * i], in[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  // u[4i + k]: rows 4i..4i+3, column k of each 128-bit lane.
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    out[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}
// Lane j of the result: the sum of s[j]'s 8 lanes (pairs 4 apart, then 2, then 1 within a
// 128-bit lane, then the two 128-bit halves).
inline __m256 reduce_add8x8(const __m256 (&s)[8]) noexcept {
  __m256 c[4], d[2];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_add_ps(_mm256_unpacklo_ps(s[2 * i], s[2 * i + 1]),
                         _mm256_unpackhi_ps(s[2 * i], s[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {
    d[i] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm256_shuffle_ps(c[2 * i], c[2 * i + 1], 0xee));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(d[0], d[1], 0x20),
                       _mm256_permute2f128_ps(d[0], d[1], 0x31));
}
}  // namespace detail

inline f32x16 zero() noexcept {
  return {_mm256_setzero_ps(), _mm256_setzero_ps()};
}
inline f32x16 set1(float x) noexcept {
  const __m256 v = _mm256_set1_ps(x);
  return {v, v};
}
inline f32x16 load(const float* p) noexcept {
  return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
inline f32x16 load(const float16* p) noexcept {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
          _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
inline f32x16 load(const bfloat16* p) noexcept {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {detail::bf16_to_f32(_mm256_castsi256_si128(b)),
          detail::bf16_to_f32(_mm256_extracti128_si256(b, 1))};
}
// 16 signed bytes as floats (quantized KV: kv::q8_0).
inline f32x16 load_s8(const std::int8_t* p) noexcept {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)))};
}
// The low (high = false) or high 4 bits of 16 bytes, minus 8, as floats -8..7 (quantized KV:
// kv::q4_0).
inline f32x16 load_q4(const std::uint8_t* p, bool high) noexcept {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (high) b = _mm_srli_epi16(b, 4);
  b = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)))};
}
// The first n (< 16) lanes from p, the rest zero; reads only n elements.
inline f32x16 load_partial(const float* p, std::size_t n) noexcept {
  const auto s = static_cast<std::ptrdiff_t>(n);
  if (n == 0) return zero();  // p may be null (an empty range)
  const __m256 lo = _mm256_maskload_ps(p, detail::half_mask(s));
  return {lo, n > 8 ? _mm256_maskload_ps(p + 8, detail::half_mask(s - 8)) : _mm256_setzero_ps()};
}
template <class T>
inline f32x16 load_partial(const T* p, std::size_t n) noexcept {  // 16-bit types
  alignas(32) T tmp[lanes] = {};
  if (n != 0) std::memcpy(tmp, p, n * sizeof(T));  // p may be null when n is 0
  return load(tmp);
}
inline void store(float* p, f32x16 a) noexcept {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline f32x16 add(f32x16 a, f32x16 b) noexcept {
  return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
inline f32x16 sub(f32x16 a, f32x16 b) noexcept {
  return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
}
inline f32x16 mul(f32x16 a, f32x16 b) noexcept {
  return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
inline f32x16 div(f32x16 a, f32x16 b) noexcept {
  return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
}
inline f32x16 max(f32x16 a, f32x16 b) noexcept {
  return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
// a * b + c, fused.
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
// Pairwise: lanes i + 8, then i + 4, i + 2, i + 1 (the AVX-512 and portable order).
inline float reduce_add(f32x16 a) noexcept {
  const __m256 s = _mm256_add_ps(a.lo, a.hi);
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float reduce_max(f32x16 a) noexcept {
  const __m256 s = _mm256_max_ps(a.lo, a.hi);
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
// Lanes at or after n become -inf.
inline f32x16 mask_tail(f32x16 a, std::size_t n) noexcept {
  const auto s = static_cast<std::ptrdiff_t>(n);
  const __m256 inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  return {_mm256_blendv_ps(inf, a.lo, _mm256_castsi256_ps(detail::half_mask(s))),
          _mm256_blendv_ps(inf, a.hi, _mm256_castsi256_ps(detail::half_mask(s - 8)))};
}
// exp(x): the AVX-512 algorithm (same polynomial, same clamping, exp(-inf) == 0 exactly), with
// 2^k applied by two exponent-field multiplications instead of vscalefps.
inline f32x16 exp(f32x16 x) noexcept {
  return {detail::exp8(x.lo), detail::exp8(x.hi)};
}
// Transposes a 16 x 16 block in place as four 8 x 8 blocks.
inline void transpose16(f32x16 (&rows)[16]) noexcept {
  __m256 in[8], a[8], b[8], c[8], d[8];
  for (int i = 0; i < 8; ++i) in[i] = rows[i].lo;
  detail::transpose8(in, a);  // rows 0..7, columns 0..7
  for (int i = 0; i < 8; ++i) in[i] = rows[8 + i].lo;
  detail::transpose8(in, b);  // rows 8..15, columns 0..7
  for (int i = 0; i < 8; ++i) in[i] = rows[i].hi;
  detail::transpose8(in, c);  // rows 0..7, columns 8..15
  for (int i = 0; i < 8; ++i) in[i] = rows[8 + i].hi;
  detail::transpose8(in, d);  // rows 8..15, columns 8..15
  for (int i = 0; i < 8; ++i) {
    rows[i] = {a[i], b[i]};
    rows[8 + i] = {c[i], d[i]};
  }
}
// Horizontal sums of 16 vectors at once: lane j of the result is the sum of a[j]'s lanes.
inline f32x16 reduce_add16(const f32x16 (&a)[16]) noexcept {
  __m256 lo[8], hi[8];
  for (int i = 0; i < 8; ++i) {
    lo[i] = _mm256_add_ps(a[i].lo, a[i].hi);
    hi[i] = _mm256_add_ps(a[8 + i].lo, a[8 + i].hi);
  }
  return {detail::reduce_add8x8(lo), detail::reduce_add8x8(hi)};
}

struct native {
  using type = __m256;
  static constexpr std::size_t lanes = 8;
  static constexpr std::size_t registers = 16;
  static constexpr bool fused = true;
  static type zero() noexcept { return _mm256_setzero_ps(); }
  static type load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  static type load(const float16* p) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static type load(const bfloat16* p) noexcept {
    return detail::bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static type broadcast(const float* p) noexcept { return _mm256_broadcast_ss(p); }
  static type fmadd(type a, type b, type c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static type add(type a, type b) noexcept { return _mm256_add_ps(a, b); }
  static void store(float* p, type a) noexcept { _mm256_storeu_ps(p, a); }
};

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::simd

#endif
