// Mixtures of experts, the parts alone: the router (moe/router.hpp) and the MoE MLP
// (moe/mlp.hpp) against a double-precision reference, dense and over quantized tiles. Files,
// configs and llama.cpp's logits: test_moe_gguf.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "npullm/model/config.hpp"
#include "npullm/moe/mlp.hpp"
#include "npullm/moe/router.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"
#include "npullm/ops/silu_mul.hpp"
#include "npullm/ops/tiled_products.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::model;
using npullm::moe::moe_buffers;
using npullm::moe::moe_mlp;
using npullm::moe::moe_scratch;
using npullm::moe::moe_weights;
using npullm::testing::expect_error;

// ---- the router ------------------------------------------------------------------------------

moe::routing route(const std::vector<float>& logits, std::size_t experts, std::size_t k,
                   bool normalize) {
  moe::routing r;
  moe::route(dense_view<const float, 2>(logits.data(), logits.size() / experts, experts), k,
             normalize, r);
  return r;
}

TEST(moe_router, picks_the_k_largest_in_descending_order_with_softmax_weights) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  const auto r = route(logits, 4, 2, false);
  ASSERT_EQ(r.experts, (std::vector<std::int32_t>{1, 3}));
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(r.weights[0], std::exp(2.0) / z, 1e-7);
  EXPECT_NEAR(r.weights[1], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(r.margins[0], (std::exp(1.0) - std::exp(0.5)) / z, 1e-7);
  const auto n = route(logits, 4, 2, true);  // renormalized: the two sum to 1
  EXPECT_EQ(n.experts, r.experts);
  EXPECT_NEAR(n.weights[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-7);
  EXPECT_NEAR(n.weights[0] + n.weights[1], 1.0, 1e-7);
}

TEST(moe_router, k_one_and_k_all) {
  const std::vector<float> logits = {0.1f, -0.3f, 0.7f, 0.2f, 0.7f, -2.0f};  // 2 rows of 3
  const auto one = route(logits, 3, 1, true);
  EXPECT_EQ(one.experts, (std::vector<std::int32_t>{2, 1}));
  EXPECT_EQ(one.weights, (std::vector<float>{1.0f, 1.0f}));  // normalized over one: exactly 1
  const auto all = route(logits, 3, 3, false);
  EXPECT_EQ(all.experts, (std::vector<std::int32_t>{2, 0, 1, 1, 0, 2}));
  EXPECT_NEAR(all.weights[0] + all.weights[1] + all.weights[2], 1.0, 1e-6);
  EXPECT_EQ(all.margins, (std::vector<float>{1.0f, 1.0f}));  // nothing left out
}

TEST(moe_router, equal_logits_go_to_the_lower_index) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 3.0f, 0.0f};
  const auto r = route(logits, 5, 2, true);
  EXPECT_EQ(r.experts, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
  EXPECT_EQ(r.margins[0], 0.0f);  // expert 3 ties with the second choice
}

TEST(moe_router, minus_infinity_is_never_preferred_and_bad_rows_are_refused) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto r = route({-inf, 0.0f, -inf, -1.0f}, 4, 3, false);
  EXPECT_EQ(r.experts, (std::vector<std::int32_t>{1, 3, 0}));  // then -inf in index order
  EXPECT_EQ(r.weights[2], 0.0f);
  expect_error(
      [] {
        route({0.0f, std::nanf(""), 1.0f}, 3, 1, false);
      },
      error_code::invalid_argument, "row 0 has a NaN logit (expert 1)");
  expect_error(
      [inf] {
        route({1.0f, 2.0f, -inf, -inf}, 2, 1, false);
      },
      error_code::invalid_argument, "row 1 has every logit -inf");
  expect_error(
      [] {
        route({1.0f, 2.0f}, 2, 3, false);
      },
      error_code::invalid_argument, "k = 3 of 2 experts");
  expect_error(
      [] {
        route({1.0f, 2.0f}, 2, 0, false);
      },
      error_code::invalid_argument, "k = 0 of 2 experts");
}

