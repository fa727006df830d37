// core/simd.hpp's portable path (NPULLM_ISA_PORTABLE, core/isa.hpp; empty on the other
// paths): f32x16 is a struct of 16 floats whose loops the compiler vectorizes for the target
// (SSE2 on baseline x86-64); the AVX-512 path's exp polynomial in plain float arithmetic; fmadd
// fused only where the target has an FMA instruction (FP_FAST_FMAF); `native` is a 4-lane GCC /
// Clang vector. Include core/simd.hpp, which picks the path.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

#if defined(NPULLM_ISA_PORTABLE)

namespace npullm::simd {
inline namespace NPULLM_ISA_NAMESPACE {

// The width of f32x16 (core/simd.hpp), the same on every path.
inline constexpr std::size_t lanes = 16;

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

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::simd

#endif
