// core/simd.hpp's AVX-512 path (NPULLM_ISA_AVX512, core/isa.hpp; empty on the other paths):
// f32x16 is one zmm register; exp is a polynomial (max relative error ~2 ulp, exp(-inf) == 0
// exactly) scaled with vscalefps; reductions in the order of GCC's _mm512_reduce_*_ps; `native`
// is the zmm register (32 of them), for the GEMM micro-kernels. Include core/simd.hpp, which
// picks the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

#if defined(NPULLM_ISA_AVX512)
#include <immintrin.h>

namespace npullm::simd {
inline namespace NPULLM_ISA_NAMESPACE {

// The width of f32x16 (core/simd.hpp), the same on every path.
inline constexpr std::size_t lanes = 16;

// Intrinsics whose plain form passes GCC's _mm512_undefined_*() as the merge operand are written
// in their maskz form with a full mask (here and in the other kernel headers): the same
// instruction, without GCC 12's -Wuninitialized on that operand (GCC bug 105593).
struct f32x16 {
  __m512 v;
};

inline f32x16 zero() noexcept {
  return {_mm512_setzero_ps()};
}
inline f32x16 set1(float x) noexcept {
  return {_mm512_set1_ps(x)};
}
inline f32x16 load(const float* p) noexcept {
  return {_mm512_loadu_ps(p)};
}
inline f32x16 load(const float16* p) noexcept {
  return {_mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline f32x16 load(const bfloat16* p) noexcept {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, b), 16))};
}
// 16 signed bytes as floats (quantized KV: kv::q8_0).
inline f32x16 load_s8(const std::int8_t* p) noexcept {
  return {_mm512_maskz_cvtepi32_ps(
      0xFFFF,
      _mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
// The low (high = false) or high 4 bits of 16 bytes, minus 8, as floats -8..7 (quantized KV:
// kv::q4_0).
inline f32x16 load_q4(const std::uint8_t* p, bool high) noexcept {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (high) b = _mm_srli_epi16(b, 4);
  b = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
  return {_mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepi8_epi32(0xFFFF, b))};
}
// The first n (< 16) lanes from p, the rest zero; reads only n elements.
inline f32x16 load_partial(const float* p, std::size_t n) noexcept {
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p)};
}
inline f32x16 load_partial(const float16* p, std::size_t n) noexcept {
  const __m256i h = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), p);
  return {_mm512_maskz_cvtph_ps(0xFFFF, h)};
}
inline f32x16 load_partial(const bfloat16* p, std::size_t n) noexcept {
  const __m256i b = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), p);
  return {_mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, b), 16))};
}
inline void store(float* p, f32x16 a) noexcept {
  _mm512_storeu_ps(p, a.v);
}
inline f32x16 add(f32x16 a, f32x16 b) noexcept {
  return {_mm512_add_ps(a.v, b.v)};
}
inline f32x16 sub(f32x16 a, f32x16 b) noexcept {
  return {_mm512_sub_ps(a.v, b.v)};
}
inline f32x16 mul(f32x16 a, f32x16 b) noexcept {
  return {_mm512_mul_ps(a.v, b.v)};
}
inline f32x16 div(f32x16 a, f32x16 b) noexcept {
  return {_mm512_div_ps(a.v, b.v)};
}
inline f32x16 max(f32x16 a, f32x16 b) noexcept {
  return {_mm512_maskz_max_ps(0xFFFF, a.v, b.v)};
}
// a * b + c, fused.
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}
// The halves, the quarters, then pairs, in the order of GCC's _mm512_reduce_*_ps (so results
// are those of the intrinsics), whose extracts pass an undefined operand that GCC 12 reports
// under -Wall (-Wuninitialized) in every file that includes this: the maskz extract has none.
template <class Op>
[[gnu::always_inline]] inline float reduce16(__m512 v, Op op) noexcept {
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 1));
  const __m256 h =
      op(hi, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 0)));
  const __m128 q = op(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
  const __m128 p = op(q, _mm_shuffle_ps(q, q, 0x4E));       // lanes 2 3 0 1
  return _mm_cvtss_f32(op(p, _mm_shuffle_ps(p, p, 0x01)));  // lane 0 op lane 1
}
inline float reduce_add(f32x16 a) noexcept {
  return reduce16(a.v, [](auto x, auto y) {
    if constexpr (sizeof(x) == 32) {
      return _mm256_add_ps(x, y);
    } else {
      return _mm_add_ps(x, y);
    }
  });
}
inline float reduce_max(f32x16 a) noexcept {
  return reduce16(a.v, [](auto x, auto y) {
    if constexpr (sizeof(x) == 32) {
      return _mm256_max_ps(x, y);
    } else {
      return _mm_max_ps(x, y);
    }
  });
}
// Lanes at or after n become -inf.
inline f32x16 mask_tail(f32x16 a, std::size_t n) noexcept {
  return {_mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1u),
                               _mm512_set1_ps(-std::numeric_limits<float>::infinity()), a.v)};
}

