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
// Only the chosen experts' matrices are read. Decode (S = 1) takes each chosen expert's three
// GEMVs in turn, each one parallel over the policy's threads.
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
};

// gate_buf / up_buf: room for S * max(expert, shared expert intermediate) floats each;
// xe / ye: (S, hidden) each.
template <storage_type W, threading_policy Policy>
void moe_mlp(const moe_weights<W>& m, const model_config& c, dense_view<const float, 2> x,
             dense_view<float, 2> y, float* gate_buf, float* up_buf, dense_view<float, 2> xe,
             dense_view<float, 2> ye, moe_scratch& s, const Policy& policy) {
  const std::size_t S = x.extent(0), H = x.extent(1), n = c.moe.experts;
  auto mlp = [&](dense_view<const float, 2> in, const projection<W>& gate, const projection<W>& up,
                 const projection<W>& down, dense_view<float, 2> out) {
    const std::size_t rows = in.extent(0), ff = gate.rows();
    const dense_view<float, 2> g(gate_buf, rows, ff), u(up_buf, rows, ff);
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
  moe::route(dense_view<const float, 2>(s.logits.data(), S, n), c.moe.experts_per_token,
             c.moe.normalize_top_k, s.routing);
  moe::group_by_expert(s.routing, n, s.groups);
  if (s.record) s.records.push_back(s.routing);

  std::fill_n(y.data_handle(), S * H, 0.0f);
  for (std::size_t e = 0; e < n; ++e) {
    const std::size_t ne = s.groups.count(e);
    if (ne == 0) continue;
    const std::int32_t* rows_e = s.groups.rows.data() + s.groups.offsets[e];
    const float* w_e = s.groups.weights.data() + s.groups.offsets[e];
    // Every row of the step, in order: x itself; else the rows gathered.
    dense_view<const float, 2> in = x;
    if (ne != S) {
      for (std::size_t i = 0; i < ne; ++i)
        std::copy_n(&x(static_cast<std::size_t>(rows_e[i]), 0), H, &xe(i, 0));
      in = dense_view<const float, 2>(xe.data_handle(), ne, H);
    }
    const dense_view<float, 2> out(ye.data_handle(), ne, H);
    mlp(in, m.gate[e], m.up[e], m.down[e], out);
    for (std::size_t i = 0; i < ne; ++i) {
      float* yr = &y(static_cast<std::size_t>(rows_e[i]), 0);
      const float* o = &out(i, 0);
      const float w = w_e[i];
      for (std::size_t j = 0; j < H; ++j) yr[j] += w * o[j];
    }
  }

  if (m.shared_gate.rows() != 0) {
    const dense_view<float, 2> out(ye.data_handle(), S, H);
    mlp(x, m.shared_gate, m.shared_up, m.shared_down, out);
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
