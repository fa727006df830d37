// linear against a double-precision loop at odd sizes, every path (GEMV M <= 8, GEMM M > 8),
// every weight dtype, with and without bias, strided x, 1 and 3 threads. Tolerance: the f32
// rounding of a K-term sum, |y - ref| <= 1e-5 * sum_k |x_k w_k| + 1e-6. Where the bf16 GEMM
// multiplies bf16-rounded activations (rounds_activations), the reference rounds x too.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/linear.hpp"

namespace {

using namespace npullm;

template <class W, class Policy>
void check_linear(std::size_t m, std::size_t k, std::size_t n, bool with_bias, const Policy& policy,
                  bool strided_x) {
  SCOPED_TRACE("m " + std::to_string(m) + " k " + std::to_string(k) + " n " + std::to_string(n) +
               (with_bias ? " bias" : "") + (strided_x ? " strided" : ""));
  std::mt19937 rng(static_cast<unsigned>(m * 1000 + k * 10 + n));
  std::uniform_real_distribution<float> u(-1, 1);
  tensor<float, 2> xbuf(m, k + (strided_x ? 5 : 0));
  for (std::size_t i = 0; i < xbuf.size(); ++i) xbuf.data()[i] = u(rng);
  tensor<W, 2> w(n, k);
  for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = from_float<W>(u(rng));
  std::vector<float> bias(with_bias ? n : 0);
  for (float& b : bias) b = u(rng);
  tensor<float, 2> y(m, n);
  const auto x = subview(xbuf.view(), all, range{0, k});  // (m, k), row stride k + 5 if strided
  ops::linear<W>(strided_view<const float, 2>(x), strided_view<const W, 2>(w.view()),
                 strided_view<float, 2>(y.view()), bias, policy);
  auto verify = [&](const tensor<float, 2>& out, bool round_x) {
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        double ref = with_bias ? bias[j] : 0.0, mag = 0.0;
        for (std::size_t t = 0; t < k; ++t) {
          const float xv = round_x ? static_cast<float>(bfloat16(x(i, t))) : x(i, t);
          const double p = static_cast<double>(xv) * to_float(w.view()(j, t));
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(out.view()(i, j), ref, 1e-5 * mag + 1e-6) << i << ", " << j;
      }
    }
  };
  verify(y, ops::rounds_activations<W>() && m > 8);
  // The same product through weights packed once (never rounds x).
  const ops::packed_weights<W> packed(w.view(), policy);
  ASSERT_EQ(packed.rows(), n);
  ASSERT_EQ(packed.columns(), k);
  tensor<float, 2> yp(m, n);
  ops::linear<W>(strided_view<const float, 2>(x), packed, strided_view<float, 2>(yp.view()), bias,
                 policy);
  SCOPED_TRACE("packed");
  verify(yp, false);
}

template <class W>
void sweep() {
  thread_pool pool(3);
  for (std::size_t m : {1u, 2u, 3u, 7u, 8u, 9u, 16u, 17u, 37u}) {
    for (std::size_t k : {1u, 17u, 37u, 64u, 100u}) {
      for (std::size_t n : {1u, 17u, 37u, 100u}) {
        check_linear<W>(m, k, n, (m + k) % 2 == 0, serial{}, false);
      }
    }
  }
  check_linear<W>(5, 37, 300, true, pool, true);
  check_linear<W>(40, 70, 300, true, pool, true);
  check_linear<W>(33, 896, 65, false, pool, false);
  // Several K blocks (kc is 128 to 512 keys) and a partial last panel, small and large M.
  for (std::size_t m : {1u, 2u, 5u, 16u, 17u, 37u}) check_linear<W>(m, 1037, 45, m % 2 == 1, pool, m > 8);
}

TEST(Linear, F32Weights) {
  sweep<float>();
}
TEST(Linear, BF16Weights) {
  sweep<bfloat16>();
}
TEST(Linear, F16Weights) {
  sweep<float16>();
}

