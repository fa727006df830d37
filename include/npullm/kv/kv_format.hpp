// The element formats a KV cache keeps K and V in, and how attention reads them.
//
//   float, float16, bfloat16   one element per storage unit, rounded to nearest
//   kv::q8_0                   a unit of 32 elements: f16 scale d, 32 int8 q; x = d q
//                              (d = max |x| / 127): llama.cpp's block_q8_0, byte for byte
//   kv::q4_0                   a unit of 32 elements: f16 scale d, 16 bytes of 4-bit q, element
//                              j in the low nibble of byte j, element 16 + j in its high nibble;
//                              x = d (q - 8) (d = the signed value of largest magnitude / -8):
//                              llama.cpp's block_q4_0, byte for byte
//
//   kv::mixed<K, V>            keys in format K, values in V (any two of the above): a cache
//                              lays out each part in its own units
//
// The quantized formats group 32 consecutive elements of one head's row (along head_dim), so a
// token's K or V is quantized when it is written, alone: a scale per token and head would let
// one outlier channel (keys have them) flatten the whole row, a scale per channel (KIVI) would
// need the tokens that come later. A row of head_dim elements is head_dim / 32 units: caches
// lay out units where they laid out elements (kv_units), and head_dim must be a multiple of 32.
//
//   quantize_row(x, n, out)     n floats -> n / unit_elements<T> units (nearest for 16-bit)
//   dequantize_row(in, n, out)  back to n floats (exact for every format)
//   round_trip(x, n)            x = dequantize(quantize(x)): what attention will read of x
//   load16(row, c)              elements [c, c + 16) of a row of units as f32 (c % 16 == 0):
//                               what the flash kernels read, fused (no dequantized copy)
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/simd.hpp"