TEST(moe_router, groups_rows_by_expert_in_row_order) {
  // 4 rows, k = 2 of 4 experts: expert 0 takes every row, expert 3 none.
  const std::vector<float> logits = {5, 1, 0, -9, 5, 0, 1, -9, 5, 1, 0, -9, 5, 0, 1, -9};
  const auto r = route(logits, 4, 2, true);
  moe::expert_groups g;
  moe::group_by_expert(r, 4, g);
  EXPECT_EQ(g.offsets, (std::vector<std::size_t>{0, 4, 6, 8, 8}));
  EXPECT_EQ(g.count(3), 0u);
  EXPECT_EQ(g.rows, (std::vector<std::int32_t>{0, 1, 2, 3, 0, 2, 1, 3}));
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(g.weights[i], r.weights[2 * i]);
  expect_error([&] { moe::group_by_expert(r, 2, g); }, error_code::invalid_argument,
               "expert 2 of 2");
}

// ---- moe_mlp against a double reference ------------------------------------------------------

// n values of N(0, 1) from rng (a step's rows of x).
std::vector<float> normal_values(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

struct random_moe {
  std::size_t H, F, SF, E, K;
  bool normalize;
  std::vector<float> router, gate, up, down, sgate, sup, sdown, sg;
  moe_weights<float> w;
  model_config c;

  random_moe(std::size_t h, std::size_t f, std::size_t sf, std::size_t e, std::size_t k, bool norm,
             std::uint32_t seed)
      : H(h), F(f), SF(sf), E(e), K(k), normalize(norm) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.3f);
    auto fill = [&](std::vector<float>& v, std::size_t n) {
      v.resize(n);
      for (float& x : v) x = d(rng);
    };
    fill(router, E * H);
    fill(gate, E * F * H);
    fill(up, E * F * H);
    fill(down, E * H * F);
    w.router = dense_view<const float, 2>(router.data(), E, H);
    for (std::size_t i = 0; i < E; ++i) {
      w.gate.emplace_back().w = dense_view<const float, 2>(gate.data() + i * F * H, F, H);
      w.up.emplace_back().w = dense_view<const float, 2>(up.data() + i * F * H, F, H);
      w.down.emplace_back().w = dense_view<const float, 2>(down.data() + i * H * F, H, F);
    }
    if (SF != 0) {
      fill(sgate, SF * H);
      fill(sup, SF * H);
      fill(sdown, H * SF);
      fill(sg, H);
      w.shared_gate.w = dense_view<const float, 2>(sgate.data(), SF, H);
      w.shared_up.w = dense_view<const float, 2>(sup.data(), SF, H);
      w.shared_down.w = dense_view<const float, 2>(sdown.data(), H, SF);
      w.shared_expert_gate = sg;
    }
    c.hidden_size = H;
    c.moe = {E, K, F, normalize, SF, {}};
  }

  // Row x's output in double: the same rule, written out.
  std::vector<double> reference(const float* x) const {
    std::vector<double> logit(E), out(H, 0.0);
    double mx = -1e300;
    for (std::size_t e = 0; e < E; ++e) {
      for (std::size_t i = 0; i < H; ++i) logit[e] += double(x[i]) * router[e * H + i];
      mx = std::max(mx, logit[e]);
    }
    std::vector<double> p(E);
    double z = 0;
    for (std::size_t e = 0; e < E; ++e) z += p[e] = std::exp(logit[e] - mx);
    std::vector<std::size_t> order(E);
    for (std::size_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
    double chosen = 0;
    for (std::size_t j = 0; j < K; ++j) chosen += p[order[j]] / z;
    auto expert = [&](const float* g, const float* u, const float* dn, std::size_t f,
                      double scale) {
      std::vector<double> a(f);
      for (std::size_t r = 0; r < f; ++r) {
        double gs = 0, us = 0;
        for (std::size_t i = 0; i < H; ++i) {
          gs += double(g[r * H + i]) * x[i];
          us += double(u[r * H + i]) * x[i];
        }
        a[r] = gs / (1 + std::exp(-gs)) * us;
      }
      for (std::size_t o = 0; o < H; ++o) {
        double s = 0;
        for (std::size_t r = 0; r < f; ++r) s += double(dn[o * f + r]) * a[r];
        out[o] += scale * s;
      }
    };
    for (std::size_t j = 0; j < K; ++j) {
      const std::size_t e = order[j];
      const double wt = p[e] / z / (normalize ? chosen : 1.0);
      expert(&gate[e * F * H], &up[e * F * H], &down[e * H * F], F, wt);
    }
    if (SF != 0) {
      double dot = 0;
      for (std::size_t i = 0; i < H; ++i) dot += double(x[i]) * sg[i];
      expert(sgate.data(), sup.data(), sdown.data(), SF, 1 / (1 + std::exp(-dot)));
    }
    return out;
  }

  // moe_mlp over rows x (S, H), with buffers of `rows` rows (0: S; S x K or more lets a pool
  // run the experts side by side).
  std::vector<float> run(const std::vector<float>& x, moe_scratch& s,
                         const thread_pool* pool = nullptr, std::size_t rows = 0) const {
    const std::size_t S = x.size() / H, wide = std::max(F, SF), R = rows != 0 ? rows : S;
    std::vector<float> y(S * H), g(R * wide), u(R * wide), xe(R * H), ye(R * H);
    moe_mlp(w, c, dense_view<const float, 2>(x.data(), S, H), dense_view<float, 2>(y.data(), S, H),
            moe_buffers{g.data(), u.data(), xe.data(), ye.data(), R}, s, pool_policy{pool});
    return y;
  }
};

