// f32x16: sixteen float lanes, the unit npullm's hot loops are written in, and `native`, one
// register of the target, for kernels blocked to the register file (GEMM micro-kernels).
//
// The path is chosen at compile time (core/isa.hpp):
//   AVX-512  f32x16 is one zmm register; exp is a polynomial (max relative error ~2 ulp,
//            exp(-inf) == 0 exactly) scaled with vscalefps.
//   AVX2     f32x16 is two ymm registers (lo = lanes 0..7, hi = 8..15): the kernels keep their
//            16-key / 16-column structure and choose their register blocking from
//            `f32x16_registers` (8 here, 32 with AVX-512). Same exp polynomial; f16 loads by
//            F16C, bf16 loads by a shift, partial loads by vmaskmovps.
//   portable a struct of 16 floats whose loops the compiler vectorizes for the target (SSE2 on
//            baseline x86-64); the same exp polynomial in plain float arithmetic; fmadd fused
//            only where the target has an FMA instruction (FP_FAST_FMAF).
// All paths give the same results for the same inputs up to rounding: reduce_add sums in the
// same pairwise order everywhere; exp and (portable, no FMA) fmadd may differ in the last bit.
//
// Everything here is in `inline namespace NPULLM_ISA_NAMESPACE` (see core/isa.hpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

#if defined(NPULLM_ISA_AVX512) || defined(NPULLM_ISA_AVX2)
#include <immintrin.h>
#endif

// Fully unrolls the loop that follows. Kernels put it on every loop over a register block (its
// accumulators in a small array): GCC keeps such an array in registers only when every index
// into it is a constant after unrolling, and otherwise stores the accumulators on every
// iteration (measured: half the FMA rate of the AVX2 GEMM micro-kernel).
// Sanitizer builds (NPULLM_NO_FORCED_UNROLL, which the asan preset sets, or GCC's
// __SANITIZE_ADDRESS__) leave the choice to the compiler: the loops and their results are the
// same, but the instrumented, fully unrolled kernels took 10x the compile time (measured: one
// TU calling ops::linear on a quantized view, -O1 ASan + UBSan, 520 s unrolled vs 52 s).
#if defined(NPULLM_NO_FORCED_UNROLL) || defined(__SANITIZE_ADDRESS__)
#define NPULLM_UNROLL
#else
#define NPULLM_UNROLL _Pragma("GCC unroll 32")
#endif

namespace npullm::simd {
inline namespace NPULLM_ISA_NAMESPACE {

inline constexpr std::size_t lanes = 16;

#if defined(NPULLM_ISA_AVX512)

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

#elif defined(NPULLM_ISA_AVX2)

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

#else  // portable

struct f32x16 {
  float v[lanes];
};

inline f32x16 zero() noexcept {
  return {};
}
inline f32x16 set1(float x) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = x;
  return r;
}
template <class T>
inline f32x16 load(const T* p) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = to_float(p[i]);
  return r;
}
inline f32x16 load_s8(const std::int8_t* p) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline f32x16 load_q4(const std::uint8_t* p, bool high) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i)
    r.v[i] = static_cast<float>(((high ? p[i] >> 4 : p[i]) & 15) - 8);
  return r;
}
template <class T>
inline f32x16 load_partial(const T* p, std::size_t n) noexcept {
  f32x16 r{};
  for (std::size_t i = 0; i < n; ++i) r.v[i] = to_float(p[i]);
  return r;
}
inline void store(float* p, f32x16 a) noexcept {
  std::memcpy(p, a.v, sizeof(a.v));
}
#define NPULLM_SIMD_BINARY(name, expr)                       \
  inline f32x16 name(f32x16 a, f32x16 b) noexcept {          \
    f32x16 r;                                                \
    for (std::size_t i = 0; i < lanes; ++i) r.v[i] = (expr); \
    return r;                                                \
  }
