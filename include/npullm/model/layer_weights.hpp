// layer_weights: one decoder layer's weights as views (norms, q/k/v/o, the dense MLP's
// gate/up/down or a mixture of experts' moe::moe_weights, biases, Qwen 3's q/k norms, Gemma 2's
// sandwich norms), and for_each_projection over a layer's matrices. Bound by model_weights
// (weights.hpp).
#pragma once

#include <cstddef>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/projection.hpp"
#include "npullm/moe/expert_weights.hpp"

namespace npullm::model {

// One decoder layer's weights (views). Which are present depends on the family (config.hpp):
// every family has input_norm, q/k/v/o and gate/up/down; Phi-3's fused qkv_proj and
// gate_up_proj are bound as row ranges of the fused matrices (zero-copy).
template <storage_type W>
struct layer_weights {
  dense_view<const W, 1> input_norm;  // (hidden): before attention
  // (hidden): before the MLP (HF's post_attention_layernorm, or Gemma 2's
  // pre_feedforward_layernorm)
  dense_view<const W, 1> post_norm;
  projection<W> q, k, v;                          // (q_size | kv_size, hidden)
  projection<W> o;                                // (hidden, q_size)
  projection<W> gate, up;                         // (intermediate, hidden)
  projection<W> down;                             // (hidden, intermediate)
  std::span<const float> q_bias, k_bias, v_bias;  // empty without attention bias
  std::span<const float> o_bias;                  // empty without an o_proj bias
  dense_view<const W, 1> q_norm, k_norm;          // (head_dim): Qwen 3's q/k norms, else empty
  // (hidden): Gemma 2's sandwich norms on the attention output (post_attention_layernorm) and
  // on the MLP output (post_feedforward_layernorm), else empty.
  dense_view<const W, 1> attn_out_norm, mlp_out_norm;
  // A mixture-of-experts layer (config.moe.in_layer): gate / up / down above are empty then.
  npullm::moe::moe_weights<W> moe;
};

// fn(projection&) for every matrix of a layer that has one: q, k, v, o, then the dense MLP's
// gate, up, down or the experts' (gate, up, down per expert) and the shared expert's.
template <class Layer, class Fn>
void for_each_projection(Layer& l, Fn&& fn) {
  auto visit = [&](auto& p) {
    if (p.rows() != 0) fn(p);
  };
  for (auto* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) visit(*p);
  for (std::size_t e = 0; e < l.moe.gate.size(); ++e) {
    visit(l.moe.gate[e]);
    visit(l.moe.up[e]);
    visit(l.moe.down[e]);
  }
  for (auto* p : {&l.moe.shared_gate, &l.moe.shared_up, &l.moe.shared_down}) visit(*p);
}
}  // namespace npullm::model