TEST(moe_mlp, matches_the_double_reference_at_odd_sizes) {
  for (const auto& [S, shared, norm] :
       {std::tuple{1u, false, true}, std::tuple{17u, true, false}, std::tuple{37u, false, false}}) {
    random_moe m(48, 40, shared ? 24 : 0, 6, 2, norm, 7 + S);
    std::mt19937 rng(S);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(S * m.H);
    for (float& v : x) v = d(rng);
    moe_scratch s;
    const auto y = m.run(x, s);
    std::set<std::int32_t> used(s.routing.experts.begin(), s.routing.experts.end());
    double worst = 0;
    for (std::size_t r = 0; r < S; ++r) {
      const auto ref = m.reference(&x[r * m.H]);
      for (std::size_t o = 0; o < m.H; ++o)
        worst = std::max(worst, std::fabs(ref[o] - y[r * m.H + o]) / (1 + std::fabs(ref[o])));
    }
    EXPECT_LE(worst, 2e-5) << "S = " << S;  // f32 dot products of length <= 48
    if (S > 1) {
      EXPECT_GT(used.size(), 2u) << "the rows should spread over experts";
    }
  }
}

TEST(moe_mlp, a_row_alone_gets_what_it_gets_in_a_batch) {
  random_moe m(32, 24, 16, 5, 2, true, 3);
  std::vector<float> x(9 * m.H);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : x) v = d(rng);
  moe_scratch s;
  const auto all = m.run(x, s);
  for (std::size_t r = 0; r < 9; ++r) {
    const std::vector<float> one(x.begin() + r * m.H, x.begin() + (r + 1) * m.H);
    const auto y = m.run(one, s);
    for (std::size_t o = 0; o < m.H; ++o) EXPECT_NEAR(y[o], all[r * m.H + o], 1e-5) << r;
  }
}

// A pool runs a small step's experts side by side, each expert's products serially: the result
// is the serial run's bit for bit. A large step (S x k rows over the buffers) runs the experts in
// turn with parallel products: the same within f32 reassociation.
TEST(moe_mlp, a_pool_gives_the_serial_result) {
  random_moe m(64, 48, 32, 8, 3, true, 9);
  thread_pool pool(2);
  std::mt19937 rng(4);
  for (const std::size_t S : {1u, 3u, 21u}) {
    const auto x = normal_values(S * m.H, rng);
    moe_scratch a, b;
    const auto serial = m.run(x, a);
    const auto side_by_side = m.run(x, b, &pool, S * m.K);
    EXPECT_EQ(serial, side_by_side) << S;
    const auto in_turn = m.run(x, b, &pool);
    for (std::size_t i = 0; i < serial.size(); ++i)
      ASSERT_NEAR(in_turn[i], serial[i], 1e-5 * (1 + std::fabs(serial[i]))) << S;
  }
}

TEST(moe_mlp, one_expert_taking_every_row_and_experts_taking_none) {
  random_moe m(32, 16, 0, 4, 1, true, 5);
  // Router row 2 dominates for every x with positive entries; the others see nothing.
  std::fill(m.router.begin(), m.router.end(), 0.0f);
  std::fill(m.router.begin() + 2 * m.H, m.router.begin() + 3 * m.H, 1.0f);
  std::vector<float> x(7 * m.H, 0.25f);
  moe_scratch s;
  s.record = true;
  const auto y = m.run(x, s);
  ASSERT_EQ(s.records.size(), 1u);
  EXPECT_EQ(s.groups.count(2), 7u);
  EXPECT_EQ(s.groups.count(0) + s.groups.count(1) + s.groups.count(3), 0u);
  const auto ref = m.reference(x.data());
  for (std::size_t o = 0; o < m.H; ++o) EXPECT_NEAR(y[o], ref[o], 1e-5 * (1 + std::fabs(ref[o])));
}

// ---- the tiled way: quantized experts over tiles (ops/tiled_products.hpp) ---------------------

// random_moe's matrices quantized to q8_0 and repacked into tiles (every matrix the step reads).
struct tiled_moe {
  const random_moe& m;
  std::vector<ops::quantized_matrix> q;
  std::vector<ops::repacked_quantized> tiles;
  moe_weights<float> w;

  explicit tiled_moe(const random_moe& src) : m(src) {
    q.reserve(3 * m.E + 3);
    tiles.reserve(3 * m.E + 3);
    auto tiled = [&](const projection<float>& p) {
      q.push_back(ops::quantize(p.w, ops::weight_format::q8_0, 32, dtype::f16));
      tiles.push_back(ops::repack(q.back().view()));
      projection<float> out;
      out.quantized = q.back().view();
      out.repacked = &tiles.back();
      return out;
    };
    w.router = m.w.router;
    for (std::size_t e = 0; e < m.E; ++e) {
      w.gate.push_back(tiled(m.w.gate[e]));
      w.up.push_back(tiled(m.w.up[e]));
      w.down.push_back(tiled(m.w.down[e]));
    }
    w.shared_gate = tiled(m.w.shared_gate);
    w.shared_up = tiled(m.w.shared_up);
    w.shared_down = tiled(m.w.shared_down);
    w.shared_expert_gate = m.w.shared_expert_gate;
  }

  std::vector<float> run(const std::vector<float>& x, moe_scratch& s,
                         const thread_pool* pool = nullptr) const {
    const std::size_t S = x.size() / m.H, wide = std::max(m.F, m.SF);
    std::vector<float> y(S * m.H), g(S * wide), u(S * wide), xe(S * m.H), ye(S * m.H);
    moe_mlp(w, m.c, dense_view<const float, 2>(x.data(), S, m.H),
            dense_view<float, 2>(y.data(), S, m.H),
            moe_buffers{g.data(), u.data(), xe.data(), ye.data(), S}, s, pool_policy{pool});
    return y;
  }

  // The same step composed of ops::linear over the same tiles, one row and expert at a time, in
  // the order moe_mlp adds (experts by index, then the shared expert), for s's routing.
  std::vector<float> composed(const std::vector<float>& x, const moe_scratch& s) const {
    const std::size_t S = x.size() / m.H, H = m.H;
    std::vector<float> y(S * H, 0.0f), g, u, o(H);
    auto expert = [&](const float* xr, const projection<float>& gp, const projection<float>& up,
                      const projection<float>& dp) {
      const std::size_t f = gp.rows();
      g.resize(f);
      u.resize(f);
      const dense_view<const float, 2> in(xr, 1, H);
      ops::linear(in, *gp.repacked, dense_view<float, 2>(g.data(), 1, f));
      ops::linear(in, *up.repacked, dense_view<float, 2>(u.data(), 1, f));
      ops::silu_mul(dense_view<const float, 2>(g.data(), 1, f),
                    dense_view<const float, 2>(u.data(), 1, f),
                    dense_view<float, 2>(g.data(), 1, f));
      ops::linear(dense_view<const float, 2>(g.data(), 1, f), *dp.repacked,
                  dense_view<float, 2>(o.data(), 1, H));
    };
    for (std::size_t e = 0; e < m.E; ++e) {
      for (std::size_t i = s.groups.offsets[e]; i < s.groups.offsets[e + 1]; ++i) {
        const auto r = static_cast<std::size_t>(s.groups.rows[i]);
        expert(&x[r * H], w.gate[e], w.up[e], w.down[e]);
        for (std::size_t j = 0; j < H; ++j) y[r * H + j] += s.groups.weights[i] * o[j];
      }
    }
    for (std::size_t r = 0; r < S; ++r) {
      expert(&x[r * H], w.shared_gate, w.shared_up, w.shared_down);
      float dot = 0;  // (by ops::linear, as moe_mlp takes it)
      ops::linear(dense_view<const float, 2>(&x[r * H], 1, H),
                  dense_view<const float, 2>(m.sg.data(), 1, H), dense_view<float, 2>(&dot, 1, 1));
      const float gate = 1.0f / (1.0f + std::exp(-dot));
      for (std::size_t j = 0; j < H; ++j) y[r * H + j] += gate * o[j];
    }
    return y;
  }
};

