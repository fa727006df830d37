// model_weights: a decoder's weights, loaded once from a model directory and shared.
//
//   auto w = model_weights<bfloat16>::load("models/qwen2-0.5b");   // shared_ptr<const ...>
//   causal_lm<config> target(w, {.max_sequence = 4096});
//   causal_lm<config> verifier(w, {.max_sequence = 512, .step_rows = 64});  // same memory
//
// Sharing is by std::shared_ptr<const model_weights>: the weights are immutable once loaded,
// and the last pipeline (or draft) holding them unmaps the files. Matrices are zero-copy views
// of the mapped safetensors; q/k/v biases are converted to f32 once. A backend whose device
// reads only its own memory (device_memory) gets a copy through copied_into(backend), owned
// by the copy.
//
// Every matrix is checked against config.json's shapes at load. One element type W for all
// matrices today; a per-tensor type (quantized weights) changes layer_weights and load() only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/safetensors.hpp"
#include "npullm/ops/linear.hpp"

namespace npullm::model {

// A projection's weight (N, K) as stored, and the packed copy (ops::packed_weights, owned by
// the pipeline that packs) that linear reads instead when there is one. The per-tensor unit:
// a quantized weight type changes this and project() only.
template <storage_type W>
struct projection {
  dense_view<const W, 2> w;
  const ops::packed_weights<W>* packed = nullptr;
};

// y = x W^T (+ bias), through the packed copy when there is one.
template <storage_type W, threading_policy Policy>
void project(dense_view<const float, 2> x, const projection<W>& p, dense_view<float, 2> y,
             std::span<const float> bias, const Policy& policy) {
  if (p.packed != nullptr) {
    ops::linear<W>(x, *p.packed, y, bias, policy);
  } else {
    ops::linear<W>(x, p.w, y, bias, policy);
  }
}

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
};

template <storage_type W>
class model_weights {
 public:
  using weight_type = W;

  // Reads config.json and the safetensors of `dir`; unsupported when a tensor is stored in
  // another dtype than W, corrupt_data when its shape is not what config.json implies.
  static std::shared_ptr<const model_weights> load(const std::filesystem::path& dir) {
    std::shared_ptr<model_weights> w(new model_weights(load_config(dir)));
    w->file_ = std::make_shared<const safetensors_model>(safetensors_model::open(dir));
    w->bind([&](const std::string& name, auto shape) { return w->mapped(name, shape); });
    return w;
  }

  // The same weights in memory `backend` allocates (for a backend whose device reads only its
  // own memory); the copy owns those buffers and keeps nothing of this one.
  template <class Backend>
  std::shared_ptr<const model_weights> copied_into(Backend& backend) const {
    std::shared_ptr<model_weights> w(new model_weights(config_));
    auto copy = [&](const auto& v) {
      using T = std::remove_const_t<typename std::remove_cvref_t<decltype(v)>::element_type>;
      auto buf = std::make_shared<typename Backend::template buffer<T, 1>>(
          backend.template allocate<T>(v.size()));
      std::copy_n(v.data_handle(), v.size(), buf->data());
      const T* p = buf->data();
      w->owned_.push_back(std::move(buf));
      return std::remove_cvref_t<decltype(v)>(p, v.extents());
    };
    w->embed = copy(embed);
    w->final_norm = copy(final_norm);
    w->lm_head = lm_head.data_handle() == embed.data_handle() ? w->embed : copy(lm_head);
    auto bias = [&](std::span<const float> b) -> std::span<const float> {
      if (b.empty()) return {};
      const auto v = copy(dense_view<const float, 1>(b.data(), b.size()));
      return {v.data_handle(), b.size()};
    };
    auto norm = [&](const dense_view<const W, 1>& n) {
      return n.data_handle() == nullptr ? n : copy(n);
    };
    for (const layer_weights<W>& l : layers) {
      layer_weights<W> c;
      c.input_norm = copy(l.input_norm);
      c.post_norm = copy(l.post_norm);
      for (auto [to, from] : {std::pair{&c.q, &l.q}, {&c.k, &l.k}, {&c.v, &l.v}, {&c.o, &l.o},
                              {&c.gate, &l.gate}, {&c.up, &l.up}, {&c.down, &l.down}}) {
        to->w = copy(from->w);
      }
      c.q_bias = bias(l.q_bias);
      c.k_bias = bias(l.k_bias);
      c.v_bias = bias(l.v_bias);
      c.o_bias = bias(l.o_bias);
      c.q_norm = norm(l.q_norm);
      c.k_norm = norm(l.k_norm);
      c.attn_out_norm = norm(l.attn_out_norm);
      c.mlp_out_norm = norm(l.mlp_out_norm);
      w->layers.push_back(c);
    }
    return w;
  }

