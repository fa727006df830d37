// Three copies of the same kernels, built for the native ISA, AVX2 and baseline x86-64, linked
// into one program (as an engine that dispatches per CPU would): each copy must run its own
// ISA's code (core/isa.hpp's inline namespaces), and all three must agree.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "mix.hpp"

namespace {

TEST(IsaMix, EachTranslationUnitRunsItsOwnIsa) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(37 * 64), w(45 * 64);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng);
  const auto native = isa_mix::run_native(x, w);
  const auto avx2 = isa_mix::run_avx2(x, w);
  const auto baseline = isa_mix::run_baseline(x, w);
  EXPECT_EQ(avx2.isa, "avx2");
  EXPECT_EQ(baseline.isa, "portable");
#if defined(__AVX512F__)
  EXPECT_NE(native.isa, "avx2");
  EXPECT_NE(native.isa, "portable");
#endif
  for (const auto* r : {&avx2, &baseline}) {
    ASSERT_EQ(r->linear.size(), native.linear.size());
    for (std::size_t i = 0; i < native.linear.size(); ++i)
      EXPECT_NEAR(r->linear[i], native.linear[i], 1e-4) << r->isa << " " << i;
    for (std::size_t i = 0; i < native.attention.size(); ++i)
      EXPECT_NEAR(r->attention[i], native.attention[i], 1e-5) << r->isa << " " << i;
  }
}

}  // namespace
