// Scores against quantized keys (kv::q8_0, kv::q4_0) by integer dot products, as llama.cpp's
// CPU attention scores them: each query row (times the attention scale) is quantized to int8
// per 32 elements with an f32 scale, and a key's score is, over the row's units u,
//
//   s = sum_u float(sum_{e in u} qq_e kq_e) * (qd_u * kd_u)         (an FMA per unit, u in order)
//
// where qq / qd are the query's codes and scale and kq / kd the key's (q4_0: kq = code - 8).
// The integer sums are exact, so a key's score depends only on its own row and the query row:
// any storage, tiling or thread count gives the same score. Against f32 arithmetic on the
// dequantized key the difference is the query's quantization (|q - qd qq| <= qd / 2 per
// element) and f32 rounding; query_round_trip gives the query values the scores correspond to.
//
// Per 16-key sub-tile, the keys' codes are transposed once (transpose_keys) into 8 vectors per
// unit, vector t holding elements 4t..4t+3 of each of the 16 keys in its 32-bit lane j (q4_0:
// nibbles unpacked), so that one instruction (AVX-512 VNNI / AVX-VNNI vpdpbusd; AVX2 vpmaddubsw
// + vpmaddwd; portable: SSE2 pmaddwd on bytes widened to i16 where the target has SSE2, as
// baseline x86-64 does, else a scalar loop) adds 4 elements' products for 16 (AVX-512) or 8 (AVX2)
// keys against a broadcast 4 bytes of the query; every row of the GQA group reuses them.
// vpdpbusd multiplies unsigned by signed bytes: q8_0 keys are stored with their sign bit flipped
// (kq + 128) and the row's accumulators start at -128 sum(qq); q4_0's codes are unsigned (kq + 8,
// start at -8 sum(qq)). Without VNNI, vpmaddubsw's i16 pair sums would overflow on kq + 128, so
// q8_0 keys stay signed (|kq| times the query's bytes with kq's sign: at most 2 * 127 * 127).
//
//   query_round_trip(x, n)        x = qd qq per 32 elements: the query the scores correspond to
//   quantize_query(x, n, o, ...)  x -> codes, scales and the per-unit start of the accumulators
//   transpose_keys(k, units, ...) 16 keys (rows `units` apart) -> 8 vectors per unit + scales
//   quantized_scores<R>(...)      R rows' scores against the transposed sub-tile
//   unit_scales(v, units, out)    the 16 keys' scales per unit (P V folds them into p)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "npullm/core/isa.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/kv/kv_format.hpp"

#if defined(NPULLM_ISA_AVX512) || defined(NPULLM_ISA_AVX2)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

// Everything here is the ISA's (core/isa.hpp): the integer kernels, and the query's
// quantization, a loop the compiler vectorizes per ISA.
namespace npullm::attention {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

// The integer kernels below: 16 keys (lanes) of 32-bit integers.
#if defined(NPULLM_ISA_AVX512) && defined(__AVX512BW__)
#define NPULLM_QK_AVX512 1
#if defined(__AVX512VNNI__)
#define NPULLM_QK_VNNI 1
#endif
#elif defined(NPULLM_ISA_AVX2)
#define NPULLM_QK_AVX2 1
#if defined(__AVXVNNI__)
#define NPULLM_QK_VNNI 1
#endif
#endif

#if defined(NPULLM_QK_VNNI)
inline constexpr bool vnni = true;
#else
inline constexpr bool vnni = false;
#endif

// What the transposed keys hold and where each row's accumulators start: codes + offset, so
// the start is -offset * sum(qq) (q8_0 is unsigned only for vpdpbusd).
template <kv::quantized_kv_element T>
inline constexpr std::int32_t key_offset = std::same_as<T, kv::q4_0> ? 8 : (vnni ? 128 : 0);

// One unit of a query row: codes, f32 scale (not f16: it is never stored) and sum of codes.
inline float quantize_query_unit(const float* x, std::int8_t* q, std::int32_t& sum) noexcept {
  float amax = 0.0f;
  for (std::size_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[e]));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  sum = 0;
  for (std::size_t e = 0; e < 32; ++e) {
    q[e] = static_cast<std::int8_t>(std::nearbyint(x[e] * id));  // |x id| <= 127 (+ rounding)
    sum += q[e];
  }
  return amax / 127.0f;
}

}  // namespace detail

