// rms_norm, rope, silu_mul, softmax, gather and argmax against straightforward double loops at
// odd sizes (1, 17, 37), with their error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "npullm/core/tensor.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/rms_norm.hpp"
#include "npullm/ops/rope.hpp"
#include "npullm/ops/silu_mul.hpp"
#include "npullm/ops/softmax.hpp"

namespace {

using namespace npullm;

void fill(float* p, std::size_t n, unsigned seed, float lo = -2, float hi = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
}

template <class W>
void check_rms_norm(std::size_t m, std::size_t d) {
  tensor<float, 2> x(m, d), y(m, d);
  tensor<W, 1> w(d);
  fill(x.data(), x.size(), 1);
  std::vector<float> wf(d);
  fill(wf.data(), d, 2, 0.5f, 1.5f);
  for (std::size_t i = 0; i < d; ++i) w.data()[i] = from_float<W>(wf[i]);
  ops::rms_norm<W>(x.view(), w.view(), 1e-6f, y.view());
  for (std::size_t r = 0; r < m; ++r) {
    double ss = 0;
    for (std::size_t i = 0; i < d; ++i) ss += static_cast<double>(x.view()(r, i)) * x.view()(r, i);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
    for (std::size_t i = 0; i < d; ++i) {
      const double ref = x.view()(r, i) * inv * to_float(w.data()[i]);
      ASSERT_NEAR(y.view()(r, i), ref, 2e-6 * std::max(1.0, std::fabs(ref))) << r << " " << i;
    }
  }
}

TEST(RmsNorm, MatchesDoubleLoop) {
  for (std::size_t m : {1u, 17u, 37u}) {
    for (std::size_t d : {1u, 17u, 37u, 896u}) {
      check_rms_norm<float>(m, d);
      check_rms_norm<bfloat16>(m, d);
      check_rms_norm<float16>(m, d);
    }
  }
  tensor<float, 2> x(2, 3), y(2, 3);
  tensor<float, 1> w(4);
  EXPECT_THROW(ops::rms_norm<float>(x.view(), w.view(), 1e-6f, y.view()), error);
}

TEST(RmsNorm, InPlace) {
  tensor<float, 2> x(3, 17);
  tensor<float, 1> w(17);
  fill(x.data(), x.size(), 3);
  for (std::size_t i = 0; i < 17; ++i) w.data()[i] = 1.0f;
  auto copy = x.clone();
  tensor<float, 2> y(3, 17);
  ops::rms_norm<float>(copy.view(), w.view(), 1e-5f, y.view());
  ops::rms_norm<float>(x.view(), w.view(), 1e-5f, x.view());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x.data()[i], y.data()[i]);
}

TEST(Rope, MatchesRotateHalfFormula) {
  const double theta = 1e6;
  for (std::size_t dim : {2u, 64u, 128u}) {
    ops::rope_table table(dim, theta, 4096);
    const std::size_t m = 17, heads = 3;
    tensor<float, 3> x(m, heads, dim);
    fill(x.data(), x.size(), 4);
    const auto before = x.clone();
    std::vector<std::int64_t> pos(m);
    for (std::size_t i = 0; i < m; ++i) pos[i] = static_cast<std::int64_t>(i * 237 % 4096);
    ops::apply_rope(x.view(), pos, table);
    const std::size_t half = dim / 2;
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t h = 0; h < heads; ++h) {
        for (std::size_t i = 0; i < half; ++i) {
          const double f =
              std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
          const double c = std::cos(static_cast<double>(pos[r]) * f),
                       s = std::sin(static_cast<double>(pos[r]) * f);
          const double a = before.view()(r, h, i), b = before.view()(r, h, i + half);
          ASSERT_NEAR(x.view()(r, h, i), a * c - b * s, 2e-6);
          ASSERT_NEAR(x.view()(r, h, i + half), b * c + a * s, 2e-6);
        }
      }
    }
  }
  ops::rope_table table(8, 10000.0, 16);
  tensor<float, 3> x(2, 1, 8);
  const std::vector<std::int64_t> bad = {3, 16};
  try {
    ops::apply_rope(x.view(), bad, table);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::out_of_range);
    EXPECT_NE(std::string(e.what()).find("position 16 of row 1"), std::string::npos);
  }
  EXPECT_THROW(ops::rope_table(7, 1e4, 8), error);
  const std::vector<std::int64_t> one = {0};
  EXPECT_THROW(ops::apply_rope(x.view(), one, table), error);
}

