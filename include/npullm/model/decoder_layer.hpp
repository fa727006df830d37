// decoder_layer: one decoder layer of any supported family over a step's rows, as a free
// function of its weights, the activations and an attention callable.
//
//   h = rms_norm(x);  q, k, v = h W_q (+ b_q), h W_k (+ b_k), h W_v (+ b_v)
//   q, k = rms_norm per head (Qwen 3's q_norm / k_norm);  rope(q, k)
//   attend(segment, io, kh, vh)        per segment of the rows: attention into io.out, and
//                                      whatever the caller keeps of the segment's K/V
//   a = att W_o (+ b_o);  a = rms_norm(a) (Gemma 2's sandwich);  x += a
//   m = down(act(rms_norm(x) W_gate) * rms_norm(x) W_up);  m = rms_norm(m) (Gemma 2);  x += m
//   (a mixture-of-experts layer: m = moe_mlp(rms_norm(x)), moe/mlp.hpp)
//
// act is silu or gelu_tanh (config.hidden_act); every rms_norm scales by (1 + w) where the
// family says so (Gemma 2); the attention scale is config.attention_scale().
//
// The rows form one segment unless the step packs independent sequences. q is handed over
// head-major (heads, rows, head_dim); the segment's own K/V (kv_heads, rows, head_dim) are
// rounded to KvT, the KV cache's format (K and V each to its part's format; quantized formats:
// quantized and dequantized per 32-element group, kv::round_trip), so the rows of one step see
// what a later step reads back from the cache. Attention (which KV, which mask) and the KV
// write-back are the caller's: a layer kind with another attention (sliding window, ...) is
// another attend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "npullm/attention/flash.hpp"
#include "npullm/core/dtype.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/model/activations.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/moe/mlp.hpp"
#include "npullm/ops/gelu_mul.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/rms_norm.hpp"
#include "npullm/ops/rope.hpp"
#include "npullm/ops/silu_mul.hpp"