  [[nodiscard]] const model_config& config() const noexcept { return config_; }

  dense_view<const W, 2> embed, lm_head;  // (vocab, hidden); lm_head may be embed (tied)
  dense_view<const W, 1> final_norm;      // (hidden)
  std::vector<layer_weights<W>> layers;

 private:
  explicit model_weights(model_config config) : config_(std::move(config)) {}

  // Every tensor through get(name, shape).
  template <class Get>
  void bind(Get&& get) {
    const auto& c = config_;
    const std::size_t h = c.hidden_size;
    auto v1 = [&](const std::string& name, std::size_t n) {
      return get(name, std::array<std::size_t, 1>{n});
    };
    auto v2 = [&](const std::string& name, std::size_t rows, std::size_t cols) {
      return get(name, std::array<std::size_t, 2>{rows, cols});
    };
    embed = v2("model.embed_tokens.weight", c.vocab_size, h);
    final_norm = v1("model.norm.weight", h);
    lm_head = c.tie_word_embeddings ? embed : v2("lm_head.weight", c.vocab_size, h);
    const std::size_t inter = c.intermediate_size, hd = c.head_dim;
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      layer_weights<W> lw;
      lw.input_norm = v1(p + "input_layernorm.weight", h);
      if (c.family == model_family::phi3) {
        // Fused: qkv_proj (q_size + 2 kv_size, hidden) rows q | k | v; gate_up_proj
        // (2 intermediate, hidden) rows gate | up.
        const auto qkv = v2(p + "self_attn.qkv_proj.weight", c.q_size() + 2 * c.kv_size(), h);
        lw.q.w = rows(qkv, 0, c.q_size());
        lw.k.w = rows(qkv, c.q_size(), c.q_size() + c.kv_size());
        lw.v.w = rows(qkv, c.q_size() + c.kv_size(), c.q_size() + 2 * c.kv_size());
        const auto gate_up = v2(p + "mlp.gate_up_proj.weight", 2 * inter, h);
        lw.gate.w = rows(gate_up, 0, inter);
        lw.up.w = rows(gate_up, inter, 2 * inter);
      } else {
        lw.q.w = v2(p + "self_attn.q_proj.weight", c.q_size(), h);
        lw.k.w = v2(p + "self_attn.k_proj.weight", c.kv_size(), h);
        lw.v.w = v2(p + "self_attn.v_proj.weight", c.kv_size(), h);
        lw.gate.w = v2(p + "mlp.gate_proj.weight", inter, h);
        lw.up.w = v2(p + "mlp.up_proj.weight", inter, h);
      }
      lw.o.w = v2(p + "self_attn.o_proj.weight", h, c.q_size());
      lw.down.w = v2(p + "mlp.down_proj.weight", h, inter);
      if (c.sandwich_norms) {
        lw.attn_out_norm = v1(p + "post_attention_layernorm.weight", h);
        lw.post_norm = v1(p + "pre_feedforward_layernorm.weight", h);
        lw.mlp_out_norm = v1(p + "post_feedforward_layernorm.weight", h);
      } else {
        lw.post_norm = v1(p + "post_attention_layernorm.weight", h);
      }
      if (c.qk_norm) {
        lw.q_norm = v1(p + "self_attn.q_norm.weight", hd);
        lw.k_norm = v1(p + "self_attn.k_norm.weight", hd);
      }
      if (c.attention_bias) {
        lw.q_bias = bias(v1(p + "self_attn.q_proj.bias", c.q_size()));
        lw.k_bias = bias(v1(p + "self_attn.k_proj.bias", c.kv_size()));
        lw.v_bias = bias(v1(p + "self_attn.v_proj.bias", c.kv_size()));
      }
      if (c.attention_output_bias) lw.o_bias = bias(v1(p + "self_attn.o_proj.bias", h));
      layers.push_back(lw);
    }
  }

  template <std::size_t Rank>
  dense_view<const W, Rank> mapped(const std::string& name, std::array<std::size_t, Rank> shape) {
    const tensor_info& info = file_->info(name);
    if (info.storage() != dtype_of<W>) {
      raise(error_code::unsupported, "causal_lm: ", name, " is stored as ", info.dtype,
            "; this pipeline is configured for ", to_string(dtype_of<W>), " weights");
    }
    auto v = file_->template view<W, Rank>(name);
    for (std::size_t r = 0; r < Rank; ++r) {
      if (v.extent(r) != shape[r]) {
        raise(error_code::corrupt_data, "causal_lm: ", name, " has shape ",
              npullm::detail::format_extents(v.extents()), ", config.json implies ",
              npullm::detail::format_list(shape));
      }
    }
    return v;
  }

  // A bias as f32, owned here.
  std::span<const float> bias(dense_view<const W, 1> v) {
    auto b = std::make_shared<tensor<float, 1>>(v.extent(0));
    for (std::size_t i = 0; i < v.extent(0); ++i) b->data()[i] = to_float(v(i));
    const std::span<const float> out(b->data(), v.extent(0));
    owned_.push_back(std::move(b));
    return out;
  }

  model_config config_;
  std::shared_ptr<const safetensors_model> file_;  // the mapping the views point into
  std::vector<std::shared_ptr<const void>> owned_;  // biases; device copies' buffers
};

