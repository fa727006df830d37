// moe_mlp: a mixture-of-experts MLP over a step's rows (config.moe; see config.hpp's moe_config).
//
//   x (S, hidden): the normed rows;  y (S, hidden): the output (overwritten)
//   logits (S, experts) = x router^T (f32);  moe::route -> k experts and weights per row
//   rows grouped by expert: for each expert with rows, one product per matrix over just its
//   rows (gathered into xe (n_e, hidden)), down(act(gate xe) * up xe) -> ye, then
//   y[row] += w * ye[i], experts in index order (so one row's sum has the same order in a
//   prefill as in a decode step)
//   + the shared expert over every row, scaled by sigmoid(shared_expert_gate . x)
//
// Only the chosen experts' matrices are read. A step whose S x k rows fit the buffers (decode,
// speculative verification, small batches) runs the chosen experts as one parallel job, each
// expert's products on one thread; a larger step runs them in turn, each product parallel
// over the policy's threads. Either way an expert's products are those of a serial run when
// the pool has one thread, and the sum over experts is in index order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/moe/router.hpp"
#include "npullm/ops/gelu_mul.hpp"
#include "npullm/ops/silu_mul.hpp"

namespace npullm::model {

// The host-side state of moe_mlp, kept by the pipeline between steps (no allocation per step
// once the largest step has run).
struct moe_scratch {
  std::vector<float> logits;  // (S, experts)
  moe::routing routing;
  moe::expert_groups groups;
  // When `record`: every call's routing appended, in call order (per step, per MoE layer):
  // expert-load statistics, and which rows' choices were near-ties (routing.margins).
  bool record = false;
  std::vector<moe::routing> records;
  std::vector<std::size_t> active;  // the experts with rows this step
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

template <storage_type W, threading_policy Policy>
void moe_mlp(const moe_weights<W>& m, const model_config& c, dense_view<const float, 2> x,
             dense_view<float, 2> y, const moe_buffers& b, moe_scratch& s, const Policy& policy) {
  const std::size_t S = x.extent(0), H = x.extent(1), n = c.moe.experts;
  const std::size_t k = c.moe.experts_per_token;
  // One expert's MLP over `in` (rows, H) into `out`, its gate / up products at g / u.
  auto mlp = [&](dense_view<const float, 2> in, const projection<W>& gate, const projection<W>& up,
                 const projection<W>& down, float* g_at, float* u_at, dense_view<float, 2> out) {
    const std::size_t rows = in.extent(0), ff = gate.rows();
    const dense_view<float, 2> g(g_at, rows, ff), u(u_at, rows, ff);
    project(in, gate, g, {}, policy);
    project(in, up, u, {}, policy);
    if (c.hidden_act == activation_kind::gelu_tanh) {
      ops::gelu_tanh_mul(g, u, g);
    } else {
      ops::silu_mul(g, u, g);
    }
    project(g, down, out, {}, policy);
  };

  // The router, from f32 weights (near-ties decide which experts run).
  s.logits.resize(S * n);
  for (std::size_t r = 0; r < S; ++r) {
    const float* xr = &x(r, 0);
    for (std::size_t e = 0; e < n; ++e) {
      const float* wr = &m.router(e, 0);
      float acc = 0;
      for (std::size_t i = 0; i < H; ++i) acc += xr[i] * wr[i];
      s.logits[r * n + e] = acc;
    }
  }
  moe::route(dense_view<const float, 2>(s.logits.data(), S, n), k, c.moe.normalize_top_k,
             s.routing);
  moe::group_by_expert(s.routing, n, s.groups);
  if (s.record) s.records.push_back(s.routing);

  // Expert e's rows go to rows [offsets[e], offsets[e + 1]) of the buffers: S x k in all.
  s.active.clear();
  for (std::size_t e = 0; e < n; ++e)
    if (s.groups.count(e) != 0) s.active.push_back(e);
  auto run_expert = [&](std::size_t e, bool gathered_rows) {
    const std::size_t ne = s.groups.count(e), at = gathered_rows ? s.groups.offsets[e] : 0;
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
    const std::size_t o = s.groups.offsets[e];
    for (std::size_t i = 0; i < s.groups.count(e); ++i) {
      float* yr = &y(static_cast<std::size_t>(s.groups.rows[o + i]), 0);
      const float* src = b.out + (at + i) * H;
      const float w = s.groups.weights[o + i];
      for (std::size_t j = 0; j < H; ++j) yr[j] += w * src[j];
    }
  };
  std::fill_n(y.data_handle(), S * H, 0.0f);
  if (policy.concurrency() > 1 && s.active.size() > 1 && S * k <= b.rows) {
    // A decode-sized step: the chosen experts side by side, one per thread at a time (their
    // products run serially inside the job: a pool's nested parallel_for does), so a layer
    // forks once for all of them instead of three times per expert; each writes its own rows.
    policy.parallel_for(s.active.size(), [&](std::size_t i) { run_expert(s.active[i], true); });
    for (const std::size_t e : s.active) accumulate(e, s.groups.offsets[e]);
  } else {
    for (const std::size_t e : s.active) {  // in index order, as above
      run_expert(e, false);
      accumulate(e, 0);
    }
  }

  if (m.shared_gate.rows() != 0) {
    const dense_view<float, 2> out(b.out, S, H);
    mlp(x, m.shared_gate, m.shared_up, m.shared_down, b.gate, b.up, out);
    for (std::size_t r = 0; r < S; ++r) {
      const float* xr = &x(r, 0);
      float dot = 0;
      for (std::size_t i = 0; i < H; ++i) dot += xr[i] * m.shared_expert_gate[i];
      const float g = 1.0f / (1.0f + std::exp(-dot));
      float* yr = &y(r, 0);
      const float* o = &out(r, 0);
      for (std::size_t j = 0; j < H; ++j) yr[j] += g * o[j];
    }
  }
}

}  // namespace npullm::model