TEST(SiluMul, MatchesDoubleLoop) {
  for (std::size_t n : {1u, 17u, 37u, 4864u}) {
    tensor<float, 2> g(3, n), u(3, n), o(3, n);
    fill(g.data(), g.size(), 5, -30, 30);
    fill(u.data(), u.size(), 6);
    ops::silu_mul(g.view(), u.view(), o.view());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double gv = g.data()[i];
      const double ref = gv / (1.0 + std::exp(-gv)) * u.data()[i];
      ASSERT_NEAR(o.data()[i], ref, 1e-6 * std::max(1.0, std::fabs(ref)));
    }
  }
  tensor<float, 2> g(2, 3), u(2, 4);
  EXPECT_THROW(ops::silu_mul(g.view(), u.view(), g.view()), error);
}

TEST(Softmax, RowsSumToOneAndMaskedRowsAreZero) {
  tensor<float, 2> x(3, 37);
  fill(x.data(), x.size(), 7, -50, 50);
  for (std::size_t i = 0; i < 37; ++i) x.view()(1, i) = -INFINITY;
  x.view()(2, 5) = -INFINITY;
  const auto ref_in = x.clone();
  ops::softmax(x.view());
  for (std::size_t r : {0u, 2u}) {
    double mx = -INFINITY, sum = 0;
    for (std::size_t i = 0; i < 37; ++i)
      mx = std::max(mx, static_cast<double>(ref_in.view()(r, i)));
    for (std::size_t i = 0; i < 37; ++i) sum += std::exp(ref_in.view()(r, i) - mx);
    for (std::size_t i = 0; i < 37; ++i) {
      ASSERT_NEAR(x.view()(r, i), std::exp(ref_in.view()(r, i) - mx) / sum, 1e-6);
    }
  }
  EXPECT_EQ(x.view()(2, 5), 0.0f);
  for (std::size_t i = 0; i < 37; ++i) ASSERT_EQ(x.view()(1, i), 0.0f);
}

template <class T>
void check_gather() {
  tensor<T, 2> table(37, 17);
  for (std::size_t i = 0; i < table.size(); ++i)
    table.data()[i] = from_float<T>(static_cast<float>(i % 200));
  const std::vector<std::int32_t> ids = {36, 0, 17, 36};
  tensor<float, 2> out(4, 17);
  ops::gather<T>(ids, table.view(), out.view());
  for (std::size_t r = 0; r < ids.size(); ++r) {
    for (std::size_t i = 0; i < 17; ++i) {
      ASSERT_EQ(out.view()(r, i), to_float(table.view()(static_cast<std::size_t>(ids[r]), i)));
    }
  }
  const std::vector<std::int32_t> bad = {1, 37};
  tensor<float, 2> out2(2, 17);
  try {
    ops::gather<T>(bad, table.view(), out2.view());
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);  // as every token-id check
    EXPECT_NE(std::string(e.what()).find("gather: token 37 at 1 outside the vocabulary of 37"),
              std::string::npos);
  }
  for (std::size_t i = 0; i < out2.size(); ++i) ASSERT_EQ(out2.data()[i], 0.0f);  // untouched
}

TEST(Gather, EveryTableType) {
  check_gather<float>();
  check_gather<bfloat16>();
  check_gather<float16>();
}

TEST(Argmax, FirstLargestAndNaN) {
  tensor<float, 2> x(3, 5);
  const float rows[3][5] = {{1, 3, 3, 2, 0}, {-1, -1, -1, -1, -1}, {NAN, 2, NAN, 5, 1}};
  for (std::size_t r = 0; r < 3; ++r) {
    for (std::size_t i = 0; i < 5; ++i) x.view()(r, i) = rows[r][i];
  }
  std::vector<std::int32_t> out(3);
  ops::argmax(x.view(), out);
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 0, 3}));
  std::vector<std::int32_t> wrong(2);
  EXPECT_THROW(ops::argmax(x.view(), wrong), error);
}

// The one-row form that greedy sampling and verification use: the same rule. A NaN in front
// does not win (std::max_element would keep it), -inf loses to any number, all-NaN gives 0.
TEST(Argmax, OneRowNaNAndInfinities) {
  const float inf = INFINITY;
  auto of = [](std::initializer_list<float> v) {
    return ops::argmax(std::span<const float>(v.begin(), v.size()));
  };
  EXPECT_EQ(of({NAN, 1, 4, 4}), 2);
  EXPECT_EQ(of({-inf, -inf, -7}), 2);
  EXPECT_EQ(of({-inf, -inf}), 0);
  EXPECT_EQ(of({NAN, NAN}), 0);
  EXPECT_EQ(of({NAN, -inf}), 1);
  EXPECT_EQ(of({2, inf, NAN, inf}), 1);
  EXPECT_THROW((void)ops::argmax(std::span<const float>()), error);
}

}  // namespace
