// Three copies of the same kernels, built for the native ISA, AVX2 and baseline x86-64, linked
// into one program (as an engine that dispatches per CPU would): each copy must run its own
// ISA's code (core/isa.hpp's inline namespaces), and all three must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "mix.hpp"
#include "npullm/kv/kv_format.hpp"
#include "npullm/ops/quant.hpp"

namespace {

using namespace isa_mix;

std::vector<float> random_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

template <class T>
bytes to_bytes(const T* p, std::size_t n) {
  bytes b(n * sizeof(T));
  std::memcpy(b.data(), p, b.size());
  return b;
}

// Inputs for the three copies, and what each computed from them.
struct mix_fixture : ::testing::Test {
  static constexpr std::size_t m = 37, n = 45, mq = 37, nq = 45;
  std::mt19937 rng{7};
  std::vector<float> x = random_values(m * 64, rng), w = random_values(n * 64, rng);
  std::vector<float> xq = random_values(mq * quant_k, rng), wq = random_values(nq * quant_k, rng);
  std::vector<float> q, k, v;
  mix_input in;
  mix_result native, avx2, baseline;

  void SetUp() override {
    in.x = x;
    in.w = w;
    in.xq = xq;
    in.wq = wq;
    for (std::string_view name : quant_formats) {
      const auto m =
          npullm::ops::quantize(npullm::dense_view<const float, 2>(wq.data(), nq, quant_k),
                                *npullm::ops::weight_format_from_string(name));
      in.weights.push_back(to_bytes(m.data().data(), m.data().size()));
    }
    // Decode-like: 3 queries per head after 70 keys (a partial last 16-key sub-tile).
    in.q_rows = 3;
    in.kv_rows = 70;
    q = random_values(q_heads * in.q_rows * head_dim, rng);
    k = random_values(kv_heads * in.kv_rows * head_dim, rng);
    v = random_values(kv_heads * in.kv_rows * head_dim, rng);
    in.q = q;
    in.k = k;
    in.v = v;
    std::vector<npullm::kv::q8_0> u8(k.size() / 32);
    std::vector<npullm::kv::q4_0> u4(k.size() / 32);
    npullm::kv::quantize_row(k.data(), k.size(), u8.data());
    in.k_q8_0 = to_bytes(u8.data(), u8.size());
    npullm::kv::quantize_row(v.data(), v.size(), u8.data());
    in.v_q8_0 = to_bytes(u8.data(), u8.size());
    npullm::kv::quantize_row(k.data(), k.size(), u4.data());
    in.k_q4_0 = to_bytes(u4.data(), u4.size());
    npullm::kv::quantize_row(v.data(), v.size(), u4.data());
    in.v_q4_0 = to_bytes(u4.data(), u4.size());
    native = run_native(in);
    avx2 = run_avx2(in);
    baseline = run_baseline(in);
  }
};

TEST_F(mix_fixture, EachTranslationUnitRunsItsOwnIsa) {
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

// The quantizers agree bit for bit: ops::quantize rounds as ggml's reference quantizers do, its
// products kept out of FMAs (quant_detail::product); the k-quants' least-squares search runs
// in double, where a contraction could flip a near-tie between two candidate scales (none does
// on these inputs); kv::quantize_row is llama.cpp's q8_0 / q4_0. The dequantizers are exact.
TEST_F(mix_fixture, QuantizersAgreeBitForBit) {
  for (const auto* r : {&native, &avx2, &baseline}) {
    ASSERT_EQ(r->quantized.size(), std::size(quant_formats));
    for (std::size_t f = 0; f < std::size(quant_formats); ++f) {
      EXPECT_EQ(r->quantized[f], in.weights[f]) << r->isa << " " << quant_formats[f];
      EXPECT_EQ(r->dequantized[f], native.dequantized[f]) << r->isa << " " << quant_formats[f];
    }
    EXPECT_EQ(r->k_q8_0, in.k_q8_0) << r->isa;
    EXPECT_EQ(r->k_q4_0, in.k_q4_0) << r->isa;
    EXPECT_EQ(r->k_q8_0_back, native.k_q8_0_back) << r->isa;
    EXPECT_EQ(r->k_q4_0_back, native.k_q4_0_back) << r->isa;
  }
}

// Every path of the quantized linear agrees with the native copy's within f32 reassociation:
// the activations' codes and the integer dot products are exact, and each output sums
// K / 32 = 8 pieces' products s · dx · dot in an order of the ISA's: at most ~10 roundings of
// 2^-24 of sum_k |w_k x_k| on either side, so |difference| < 2^-19 sum_k |w_k x_k|.
TEST_F(mix_fixture, QuantizedLinearAgrees) {
  const std::size_t paths = std::size(quant_paths);
  for (const auto* r : {&avx2, &baseline}) {
    ASSERT_EQ(r->quant_linear.size(), std::size(quant_formats) * paths);
    for (std::size_t f = 0; f < std::size(quant_formats); ++f) {
      const std::vector<float>& w = native.dequantized[f];  // (nq, quant_k)
      for (std::size_t p = 0; p < paths; ++p) {
        const auto& got = r->quant_linear[f * paths + p];
        const auto& want = native.quant_linear[f * paths + p];
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(got.size() % nq, 0u);
        for (std::size_t i = 0; i < got.size(); ++i) {
          const std::size_t row = i / nq, col = i % nq;
          double magnitude = 0;
          for (std::size_t c = 0; c < quant_k; ++c)
            magnitude += std::fabs(w[col * quant_k + c] * xq[row * quant_k + c]);
          ASSERT_NEAR(got[i], want[i], std::ldexp(magnitude, -19))
              << r->isa << " " << quant_formats[f] << " " << quant_paths[p] << " y(" << row << ", "
              << col << ")";
        }
      }
    }
  }
}

// Attention over q8_0, q4_0 and mixed K / V: the same integer scores (exact), then the
// softmax and P V in f32 with each ISA's exp, as the f32 attention above (outputs are convex
// combinations of values in [-1, 1]).
TEST_F(mix_fixture, QuantizedKvAttentionAgrees) {
  for (const auto* r : {&avx2, &baseline}) {
    ASSERT_EQ(r->kv_attention.size(), std::size(kv_formats));
    for (std::size_t f = 0; f < std::size(kv_formats); ++f) {
      ASSERT_EQ(r->kv_attention[f].size(), native.kv_attention[f].size());
      ASSERT_EQ(r->kv_attention[f].size(), q_heads * in.q_rows * head_dim);
      for (std::size_t i = 0; i < r->kv_attention[f].size(); ++i) {
        ASSERT_NEAR(r->kv_attention[f][i], native.kv_attention[f][i], 1e-5)
            << r->isa << " " << kv_formats[f] << " " << i;
      }
    }
  }
}

// The other ops: softmax and rope are f32 loops compiled per ISA (exp, FMA contraction);
// argmax and gather are exact.
TEST_F(mix_fixture, OtherOpsAgree) {
  ASSERT_EQ(quant_formats[2], "q4_k");  // the gathered quantized table
  for (const auto* r : {&avx2, &baseline}) {
    ASSERT_EQ(r->softmax.size(), native.softmax.size());
    for (std::size_t i = 0; i < r->softmax.size(); ++i)
      ASSERT_NEAR(r->softmax[i], native.softmax[i], 1e-6) << r->isa << " " << i;
    EXPECT_EQ(r->argmax, native.argmax) << r->isa;
    EXPECT_EQ(r->gathered, native.gathered) << r->isa;
    ASSERT_EQ(r->rope.size(), native.rope.size());
    for (std::size_t i = 0; i < r->rope.size(); ++i)
      ASSERT_NEAR(r->rope[i], native.rope[i], 1e-6) << r->isa << " " << i;
  }
}

}  // namespace
