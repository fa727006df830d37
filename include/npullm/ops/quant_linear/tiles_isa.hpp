// The vector operations the tiled kernel (quant_linear/tiles_kernel.hpp) is written in, one
// struct per vector width: tile_avx512 (AVX-512 VNNI: 16 rows a vector) and tile_avx2 (AVX2,
// with vpdpbusd on ymm where the compiler targets AVX-VNNI or AVX-512 VNNI + VL: 8 rows a
// vector). AVX-512 VNNI builds have both (tile_height_of picks per format). Portable builds run the
// kernel's portable loops instead (tiles_kernel.hpp; SSE2's pmaddwd where the target has it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "npullm/core/isa.hpp"
#include "npullm/ops/quant_linear/activations.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

#if defined(NPULLM_QUANT_VNNI512)
struct tile_avx512 {
  using i = __m512i;
  using f = __m512;
  static constexpr std::size_t rows = 16;
  static i load(const void* p) noexcept { return _mm512_loadu_si512(p); }
  static i bcast4(const std::int8_t* p) noexcept {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static i set1(std::int32_t v) noexcept { return _mm512_set1_epi32(v); }
  static i bytes(std::uint8_t v) noexcept { return _mm512_set1_epi8(static_cast<char>(v)); }
  static i and_(i a, i b) noexcept { return _mm512_and_si512(a, b); }
  static i or_(i a, i b) noexcept { return _mm512_or_si512(a, b); }
  template <int N>
  static i srl16(i a) noexcept {
    return _mm512_srli_epi16(a, N);
  }
  template <int N>
  static i sll16(i a) noexcept {
    return _mm512_slli_epi16(a, N);
  }
  // 16 bytes in every 128-bit lane; byte b of each lane of idx (0..15) looked up in them
  static i table16(const void* p) noexcept {
    return _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static i lookup(i table, i idx) noexcept { return _mm512_shuffle_epi8(table, idx); }
  // acc + Σ over each 4 bytes of u (u8) · x (s8)
  static i dot(i acc, i u, i x) noexcept { return _mm512_dpbusd_epi32(acc, u, x); }
  // Dot products of small codes into acc: small_begin, small_dot, small_end (tile_avx2
  // without VNNI sums them in 16 bits between; here they are plain dots).
  static i small_begin(i acc) noexcept { return acc; }
  static i small_dot(i s, i u, i x) noexcept { return dot(s, u, x); }
  static i small_end(i s, i) noexcept { return s; }
  // (declared for the kernel's q8_0 branch that this ISA's u8 tiles never take)
  static i dot_signed(i acc, i w, i x) noexcept = delete;
  // (maskz forms: GCC 12 warns about the unmasked ones' undefined pass-through operand)
  static f cvt(i v) noexcept { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }
  static f f16(const void* p) noexcept {
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  static f u8(const void* p) noexcept {
    return cvt(_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(static_cast<const __m128i*>(p))));
  }
  static f s8(const void* p) noexcept {
    return cvt(_mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(static_cast<const __m128i*>(p))));
  }
  // the low / high nibbles of 16 bytes as floats
  static f u4lo(const void* p) noexcept {
    return cvt(_mm512_and_si512(
        _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(static_cast<const __m128i*>(p))),
        _mm512_set1_epi32(0xF)));
  }
  static f u4hi(const void* p) noexcept {
    return cvt(_mm512_maskz_srli_epi32(
        0xFFFF, _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(static_cast<const __m128i*>(p))),
        4));
  }
  static f loadf(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static f set1f(float v) noexcept { return _mm512_set1_ps(v); }
  static f zerof() noexcept { return _mm512_setzero_ps(); }
  static f fmadd(f a, f b, f c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static f fnmadd(f a, f b, f c) noexcept { return _mm512_fnmadd_ps(a, b, c); }
  static f mul(f a, f b) noexcept { return _mm512_mul_ps(a, b); }
  static f add(f a, f b) noexcept { return _mm512_add_ps(a, b); }
  static void storef(float* p, f v) noexcept { _mm512_storeu_ps(p, v); }
};
#endif
#if defined(__AVX2__)
struct tile_avx2 {
  using i = __m256i;
  using f = __m256;
  static constexpr std::size_t rows = 8;
  static i load(const void* p) noexcept { return _mm256_loadu_si256(static_cast<const i*>(p)); }
  static i bcast4(const std::int8_t* p) noexcept {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  static i set1(std::int32_t v) noexcept { return _mm256_set1_epi32(v); }
  static i bytes(std::uint8_t v) noexcept { return _mm256_set1_epi8(static_cast<char>(v)); }
  static i and_(i a, i b) noexcept { return _mm256_and_si256(a, b); }
  static i or_(i a, i b) noexcept { return _mm256_or_si256(a, b); }
  template <int N>
  static i srl16(i a) noexcept {
    return _mm256_srli_epi16(a, N);
  }
  template <int N>
  static i sll16(i a) noexcept {
    return _mm256_slli_epi16(a, N);
  }
  static i table16(const void* p) noexcept {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static i lookup(i table, i idx) noexcept { return _mm256_shuffle_epi8(table, idx); }
  // acc + Σ over each 4 bytes of u (u8 <= 63 without VNNI: maddubs's pair sums stay in i16) · x
  static i dot(i acc, i u, i x) noexcept {
#if defined(NPULLM_QUANT_VNNI256)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, x);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#endif
#else
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
  }
  // Dot products of small codes into acc: s = small_begin(acc), s = small_dot(s, u, x) for
  // each, acc = small_end(s, acc). Without VNNI s holds vpmaddubsw's 16-bit pair sums, widened
  // once by small_end: one vpmaddwd for the group instead of one a dot. x's codes are in
  // [-127, 127], so a group stays within i16 (nothing saturates or wraps) when it is at most
  // 8 dots of codes <= 15 (8 x 2 x 15 x 127 = 30480; codes <= 7 or 3: more), 4 of codes <= 31
  // (31496) or 2 of codes <= 63 (32004); the integers are the same as dot's.
#if defined(NPULLM_QUANT_VNNI256)
  static i small_begin(i acc) noexcept {
    return acc;
  }
  static i small_dot(i s, i u, i x) noexcept {
    return dot(s, u, x);
  }
  static i small_end(i s, i) noexcept {
    return s;
  }
#else
  static i small_begin(i) noexcept {
    return _mm256_setzero_si256();
  }
  static i small_dot(i s, i u, i x) noexcept {
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(u, x));
  }
  static i small_end(i s, i acc) noexcept {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
  }
#endif
  // acc + Σ over each 4 bytes of w (s8) · x (s8): |w| · sign(x, w)
  static i dot_signed(i acc, i w, i x) noexcept {
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)),
                               _mm256_set1_epi16(1)));
  }
  static f cvt(i v) noexcept {
    return _mm256_cvtepi32_ps(v);
  }
  static f f16(const void* p) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static f u8(const void* p) noexcept {
    return cvt(_mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
  }
  static f s8(const void* p) noexcept {
    return cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
  }
  static f u4lo(const void* p) noexcept {
    return cvt(
        _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))),
                         _mm256_set1_epi32(0xF)));
  }
  static f u4hi(const void* p) noexcept {
    return cvt(_mm256_srli_epi32(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))), 4));
  }
  static f loadf(const float* p) noexcept {
    return _mm256_loadu_ps(p);
  }
  static f set1f(float v) noexcept {
    return _mm256_set1_ps(v);
  }
  static f zerof() noexcept {
    return _mm256_setzero_ps();
  }
  static f fmadd(f a, f b, f c) noexcept {
    return _mm256_fmadd_ps(a, b, c);
  }
  static f fnmadd(f a, f b, f c) noexcept {
    return _mm256_fnmadd_ps(a, b, c);
  }
  static f mul(f a, f b) noexcept {
    return _mm256_mul_ps(a, b);
  }
  static f add(f a, f b) noexcept {
    return _mm256_add_ps(a, b);
  }
  static void storef(float* p, f v) noexcept {
    _mm256_storeu_ps(p, v);
  }
};
#endif

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
