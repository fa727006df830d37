// float16 / bfloat16: every one of the 65,536 bit patterns of each type, against a reference
// written independently from the encoding rules (double arithmetic, not bit tricks), and the
// hardware paths against the portable ones bit for bit. Built twice: for this CPU (F16C,
// AVX-512 BF16 when present) and for baseline x86-64 (portable code only).
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "npullm/core/dtype.hpp"

namespace {

using npullm::bfloat16;
using npullm::float16;

// ---- reference: value of a 16-bit pattern, and nearest-even rounding, in double -----------

double f16_value(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}

// Rounds x to a grid: `mantissa_bits` explicit bits, minimum normal exponent `emin`, values at
// or above `overflow` become infinite. Ties go to even (nearbyint in the default mode).
double round_to_format(double x, int mantissa_bits, int emin, double overflow) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double a = std::fabs(x);
  const int e = std::max(std::ilogb(a), emin);
  const double ulp = std::ldexp(1.0, e - mantissa_bits);
  const double q = std::nearbyint(a / ulp) * ulp;
  return std::copysign(q >= overflow ? INFINITY : q, x);
}

std::uint16_t reference_f16_bits(float x) {
  if (std::isnan(x)) return 0x7e00;  // only NaN-ness and sign are compared for NaN
  const double q = round_to_format(x, 10, -14, 65520.0);
  const std::uint16_t sign = std::signbit(q) ? 0x8000 : 0;
  const double a = std::fabs(q);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<std::uint16_t>(a * std::ldexp(1.0, 24));
  const int e = std::ilogb(a);
  const auto m = static_cast<std::uint16_t>(std::ldexp(a, 10 - e) - 1024);
  return sign | static_cast<std::uint16_t>((e + 15) << 10) | m;
}

std::uint16_t reference_bf16_bits(float x) {
  if (std::isnan(x)) return 0x7fc0;
  // bf16 max finite = (2 - 2^-7) * 2^127; halfway to the next binade rounds up to inf.
  const double q = round_to_format(x, 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(q)) >> 16);
}

void expect_f16_matches_reference(float x) {
  const std::uint16_t got = float16(x).bits();
  ASSERT_EQ(got, npullm::detail::f32_to_f16_bits_portable(x)) << "x = " << x;
  if (std::isnan(x)) {
    ASSERT_TRUE(std::isnan(static_cast<float>(float16::from_bits(got))));
    ASSERT_EQ(got >> 15, std::bit_cast<std::uint32_t>(x) >> 31);
  } else {
    ASSERT_EQ(got, reference_f16_bits(x)) << "x = " << x;
  }
}

void expect_bf16_matches_reference(float x) {
  const std::uint16_t got = bfloat16(x).bits();
  if (std::isnan(x)) {
    ASSERT_TRUE(std::isnan(static_cast<float>(bfloat16::from_bits(got))));
    ASSERT_EQ(got >> 15, std::bit_cast<std::uint32_t>(x) >> 31);
  } else {
    ASSERT_EQ(got, reference_bf16_bits(x)) << "x = " << x;
  }
}

std::vector<std::uint16_t> all_patterns() {
  std::vector<std::uint16_t> v(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<std::uint16_t>(i);
  return v;
}

// ---- float16 ---------------------------------------------------------------------------------

TEST(Float16, EveryPatternConvertsToFloatExactly) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = float16::from_bits(h);
    const float portable = npullm::detail::f16_bits_to_f32_portable(h);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), std::bit_cast<std::uint32_t>(portable))
        << "pattern 0x" << std::hex << i;
    const float branchless = npullm::detail::f16_bits_to_f32_branchless(h);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(branchless), std::bit_cast<std::uint32_t>(portable))
        << "pattern 0x" << std::hex << i;
    const double ref = f16_value(h);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h >> 15) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(f), ref) << "pattern 0x" << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h >> 15) != 0);  // -0 stays -0
    }
  }
}

TEST(Float16, EveryFinitePatternRoundTrips) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = float16::from_bits(h);
    if (std::isnan(f)) {
      const std::uint16_t back = float16(f).bits();
      ASSERT_TRUE(std::isnan(static_cast<float>(float16::from_bits(back))));
      ASSERT_EQ(back & 0x8000, h & 0x8000);
      ASSERT_EQ(back, h | 0x0200) << "NaN keeps its payload and becomes quiet";
    } else {
      ASSERT_EQ(float16(f).bits(), h) << "pattern 0x" << std::hex << i;
    }
  }
}