TEST(Linear, ThreadCountDoesNotChangeResults) {
  tensor<float, 2> x(20, 64), y1(20, 300), y2(20, 300);
  tensor<bfloat16, 2> w(300, 64);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::sin(static_cast<float>(i));
  for (std::size_t i = 0; i < w.size(); ++i)
    w.data()[i] = bfloat16(std::cos(static_cast<float>(i)));
  thread_pool pool(3);
  for (std::size_t m : {1u, 20u}) {
    const auto xs = rows(x.view(), 0, m);
    ops::linear<bfloat16>(xs, w.view(), rows(y1.view(), 0, m), {}, serial{});
    ops::linear<bfloat16>(xs, w.view(), rows(y2.view(), 0, m), {}, pool);
    for (std::size_t i = 0; i < m * 300; ++i) ASSERT_EQ(y1.data()[i], y2.data()[i]);
  }
}

TEST(Linear, PackedThreadCountDoesNotChangeResults) {
  tensor<float, 2> x(37, 600), y1(37, 300), y2(37, 300);
  tensor<float16, 2> w(300, 600);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::sin(static_cast<float>(i));
  for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = float16(std::cos(static_cast<float>(i)));
  thread_pool pool(3);
  const ops::packed_weights<float16> packed(w.view(), pool);
  for (std::size_t m : {1u, 3u, 16u, 37u}) {
    const auto xs = rows(x.view(), 0, m);
    ops::linear<float16>(xs, packed, rows(y1.view(), 0, m), {}, serial{});
    ops::linear<float16>(xs, packed, rows(y2.view(), 0, m), {}, pool);
    for (std::size_t i = 0; i < m * 300; ++i) ASSERT_EQ(y1.data()[i], y2.data()[i]);
  }
  // A row's result does not depend on how many rows share the call (decode vs verify steps).
  tensor<float, 2> one(1, 300);
  for (std::size_t r : {0u, 5u, 36u}) {
    ops::linear<float16>(rows(x.view(), r, r + 1), packed, one.view(), {}, pool);
    for (std::size_t j = 0; j < 300; ++j) ASSERT_EQ(one.view()(0, j), y1.view()(r, j)) << r;
  }
}

TEST(Linear, PackedWeightsKeepEveryValue) {
  tensor<bfloat16, 2> w(37, 17);
  for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = bfloat16(static_cast<float>(i) - 300.0f);
  const ops::packed_weights<bfloat16> packed(w.view());
  constexpr std::size_t nr = ops::packed_weights<bfloat16>::panel_columns;
  ASSERT_EQ(packed.panels(), (37 + nr - 1) / nr);
  for (std::size_t p = 0; p < packed.panels(); ++p) {
    for (std::size_t k = 0; k < 17; ++k) {
      for (std::size_t c = 0; c < nr; ++c) {
        const std::size_t row = p * nr + c;
        const float want = row < 37 ? static_cast<float>(w.view()(row, k)) : 0.0f;
        ASSERT_EQ(static_cast<float>(packed.panel(p)[k * nr + c]), want) << p << " " << k << " " << c;
      }
    }
  }
}

TEST(Linear, PackedBadShapesNameThem) {
  tensor<float, 2> x(2, 8), y(2, 5);
  tensor<float, 2> w(5, 9);
  const ops::packed_weights<float> packed(w.view());
  try {
    ops::linear<float>(x.view(), packed, y.view());
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape);
    EXPECT_NE(std::string(e.what()).find("packed W [5, 9]"), std::string::npos) << e.what();
  }
}

TEST(Linear, BadShapesNameThem) {
  tensor<float, 2> x(2, 8), y(2, 5);
  tensor<float, 2> w(5, 9);
  try {
    ops::linear<float>(x.view(), w.view(), y.view());
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape);
    EXPECT_NE(std::string(e.what()).find("x [2, 8], W [5, 9], y [2, 5]"), std::string::npos)
        << e.what();
  }
  tensor<float, 2> w2(5, 8);
  std::vector<float> bias(4);
  EXPECT_THROW(ops::linear<float>(x.view(), w2.view(), y.view(), bias), error);
}

}  // namespace