namespace npullm::model {

// Rows [begin, begin + rows) of a step.
template <class S>
concept row_segment = requires(const S& s) {
  { s.begin } -> std::convertible_to<std::size_t>;
  { s.rows } -> std::convertible_to<std::size_t>;
};

// attend(const Segment&, const attention::attention_io&, dense_view<float, 3> kh,
//        dense_view<float, 3> vh)
template <kv::kv_format KvT, storage_type W, class Backend, row_segment Segment, class Attend>
void decoder_layer(const layer_weights<W>& w, activations<Backend>& a, const model_config& cfg,
                   const ops::rope_table& rope, std::span<const std::int64_t> positions,
                   std::size_t S, std::span<const Segment> segments, const pool_policy& policy,
                   Attend&& attend) {
  const std::size_t D = cfg.head_dim;
  const std::size_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads;
  auto x = rows(a.x.view(), 0, S);  // (S, hidden)
  auto h = rows(a.h.view(), 0, S);  // (S, hidden)
  auto q = rows(a.q.view(), 0, S);  // (S, q_size)
  auto k = rows(a.k.view(), 0, S);  // (S, kv_size)
  auto v = rows(a.v.view(), 0, S);  // (S, kv_size)

  const float eps = static_cast<float>(cfg.rms_norm_eps);
  const float norm_offset = cfg.norm_unit_offset ? 1.0f : 0.0f;
  auto norm = [&](dense_view<const float, 2> in, const dense_view<const W, 1>& weight,
                  dense_view<float, 2> out) {
    ops::rms_norm<W>(in, weight, eps, out, norm_offset);
  };
  norm(x, w.input_norm, h);
  const projection_into<W> qkv[] = {{&w.q, q, w.q_bias}, {&w.k, k, w.k_bias}, {&w.v, v, w.v_bias}};
  project_together<W>(h, qkv, policy);
  if (w.q_norm.data_handle() != nullptr) {  // per head: (S * heads, D) rows
    const dense_view<float, 2> qr(q.data_handle(), S * hq, D), kr(k.data_handle(), S * hkv, D);
    norm(qr, w.q_norm, qr);
    norm(kr, w.k_norm, kr);
  }
  ops::apply_rope(dense_view<float, 3>(q.data_handle(), S, hq, D), positions, rope);
  ops::apply_rope(dense_view<float, 3>(k.data_handle(), S, hkv, D), positions, rope);

  // Head-major copies, one contiguous block per segment.
  const float scale = static_cast<float>(cfg.attention_scale());
  for (const Segment& g : segments) {
    const dense_view<float, 3> qh(a.qh.data() + g.begin * hq * D, hq, g.rows, D);  // (hq, rows, D)
    const dense_view<float, 3> kh(a.kh.data() + g.begin * hkv * D, hkv, g.rows,
                                  D);  // (hkv, rows, D)
    const dense_view<float, 3> vh(a.vh.data() + g.begin * hkv * D, hkv, g.rows,
                                  D);  // (hkv, rows, D)
    const dense_view<float, 3> att(a.att.data() + g.begin * hq * D, hq, g.rows,
                                   D);  // (hq, rows, D)
    for (std::size_t r = 0; r < g.rows; ++r) {
      for (std::size_t hh = 0; hh < hq; ++hh)
        std::copy_n(&q(g.begin + r, hh * D), D, &qh(hh, r, 0));
      for (std::size_t hh = 0; hh < hkv; ++hh) {
        // At the cache's precision (nothing to do for f32): later steps read these K/V back
        // from the cache, so the rows of one step (a prefill, a speculative verify pass) see
        // what token-by-token decoding sees, and greedy verification agrees with plain
        // decoding exactly.
        std::copy_n(&k(g.begin + r, hh * D), D, &kh(hh, r, 0));
        std::copy_n(&v(g.begin + r, hh * D), D, &vh(hh, r, 0));
        kv::round_trip<kv::key_format_t<KvT>>(&kh(hh, r, 0), D);
        kv::round_trip<kv::value_format_t<KvT>>(&vh(hh, r, 0), D);
      }
    }
    attention::attention_io io{qh, att, {}, scale};
    io.softcap = static_cast<float>(cfg.attn_logit_softcapping);  // 0: none (Gemma 2: 50)
    attend(g, io, kh, vh);
  }
  // Back to rows (S, hq * D), then the o projection into h and the residual.
  for (const Segment& g : segments) {
    const dense_view<float, 3> att(a.att.data() + g.begin * hq * D, hq, g.rows, D);
    for (std::size_t r = 0; r < g.rows; ++r) {
      for (std::size_t hh = 0; hh < hq; ++hh)
        std::copy_n(&att(hh, r, 0), D, &q(g.begin + r, hh * D));
    }
  }
  auto add_into = [](dense_view<float, 2> y, dense_view<const float, 2> z) {
    float* p = y.data_handle();
    const float* s = z.data_handle();
    for (std::size_t i = 0; i < y.size(); ++i) p[i] += s[i];
  };
  project(q, w.o, h, w.o_bias, policy);
  if (w.attn_out_norm.data_handle() != nullptr) norm(h, w.attn_out_norm, h);
  add_into(x, h);
  // MLP.
  norm(x, w.post_norm, h);
  if (w.moe.present()) {  // a mixture of experts (moe/mlp.hpp)
    const std::size_t H = cfg.hidden_size;
    const dense_view<float, 2> y(a.moe_out.data(), S, H);
    moe::moe_mlp(w.moe, cfg, h, y,
                 moe::moe_buffers{a.gate.data(), a.up.data(), a.expert_in.data(),
                                  a.expert_out.data(), a.expert_in.view().extent(0)},
                 a.moe, policy);
    add_into(x, y);
    return;
  }
  const dense_view<float, 2> gt(a.gate.data(), S, cfg.intermediate_size);  // (S, intermediate)
  const dense_view<float, 2> up(a.up.data(), S, cfg.intermediate_size);    // (S, intermediate)
  const projection_into<W> gate_up[] = {{&w.gate, gt, {}}, {&w.up, up, {}}};
  project_together<W>(h, gate_up, policy);
  if (cfg.hidden_act == activation_kind::gelu_tanh) {
    ops::gelu_tanh_mul(gt, up, gt);
  } else {
    ops::silu_mul(gt, up, gt);
  }
  project(gt, w.down, h, {}, policy);
  if (w.mlp_out_norm.data_handle() != nullptr) norm(h, w.mlp_out_norm, h);
  add_into(x, h);
}

}  // namespace npullm::model
