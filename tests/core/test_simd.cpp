// The SIMD layer on whatever ISA this translation unit is built for (the test is built for the
// native ISA, AVX2 and baseline x86-64): every operation against scalar arithmetic.
#include "npullm/core/simd.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string_view>
#include <vector>

namespace simd = npullm::simd;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

std::array<float, 16> lanes_of(simd::f32x16 v) {
  std::array<float, 16> out{};
  simd::store(out.data(), v);
  return out;
}

std::array<float, 16> iota_values(float base) {
  std::array<float, 16> a{};
  for (std::size_t i = 0; i < 16; ++i) a[i] = base + 0.25f * static_cast<float>(i);
  return a;
}

TEST(Simd, IsaMatchesTheCompilerTarget) {
  const std::string_view name = npullm::isa_tag::name;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  EXPECT_EQ(name, "avx512-bf16");
#elif defined(__AVX512F__)
  EXPECT_EQ(name, "avx512");
#elif defined(__AVX2__) && defined(__FMA__)
  EXPECT_EQ(name, "avx2");
  EXPECT_EQ(simd::native::lanes, 8u);
  EXPECT_EQ(simd::f32x16_registers, 8u);
#else
  EXPECT_EQ(name, "portable");
#endif
}

TEST(Simd, LoadsConvertEveryStorageType) {
  const auto a = iota_values(-3.0f);
  std::array<npullm::float16, 16> h{};
  std::array<npullm::bfloat16, 16> b{};
  for (std::size_t i = 0; i < 16; ++i) {
    h[i] = npullm::float16(a[i]);
    b[i] = npullm::bfloat16(a[i]);
  }
  EXPECT_EQ(lanes_of(simd::load(a.data())), a);
  const auto lh = lanes_of(simd::load(h.data()));
  const auto lb = lanes_of(simd::load(b.data()));
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(lh[i], static_cast<float>(h[i])) << i;
    EXPECT_EQ(lb[i], static_cast<float>(b[i])) << i;
  }
}

TEST(Simd, PartialLoadsReadOnlyNAndZeroTheRest) {
  const auto a = iota_values(1.0f);
  std::array<npullm::float16, 16> h{};
  std::array<npullm::bfloat16, 16> b{};
  for (std::size_t i = 0; i < 16; ++i) {
    h[i] = npullm::float16(a[i]);
    b[i] = npullm::bfloat16(a[i]);
  }
  for (std::size_t n = 0; n < 16; ++n) {
    // The source ends at n elements (heap copies, so ASan sees a read past them).
    std::vector<float> fa(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<npullm::float16> fh(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<npullm::bfloat16> fb(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    const auto la = lanes_of(simd::load_partial(fa.data(), n));
    const auto lh = lanes_of(simd::load_partial(fh.data(), n));
    const auto lb = lanes_of(simd::load_partial(fb.data(), n));
    for (std::size_t i = 0; i < 16; ++i) {
      EXPECT_EQ(la[i], i < n ? a[i] : 0.0f) << n << " " << i;
      EXPECT_EQ(lh[i], i < n ? static_cast<float>(h[i]) : 0.0f) << n << " " << i;
      EXPECT_EQ(lb[i], i < n ? static_cast<float>(b[i]) : 0.0f) << n << " " << i;
    }
  }
}

TEST(Simd, ArithmeticIsLaneWise) {
  const auto a = iota_values(-2.0f), b = iota_values(0.5f), c = iota_values(3.0f);
  const auto va = simd::load(a.data()), vb = simd::load(b.data()), vc = simd::load(c.data());
  const auto add = lanes_of(simd::add(va, vb)), sub = lanes_of(simd::sub(va, vb));
  const auto mul = lanes_of(simd::mul(va, vb)), mx = lanes_of(simd::max(va, vb));
  const auto fma = lanes_of(simd::fmadd(va, vb, vc));
  const auto fb = lanes_of(simd::fmadd_broadcast(&a[3], vb, vc));
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(add[i], a[i] + b[i]);
    EXPECT_EQ(sub[i], a[i] - b[i]);
    EXPECT_EQ(mul[i], a[i] * b[i]);
    EXPECT_EQ(mx[i], std::max(a[i], b[i]));
    // Quarter-integers: the products and sums are exact, fused or not.
    EXPECT_EQ(fma[i], a[i] * b[i] + c[i]);
    EXPECT_EQ(fb[i], a[3] * b[i] + c[i]);
  }
  std::array<float, 16> twos{};
  twos.fill(2.5f);
  EXPECT_EQ(lanes_of(simd::set1(2.5f)), twos);
  EXPECT_EQ(lanes_of(simd::zero()), (std::array<float, 16>{}));
}

TEST(Simd, ReductionsSumPairwiseInOneOrder) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int trial = 0; trial < 100; ++trial) {
    std::array<float, 16> a{};
    for (auto& x : a) x = u(rng);
    // Lanes i + 8, then i + 4, i + 2, i + 1: every path sums in this order, bit for bit.
    std::array<float, 16> t = a;
    for (std::size_t w = 8; w > 0; w /= 2) {
      for (std::size_t i = 0; i < w; ++i) t[i] += t[i + w];
    }
    EXPECT_EQ(simd::reduce_add(simd::load(a.data())), t[0]);
    EXPECT_EQ(simd::reduce_max(simd::load(a.data())), *std::max_element(a.begin(), a.end()));
  }
}