// x = qd qq per 32 elements (qd = max |x| / 127, qq = round(x / qd)): the values of a query row
// that scores against quantized keys correspond to (n a multiple of 32).
inline void query_round_trip(float* x, std::size_t n) noexcept {
  std::int8_t q[32];
  std::int32_t sum = 0;
  for (std::size_t u = 0; u < n / 32; ++u) {
    const float d = detail::quantize_query_unit(x + u * 32, q, sum);
    for (std::size_t e = 0; e < 32; ++e) x[u * 32 + e] = d * static_cast<float>(q[e]);
  }
}

namespace detail {

// A row of n elements (n / 32 units) -> unit u's codes at q + u * rows * 32, its scale at
// d[u * rows], its accumulator start (for keys of format T) at c[u * rows]: one row of the
// unit-major layout quantized_scores reads.
template <kv::quantized_kv_element T>
void quantize_query(const float* x, std::size_t n, std::size_t rows, std::int8_t* q, float* d,
                    std::int32_t* c) noexcept {
  for (std::size_t u = 0; u < n / 32; ++u) {
    std::int32_t sum = 0;
    d[u * rows] = quantize_query_unit(x + u * 32, q + u * rows * 32, sum);
    c[u * rows] = -key_offset<T> * sum;
  }
}

// The 16 keys' scales of each unit: out[u * 16 + j] = key j's scale of unit u (rows `units`
// apart), the 16 halves inserted into a vector in registers, then converted. (Collecting them
// in memory and loading them as a vector stalls on store forwarding; a vpgatherdd took longer
// still: measured, a third of the decode time for 8/8 heads of 128.)
template <kv::quantized_kv_element T>
inline void unit_scales(const T* rows, std::size_t units, float* out) noexcept {
  for (std::size_t u = 0; u < units; ++u) {
#if defined(NPULLM_ISA_AVX512) || defined(NPULLM_ISA_AVX2)
    auto h = [&](std::size_t j) {
      std::int16_t bits;
      std::memcpy(&bits, &rows[j * units + u].d, 2);
      return bits;
    };
    const __m256i halves = _mm256_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7), h(8),
                                             h(9), h(10), h(11), h(12), h(13), h(14), h(15));
#if defined(NPULLM_ISA_AVX512)
    _mm512_storeu_ps(out + u * simd::lanes, _mm512_maskz_cvtph_ps(0xFFFF, halves));
#else
    _mm256_storeu_ps(out + u * simd::lanes, _mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
    _mm256_storeu_ps(out + u * simd::lanes + 8,
                     _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)));
#endif
#else
    for (std::size_t j = 0; j < simd::lanes; ++j) {
      out[u * simd::lanes + j] = static_cast<float>(rows[j * units + u].d);
    }
#endif
  }
}

#if defined(NPULLM_QK_AVX512)

struct i32x16 {
  __m512i v;
};
inline i32x16 ik_set1(std::int32_t x) noexcept {
  return {_mm512_set1_epi32(x)};
}
inline i32x16 ik_load(const std::int32_t* p) noexcept {
  return {_mm512_loadu_si512(p)};
}
inline simd::f32x16 ik_to_f32(i32x16 a) noexcept {
  return {_mm512_maskz_cvtepi32_ps(0xFFFF, a.v)};
}
// acc + per lane the sum of 4 byte products of k (its encoding: key_offset) and the query's
// 4 bytes q4 (broadcast).
template <bool Signed>
inline i32x16 ik_dot(i32x16 acc, i32x16 k, std::int32_t q4) noexcept {
  const __m512i q = _mm512_set1_epi32(q4);
  if constexpr (Signed) {  // no VNNI, q8_0: |k| times q with k's sign
    const __m512i qs = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(k.v), _mm512_setzero_si512(), q);
    return {_mm512_add_epi32(
        acc.v,
        _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(k.v), qs), _mm512_set1_epi16(1)))};
  } else {
#if defined(NPULLM_QK_VNNI)
    return {_mm512_dpbusd_epi32(acc.v, k.v, q)};
#else  // q4_0 codes <= 15: the i16 pair sums fit
    return {_mm512_add_epi32(
        acc.v, _mm512_madd_epi16(_mm512_maddubs_epi16(k.v, q), _mm512_set1_epi16(1)))};
#endif
  }
}