// exp(x): 2^k * p(r), k = round(x / ln 2), r = x - k ln 2 (two-part ln 2), p a degree-6
// Taylor polynomial on |r| <= ln2 / 2; vscalefps applies 2^k with correct underflow to 0.
// Inputs are clamped to [-104, 88.7]: exp(-inf) and anything below -104 give exactly 0.
inline f32x16 exp(f32x16 x) noexcept {
  const __m512 c = _mm512_maskz_min_ps(
      0xFFFF, _mm512_maskz_max_ps(0xFFFF, x.v, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.7f));
  const __m512 k =
      _mm512_maskz_roundscale_ps(0xFFFF, _mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return {_mm512_maskz_scalef_ps(0xFFFF, p, k)};
}

// Transposes a 16 x 16 block in place: rows[i] lane j <-> rows[j] lane i.
inline void transpose16(f32x16 (&rows)[16]) noexcept {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, rows[2 * i].v, rows[2 * i + 1].v);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, rows[2 * i].v, rows[2 * i + 1].v);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 0], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  // u[4i + k]: rows 4i..4i+3, column k of each 128-bit lane. Gather lanes across row groups.
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[k], u[4 + k], 0x88);  // lanes 0, 2 of groups 0, 1
    t[4 + k] =
        _mm512_maskz_shuffle_f32x4(0xFFFF, u[k], u[4 + k], 0xdd);  // lanes 1, 3 of groups 0, 1
    t[8 + k] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + k], u[12 + k], 0x88);
    t[12 + k] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + k], u[12 + k], 0xdd);
  }
  for (int k = 0; k < 4; ++k) {
    rows[k].v = _mm512_maskz_shuffle_f32x4(0xFFFF, t[k], t[8 + k], 0x88);
    rows[4 + k].v = _mm512_maskz_shuffle_f32x4(0xFFFF, t[4 + k], t[12 + k], 0x88);
    rows[8 + k].v = _mm512_maskz_shuffle_f32x4(0xFFFF, t[k], t[8 + k], 0xdd);
    rows[12 + k].v = _mm512_maskz_shuffle_f32x4(0xFFFF, t[4 + k], t[12 + k], 0xdd);
  }
}

// Horizontal sums of 16 vectors at once: lane j of the result is the sum of a[j]'s lanes.
inline f32x16 reduce_add16(const f32x16 (&a)[16]) noexcept {
  __m512 c[8], d[4];
  for (int i = 0; i < 8; ++i) {
    c[i] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, a[2 * i].v, a[2 * i + 1].v),
                         _mm512_maskz_unpackhi_ps(0xFFFF, a[2 * i].v, a[2 * i + 1].v));
  }
  for (int i = 0; i < 4; ++i) {
    d[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(0xFFFF, c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_ps(0xFFFF, c[2 * i], c[2 * i + 1], 0xee));
  }
  // d[i]: each 128-bit lane L holds that lane's partial sums of a[4i .. 4i+3].
  const __m512 g01 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, d[0], d[1], 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xFFFF, d[0], d[1], 0xdd));
  const __m512 g23 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, d[2], d[3], 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xFFFF, d[2], d[3], 0xdd));
  return {_mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, g01, g23, 0x88),
                        _mm512_maskz_shuffle_f32x4(0xFFFF, g01, g23, 0xdd))};
}

// The native register, for kernels blocked to the register file (GEMM micro-kernels).
struct native {
  using type = __m512;
  static constexpr std::size_t lanes = 16;
  static constexpr std::size_t registers = 32;
  static constexpr bool fused = true;  // fmadd is one instruction
  static type zero() noexcept { return _mm512_setzero_ps(); }
  static type load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static type load(const float16* p) noexcept {
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static type load(const bfloat16* p) noexcept {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, b), 16));
  }
  static type broadcast(const float* p) noexcept { return _mm512_set1_ps(*p); }
  static type fmadd(type a, type b, type c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static type add(type a, type b) noexcept { return _mm512_add_ps(a, b); }
  static void store(float* p, type a) noexcept { _mm512_storeu_ps(p, a); }
};

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::simd

#endif
