// f32x16: sixteen float lanes, the unit npullm's hot loops are written in.
//
// With AVX-512 (chosen at compile time: __AVX512F__) each operation is one instruction on a
// zmm register; otherwise a portable struct of 16 floats whose loops the compiler vectorizes
// for whatever the target has. Both give the same results for the same inputs except exp,
// which is a polynomial on AVX-512 (max relative error ~2 ulp, exp(-inf) == 0 exactly) and
// std::exp in the portable path.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "npullm/core/dtype.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace npullm::simd {

inline constexpr std::size_t lanes = 16;

#if defined(__AVX512F__)

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
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline f32x16 load(const bfloat16* p) noexcept {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16))};
}
// The first n (< 16) lanes from p, the rest zero; reads only n elements.
inline f32x16 load_partial(const float* p, std::size_t n) noexcept {
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p)};
}
inline f32x16 load_partial(const float16* p, std::size_t n) noexcept {
  const __m256i h = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), p);
  return {_mm512_cvtph_ps(h)};
}
inline f32x16 load_partial(const bfloat16* p, std::size_t n) noexcept {
  const __m256i b = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16))};
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
inline f32x16 max(f32x16 a, f32x16 b) noexcept {
  return {_mm512_max_ps(a.v, b.v)};
}
// a * b + c, fused.
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}
inline float reduce_add(f32x16 a) noexcept {
  return _mm512_reduce_add_ps(a.v);
}
inline float reduce_max(f32x16 a) noexcept {
  return _mm512_reduce_max_ps(a.v);
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
  const __m512 c =
      _mm512_min_ps(_mm512_max_ps(x.v, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.7f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
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
  return {_mm512_scalef_ps(p, k)};
}

// Transposes a 16 x 16 block in place: rows[i] lane j <-> rows[j] lane i.
inline void transpose16(f32x16 (&rows)[16]) noexcept {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(rows[2 * i].v, rows[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i].v, rows[2 * i + 1].v);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  // u[4i + k]: rows 4i..4i+3, column k of each 128-bit lane. Gather lanes across row groups.
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);      // lanes 0, 2 of groups 0, 1
    t[4 + k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);  // lanes 1, 3 of groups 0, 1
    t[8 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
  }
  for (int k = 0; k < 4; ++k) {
    rows[k].v = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    rows[4 + k].v = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
    rows[8 + k].v = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
    rows[12 + k].v = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd);
  }
}

// Horizontal sums of 16 vectors at once: lane j of the result is the sum of a[j]'s lanes.
inline f32x16 reduce_add16(const f32x16 (&a)[16]) noexcept {
  __m512 c[8], d[4];
  for (int i = 0; i < 8; ++i) {
    c[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i].v, a[2 * i + 1].v),
                         _mm512_unpackhi_ps(a[2 * i].v, a[2 * i + 1].v));
  }
  for (int i = 0; i < 4; ++i) {
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xee));
  }
  // d[i]: each 128-bit lane L holds that lane's partial sums of a[4i .. 4i+3].
  const __m512 g01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
  const __m512 g23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(d[2], d[3], 0x88), _mm512_shuffle_f32x4(d[2], d[3], 0xdd));
  return {
      _mm512_add_ps(_mm512_shuffle_f32x4(g01, g23, 0x88), _mm512_shuffle_f32x4(g01, g23, 0xdd))};
}

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
NPULLM_SIMD_BINARY(max, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef NPULLM_SIMD_BINARY
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
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
inline f32x16 exp(f32x16 x) noexcept {
  f32x16 r;
  for (std::size_t i = 0; i < lanes; ++i) r.v[i] = std::exp(x.v[i]);
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

#endif

// Broadcast-multiply-add from memory: acc + (*p) * b.
inline f32x16 fmadd_broadcast(const float* p, f32x16 b, f32x16 acc) noexcept {
  return fmadd(set1(*p), b, acc);
}

}  // namespace npullm::simd