// Between every two neighbouring float16 values: the midpoint (a tie: goes to even) and the
// floats just below and above it (go to the nearer neighbour).
TEST(Float16, EveryRoundingBoundaryTiesToEven) {
  for (std::uint32_t i = 0; i < 0x7c00; ++i) {
    for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      const float lo = float16::from_bits(static_cast<std::uint16_t>(i | sign));
      const float hi = float16::from_bits(static_cast<std::uint16_t>((i + 1) | sign));
      const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
      expect_f16_matches_reference(mid);
      expect_f16_matches_reference(std::nextafter(mid, 0.0f));
      expect_f16_matches_reference(std::nextafter(mid, INFINITY * (sign ? -1.0f : 1.0f)));
      const std::uint16_t even = (i & 1) ? static_cast<std::uint16_t>((i + 1) | sign)
                                         : static_cast<std::uint16_t>(i | sign);
      ASSERT_EQ(float16(mid).bits(), even) << "tie at " << mid;
    }
  }
}

TEST(Float16, RandomFloatsMatchReference) {
  std::mt19937 rng(20261121);
  for (int n = 0; n < 1'000'000; ++n) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    expect_f16_matches_reference(x);
  }
}

TEST(Float16, SpecialValues) {
  EXPECT_EQ(float16(INFINITY).bits(), 0x7c00);
  EXPECT_EQ(float16(-INFINITY).bits(), 0xfc00);
  EXPECT_EQ(float16(65504.0f).bits(), 0x7bff);               // max finite
  EXPECT_EQ(float16(65519.996f).bits(), 0x7bff);             // below the tie
  EXPECT_EQ(float16(65520.0f).bits(), 0x7c00);               // tie -> even = inf
  EXPECT_EQ(float16(std::ldexp(1.0f, -24)).bits(), 0x0001);  // min subnormal
  EXPECT_EQ(float16(std::ldexp(1.0f, -25)).bits(), 0x0000);  // tie -> even = 0
  EXPECT_EQ(float16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits(), 0x0001);
  EXPECT_EQ(float16(-0.0f).bits(), 0x8000);
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));
  const float snan = std::bit_cast<float>(0xff800001u);  // negative signaling NaN
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(snan))));
  EXPECT_EQ(float16(snan).bits() & 0x8000, 0x8000);
}

// ---- bfloat16 --------------------------------------------------------------------------------

TEST(BFloat16, EveryPatternConvertsToFloatExactly) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float f = bfloat16::from_bits(b);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), i << 16) << "pattern 0x" << std::hex << i;
  }
}

TEST(BFloat16, EveryFinitePatternRoundTrips) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float f = bfloat16::from_bits(b);
    if (std::isnan(f)) {
      ASSERT_EQ(bfloat16(f).bits(), b | 0x40) << "NaN keeps its payload and becomes quiet";
    } else {
      ASSERT_EQ(bfloat16(f).bits(), b) << "pattern 0x" << std::hex << i;
    }
  }
}

TEST(BFloat16, EveryRoundingBoundaryTiesToEven) {
  for (std::uint32_t i = 0; i < 0x7f80; ++i) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const auto lo_bits = static_cast<std::uint16_t>(i | sign);
      const auto hi_bits = static_cast<std::uint16_t>((i + 1) | sign);
      // The midpoint is the float with one more mantissa bit set: exact by construction.
      const float mid = std::bit_cast<float>((static_cast<std::uint32_t>(lo_bits) << 16) | 0x8000u);
      expect_bf16_matches_reference(mid);
      expect_bf16_matches_reference(std::bit_cast<float>(std::bit_cast<std::uint32_t>(mid) - 1));
      expect_bf16_matches_reference(std::bit_cast<float>(std::bit_cast<std::uint32_t>(mid) + 1));
      ASSERT_EQ(bfloat16(mid).bits(), (i & 1) ? hi_bits : lo_bits) << "tie at " << mid;
    }
  }
}

