// float16 and bfloat16 storage types, and bulk conversion to and from float.
//
// Both are 16-bit storage formats: arithmetic happens in float. Conversion from float rounds to
// nearest, ties to even; conversion to float is exact. NaN stays NaN (same sign, quiet, the top
// payload bits kept) and infinities stay infinite.
//
// Hardware paths are chosen at compile time from what the compiler targets:
//   - F16C (`vcvtps2ph` / `vcvtph2ps`) for float16, scalar and bulk;
//   - AVX-512 BF16 (`vcvtneps2bf16`) for bulk float -> bfloat16. That instruction treats f32
//     denormal inputs as zero, so the bulk path blends in the integer result for those lanes:
//     every path gives the same bits as the portable one (the tests check all of them).
// Without those targets the portable integer code runs; it is always available in `detail` so
// tests can compare the paths.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"

#if defined(__F16C__) || defined(__AVX512BF16__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace npullm {

// Every conversion is the ISA's (core/isa.hpp), the portable ones too: integer code that the
// compiler selects and vectorizes per ISA. float16 and bfloat16 are the same types for every
// ISA, so their conversions are always inlined into the ISA's code that calls them.
namespace detail {
inline namespace NPULLM_ISA_NAMESPACE {

// ---- portable conversions (bit patterns) ---------------------------------------------------

constexpr std::uint16_t f32_to_f16_bits_portable(float value) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {  // inf or NaN
    if (u == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));  // quiet NaN
  }
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (u < 0x38800000u) {
    // |value| < 2^-14: a float16 subnormal (or zero), an integer count of 2^-24.
    // Round u's value / 2^-24 to nearest even with integer arithmetic.
    if (u < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
    const std::uint32_t exponent = u >> 23;                        // 102..112
    const std::uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;    // 24 significant bits
    const std::uint32_t shift = 126u - exponent;                   // 14..24
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  const std::uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // (15 - 127) << 23, plus rounding bias
  return static_cast<std::uint16_t>(sign | (u >> 13));
}

constexpr float f16_bits_to_f32_portable(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {  // inf or NaN (NaN made quiet)
    const std::uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalize so the leading 1 becomes the hidden bit.
    std::uint32_t e = 113;  // exponent of 2^-14 in float bias, decremented per shift
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The same conversion without branches, so that loops of it vectorize (the portable kernels
// read f16 KV and weights through it): the exponent is rebiased by multiplying the value,
// placed in an f32's fields, by 2^112, which is exact for normal and subnormal halves alike;
// exponent 31 (inf, NaN) is rebuilt as 255 with NaNs made quiet. Bit for bit the same results.
constexpr float f16_bits_to_f32_branchless(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t fields = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t scaled =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(fields) * 0x1p112f);
  const std::uint32_t mantissa = fields & 0x7fffffu;
  const std::uint32_t special = 0x7f800000u | mantissa | (mantissa != 0 ? 0x400000u : 0u);
  return std::bit_cast<float>(sign | ((h & 0x7c00u) == 0x7c00u ? special : scaled));
}

constexpr std::uint16_t f32_to_bf16_bits_portable(float value) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the top payload bits, make it quiet
    return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  }
  const std::uint32_t odd = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + odd) >> 16);
}

constexpr float bf16_bits_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// ---- dispatch: hardware where the compiler targets it ---------------------------------------

inline std::uint16_t f32_to_f16_bits(float value) noexcept {
#if defined(__F16C__)
  return static_cast<std::uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT));
#else
  return f32_to_f16_bits_portable(value);
#endif
}