TEST(Simd, ReduceAdd16AndTransposeAgreeWithScalarCode) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float m[16][16];
  simd::f32x16 rows[16];
  for (std::size_t i = 0; i < 16; ++i) {
    for (std::size_t j = 0; j < 16; ++j) m[i][j] = u(rng);
    rows[i] = simd::load(m[i]);
  }
  const auto sums = lanes_of(simd::reduce_add16(rows));
  for (std::size_t i = 0; i < 16; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < 16; ++j) s += m[i][j];
    EXPECT_NEAR(sums[i], s, 1e-5) << i;
  }
  simd::transpose16(rows);
  for (std::size_t i = 0; i < 16; ++i) {
    const auto r = lanes_of(rows[i]);
    for (std::size_t j = 0; j < 16; ++j) EXPECT_EQ(r[j], m[j][i]) << i << " " << j;
  }
}

TEST(Simd, MaskTailHidesLanesFromN) {
  const auto a = iota_values(0.0f);
  for (std::size_t n = 0; n <= 16; ++n) {
    const auto r = lanes_of(simd::mask_tail(simd::load(a.data()), n));
    for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(r[i], i < n ? a[i] : -inf) << n << " " << i;
  }
}

// exp: relative error against double precision over the range softmax uses, and the edges.
TEST(Simd, ExpIsAccurateAndZeroAtMinusInfinity) {
  double worst = 0;
  for (int i = -104 * 64; i <= 88 * 64; i += 16) {
    std::array<float, 16> x{};
    for (std::size_t j = 0; j < 16; ++j) x[j] = (static_cast<float>(i) + 0.37f * j) / 64.0f;
    const auto e = lanes_of(simd::exp(simd::load(x.data())));
    for (std::size_t j = 0; j < 16; ++j) {
      const double want = std::exp(static_cast<double>(x[j]));
      if (want < 1.2e-38) continue;  // subnormal results: absolute error below
      worst = std::max(worst, std::abs(e[j] - want) / want);
    }
  }
  EXPECT_LT(worst, 3.0 * std::numeric_limits<float>::epsilon()) << worst;

  std::array<float, 16> edge{-inf, -1000.0f, -104.0f, -103.0f, -87.5f, 0.0f, -0.0f, 1.0f,
                             88.0f, 88.7f, -1e-30f, 1e-30f, -50.0f, 50.0f, -0.5f, 0.5f};
  const auto e = lanes_of(simd::exp(simd::load(edge.data())));
  EXPECT_EQ(e[0], 0.0f);  // exp(-inf) == 0 exactly: masked scores vanish
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_NEAR(e[3], std::exp(-103.0), 2e-45);  // subnormal
  EXPECT_NEAR(e[4], std::exp(-87.5), 1e-44);
  EXPECT_EQ(e[5], 1.0f);
  EXPECT_EQ(e[6], 1.0f);
  EXPECT_TRUE(std::isfinite(e[9]));
  for (std::size_t j = 7; j < 16; ++j) {
    EXPECT_NEAR(e[j], std::exp(static_cast<double>(edge[j])),
                3e-7 * std::exp(static_cast<double>(edge[j])))
        << j;
  }
}

TEST(Simd, NativeRegisterOps) {
  using n = simd::native;
  std::array<float, 64> a{}, b{}, c{}, out{};
  for (std::size_t i = 0; i < n::lanes; ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = 2.0f - static_cast<float>(i);
    c[i] = 1.0f;
  }
  n::store(out.data(), n::fmadd(n::load(a.data()), n::load(b.data()), n::load(c.data())));
  for (std::size_t i = 0; i < n::lanes; ++i) EXPECT_EQ(out[i], a[i] * b[i] + c[i]);
  const float s = 3.0f;
  n::store(out.data(), n::fmadd(n::broadcast(&s), n::load(b.data()), n::zero()));
  for (std::size_t i = 0; i < n::lanes; ++i) EXPECT_EQ(out[i], 3.0f * b[i]);
  EXPECT_EQ(simd::f32x16_registers * simd::lanes, n::registers * n::lanes);
}

}  // namespace
