// A weight format added from outside the library (tests/ops/formats/q7_1.hpp, through
// NPULLM_EXTRA_WEIGHT_FORMATS): its header alone makes it a format like npullm's own, without
// kernels of its own.
//
//  - The table: name, lookup by name, block, row bytes, no GGUF type, no kernels, no tiles;
//    npullm's formats keep their numbers.
//  - quantize -> dequantize: every element is q · d + m of its block's bytes (decoded here from
//    the documented layout, f16 factors), within (d / 2 + |code| · d's f16 rounding) of x.
//  - linear through the decode-based GEMV (M <= 16) and GEMM (M > 16), serial and on 2 threads,
//    against a double GEMM over the dequantized W: within test_quant's bound,
//      Σ_k |w_k| · dx(block of k) / 2 + 1e-5 · Σ_k |w_k x_k| + 1e-5
//    (activations rounded to int8 per block of 32; f32 accumulation).
//  - repack refuses it (unsupported, naming it); a K that is not a multiple of 32 is refused.
// Built for this build's ISA only and without npullm's precompiled kernels (their enum has
// npullm's formats only); it instantiates this format's kernels and no others.
#define NPULLM_EXTRA_WEIGHT_FORMATS(X) X(q7_1)
#define NPULLM_EXTRA_WEIGHT_FORMAT_HEADER "ops/formats/q7_1.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "npullm/core/parallel.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"

namespace {

using namespace npullm;
using ops::weight_format;

float f16_at(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(float16::from_bits(h));
}

std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(FormatExtension, TheTableHasItWithoutKernels) {
  constexpr auto f = weight_format::q7_1;
  static_assert(ops::weight_format_count == 15);
  EXPECT_EQ(ops::all_weight_formats[14], f);
  EXPECT_EQ(static_cast<int>(weight_format::iq4_xs), 13);  // npullm's numbering unchanged
  EXPECT_EQ(ops::to_string(f), "q7_1");
  EXPECT_EQ(ops::weight_format_from_string("q7_1"), f);
  EXPECT_EQ(ops::block_values(f), 32u);
  EXPECT_EQ(ops::block_bytes(f), 36u);
  EXPECT_EQ(ops::row_bytes(f, 96), 108u);
  EXPECT_TRUE(ops::is_block_format(f));
  EXPECT_TRUE(ops::piece_layout_of(f).offset);
  EXPECT_FALSE(ops::has_kernels(f));
  EXPECT_FALSE(ops::has_repacked_layout(f));
  EXPECT_EQ(ops::info_of(f).gguf_type, -1);
  EXPECT_FALSE(ops::weight_format_of_gguf_type(-1).has_value());
  EXPECT_EQ(ops::weight_format_of_gguf_type(8), weight_format::q8_0);
}

TEST(FormatExtension, QuantizeDequantizeFollowTheLayout) {
  const std::size_t n = 5, k = 96;
  const std::vector<float> w = random_values(n * k, 1);
  const auto q = ops::quantize(dense_view<const float, 2>(w.data(), n, k), weight_format::q7_1);
  ASSERT_EQ(q.data().size(), n * k / 32 * 36);
  std::vector<float> back(n * k);
  ops::dequantize(q.view(), dense_view<float, 2>(back.data(), n, k));
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t b = 0; b < k / 32; ++b) {
      const std::byte* blk = q.data().data() + (r * k / 32 + b) * 36;
      const float d = f16_at(blk), m = f16_at(blk + 2);
      for (std::size_t i = 0; i < 32; ++i) {
        const auto code = static_cast<std::uint8_t>(blk[4 + i]);
        ASSERT_LE(code, 127);
        const std::size_t e = r * k + 32 * b + i;
        EXPECT_EQ(back[e], static_cast<float>(code) * d + m) << e;
        // d / 2 of rounding, d's and m's f16 rounding (2^-11 relative), and f32 products
        const float bound = d / 2 + (static_cast<float>(code) * d + std::fabs(m)) / 1024 + 1e-6f;
        EXPECT_LE(std::fabs(back[e] - w[e]), bound) << e;
      }
    }
  }
}

template <class Policy>
void check_linear(std::size_t m, std::size_t n, std::size_t k, const Policy& policy) {
  const std::vector<float> wf = random_values(n * k, 2 + static_cast<std::uint32_t>(m));
  const std::vector<float> x = random_values(m * k, 3 + static_cast<std::uint32_t>(m));
  const auto q = ops::quantize(dense_view<const float, 2>(wf.data(), n, k), weight_format::q7_1);
  std::vector<float> w(n * k), y(m * n, -1.0f), bias = random_values(n, 4);
  ops::dequantize(q.view(), dense_view<float, 2>(w.data(), n, k));
  ops::detail::run_quant_linear<weight_format::q7_1>(q.view(), x.data(), k, m, bias.data(),
                                                     y.data(), n, policy);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double ref = bias[j], bound = 1e-5;
      for (std::size_t b = 0; b < k / 32; ++b) {
        float amax = 0.0f;
        for (std::size_t t = 0; t < 32; ++t)
          amax = std::max(amax, std::fabs(x[i * k + 32 * b + t]));
        for (std::size_t t = 0; t < 32; ++t) {
          const double wv = w[j * k + 32 * b + t], xv = x[i * k + 32 * b + t];
          ref += wv * xv;
          bound += std::fabs(wv) * amax / 127.0 / 2.0 + 1e-5 * std::fabs(wv * xv);
        }
      }
      EXPECT_NEAR(y[i * n + j], ref, bound) << "M " << m << " row " << i << " col " << j;
    }
  }
}

TEST(FormatExtension, LinearRunsTheDecodeBasedKernels) {
  const thread_pool pool(2);
  for (std::size_t m : {1, 3, 17, 37}) {
    check_linear(m, 37, 96, serial{});
    check_linear(m, 17, 32, pool_policy{&pool});
  }
}

TEST(FormatExtension, RepackAndBadShapesAreRefused) {
  const std::vector<float> w = random_values(4 * 64, 5);
  const auto q = ops::quantize(dense_view<const float, 2>(w.data(), 4, 64), weight_format::q7_1);
  try {
    (void)ops::repack(q.view());
    FAIL() << "repack of a format without tiles";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("q7_1"), std::string::npos) << e.what();
  }
  const std::vector<std::byte> bytes(4 * 36);
  try {
    (void)ops::quantized_view(weight_format::q7_1, 4, 40, bytes);
    FAIL() << "K = 40";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape) << e.what();
  }
}

}  // namespace