inline float f16_bits_to_f32(std::uint16_t h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_bits_to_f32_branchless(h);
#endif
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace detail

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
class float16 {
 public:
  float16() = default;
  [[gnu::always_inline]] explicit float16(float value) noexcept
      : bits_(detail::f32_to_f16_bits(value)) {}
  [[gnu::always_inline]] operator float() const noexcept {  // exact
    return detail::f16_bits_to_f32(bits_);
  }

  static constexpr float16 from_bits(std::uint16_t bits) noexcept {
    float16 h;
    h.bits_ = bits;
    return h;
  }
  [[nodiscard]] constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_;
};

// bfloat16: the top half of an IEEE binary32 (1 sign, 8 exponent, 7 mantissa bits).
class bfloat16 {
 public:
  bfloat16() = default;
  [[gnu::always_inline]] explicit constexpr bfloat16(float value) noexcept
      : bits_(detail::f32_to_bf16_bits_portable(value)) {}
  [[gnu::always_inline]] constexpr operator float() const noexcept {
    return detail::bf16_bits_to_f32(bits_);
  }

  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 b;
    b.bits_ = bits;
    return b;
  }
  [[nodiscard]] constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

// The element types npullm stores tensors, weights and KV in.
enum class dtype { f32, f16, bf16 };

template <class T>
concept storage_type =
    std::same_as<T, float> || std::same_as<T, float16> || std::same_as<T, bfloat16>;

template <storage_type T>
inline constexpr dtype dtype_of = std::same_as<T, float>
                                      ? dtype::f32
                                      : (std::same_as<T, float16> ? dtype::f16 : dtype::bf16);

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "unknown";
}

constexpr std::size_t size_of(dtype t) noexcept {
  return t == dtype::f32 ? 4 : 2;
}

// Reads any storage type as float (exact).
inline float to_float(float x) noexcept {
  return x;
}
[[gnu::always_inline]] inline float to_float(float16 x) noexcept {
  return static_cast<float>(x);
}
[[gnu::always_inline]] constexpr float to_float(bfloat16 x) noexcept {
  return static_cast<float>(x);
}

// Rounds a float into a storage type (nearest, ties to even). Always inlined, as the
// conversions it calls.
template <storage_type T>
[[gnu::always_inline]] inline T from_float(float x) noexcept {
  if constexpr (std::same_as<T, float>) {
    return x;
  } else {
    return T(x);
  }
}

namespace detail {
inline namespace NPULLM_ISA_NAMESPACE {

inline void check_same_size(std::size_t in, std::size_t out) {
  if (in != out) {
    raise(error_code::invalid_shape, "convert: input has ", in, " elements, output has ", out);
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace detail

// ---- bulk conversion: [n] -> [n] ------------------------------------------------------------
inline namespace NPULLM_ISA_NAMESPACE {

inline void convert(std::span<const float> in, std::span<float16> out) {
  detail::check_same_size(in.size(), out.size());
  std::size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= in.size(); i += 16) {
    const __m256i h =
        _mm512_maskz_cvtps_ph(0xFFFF, _mm512_loadu_ps(in.data() + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + i), h);
  }
#elif defined(__F16C__)
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in.data() + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + i), h);
  }
#endif
  for (; i < in.size(); ++i) out[i] = float16(in[i]);
}

inline void convert(std::span<const float16> in, std::span<float> out) {
  detail::check_same_size(in.size(), out.size());
  std::size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= in.size(); i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.data() + i));
    _mm512_storeu_ps(out.data() + i, _mm512_maskz_cvtph_ps(0xFFFF, h));
  }
#elif defined(__F16C__)
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data() + i));
    _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < in.size(); ++i) out[i] = static_cast<float>(in[i]);
}

inline void convert(std::span<const float> in, std::span<bfloat16> out) {
  detail::check_same_size(in.size(), out.size());
  std::size_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512VL__) && defined(__AVX512BW__)
  const __m512i exponent_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (; i + 16 <= in.size(); i += 16) {
    const __m512 x = _mm512_loadu_ps(in.data() + i);
    const __m512i u = _mm512_castps_si512(x);
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    // vcvtneps2bf16 flushes denormal inputs to zero: redo those lanes with integer RNE.
    const __mmask16 denormal =
        _mm512_testn_epi32_mask(u, exponent_mask) & _mm512_test_epi32_mask(u, abs_mask);
    if (denormal) {
      const __m512i odd =
          _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 16), _mm512_set1_epi32(1));
      const __m512i rounded = _mm512_maskz_srli_epi32(
          0xFFFF, _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
      h = _mm256_mask_mov_epi16(h, denormal, _mm512_maskz_cvtepi32_epi16(0xFFFF, rounded));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + i), h);
  }
#endif
  for (; i < in.size(); ++i) out[i] = bfloat16(in[i]);
}

inline void convert(std::span<const bfloat16> in, std::span<float> out) {
  detail::check_same_size(in.size(), out.size());
  // A shift per element: the compiler vectorizes this loop on every target.
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(in[i]);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm
