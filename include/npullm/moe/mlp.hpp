// mlp: the mixture-of-experts MLP (moe_mlp) over a step's rows (config.moe; see
// model/config_types.hpp's moe_config), its buffers and routing state (moe_scratch).
//
//   x (S, hidden): the normed rows;  y (S, hidden): the output (overwritten)
//   logits (S, experts) = x router^T (f32);  moe::route -> k experts and weights per row
//   rows grouped by expert: for each expert with rows, one product per matrix over just its
//   rows (gathered into xe (n_e, hidden)), down(act(gate xe) * up xe) -> ye, then
//   y[row] += w * ye[i], experts in index order (so one row's sum has the same order in a
//   prefill as in a decode step)
//   + the shared expert over every row, scaled by sigmoid(shared_expert_gate . x)
//
// Only the chosen experts' matrices are read. Three ways, by step size and weights:
//  - tiled (S <= 16: decode, speculative verification, small batches; every matrix the step
//    reads repacked into tiles): x quantized once; every chosen expert's gate and up and the
//    shared expert's as ONE parallel job split over all their tiles (ops/tiled_products.hpp),
//    the activation products once over all of them, quantized once, then every down product
//    as one job: two forks per layer, each product's tiles read as one contiguous stream per
//    part, and each output that of linear over the tiles (so bit for bit the same for any
//    thread count, and as the per-expert ways below give);
//  - otherwise, on several threads: the chosen experts side by side, each expert's products on
//    one thread, in groups of consecutive experts whose rows fit the buffers (one group when
//    the step's S x k rows do), one parallel job a group;
//  - on one thread: the experts in turn.
// Either way the sum over experts is in index order, then the shared expert's term.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/config_types.hpp"
#include "npullm/model/projection.hpp"
#include "npullm/moe/expert_weights.hpp"
#include "npullm/moe/router.hpp"
#include "npullm/ops/gelu_mul.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/silu_mul.hpp"
#include "npullm/ops/tiled_products.hpp"

namespace npullm::moe {

// The host-side state of moe_mlp, kept by the pipeline between steps (no allocation per step
// once the largest step has run).
struct moe_scratch {
  std::vector<float> logits;         // (S, experts)
  std::vector<float> shared_logits;  // (S): shared_expert_gate . x (with a shared expert)
  moe::routing routing;
  moe::expert_groups groups;
  // When `record`: every call's routing appended, in call order (per step, per MoE layer):
  // expert-load statistics, and which rows' choices were near-ties (routing.margins).
  bool record = false;
  std::vector<moe::routing> records;
  std::vector<std::size_t> active;  // the experts with rows this step
  std::vector<std::size_t> order;   // a group of them, larger first (moe_mlp)
  // The tiled way's: x (S, hidden) and its rows gathered by expert (S x k, hidden) quantized,
  // gate / up (S x k rows of the experts, then S of the shared expert), their activation
  // products quantized, the down outputs (S x k, then S, hidden) and the product list.
  ops::tile_activations xq, xg, hq, hsq;
  std::vector<float> gate, up, out;
  std::vector<ops::tiled_product> products;
};

// Where moe_mlp works: gate / up hold `rows` x (the widest MLP) floats each, in / out `rows` x
// hidden each (the pipeline's activations: rows = its largest step).
struct moe_buffers {
  float* gate = nullptr;
  float* up = nullptr;
  float* in = nullptr;
  float* out = nullptr;
  std::size_t rows = 0;
};

// g = act(g) * u, elementwise over (rows, cols) (the model's hidden_act).
inline void moe_act(const model::model_config& c, dense_view<float, 2> g,
                    dense_view<const float, 2> u) {
  if (c.hidden_act == model::activation_kind::gelu_tanh) {
    ops::gelu_tanh_mul(g, u, g);
  } else {
    ops::silu_mul(g, u, g);
  }
}

// y[row] += w · out's row i for expert e's i-th row (out: its rows' outputs, (count, H)).
inline void add_expert_rows(const moe::expert_groups& g, std::size_t e, const float* out,
                            dense_view<float, 2> y) {
  const std::size_t o = g.offsets[e], H = y.extent(1);
  for (std::size_t i = 0; i < g.count(e); ++i) {
    float* yr = &y(static_cast<std::size_t>(g.rows[o + i]), 0);
    const float* src = out + i * H;
    const float w = g.weights[o + i];
    for (std::size_t j = 0; j < H; ++j) yr[j] += w * src[j];
  }
}

// Per row r of x: s.logits[r] = router x[r] and, with a shared expert, s.shared_logits[r] =
// shared_expert_gate . x[r]. Each row by ops::linear of one row (a vector kernel; a scalar
// loop's chain of dependent adds takes about 1024 x 4 cycles per row and expert: some 4.5 ms a
// layer for a prefill of 128 tokens of Qwen2-MoE 1B, all on one thread), rows split over the
// threads: a row's logits are the same bits in a step of any size, so a token is routed alike
// alone, in a batch, in a verification step and in a prefill.
template <storage_type W, threading_policy Policy>
void router_logits(const moe_weights<W>& m, dense_view<const float, 2> x, moe_scratch& s,
                   const Policy& policy) {
  const std::size_t S = x.extent(0), H = x.extent(1), n = m.router.extent(0);
  const bool shared = !m.shared_expert_gate.empty();
  s.logits.resize(S * n);
  s.shared_logits.resize(shared ? S : 0);
  const std::size_t parts = std::min(S, policy.concurrency() * 4);
  policy.parallel_for(parts, [&](std::size_t p) {
    for (std::size_t r = chunk_begin(S, parts, p); r < chunk_begin(S, parts, p + 1); ++r) {
      const dense_view<const float, 2> xr(&x(r, 0), 1, H);
      ops::linear(xr, m.router, dense_view<float, 2>(s.logits.data() + r * n, 1, n));
      if (shared) {
        ops::linear(xr, dense_view<const float, 2>(m.shared_expert_gate.data(), 1, H),
                    dense_view<float, 2>(s.shared_logits.data() + r, 1, 1));
      }
    }
  });
}

// y[r] += sigmoid(s.shared_logits[r]) · out[r]: Qwen2-MoE's shared expert, out (S, H).
inline void add_shared_expert(const moe_scratch& s, const float* out, dense_view<float, 2> y) {
  const std::size_t H = y.extent(1);
  for (std::size_t r = 0; r < y.extent(0); ++r) {
    const float g = 1.0f / (1.0f + std::exp(-s.shared_logits[r]));
    float* yr = &y(r, 0);
    const float* o = out + r * H;
    for (std::size_t j = 0; j < H; ++j) yr[j] += g * o[j];
  }
}

// Whether a step of S rows takes the tiled way: S <= 16 and every matrix it reads has tiles.
template <storage_type W>
bool moe_tiled(const moe_weights<W>& m, const std::vector<std::size_t>& active, std::size_t S) {
  if (S == 0 || S > 16 || active.empty()) return false;
  const auto tiled = [](const model::projection<W>& p) { return p.repacked != nullptr; };
  for (const std::size_t e : active) {
    if (!tiled(m.gate[e]) || !tiled(m.up[e]) || !tiled(m.down[e])) return false;
  }
  return m.shared_gate.rows() == 0 ||
         (tiled(m.shared_gate) && tiled(m.shared_up) && tiled(m.shared_down));
}

// The tiled way (see the top), after routing: s.groups and s.active are this step's; y is zero.
template <storage_type W, threading_policy Policy>
void moe_tiled_step(const moe_weights<W>& m, const model::model_config& c,
                    dense_view<const float, 2> x, dense_view<float, 2> y, moe_scratch& s,
                    const Policy& policy) {
  const std::size_t S = x.extent(0), H = x.extent(1), k = c.moe.experts_per_token;
  const std::size_t F = m.gate[s.active.front()].rows(), SK = S * k;
  const bool shared = m.shared_gate.rows() != 0;
  const std::size_t FS = shared ? m.shared_gate.rows() : 0;
  ops::quantize_for_tiles(x, s.xq);
  // Expert e's rows are rows [offsets[e], offsets[e + 1]) of the gathered set; when an expert
  // takes every row of the step (always at S = 1), x's own quantized rows serve.
  bool gather = false;
  for (const std::size_t e : s.active) gather = gather || s.groups.count(e) != S;
  if (gather) ops::gather_tile_rows(s.xq, s.groups.rows, s.xg);
  s.gate.resize(SK * F + S * FS);
  s.up.resize(SK * F + S * FS);
  s.out.resize((SK + S) * H);
  auto& ps = s.products;
  ps.clear();
  for (const std::size_t e : s.active) {
    const std::size_t at = s.groups.offsets[e], ne = s.groups.count(e);
    const ops::tile_activations* in = gather ? &s.xg : &s.xq;
    const std::size_t m0 = gather ? at : 0;
    ps.push_back({m.gate[e].repacked, in, m0, ne, s.gate.data() + at * F, F});
    ps.push_back({m.up[e].repacked, in, m0, ne, s.up.data() + at * F, F});
  }
  if (shared) {
    ps.push_back({m.shared_gate.repacked, &s.xq, 0, S, s.gate.data() + SK * F, FS});
    ps.push_back({m.shared_up.repacked, &s.xq, 0, S, s.up.data() + SK * F, FS});
  }
  ops::run_tiled_products(std::span<const ops::tiled_product>(ps), policy);
  // act(gate) * up over the experts' (S x k, F) rows, then the shared expert's (S, FS).
  moe_act(c, dense_view<float, 2>(s.gate.data(), SK, F),
          dense_view<const float, 2>(s.up.data(), SK, F));
  ops::quantize_for_tiles(dense_view<const float, 2>(s.gate.data(), SK, F), s.hq);
  if (shared) {
    moe_act(c, dense_view<float, 2>(s.gate.data() + SK * F, S, FS),
            dense_view<const float, 2>(s.up.data() + SK * F, S, FS));
    ops::quantize_for_tiles(dense_view<const float, 2>(s.gate.data() + SK * F, S, FS), s.hsq);
  }
  ps.clear();
  for (const std::size_t e : s.active) {
    const std::size_t at = s.groups.offsets[e];
    ps.push_back({m.down[e].repacked, &s.hq, at, s.groups.count(e), s.out.data() + at * H, H});
  }
  if (shared) ps.push_back({m.shared_down.repacked, &s.hsq, 0, S, s.out.data() + SK * H, H});
  ops::run_tiled_products(std::span<const ops::tiled_product>(ps), policy);
  // y = Σ over experts in index order of w · expert out, then + sigmoid(gate . x) · shared.
  for (const std::size_t e : s.active)
    add_expert_rows(s.groups, e, s.out.data() + s.groups.offsets[e] * H, y);
  if (shared) add_shared_expert(s, s.out.data() + SK * H, y);
}

template <storage_type W, threading_policy Policy>
void moe_mlp(const moe_weights<W>& m, const model::model_config& c, dense_view<const float, 2> x,
             dense_view<float, 2> y, const moe_buffers& b, moe_scratch& s, const Policy& policy) {
  const std::size_t S = x.extent(0), H = x.extent(1), n = c.moe.experts;
  const std::size_t k = c.moe.experts_per_token;
  // One expert's MLP over `in` (rows, H) into `out`, its gate / up products at g / u.
  auto mlp = [&](dense_view<const float, 2> in, const model::projection<W>& gate,
                 const model::projection<W>& up, const model::projection<W>& down, float* g_at,
                 float* u_at, dense_view<float, 2> out) {
    const std::size_t rows = in.extent(0), ff = gate.rows();
    const dense_view<float, 2> g(g_at, rows, ff), u(u_at, rows, ff);
    model::project(in, gate, g, {}, policy);
    model::project(in, up, u, {}, policy);
    moe_act(c, g, u);
    model::project(g, down, out, {}, policy);
  };

  // The router, from f32 weights (near-ties decide which experts run).
  router_logits(m, x, s, policy);
  moe::route(dense_view<const float, 2>(s.logits.data(), S, n), k, c.moe.normalize_top_k,
             s.routing);
  moe::group_by_expert(s.routing, n, s.groups);
  if (s.record) s.records.push_back(s.routing);

  // Expert e's rows go to rows [offsets[e], offsets[e + 1]) of the buffers: S x k in all.
  s.active.clear();
  for (std::size_t e = 0; e < n; ++e)
    if (s.groups.count(e) != 0) s.active.push_back(e);
  // Expert e's MLP over its rows, gathered at row `at` of the buffers (x itself when every
  // row of the step chose e).
  auto run_expert = [&](std::size_t e, std::size_t at) {
    const std::size_t ne = s.groups.count(e);
    const std::int32_t* rows_e = s.groups.rows.data() + s.groups.offsets[e];
    const std::size_t ff = m.gate[e].rows();
    dense_view<const float, 2> in = x;  // every row of the step, in order: x itself
    if (ne != S) {
      for (std::size_t i = 0; i < ne; ++i)
        std::copy_n(&x(static_cast<std::size_t>(rows_e[i]), 0), H, b.in + (at + i) * H);
      in = dense_view<const float, 2>(b.in + at * H, ne, H);
    }
    mlp(in, m.gate[e], m.up[e], m.down[e], b.gate + at * ff, b.up + at * ff,
        dense_view<float, 2>(b.out + at * H, ne, H));
  };
  auto accumulate = [&](std::size_t e, std::size_t at) {
    add_expert_rows(s.groups, e, b.out + at * H, y);
  };
  std::fill_n(y.data_handle(), S * H, 0.0f);
  if (moe_tiled(m, s.active, S)) return moe_tiled_step(m, c, x, y, s, policy);
  if (policy.concurrency() > 1 && s.active.size() > 1) {
    // The chosen experts side by side, one per thread at a time (their products run serially
    // inside the job: a pool's nested parallel_for does), in groups of consecutive experts
    // whose rows fit the buffers (all of them at once for a decode-sized step: S x k rows):
    // a layer forks once per group instead of three times per expert, and each product keeps
    // its thread busy (a prefill of 512 rows over 32 experts: ~64 rows an expert, too few to
    // split one product over threads). Larger experts start first (each writes its own rows;
    // the order changes no result). Expert e's rows sit at offsets[e] - the group's first.
    for (std::size_t i = 0; i < s.active.size();) {
      const std::size_t base = s.groups.offsets[s.active[i]];
      std::size_t j = i;  // an expert's rows (<= S) always fit: every group has one
      while (j < s.active.size() &&
             s.groups.offsets[s.active[j]] + s.groups.count(s.active[j]) - base <= b.rows)
        ++j;
      s.order.assign(s.active.begin() + static_cast<std::ptrdiff_t>(i),
                     s.active.begin() + static_cast<std::ptrdiff_t>(j));
      std::stable_sort(s.order.begin(), s.order.end(), [&](std::size_t a, std::size_t e) {
        return s.groups.count(a) > s.groups.count(e);
      });
      policy.parallel_for(s.order.size(), [&](std::size_t t) {
        run_expert(s.order[t], s.groups.offsets[s.order[t]] - base);
      });
      for (std::size_t t = i; t < j; ++t)  // in index order, as below
        accumulate(s.active[t], s.groups.offsets[s.active[t]] - base);
      i = j;
    }
  } else {
    for (const std::size_t e : s.active) {  // in index order
      run_expert(e, 0);
      accumulate(e, 0);
    }
  }

  if (m.shared_gate.rows() != 0) {
    const dense_view<float, 2> out(b.out, S, H);
    mlp(x, m.shared_gate, m.shared_up, m.shared_down, b.gate, b.up, out);
    add_shared_expert(s, out.data_handle(), y);
  }
}

}  // namespace npullm::moe