// 16 q8_0 keys' unit (32 bytes each at base + j * stride) -> out[t] lane j = bytes 4t..4t+3.
inline void transpose_q8(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  __m512i z[8];
  for (std::size_t j = 0; j < 8; ++j) {  // key j in the low half, key j + 8 in the high half
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * stride));
    const __m256i hi =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (j + 8) * stride));
    z[j] = _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(lo), hi, 1);
  }
  // An 8 x 8 transpose of 32-bit elements in each 256-bit half.
  __m512i t[8], u[8];
  for (std::size_t i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(0xFFFF, z[2 * i], z[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, z[2 * i], z[2 * i + 1]);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * i + 1], t[4 * i + 3]);
  }
  // u[d] holds element d (128-bit lanes 0, 2) and d + 4 (lanes 1, 3) of keys 0-3 / 8-11,
  // u[d + 4] the same of keys 4-7 / 12-15.
  const __m512i first = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (std::size_t d = 0; d < 4; ++d) {
    __m512i a = _mm512_permutex2var_epi64(u[d], first, u[d + 4]);
    __m512i b = _mm512_permutex2var_epi64(u[d], second, u[d + 4]);
    if constexpr (vnni) {
      a = _mm512_xor_si512(a, flip);
      b = _mm512_xor_si512(b, flip);
    }
    _mm512_storeu_si512(out + d * 16, a);
    _mm512_storeu_si512(out + (d + 4) * 16, b);
  }
}

// 16 q4_0 keys' unit (16 bytes of nibbles each) -> out[t] lane j = codes 4t..4t+3 (t < 4: low
// nibbles of bytes 4t..4t+3, t >= 4: high nibbles of bytes 4(t - 4)..: elements 16 + 4(t - 4)).
inline void transpose_q4(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  __m512i z[4];
  for (std::size_t j = 0; j < 4; ++j) {  // 128-bit lane l: key j + 4 l
    auto at = [&](std::size_t key) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + key * stride));
    };
    __m512i v = _mm512_castsi128_si512(at(j));
    v = _mm512_inserti32x4(v, at(j + 4), 1);
    v = _mm512_inserti32x4(v, at(j + 8), 2);
    z[j] = _mm512_inserti32x4(v, at(j + 12), 3);
  }
  const __m512i t0 = _mm512_maskz_unpacklo_epi32(0xFFFF, z[0], z[1]),
                t1 = _mm512_maskz_unpackhi_epi32(0xFFFF, z[0], z[1]);
  const __m512i t2 = _mm512_maskz_unpacklo_epi32(0xFFFF, z[2], z[3]),
                t3 = _mm512_maskz_unpackhi_epi32(0xFFFF, z[2], z[3]);
  const __m512i b[4] = {
      _mm512_maskz_unpacklo_epi64(0xFF, t0, t2), _mm512_maskz_unpackhi_epi64(0xFF, t0, t2),
      _mm512_maskz_unpacklo_epi64(0xFF, t1, t3), _mm512_maskz_unpackhi_epi64(0xFF, t1, t3)};
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (std::size_t d = 0; d < 4; ++d) {
    _mm512_storeu_si512(out + d * 16, _mm512_and_si512(b[d], low));
    _mm512_storeu_si512(out + (d + 4) * 16, _mm512_and_si512(_mm512_srli_epi16(b[d], 4), low));
  }
}

#elif defined(NPULLM_QK_AVX2)

struct i32x16 {
  __m256i lo, hi;
};
inline i32x16 ik_set1(std::int32_t x) noexcept {
  return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)};
}
inline i32x16 ik_load(const std::int32_t* p) noexcept {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8))};
}
inline simd::f32x16 ik_to_f32(i32x16 a) noexcept {
  return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)};
}
template <bool Signed>
inline __m256i ik_dot8(__m256i acc, __m256i k, __m256i q) noexcept {
  if constexpr (Signed) {
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(k), _mm256_sign_epi8(q, k)),
                               _mm256_set1_epi16(1)));
  } else {
#if defined(NPULLM_QK_VNNI)
    return _mm256_dpbusd_avx_epi32(acc, k, q);
#else
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(k, q), _mm256_set1_epi16(1)));
#endif
  }
}
template <bool Signed>
inline i32x16 ik_dot(i32x16 acc, i32x16 k, std::int32_t q4) noexcept {
  const __m256i q = _mm256_set1_epi32(q4);
  return {ik_dot8<Signed>(acc.lo, k.lo, q), ik_dot8<Signed>(acc.hi, k.hi, q)};
}