namespace npullm::kv {

struct q8_0 {
  float16 d;
  std::int8_t qs[32];
};
struct q4_0 {
  float16 d;
  std::uint8_t qs[16];
};
static_assert(sizeof(q8_0) == 34 && sizeof(q4_0) == 18, "llama.cpp's block sizes");

template <class T>
concept quantized_kv_element = std::same_as<T, q8_0> || std::same_as<T, q4_0>;

// What a KV cache may store: a storage type (float, float16, bfloat16) or a quantized format.
template <class T>
concept kv_element = storage_type<T> || quantized_kv_element<T>;

// K and V in different formats (e.g. mixed<q8_0, q4_0>: keys at 8 bits, values at 4): a
// cache's format is either one kv_element for both or a mixed pair. Scores read K, P V reads
// V, so each part keeps its own units and its own kernels.
template <kv_element K, kv_element V>
struct mixed {
  using key_type = K;
  using value_type = V;
};

namespace detail {
template <class F>
struct format_parts {
  using key_type = F;
  using value_type = F;
};
template <class K, class V>
struct format_parts<mixed<K, V>> {
  using key_type = K;
  using value_type = V;
};
template <class F>
inline constexpr bool is_mixed = false;
template <class K, class V>
inline constexpr bool is_mixed<mixed<K, V>> = true;
}  // namespace detail

// What a KV cache or pipeline policy may name: one element format, or mixed<K, V>.
template <class F>
concept kv_format = kv_element<F> || detail::is_mixed<F>;

template <kv_format F>
using key_format_t = typename detail::format_parts<F>::key_type;
template <kv_format F>
using value_format_t = typename detail::format_parts<F>::value_type;

// Elements per storage unit.
template <kv_element T>
inline constexpr std::size_t unit_elements = quantized_kv_element<T> ? 32 : 1;

template <kv_element T>
constexpr std::string_view kv_element_name() noexcept {
  if constexpr (std::same_as<T, q8_0>) {
    return "q8_0";
  } else if constexpr (std::same_as<T, q4_0>) {
    return "q4_0";
  } else {
    return to_string(dtype_of<T>);
  }
}

// "q8_0", or "k q8_0 / v q4_0" for a mixed format.
template <kv_format F>
std::string kv_format_name() {
  if constexpr (kv_element<F>) {
    return std::string(kv_element_name<F>());
  } else {
    return "k " + std::string(kv_element_name<key_format_t<F>>()) + " / v " +
           std::string(kv_element_name<value_format_t<F>>());
  }
}

// Bytes per element (34 / 32 for q8_0, 18 / 32 for q4_0): what a read of n elements costs.
template <kv_element T>
inline constexpr double bytes_per_element = static_cast<double>(sizeof(T)) /
                                            static_cast<double>(unit_elements<T>);

// Units of one head's row of head_dim elements; head_dim must be a multiple of the unit.
template <kv_element T>
std::size_t kv_units(std::size_t head_dim, const char* who) {
  if (head_dim % unit_elements<T> != 0) {
    raise(error_code::unsupported, who, ": head_dim ", head_dim, " is not a multiple of ",
          unit_elements<T>, ", the ", kv_element_name<T>(), " KV format's group");
  }
  return head_dim / unit_elements<T>;
}
// The same check for both parts of a format.
template <kv_format F>
void check_head_dim(std::size_t head_dim, const char* who) {
  kv_units<key_format_t<F>>(head_dim, who);
  if constexpr (!kv_element<F>) kv_units<value_format_t<F>>(head_dim, who);
}

// The row quantizers and dequantizers: loops the compiler vectorizes (and contracts into FMAs)
// per ISA, so they are the ISA's, with load16 (core/isa.hpp). (The ISA namespace inside
// `detail`, not a `detail` inside the ISA namespace: two namespaces named detail, one of them in
// an inline namespace, would make kv::detail ambiguous.)
namespace detail {
inline namespace NPULLM_ISA_NAMESPACE {

inline void quantize_q8_0(const float* x, q8_0& b) noexcept {
  float amax = 0.0f;
  for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = float16(d);
  for (std::size_t j = 0; j < 32; ++j) b.qs[j] = static_cast<std::int8_t>(std::round(x[j] * id));
}

inline void quantize_q4_0(const float* x, q4_0& b) noexcept {
  float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
  for (std::size_t j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = float16(d);
  auto code = [&](float v) {  // 0..15 (x * id lies in [-8, 8]: +8 at the extreme clamps to 15)
    return static_cast<std::uint8_t>(std::min(15, static_cast<int>(v * id + 8.5f)));
  };
  for (std::size_t j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<std::uint8_t>(code(x[j]) | (code(x[16 + j]) << 4));
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace detail

inline namespace NPULLM_ISA_NAMESPACE {

// n floats (a multiple of unit_elements<T>) -> n / unit_elements<T> units.
template <kv_element T>
void quantize_row(const float* x, std::size_t n, T* out) noexcept {
  if constexpr (std::same_as<T, q8_0>) {
    for (std::size_t u = 0; u < n / 32; ++u) detail::quantize_q8_0(x + u * 32, out[u]);
  } else if constexpr (std::same_as<T, q4_0>) {
    for (std::size_t u = 0; u < n / 32; ++u) detail::quantize_q4_0(x + u * 32, out[u]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(x[i]);
  }
}

// n / unit_elements<T> units -> n floats.
template <kv_element T>
void dequantize_row(const T* in, std::size_t n, float* out) noexcept {
  if constexpr (std::same_as<T, q8_0>) {
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = static_cast<float>(in[i / 32].d) * static_cast<float>(in[i / 32].qs[i % 32]);
    }
  } else if constexpr (std::same_as<T, q4_0>) {
    for (std::size_t i = 0; i < n; ++i) {
      const q4_0& b = in[i / 32];
      const std::size_t j = i % 32;
      const int q = j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4);
      out[i] = static_cast<float>(b.d) * static_cast<float>(q - 8);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
  }
}

// x = dequantize(quantize(x)) in place: the values attention will read once x is stored.
template <kv_element T>
void round_trip(float* x, std::size_t n) noexcept {
  if constexpr (std::same_as<T, float>) {
    return;
  } else if constexpr (quantized_kv_element<T>) {
    T unit;
    for (std::size_t u = 0; u < n / 32; ++u) {
      quantize_row(x + u * 32, 32, &unit);
      dequantize_row(&unit, 32, x + u * 32);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) x[i] = to_float(from_float<T>(x[i]));
  }
}

// Elements [c, c + 16) of a row of units (c a multiple of 16) as f32, exactly
// dequantize_row's values (d q for q8_0, d (q - 8) for q4_0: one rounding each).
template <kv_element T>
[[gnu::always_inline]] inline simd::f32x16 load16(const T* row, std::size_t c) noexcept {
  if constexpr (std::same_as<T, q8_0>) {
    const q8_0& b = row[c / 32];
    return simd::mul(simd::load_s8(b.qs + (c % 32)), simd::set1(static_cast<float>(b.d)));
  } else if constexpr (std::same_as<T, q4_0>) {
    const q4_0& b = row[c / 32];
    return simd::mul(simd::load_q4(b.qs, c % 32 != 0), simd::set1(static_cast<float>(b.d)));
  } else {
    return simd::load(row + c);
  }
}

}  // namespace NPULLM_ISA_NAMESPACE

}  // namespace npullm::kv