// The element type the model directory stores its weights in (that of its embedding matrix;
// load() checks every other matrix against it): what to instantiate a pipeline for.
inline npullm::dtype stored_weight_type(const std::filesystem::path& dir) {
  const safetensors_model file = safetensors_model::open(dir);
  const tensor_info& info = file.info("model.embed_tokens.weight");
  const auto d = info.storage();
  if (!d) {
    raise(error_code::unsupported, "model ", dir.string(), ": model.embed_tokens.weight is stored as ",
          info.dtype, " (npullm reads F32, F16 and BF16)");
  }
  return *d;
}

// Loads the weights in the type the files store and calls fn(std::shared_ptr<const
// model_weights<W>>) with that W, one of float, float16 and bfloat16: the caller's pipeline
// type follows from decltype, so nobody opens the safetensors header to choose it.
//
//   model::with_stored_weights(dir, [&](auto weights) {
//     using W = typename decltype(weights)::element_type::weight_type;
//     causal_lm<pipeline_config<block_kv<W, 16>, dynamic_attention<>, W>> lm(weights, options);
//     ...
//   });
//
// Each of the three instantiations costs its compile time (about as much as one pipeline
// each); fn's result type must be the same for all three.
template <class Fn>
decltype(auto) with_stored_weights(const std::filesystem::path& dir, Fn&& fn) {
  switch (stored_weight_type(dir)) {
    case npullm::dtype::f32: return fn(model_weights<float>::load(dir));
    case npullm::dtype::f16: return fn(model_weights<float16>::load(dir));
    case npullm::dtype::bf16: break;
  }
  return fn(model_weights<bfloat16>::load(dir));
}

}  // namespace npullm::model