inline void transpose_q8(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (std::size_t h = 0; h < 2; ++h) {  // keys 8h .. 8h + 7
    __m256i z[8], t[8], u[8];
    for (std::size_t j = 0; j < 8; ++j)
      z[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (8 * h + j) * stride));
    for (std::size_t i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (std::size_t i = 0; i < 2; ++i) {
      u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (std::size_t d = 0; d < 4; ++d) {
      __m256i a = _mm256_permute2x128_si256(u[d], u[d + 4], 0x20);
      __m256i b = _mm256_permute2x128_si256(u[d], u[d + 4], 0x31);
      if constexpr (vnni) {
        a = _mm256_xor_si256(a, flip);
        b = _mm256_xor_si256(b, flip);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d * 16 + 8 * h), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (d + 4) * 16 + 8 * h), b);
    }
  }
}

inline void transpose_q4(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (std::size_t h = 0; h < 2; ++h) {
    __m256i z[4];
    for (std::size_t j = 0; j < 4; ++j) {  // key 8h + j, then key 8h + j + 4
      const char* p = base + (8 * h + j) * stride;
      z[j] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * stride)), 1);
    }
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    const __m256i b[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    for (std::size_t d = 0; d < 4; ++d) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d * 16 + 8 * h),
                          _mm256_and_si256(b[d], low));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (d + 4) * 16 + 8 * h),
                          _mm256_and_si256(_mm256_srli_epi16(b[d], 4), low));
    }
  }
}

#elif defined(__SSE2__)  // portable on x86-64's baseline: SSE2 (no pmaddubsw before SSSE3)