NPULLM_SIMD_BINARY(add, a.v[i] + b.v[i])
NPULLM_SIMD_BINARY(sub, a.v[i] - b.v[i])
NPULLM_SIMD_BINARY(mul, a.v[i] * b.v[i])
NPULLM_SIMD_BINARY(div, a.v[i] / b.v[i])
NPULLM_SIMD_BINARY(max, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef NPULLM_SIMD_BINARY
// a * b + c: fused where the target has an FMA instruction; otherwise a multiply and an add
// (std::fma without hardware support is a library call per lane, slower than naive code).
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  f32x16 r;
#if defined(FP_FAST_FMAF)
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
#else
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
#endif
  return r;
}
inline float reduce_add(f32x16 a) noexcept {
  // Pairwise, in the same order as the AVX-512 reduction tree.
  for (std::size_t w = lanes / 2; w > 0; w /= 2) {
    for (std::size_t i = 0; i < w; ++i) a.v[i] += a.v[i + w];
  }
  return a.v[0];
}
inline float reduce_max(f32x16 a) noexcept {
  float m = a.v[0];
  for (std::size_t i = 1; i < lanes; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
inline f32x16 mask_tail(f32x16 a, std::size_t n) noexcept {
  for (std::size_t i = n; i < lanes; ++i) a.v[i] = -std::numeric_limits<float>::infinity();
  return a;
}
// exp(x): the AVX-512 algorithm in plain float arithmetic (the compiler vectorizes it; a libm
// call per lane does not): k = round(x / ln 2) by the 1.5 * 2^23 trick, a degree-6 polynomial
// in r = x - k ln 2, 2^k as two exponent-field multiplications. Same clamping: exp(-inf) == 0.
inline f32x16 exp(f32x16 x) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) {
    float c = x.v[i] > -104.0f ? x.v[i] : -104.0f;
    c = c < 88.7f ? c : 88.7f;
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float k = (c * 1.44269504088896341f + shifter) - shifter;
    float t = c - k * 0.693359375f;
    t = t - k * -2.12194440e-4f;
    float p = 1.0f / 720;
    p = p * t + 1.0f / 120;
    p = p * t + 1.0f / 24;
    p = p * t + 1.0f / 6;
    p = p * t + 0.5f;
    p = p * t + 1.0f;
    p = p * t + 1.0f;
    const auto ki = static_cast<std::int32_t>(k);
    const std::int32_t k1 = ki >> 1, k2 = ki - k1;
    const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(k1 + 127) << 23);
    const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(k2 + 127) << 23);
    r.v[i] = p * s1 * s2;
  }
  return r;
}
inline f32x16 reduce_add16(const f32x16 (&a)[16]) noexcept {
  f32x16 r;
  for (std::size_t j = 0; j < lanes; ++j) r.v[j] = reduce_add(a[j]);
  return r;
}
inline void transpose16(f32x16 (&rows)[16]) noexcept {
  for (std::size_t i = 0; i < lanes; ++i) {
    for (std::size_t j = i + 1; j < lanes; ++j) {
      const float t = rows[i].v[j];
      rows[i].v[j] = rows[j].v[i];
      rows[j].v[i] = t;
    }
  }
}

// The native register: 4 lanes (SSE2 on baseline x86-64, NEON elsewhere) through the GCC /
// Clang vector extension; multiply and add, fused only where the target has FMA.
struct native {
  typedef float type __attribute__((vector_size(16)));
  static constexpr std::size_t lanes = 4;
  static constexpr std::size_t registers = 16;
  static constexpr bool fused = false;  // a multiply and an add (and a temporary register)
  static type zero() noexcept { return type{}; }
  static type load(const float* p) noexcept {
    type v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  template <class T>  // 16-bit storage types (linear packs them as f32 on this path)
  static type load(const T* p) noexcept {
    return type{to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3])};
  }
  static type broadcast(const float* p) noexcept { return type{*p, *p, *p, *p}; }
  static type fmadd(type a, type b, type c) noexcept { return a * b + c; }
  static type add(type a, type b) noexcept { return a + b; }
  static void store(float* p, type a) noexcept { std::memcpy(p, &a, sizeof(a)); }
};

#endif

// How many f32x16 values fit in the register file: kernels size their register blocks by it.
inline constexpr std::size_t f32x16_registers = native::registers * native::lanes / lanes;

// Broadcast-multiply-add from memory: acc + (*p) * b.
inline f32x16 fmadd_broadcast(const float* p, f32x16 b, f32x16 acc) noexcept {
  return fmadd(set1(*p), b, acc);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::simd