TEST(BFloat16, RandomFloatsMatchReference) {
  std::mt19937 rng(1121);
  for (int n = 0; n < 1'000'000; ++n) {
    expect_bf16_matches_reference(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  }
}

TEST(BFloat16, SpecialValues) {
  EXPECT_EQ(bfloat16(INFINITY).bits(), 0x7f80);
  EXPECT_EQ(bfloat16(-INFINITY).bits(), 0xff80);
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits(), 0x7f80);  // rounds up to inf
  EXPECT_EQ(bfloat16(-0.0f).bits(), 0x8000);
  EXPECT_EQ(bfloat16(1.0f).bits(), 0x3f80);
  EXPECT_EQ(bfloat16(std::bit_cast<float>(0x00018000u)).bits(), 0x0002);  // subnormal tie -> even
  EXPECT_EQ(bfloat16(std::bit_cast<float>(0x00008000u)).bits(), 0x0000);  // subnormal tie -> even
  const float snan = std::bit_cast<float>(0x7f800001u);         // payload only in the low bits
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(snan))));  // stays NaN, not inf
  static_assert(bfloat16(2.0f).bits() == 0x4000, "bfloat16 converts in constant expressions");
}

// ---- bulk conversion: same bits as the scalar conversions, at every tail length -------------

TEST(Convert, BulkMatchesScalarOnEveryPattern) {
  const auto patterns = all_patterns();
  std::vector<float16> h(patterns.size());
  std::vector<bfloat16> b(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    h[i] = float16::from_bits(patterns[i]);
    b[i] = bfloat16::from_bits(patterns[i]);
  }
  std::vector<float> f(patterns.size());
  npullm::convert(std::span<const float16>(h), std::span<float>(f));
  for (std::size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f[i]),
              std::bit_cast<std::uint32_t>(static_cast<float>(h[i])));
  }
  std::vector<float16> h2(f.size());
  npullm::convert(std::span<const float>(f), std::span<float16>(h2));
  for (std::size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h2[i].bits(), float16(f[i]).bits());

  npullm::convert(std::span<const bfloat16>(b), std::span<float>(f));
  for (std::size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f[i]), static_cast<std::uint32_t>(patterns[i]) << 16);
  }
}

TEST(Convert, BulkFloatToBFloat16HandlesDenormalsAndTies) {
  // Random floats, half of them denormal (where vcvtneps2bf16 alone would flush to zero).
  std::mt19937 rng(7);
  std::vector<float> f(1 << 16);
  for (std::size_t i = 0; i < f.size(); ++i) {
    std::uint32_t u = static_cast<std::uint32_t>(rng());
    if (i % 2) u &= 0x807fffffu;  // exponent 0: denormal
    f[i] = std::bit_cast<float>(u);
  }
  std::vector<bfloat16> b(f.size());
  npullm::convert(std::span<const float>(f), std::span<bfloat16>(b));
  for (std::size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(b[i].bits(), bfloat16(f[i]).bits()) << "x = " << f[i];
  }
  std::vector<float16> h(f.size());
  npullm::convert(std::span<const float>(f), std::span<float16>(h));
  for (std::size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h[i].bits(), float16(f[i]).bits());
}

TEST(Convert, OddLengths) {
  for (std::size_t n : {0, 1, 7, 17, 37, 64}) {
    std::vector<float> f(n), back(n);
    for (std::size_t i = 0; i < n; ++i) f[i] = 0.1f * static_cast<float>(i) - 1.3f;
    std::vector<float16> h(n);
    std::vector<bfloat16> b(n);
    npullm::convert(std::span<const float>(f), std::span<float16>(h));
    npullm::convert(std::span<const float16>(h), std::span<float>(back));
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], static_cast<float>(float16(f[i])));
    npullm::convert(std::span<const float>(f), std::span<bfloat16>(b));
    npullm::convert(std::span<const bfloat16>(b), std::span<float>(back));
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], static_cast<float>(bfloat16(f[i])));
  }
}

TEST(Convert, SizeMismatchThrowsInvalidShape) {
  std::vector<float> f(5);
  std::vector<float16> h(4);
  try {
    npullm::convert(std::span<const float>(f), std::span<float16>(h));
    FAIL() << "expected npullm::error";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::invalid_shape);
    EXPECT_NE(std::string(e.what()).find("5"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("4"), std::string::npos);
  }
}

TEST(DType, Traits) {
  static_assert(npullm::dtype_of<float> == npullm::dtype::f32);
  static_assert(npullm::dtype_of<float16> == npullm::dtype::f16);
  static_assert(npullm::dtype_of<bfloat16> == npullm::dtype::bf16);
  static_assert(npullm::size_of(npullm::dtype::bf16) == 2);
  EXPECT_EQ(npullm::to_string(npullm::dtype::f16), "f16");
  EXPECT_EQ(npullm::from_float<bfloat16>(3.0f).bits(), bfloat16(3.0f).bits());
}

}  // namespace