struct i32x16 {
  __m128i v[4];  // lanes 4i..4i+3
};
inline i32x16 ik_set1(std::int32_t x) noexcept {
  const __m128i a = _mm_set1_epi32(x);
  return {{a, a, a, a}};
}
inline i32x16 ik_load(const std::int32_t* p) noexcept {
  i32x16 r;
  for (std::size_t i = 0; i < 4; ++i)
    r.v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * i));
  return r;
}
inline simd::f32x16 ik_to_f32(i32x16 a) noexcept {
  alignas(64) float f[simd::lanes];
  for (std::size_t i = 0; i < 4; ++i) _mm_store_ps(f + 4 * i, _mm_cvtepi32_ps(a.v[i]));
  return simd::load(f);
}
// Lane j's 4 bytes (signed codes for q8_0, unsigned for q4_0) widened to i16, times the query's
// 4 bytes (also widened) by pmaddwd: two pair sums per lane, added after a shuffle. Exact, so
// the same sums as the scalar loop below.
template <bool Signed>
inline i32x16 ik_dot(i32x16 acc, i32x16 k, std::int32_t q4) noexcept {
  const __m128i zero = _mm_setzero_si128();
  __m128i q = _mm_cvtsi32_si128(q4);
  q = _mm_unpacklo_epi8(q, _mm_cmpgt_epi8(zero, q));  // 4 x i16
  q = _mm_unpacklo_epi64(q, q);                       // q0..q3 q0..q3
  for (std::size_t i = 0; i < 4; ++i) {
    const __m128i kb = k.v[i];
    const __m128i sign = Signed ? _mm_cmpgt_epi8(zero, kb) : zero;
    const __m128 lo = _mm_castsi128_ps(_mm_madd_epi16(_mm_unpacklo_epi8(kb, sign), q));
    const __m128 hi = _mm_castsi128_ps(_mm_madd_epi16(_mm_unpackhi_epi8(kb, sign), q));
    const __m128i even = _mm_castps_si128(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m128i odd = _mm_castps_si128(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
    acc.v[i] = _mm_add_epi32(acc.v[i], _mm_add_epi32(even, odd));
  }
  return acc;
}

#else  // portable without SSE2: plain integers

struct i32x16 {
  std::int32_t v[simd::lanes];
};
inline i32x16 ik_set1(std::int32_t x) noexcept {
  i32x16 r;
  for (auto& e : r.v) e = x;
  return r;
}
inline i32x16 ik_load(const std::int32_t* p) noexcept {
  i32x16 r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline simd::f32x16 ik_to_f32(i32x16 a) noexcept {
  alignas(64) float f[simd::lanes];
  for (std::size_t j = 0; j < simd::lanes; ++j) f[j] = static_cast<float>(a.v[j]);
  return simd::load(f);
}
// Lane j's 4 bytes: signed codes (q8_0) or unsigned ones (q4_0), times the query's 4 bytes.
// (Written over typed byte arrays so that the compiler can vectorize it.)
template <bool Signed>
inline i32x16 ik_dot(i32x16 acc, i32x16 k, std::int32_t q4) noexcept {
  using byte = std::conditional_t<Signed, std::int8_t, std::uint8_t>;
  byte kb[simd::lanes * 4];
  std::int8_t q[4];
  std::memcpy(kb, k.v, sizeof(kb));
  std::memcpy(q, &q4, 4);
  for (std::size_t j = 0; j < simd::lanes; ++j) {
    acc.v[j] +=
        kb[4 * j] * q[0] + kb[4 * j + 1] * q[1] + kb[4 * j + 2] * q[2] + kb[4 * j + 3] * q[3];
  }
  return acc;
}

#endif

#if !defined(NPULLM_QK_AVX512) && !defined(NPULLM_QK_AVX2)  // portable transposes

inline void transpose_q8(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  for (std::size_t j = 0; j < simd::lanes; ++j)
    for (std::size_t t = 0; t < 8; ++t) std::memcpy(out + t * 16 + j, base + j * stride + 4 * t, 4);
}

inline void transpose_q4(const char* base, std::size_t stride, std::int32_t* out) noexcept {
  for (std::size_t j = 0; j < simd::lanes; ++j) {
    const auto* qs = reinterpret_cast<const std::uint8_t*>(base + j * stride);
    for (std::size_t t = 0; t < 8; ++t) {
      std::uint8_t b[4];
      for (std::size_t e = 0; e < 4; ++e)
        b[e] = t < 4 ? qs[4 * t + e] & 15 : qs[4 * (t - 4) + e] >> 4;
      std::memcpy(out + t * 16 + j, b, 4);
    }
  }
}

#endif

// 16 keys (rows of `units` units, `units` apart) -> kq (units, 8, 16) codes as transposed
// above and kd (units, 16) scales.
template <kv::quantized_kv_element T>
inline void transpose_keys(const T* k, std::size_t units, std::int32_t* kq, float* kd) noexcept {
  const std::size_t stride = units * sizeof(T);
  for (std::size_t u = 0; u < units; ++u) {
    const char* base = reinterpret_cast<const char*>(k + u) + offsetof(T, qs);
    if constexpr (std::same_as<T, kv::q8_0>)
      transpose_q8(base, stride, kq + u * 8 * simd::lanes);
    else
      transpose_q4(base, stride, kq + u * 8 * simd::lanes);
  }
  unit_scales(k, units, kd);
}

// Scores of R query rows against a transposed sub-tile. The rows' codes, scales and
// accumulator starts are laid out unit-major, so a row block's are a constant distance apart:
// codes (units, rows, 32), scales and starts (units, rows); q, d, c point at the block's first
// row in unit 0, `rows` is the whole item's row count.
template <std::size_t R, kv::quantized_kv_element T>
inline void quantized_scores(const std::int8_t* q, const float* d, const std::int32_t* c,
                             std::size_t rows, const std::int32_t* kq, const float* kd,
                             std::size_t units, simd::f32x16* s) noexcept {
  constexpr bool is_signed = key_offset<T> == 0;
  NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) s[r] = simd::zero();
  for (std::size_t u = 0; u < units; ++u) {
    const std::int8_t* qu = q + u * rows * 32;
    i32x16 acc[R];
    NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) acc[r] = ik_set1(c[u * rows + r]);
    NPULLM_UNROLL for (std::size_t t = 0; t < 8; ++t) {
      const i32x16 kv = ik_load(kq + (u * 8 + t) * simd::lanes);
      NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
        std::int32_t q4;
        std::memcpy(&q4, qu + r * 32 + 4 * t, 4);
        acc[r] = ik_dot<is_signed>(acc[r], kv, q4);
      }
    }
    const simd::f32x16 ku = simd::load(kd + u * simd::lanes);
    NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
      s[r] = simd::fmadd(ik_to_f32(acc[r]), simd::mul(ku, simd::set1(d[u * rows + r])), s[r]);
    }
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::attention

// The macros that select the kernels above are this header's alone.
#undef NPULLM_QK_AVX512
#undef NPULLM_QK_AVX2
#undef NPULLM_QK_VNNI
