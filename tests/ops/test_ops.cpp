// rms_norm (weight offsets 0 and 1), rope, silu_mul, gelu_tanh_mul, softcap, softmax, gather and
// argmax against straightforward double loops at odd sizes (1, 17, 37), with their error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "npullm/core/tensor.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/gelu_mul.hpp"
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

// offset: rms_norm's weight_offset. 0: weights in [0.5, 1.5]; 1: Gemma 2's (1 + w), w stored in
// [-0.5, 0.5]. worst, when given, receives the largest |y - ref| / max(1, |ref|) seen.
template <class W>
void check_rms_norm(std::size_t m, std::size_t d, float offset = 0.0f, double* worst = nullptr) {
  tensor<float, 2> x(m, d), y(m, d);
  tensor<W, 1> w(d);
  fill(x.data(), x.size(), 1);
  std::vector<float> wf(d);
  fill(wf.data(), d, 2, offset == 0.0f ? 0.5f : -0.5f, offset == 0.0f ? 1.5f : 0.5f);
  for (std::size_t i = 0; i < d; ++i) w.data()[i] = from_float<W>(wf[i]);
  ops::rms_norm<W>(x.view(), w.view(), 1e-6f, y.view(), offset);
  for (std::size_t r = 0; r < m; ++r) {
    double ss = 0;
    for (std::size_t i = 0; i < d; ++i) ss += static_cast<double>(x.view()(r, i)) * x.view()(r, i);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
    for (std::size_t i = 0; i < d; ++i) {
      const double ref =
          x.view()(r, i) * inv * (offset + static_cast<double>(to_float(w.data()[i])));
      const double scale = std::max(1.0, std::fabs(ref));
      ASSERT_NEAR(y.view()(r, i), ref, 2e-6 * scale) << r << " " << i;
      if (worst) *worst = std::max(*worst, std::fabs(y.view()(r, i) - ref) / scale);
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

// Gemma 2's RMSNorm: y = x / rms(x) * (1 + w), weight_offset = 1, for every weight type, rows 1
// and 3, d = 1, 17, 37 (tails after 0, 1 and 2 vectors of 16), 896 and 2304 (Gemma 2 2B's
// hidden size). Tolerance as above, 2e-6 * max(1, |ref|): the sum of squares and the products
// are f32 (a few ulp over d <= 2304 terms), and 1 + w adds one f32 rounding (half an ulp).
TEST(RmsNorm, WeightOffsetOneMatchesDoubleLoop) {
  double worst_f32 = 0, worst_bf16 = 0, worst_f16 = 0;
  for (std::size_t m : {1u, 3u}) {
    for (std::size_t d : {1u, 17u, 37u, 896u, 2304u}) {
      check_rms_norm<float>(m, d, 1.0f, &worst_f32);
      check_rms_norm<bfloat16>(m, d, 1.0f, &worst_bf16);
      check_rms_norm<float16>(m, d, 1.0f, &worst_f16);
    }
  }
  std::printf("  rms_norm (1 + w): max |y - ref| / max(1, |ref|): f32 %.2e, bf16 %.2e, f16 %.2e\n",
              worst_f32, worst_bf16, worst_f16);
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

// gelu_tanh(g) * u in double: HF's "gelu_pytorch_tanh".
double gelu_tanh_ref(double g, double u) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
}

// Gates where gelu_tanh is delicate: zeros, tiny values, the negative range where 1 + tanh
// cancels (-3, -5, -10), tanh saturated (+-20, +-1e4) and g^3 overflowing f32 (+-1e15).
constexpr float gelu_special[] = {0.0f,  -0.0f,  1e-4f, -1e-4f, -3.0f, -5.0f, -10.0f,
                                  20.0f, -20.0f, 1e4f,  -1e4f,  1e15f, -1e15f};

// Tolerance of gelu_tanh_mul: |y - ref| <= 4 eps (|ref| + |g u| / 2), eps = 2^-23. The kernel
// computes 1 + tanh(z) in f32 (tanh as 1 - 2 / (exp(2z) + 1) with the SIMD exp, about 2 ulp, on
// vectors of 16; std::tanh on the tail), so 1 + tanh carries an absolute error of a few ulp of 1
// (for g <= -3, where 1 + tanh cancels, that is most of its value), which the product scales by
// |g u| / 2; the products round once each (the relative part). A million random gates in
// [-12, 12] measured at most 1.5 eps (|ref| + |g u| / 2) on native, avx2 and x86-64.
double gelu_tolerance(double g, double u, double ref) {
  constexpr double eps = std::numeric_limits<float>::epsilon();
  return 4 * eps * (std::fabs(ref) + 0.5 * std::fabs(g * u));
}

// Rows 1 and 3, columns 1, 17, 37 and 300 (gate/up/out are treated as one flat array: vectors of
// 16, then a scalar tail of 1 to 15 elements), gates in [-6, 6] with every third replaced by a
// special value, ups in [-2, 2]; then each special alone (the scalar path) and in a full vector.
TEST(GeluTanhMul, MatchesDoubleLoop) {
  double worst_abs = 0, worst_ratio = 0;
  auto check = [&](const tensor<float, 2>& g, const tensor<float, 2>& u) {
    tensor<float, 2> o(g.view().extent(0), g.view().extent(1));
    ops::gelu_tanh_mul(g.view(), u.view(), o.view());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double gv = g.data()[i], uv = u.data()[i];
      const double ref = gelu_tanh_ref(gv, uv);
      const double tol = gelu_tolerance(gv, uv, ref);
      ASSERT_NEAR(o.data()[i], ref, tol) << "g " << gv << " u " << uv << " at " << i;
      const double err = std::fabs(o.data()[i] - ref);
      if (std::fabs(gv) <= 20) worst_abs = std::max(worst_abs, err);
      if (tol > 0) worst_ratio = std::max(worst_ratio, err / tol);
    }
  };
  constexpr std::size_t n_special = std::size(gelu_special);
  for (std::size_t m : {1u, 3u}) {
    for (std::size_t n : {1u, 17u, 37u, 300u}) {
      tensor<float, 2> g(m, n), u(m, n);
      fill(g.data(), g.size(), 11, -6, 6);
      fill(u.data(), u.size(), 12);
      for (std::size_t i = 0; i < g.size(); i += 3) g.data()[i] = gelu_special[(i / 3) % n_special];
      check(g, u);
    }
  }
  for (float s : gelu_special) {
    for (std::size_t n : {1u, 16u}) {  // scalar tail alone; one full vector
      tensor<float, 2> g(1, n), u(1, n);
      fill(u.data(), n, 13);
      for (std::size_t i = 0; i < n; ++i) g.data()[i] = s;
      check(g, u);
    }
  }
  std::printf("  gelu_tanh_mul: max |y - ref| / tolerance %.2f; max |y - ref| for |g| <= 20 %.2e\n",
              worst_ratio, worst_abs);
}

// out may alias gate or up: the same bits as a separate output.
TEST(GeluTanhMul, InPlace) {
  tensor<float, 2> g(3, 37), u(3, 37), o(3, 37);
  fill(g.data(), g.size(), 14, -6, 6);
  fill(u.data(), u.size(), 15);
  ops::gelu_tanh_mul(g.view(), u.view(), o.view());
  auto g2 = g.clone();
  ops::gelu_tanh_mul(g2.view(), u.view(), g2.view());
  auto u2 = u.clone();
  ops::gelu_tanh_mul(g.view(), u2.view(), u2.view());
  for (std::size_t i = 0; i < o.size(); ++i) {
    ASSERT_EQ(g2.data()[i], o.data()[i]) << i;
    ASSERT_EQ(u2.data()[i], o.data()[i]) << i;
  }
}

// Mismatched shapes raise invalid_shape naming all three, before anything is written.
TEST(GeluTanhMul, ShapeErrorsLeaveOutputUnchanged) {
  auto expect_shape_error = [](std::size_t gm, std::size_t gn, std::size_t um, std::size_t un,
                               std::size_t om, std::size_t on, const std::string& message) {
    tensor<float, 2> g(gm, gn), u(um, un), o(om, on);
    fill(g.data(), g.size(), 16);
    fill(u.data(), u.size(), 17);
    for (std::size_t i = 0; i < o.size(); ++i) o.data()[i] = 7.0f;
    try {
      ops::gelu_tanh_mul(g.view(), u.view(), o.view());
      FAIL() << message;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_shape);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    for (std::size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o.data()[i], 7.0f) << message;
  };
  expect_shape_error(2, 3, 2, 4, 2, 3, "gelu_tanh_mul: gate [2, 3], up [2, 4], out [2, 3]");
  expect_shape_error(2, 3, 2, 3, 3, 2, "gelu_tanh_mul: gate [2, 3], up [2, 3], out [3, 2]");
  expect_shape_error(2, 3, 2, 3, 2, 4, "gelu_tanh_mul: gate [2, 3], up [2, 3], out [2, 4]");
}

// softcap: v = cap tanh(v / cap), caps 2, 30 (Gemma 2's final logits) and 50 (its attention
// scores), sizes 1, 17, 37, values in [-3 cap, 3 cap] with every third replaced by a special
// one (0, -0, +-cap, tiny, and ones saturating to +-cap: +-1e4, +-1e30, +-inf). Tolerance:
// |v - ref| <= 4 eps |ref|, eps = 2^-23: v / cap and cap * t round once each and tanhf is
// within about 1 ulp; tanh's relative condition number z (1 - tanh^2 z) / tanh z is at most 1,
// so the division's rounding is not amplified. Near 0 the value itself is small, so the
// relative bound holds there too (ref 0 demands exactly 0).
TEST(Softcap, MatchesDoubleLoop) {
  constexpr double eps = std::numeric_limits<float>::epsilon();
  const float inf = std::numeric_limits<float>::infinity();
  double worst = 0;
  for (float cap : {2.0f, 30.0f, 50.0f}) {
    const float special[] = {0.0f, -0.0f, cap,   -cap,   1e-3f, -1e-3f,
                             1e4f, -1e4f, 1e30f, -1e30f, inf,   -inf};
    auto check = [&](std::vector<float> v) {
      const std::vector<float> in = v;
      ops::softcap(v, cap);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double ref = cap * std::tanh(static_cast<double>(in[i]) / cap);
        ASSERT_NEAR(v[i], ref, 4 * eps * std::fabs(ref)) << "cap " << cap << " v " << in[i];
        if (ref != 0) worst = std::max(worst, std::fabs(v[i] - ref) / std::fabs(ref));
      }
    };
    for (std::size_t n : {1u, 17u, 37u}) {
      std::vector<float> v(n);
      fill(v.data(), n, 18 + static_cast<unsigned>(n), -3 * cap, 3 * cap);
      for (std::size_t i = 0; i < n; i += 3) v[i] = special[(i / 3) % std::size(special)];
      check(v);
    }
    for (float s : special) check({s});
  }
  std::printf("  softcap: max |v - ref| / |ref| %.2e (%.2f eps)\n", worst, worst / eps);
}

// cap <= 0 or NaN: invalid_argument, v untouched.
TEST(Softcap, BadCapLeavesValuesUnchanged) {
  for (float cap : {0.0f, -0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    std::vector<float> v(17);
    fill(v.data(), v.size(), 19, -100, 100);
    const std::vector<float> before = v;
    try {
      ops::softcap(v, cap);
      FAIL() << "cap " << cap;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("must be finite and > 0"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(v, before) << "cap " << cap;
  }
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