// One token, 3 tokens (their rows spread over the experts: gathered) and 16 (the most the tiled
// way takes): the step equals ops::linear over the same tiles composed row by row, bit for bit,
// serially and on a pool of 2 (whose parts split products anywhere); and stays within the
// quantization's reach of the f32 experts (of the largest output).
TEST(moe_mlp, a_tiled_step_equals_linear_over_the_same_tiles_bit_for_bit) {
  const random_moe m(64, 96, 128, 8, 3, false, 21);
  const tiled_moe t(m);
  thread_pool pool(2);
  std::mt19937 rng(6);
  for (const std::size_t S : {1u, 3u, 16u}) {
    const auto x = normal_values(S * m.H, rng);
    moe_scratch a, b, f;
    const auto serial = t.run(x, a);
    const auto pooled = t.run(x, b, &pool);
    EXPECT_EQ(serial, pooled) << S;
    EXPECT_EQ(serial, t.composed(x, a)) << S;
    if (S > 1) {
      std::size_t spread = 0;
      for (std::size_t e = 0; e < m.E; ++e)
        spread += a.groups.count(e) != 0 && a.groups.count(e) != S;
      EXPECT_GT(spread, 0u) << "some expert should take only some of the rows: " << S;
    }
    const auto exact = m.run(x, f);  // the f32 experts
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < serial.size(); ++i) {
      worst = std::max(worst, double(std::fabs(serial[i] - exact[i])));
      scale = std::max(scale, double(std::fabs(exact[i])));
    }
    // q8_0 weights, and activations quantized twice (x, then act(gate) * up): 2.1 % measured
    EXPECT_LE(worst, 0.05 * scale) << S;
  }
}

TEST(moe_mlp, tiled_products_refuse_mismatched_products_and_write_nothing) {
  const random_moe m(64, 96, 128, 2, 1, false, 3);
  const tiled_moe t(m);
  std::vector<float> x(2 * m.H, 0.5f), y(2 * m.F, -1.0f);
  ops::tile_activations xa;
  ops::quantize_for_tiles(dense_view<const float, 2>(x.data(), 2, m.H), xa);
  // down (H, F) reads K = F, not H
  const ops::tiled_product good{t.w.gate[0].repacked, &xa, 0, 2, y.data(), m.F};
  const ops::tiled_product bad{t.w.down[0].repacked, &xa, 0, 2, y.data(), m.F};
  const ops::tiled_product past{t.w.gate[0].repacked, &xa, 1, 2, y.data(), m.F};
  for (const auto& p : {bad, past}) {
    const ops::tiled_product both[] = {good, p};
    expect_error([&] { ops::run_tiled_products(both); }, error_code::invalid_shape, "product 1");
    EXPECT_EQ(y, std::vector<float>(2 * m.F, -1.0f));
  }
  const std::int32_t rows[] = {1, 2};
  ops::tile_activations g;
  expect_error([&] { ops::gather_tile_rows(xa, rows, g); }, error_code::invalid_argument,
               "row 2 (entry 1) of 2");
}

}  // namespace
