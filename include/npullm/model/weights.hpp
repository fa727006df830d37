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
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/io/quantized_safetensors.hpp"
#include "npullm/io/safetensors.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/gguf_model.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"
#include "npullm/ops/tiled_products.hpp"

namespace npullm::model {

// How a matrix is quantized at load (ops::quantize, round to nearest).
struct quantization {
  ops::weight_format format = ops::weight_format::int4_sym;  // q8_0, q4_0, int8_sym, int4_sym
  std::size_t group = 128;  // *_sym: 32, 64, 128, or 0 = one group per output channel (K)
  npullm::dtype scale_type = npullm::dtype::f16;  // *_sym: f16 or f32
};

// Options of model_weights::load. Quantization belongs to the weights (every pipeline over
// them runs the same quantized matrices), so it is chosen here, not per pipeline. A matrix the
// files already store quantized (npullm_quantize's safetensors) is used as stored.
struct load_options {
  // Every layer's q/k/v/o/gate/up/down (the Intel NPU recipe: int4_sym, group 128).
  std::optional<quantization> projections = std::nullopt;
  // The token embedding and the LM head (once when tied): the NPU recipe keeps them int8
  // (int8_sym, per channel). The gather dequantizes the rows it reads.
  std::optional<quantization> embedding_and_head = std::nullopt;
  // Keys of config.json or GGUF metadata to accept unread: names, or prefixes ending in '*'
  // ("_*"). Both readers refuse a key nobody has classified (it might change the math), and
  // tools add their own to fine-tuned checkpoints (`unsloth_version`, provenance keys starting
  // with `_`): list here those you know cannot change the forward pass.
  std::vector<std::string> accept_keys = {};
};

// A weight matrix (N, K): dense in W as stored, or quantized (a checked view of its blocks,
// zero-copy into a GGUF / quantized safetensors mapping, or owned by the weights when quantized
// or row-permuted at load), plus the packed copy that linear reads instead when there is one
// (owned by the pipeline that packs: ops::packed_weights for a dense W, ops::packed_quantized's
// int8 panels for a quantized one, read by steps of more than 16 rows). The per-tensor unit:
// project() dispatches on it at run time to W's dense linear or one of the quantized kernels.
template <storage_type W>
struct projection {
  dense_view<const W, 2> w;  // (N, K); empty when quantized
  const ops::packed_weights<W>* packed = nullptr;
  std::optional<ops::quantized_view> quantized;
  const ops::packed_quantized* packed_quantized = nullptr;  // of *quantized
  const ops::repacked_quantized* repacked = nullptr;        // of *quantized: its tiles

  [[nodiscard]] bool is_quantized() const noexcept { return quantized.has_value(); }
  [[nodiscard]] std::size_t rows() const noexcept {
    return quantized ? quantized->rows : w.extent(0);
  }
  [[nodiscard]] std::size_t cols() const noexcept {
    return quantized ? quantized->cols : w.extent(1);
  }
  // The first stored byte: identifies the tensor (a tied LM head has its embedding's).
  [[nodiscard]] const void* identity() const noexcept {
    return quantized ? static_cast<const void*>(quantized->data.data())
                     : static_cast<const void*>(w.data_handle());
  }
  // Bytes a product with it reads (data and scales).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return quantized ? quantized->data.size() + quantized->scales.size() : w.size() * sizeof(W);
  }
};

// Rows [r0, r1) of a matrix, zero-copy (Phi-3's fused projections).
template <storage_type W>
projection<W> row_range(const projection<W>& p, std::size_t r0, std::size_t r1) {
  projection<W> out;
  if (!p.quantized) {
    out.w = rows(p.w, r0, r1);
    return out;
  }
  const ops::quantized_view& q = *p.quantized;
  const std::size_t rb = q.row_bytes();
  const auto data = q.data.subspan(r0 * rb, (r1 - r0) * rb);
  if (ops::is_block_format(q.format)) {
    out.quantized.emplace(q.format, r1 - r0, q.cols, data);
  } else {
    const std::size_t sb = q.groups() * size_of(q.scale_type);
    out.quantized.emplace(q.format, r1 - r0, q.cols, data,
                          q.scales.subspan(r0 * sb, (r1 - r0) * sb), q.group, q.scale_type);
  }
  return out;
}

// y = x W^T (+ bias): the quantized kernel of the matrix's format (over its tiles when repacked,
// except steps of more than 16 rows where there are panels too; over its panels when packed),
// else W's linear through the packed copy when there is one.
template <storage_type W, threading_policy Policy>
void project(dense_view<const float, 2> x, const projection<W>& p, dense_view<float, 2> y,
             std::span<const float> bias, const Policy& policy) {
  if (p.repacked != nullptr && (p.packed_quantized == nullptr || x.extent(0) <= 16)) {
    ops::linear(x, *p.repacked, y, bias, policy);
  } else if (p.packed_quantized != nullptr) {
    ops::linear(x, *p.packed_quantized, y, bias, policy);
  } else if (p.quantized) {
    ops::linear(x, *p.quantized, y, bias, policy);
  } else if (p.packed != nullptr) {
    ops::linear<W>(x, *p.packed, y, bias, policy);
  } else {
    ops::linear<W>(x, p.w, y, bias, policy);
  }
}

// One of several projections of the same x (project_together).
template <storage_type W>
struct projection_into {
  const projection<W>* p;
  dense_view<float, 2> y;
  std::span<const float> bias;
};

// y_i = x W_i^T (+ bias_i) for projections that all read x (Q, K and V; gate and up). Where
// every one has tiles and x has at most 16 rows (a decode step, a small batch or a speculative
// verification), x is quantized once and all run as ONE parallel job over their tiles
// (ops/tiled_products.hpp): one fork and join instead of one per matrix, the threads' parts
// split over all their bytes. Each y equals project()'s bit for bit either way (the same
// tile kernel over the same quantized x), so nothing depends on which path ran.
template <storage_type W, threading_policy Policy>
void project_together(dense_view<const float, 2> x, std::span<const projection_into<W>> outs,
                      const Policy& policy) {
  const std::size_t m = x.extent(0);
  for (std::size_t i = 0; i < outs.size(); ++i) {  // all checked before any is written
    const projection_into<W>& o = outs[i];
    if (o.p == nullptr || o.p->cols() != x.extent(1) || o.y.extent(0) != m ||
        o.y.extent(1) != o.p->rows() || (!o.bias.empty() && o.bias.size() != o.p->rows())) {
      raise(error_code::invalid_shape, "project_together: projection ", i, ": x (", m, ", ",
            x.extent(1), "), W [", o.p ? o.p->rows() : 0, ", ", o.p ? o.p->cols() : 0, "], y (",
            o.y.extent(0), ", ", o.y.extent(1), "), bias [", o.bias.size(),
            "] (want y (M, N), bias empty or [N])");
    }
  }
  constexpr std::size_t most = 4;
  bool together = m >= 1 && m <= 16 && outs.size() >= 2 && outs.size() <= most &&
                  x.stride(1) == 1 && static_cast<std::size_t>(x.stride(0)) == x.extent(1) &&
                  x.extent(1) % 32 == 0;
  for (const projection_into<W>& o : outs) {
    together = together && o.p->repacked != nullptr && o.y.stride(1) == 1;
  }
  if (!together) {
    for (const projection_into<W>& o : outs) project(x, *o.p, o.y, o.bias, policy);
    return;
  }
  thread_local ops::tile_activations xa;  // (kept: no allocation per step)
  ops::quantize_for_tiles(x, xa);
  std::array<ops::tiled_product, most> ps{};
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const projection_into<W>& o = outs[i];
    ps[i] = {.w = o.p->repacked,
             .x = &xa,
             .m0 = 0,
             .m = m,
             .y = o.y.data_handle(),
             .ldy = static_cast<std::size_t>(o.y.stride(0)),
             .bias = o.bias.empty() ? nullptr : o.bias.data()};
  }
  ops::run_tiled_products(std::span<const ops::tiled_product>(ps.data(), outs.size()), policy);
}

// Rows ids of a (vocab, hidden) matrix as f32 (the embedding gather): quantized rows are
// dequantized as their format defines them.
template <storage_type W>
void gather_rows(std::span<const std::int32_t> ids, const projection<W>& table,
                 dense_view<float, 2> out) {
  if (table.quantized) {
    ops::gather(ids, *table.quantized, out);
  } else {
    ops::gather<W>(ids, table.w, out);
  }
}

namespace detail {

// Bytes owned by the weights: a matrix quantized or row-permuted at load, or a converted vector.
struct owned_bytes {
  std::vector<std::byte> data, scales;
};

// w (N, K) quantized as q asks, in chunks of rows (a bf16 embedding is not converted to f32
// whole). The view points into *out.
template <storage_type W>
ops::quantized_view quantize_matrix(dense_view<const W, 2> w, const quantization& q,
                                    owned_bytes& out) {
  const std::size_t n = w.extent(0), k = w.extent(1);
  const std::size_t group = q.group == 0 ? k : q.group;
  constexpr std::size_t chunk = 256;
  tensor<float, 2> f(std::min(chunk, std::max<std::size_t>(n, 1)), k);
  out.data.clear();
  out.scales.clear();
  for (std::size_t r0 = 0; r0 < n; r0 += chunk) {
    const std::size_t r1 = std::min(n, r0 + chunk);
    const W* src = w.data_handle() + r0 * k;
    float* dst = f.data();
    for (std::size_t i = 0; i < (r1 - r0) * k; ++i) dst[i] = to_float(src[i]);
    const auto m =
        ops::quantize(dense_view<const float, 2>(dst, r1 - r0, k), q.format, group, q.scale_type);
    out.data.insert(out.data.end(), m.data().begin(), m.data().end());
    out.scales.insert(out.scales.end(), m.scales().begin(), m.scales().end());
  }
  if (ops::is_block_format(q.format)) return ops::quantized_view(q.format, n, k, out.data);
  return ops::quantized_view(q.format, n, k, out.data, out.scales, group, q.scale_type);
}

}  // namespace detail

// A mixture-of-experts MLP's weights (config.moe): the router in f32 (the choice of experts
// turns on near-ties, so its logits are computed from the stored values without rounding them
// to W), each expert's three matrices (views of the GGUF's 3-D tensors' slabs, zero-copy, or
// of the per-expert safetensors), and Qwen2-MoE's shared expert with its sigmoid gate.
template <storage_type W>
struct moe_weights {
  dense_view<const float, 2> router;                  // (experts, hidden)
  std::vector<projection<W>> gate, up;                // [experts] (expert_intermediate, hidden)
  std::vector<projection<W>> down;                    // [experts] (hidden, expert_intermediate)
  projection<W> shared_gate, shared_up, shared_down;  // rows() == 0 without a shared expert
  std::span<const float> shared_expert_gate;          // (hidden); empty without one

  [[nodiscard]] bool present() const noexcept { return !gate.empty(); }
};

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
  moe_weights<W> moe;
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

template <storage_type W>
class model_weights {
 public:
  using weight_type = W;

  // Reads config.json and the safetensors of `dir`; unsupported when a dense tensor is stored
  // in another dtype than W, corrupt_data when a shape is not what config.json implies.
  // options.projections / embedding_and_head quantize those matrices at load (owned here; the
  // mapping of the dense ones is dropped). Matrices stored quantized by npullm_quantize (see
  // model/quantized_io.hpp) are read zero-copy as they are.
  static std::shared_ptr<const model_weights> load(const std::filesystem::path& dir,
                                                   const load_options& options = {}) {
    std::shared_ptr<model_weights> w(new model_weights(load_config(dir, options.accept_keys)));
    w->file_ = std::make_shared<const io::safetensors_model>(io::safetensors_model::open(dir));
    w->bind(
        [&](const std::string& name, std::size_t n) { return w->template mapped<1>(name, {n}); },
        [&](const std::string& name, std::size_t rows, std::size_t cols, matrix_role role) {
          const auto& q =
              role == matrix_role::projection ? options.projections : options.embedding_and_head;
          return w->safetensors_matrix(name, rows, cols, q);
        },
        [&](const std::string& name, std::size_t n) {
          return w->bias(w->template mapped<1>(name, {n}));
        },
        [&](const std::string& name, std::size_t rows, std::size_t cols) {
          return w->floats(w->template mapped<2>(name, {rows, cols}));
        });
    return w;
  }

  // Reads a llama.cpp GGUF file of a llama (also Mistral), qwen2, qwen3, gemma2 or phi3 model
  // (model/gguf_model.hpp): its hyperparameters, F32 / F16 / BF16 tensors as dense (a 2-D one
  // must be stored as W; 1-D norms of another float type are converted to W, biases to f32),
  // and Q8_0 / Q4_0 / Q4_K / Q6_K tensors as quantized views into the mapping (zero-copy;
  // Llama's Q and K, stored row-permuted, are copied once into HF order). Every tensor of
  // another type is refused up front, naming it and its type (unsupported); a missing tensor
  // or a shape other than the hyperparameters imply is corrupt_data; a tensor the model does not
  // read is unsupported naming it. options.accept_keys accepts metadata keys unread; quantizing
  // at load is for safetensors models (the file's tensors are used as stored), so
  // options.projections / embedding_and_head are refused here.
  static std::shared_ptr<const model_weights> load_gguf(const std::filesystem::path& path,
                                                        const load_options& options = {}) {
    if (options.projections || options.embedding_and_head) {
      raise(error_code::invalid_argument, "load_gguf ", path.string(),
            ": quantization at load applies to safetensors models; a GGUF's tensors are used "
            "as stored");
    }
    std::shared_ptr<const io::gguf_file> file = io::gguf_file::open(path);
    const gguf_model_info info = read_gguf_model(
        file->header(), [&](const io::gguf_tensor_info& t) { return file->bytes(t); },
        options.accept_keys);
    for (const io::gguf_tensor_info& t : file->tensors()) {
      if (!io::ggml_storage(t.type) && !gguf_weight_format(t.type)) {
        raise(error_code::unsupported, "GGUF ", file->path(), ": tensor '",
              io::detail::gguf_printable(t.name), "' is ", io::ggml_type_name(t.type),
              " (npullm runs F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
              "Q5_K, Q6_K, IQ4_NL and IQ4_XS; not the grid-based IQ1 / IQ2 / IQ3 types)");
      }
    }
    std::shared_ptr<model_weights> w(new model_weights(info.config));
    w->gguf_ = file;
    std::set<std::string, std::less<>> used(info.config_tensors.begin(), info.config_tensors.end());
    w->gguf_used_ = &used;
    w->bind([&](const std::string& name, std::size_t n) { return w->gguf_vector(name, n); },
            [&](const std::string& name, std::size_t rows, std::size_t cols, matrix_role) {
              return w->gguf_matrix(name, rows, cols);
            },
            [&](const std::string& name, std::size_t n) { return w->gguf_bias(name, n); },
            [&](const std::string& name, std::size_t rows, std::size_t cols) {
              return w->gguf_float_matrix(name, rows, cols);
            });
    w->gguf_used_ = nullptr;
    for (const io::gguf_tensor_info& t : file->tensors()) {
      if (!used.contains(t.name)) {
        raise(error_code::unsupported, "GGUF ", file->path(), ": tensor '",
              io::detail::gguf_printable(t.name), "' is not one npullm's ",
              to_string(info.config.family),
              " model reads (a tensor nobody reads might be part of the math)");
      }
    }
    return w;
  }

  // The same weights in memory `backend` allocates (for a backend whose device reads only its
  // own memory); the copy owns those buffers and keeps nothing of this one. Quantized weights
  // are refused (unsupported) for now: the device kernels read dense W.
  template <class Backend>
  std::shared_ptr<const model_weights> copied_into(Backend& backend) const {
    if (quantized_matrices() != 0) {
      raise(error_code::unsupported, "model_weights: ", quantized_matrices(),
            " quantized matrices; a device-memory backend runs dense weights only");
    }
    if (config_.moe.experts != 0) {
      raise(error_code::unsupported, "model_weights: a mixture of ", config_.moe.experts,
            " experts; a device-memory backend runs dense MLPs only");
    }
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
    auto matrix = [&](const projection<W>& p) {
      projection<W> c;
      c.w = copy(p.w);
      return c;
    };
    w->embed = matrix(embed);
    w->final_norm = copy(final_norm);
    w->lm_head = lm_head.identity() == embed.identity() ? w->embed : matrix(lm_head);
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
      for (auto [to, from] : {std::pair{&c.q, &l.q},
                              {&c.k, &l.k},
                              {&c.v, &l.v},
                              {&c.o, &l.o},
                              {&c.gate, &l.gate},
                              {&c.up, &l.up},
                              {&c.down, &l.down}}) {
        *to = matrix(*from);
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

  // How many matrices (embedding, LM head when untied, every projection and expert matrix) are
  // quantized.
  [[nodiscard]] std::size_t quantized_matrices() const noexcept {
    std::size_t n =
        embed.is_quantized() + (lm_head.identity() != embed.identity() && lm_head.is_quantized());
    for (const layer_weights<W>& l : layers)
      for_each_projection(l, [&](const projection<W>& p) { n += p.is_quantized(); });
    return n;
  }

  projection<W> embed, lm_head;       // (vocab, hidden); lm_head may be embed (tied)
  dense_view<const W, 1> final_norm;  // (hidden)
  std::vector<layer_weights<W>> layers;

 private:
  enum class matrix_role { projection, embedding };

  explicit model_weights(model_config config) : config_(std::move(config)) {}

  // Every tensor through vec(name, n), mat(name, rows, cols, role), bias(name, n) and
  // f32(name, rows, cols) (a small matrix as f32: the router), by its Hugging Face name; the
  // experts of a GGUF through gguf_experts.
  template <class Vec, class Mat, class Bias, class F32>
  void bind(Vec&& vec, Mat&& mat, Bias&& bias, F32&& f32) {
    const auto& c = config_;
    const std::size_t h = c.hidden_size;
    const auto P = matrix_role::projection;
    embed = mat("model.embed_tokens.weight", c.vocab_size, h, matrix_role::embedding);
    final_norm = vec("model.norm.weight", h);
    lm_head = c.tie_word_embeddings
                  ? embed
                  : mat("lm_head.weight", c.vocab_size, h, matrix_role::embedding);
    const std::size_t inter = c.intermediate_size, hd = c.head_dim;
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      layer_weights<W> lw;
      lw.input_norm = vec(p + "input_layernorm.weight", h);
      if (c.family == model_family::phi3) {
        // Fused: qkv_proj (q_size + 2 kv_size, hidden) rows q | k | v; gate_up_proj
        // (2 intermediate, hidden) rows gate | up.
        const auto qkv = mat(p + "self_attn.qkv_proj.weight", c.q_size() + 2 * c.kv_size(), h, P);
        lw.q = row_range(qkv, 0, c.q_size());
        lw.k = row_range(qkv, c.q_size(), c.q_size() + c.kv_size());
        lw.v = row_range(qkv, c.q_size() + c.kv_size(), c.q_size() + 2 * c.kv_size());
        const auto gate_up = mat(p + "mlp.gate_up_proj.weight", 2 * inter, h, P);
        lw.gate = row_range(gate_up, 0, inter);
        lw.up = row_range(gate_up, inter, 2 * inter);
      } else {
        lw.q = mat(p + "self_attn.q_proj.weight", c.q_size(), h, P);
        lw.k = mat(p + "self_attn.k_proj.weight", c.kv_size(), h, P);
        lw.v = mat(p + "self_attn.v_proj.weight", c.kv_size(), h, P);
        if (!c.moe.in_layer(l)) {
          lw.gate = mat(p + "mlp.gate_proj.weight", inter, h, P);
          lw.up = mat(p + "mlp.up_proj.weight", inter, h, P);
        }
      }
      lw.o = mat(p + "self_attn.o_proj.weight", h, c.q_size(), P);
      if (c.moe.in_layer(l)) {
        bind_moe(l, p, lw.moe, mat, f32);
      } else {
        lw.down = mat(p + "mlp.down_proj.weight", h, inter, P);
      }
      if (c.sandwich_norms) {
        lw.attn_out_norm = vec(p + "post_attention_layernorm.weight", h);
        lw.post_norm = vec(p + "pre_feedforward_layernorm.weight", h);
        lw.mlp_out_norm = vec(p + "post_feedforward_layernorm.weight", h);
      } else {
        lw.post_norm = vec(p + "post_attention_layernorm.weight", h);
      }
      if (c.qk_norm) {
        lw.q_norm = vec(p + "self_attn.q_norm.weight", hd);
        lw.k_norm = vec(p + "self_attn.k_norm.weight", hd);
      }
      if (c.attention_bias) {
        lw.q_bias = bias(p + "self_attn.q_proj.bias", c.q_size());
        lw.k_bias = bias(p + "self_attn.k_proj.bias", c.kv_size());
        lw.v_bias = bias(p + "self_attn.v_proj.bias", c.kv_size());
      }
      if (c.attention_output_bias) lw.o_bias = bias(p + "self_attn.o_proj.bias", h);
      layers.push_back(lw);
    }
  }

  // Layer l's experts (HF prefix p): Mixtral's block_sparse_moe (w1 gate, w3 up, w2 down) or
  // the Qwen mixtures' mlp.experts, the router, and Qwen2-MoE's shared expert.
  template <class Mat, class F32>
  void bind_moe(std::size_t l, const std::string& p, moe_weights<W>& m, Mat& mat, F32& f32) {
    const auto& c = config_;
    const std::size_t h = c.hidden_size, n = c.moe.experts, ff = c.moe.expert_intermediate_size;
    const auto P = matrix_role::projection;
    const bool mixtral = c.family == model_family::mistral || c.family == model_family::llama;
    const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
    m.router = f32(block + "gate.weight", n, h);
    if (gguf_) {
      m.gate = gguf_experts(l, "gate", ff, h);
      m.up = gguf_experts(l, "up", ff, h);
      m.down = gguf_experts(l, "down", h, ff);
    } else {
      for (std::size_t e = 0; e < n; ++e) {
        const std::string x = block + "experts." + std::to_string(e) + ".";
        m.gate.push_back(mat(x + (mixtral ? "w1.weight" : "gate_proj.weight"), ff, h, P));
        m.up.push_back(mat(x + (mixtral ? "w3.weight" : "up_proj.weight"), ff, h, P));
        m.down.push_back(mat(x + (mixtral ? "w2.weight" : "down_proj.weight"), h, ff, P));
      }
    }
    if (const std::size_t sf = c.moe.shared_expert_intermediate_size; sf != 0) {
      m.shared_gate = mat(p + "mlp.shared_expert.gate_proj.weight", sf, h, P);
      m.shared_up = mat(p + "mlp.shared_expert.up_proj.weight", sf, h, P);
      m.shared_down = mat(p + "mlp.shared_expert.down_proj.weight", h, sf, P);
      const auto g = f32(p + "mlp.shared_expert_gate.weight", 1, h);
      m.shared_expert_gate = {g.data_handle(), h};
    }
  }

  // A small matrix as f32, owned here.
  template <class T>
  dense_view<const float, 2> floats(dense_view<const T, 2> v) {
    auto owned = std::make_shared<tensor<float, 2>>(v.extent(0), v.extent(1));
    for (std::size_t i = 0; i < v.size(); ++i) owned->data()[i] = to_float(v.data_handle()[i]);
    const dense_view<const float, 2> out(owned->data(), v.extent(0), v.extent(1));
    owned_.push_back(std::move(owned));
    return out;
  }

  template <std::size_t Rank>
  dense_view<const W, Rank> mapped(const std::string& name, std::array<std::size_t, Rank> shape) {
    const io::tensor_info& info = file_->info(name);
    if (info.storage() != dtype_of<W>) {
      raise(error_code::unsupported, "causal_lm: ", name, " is stored as ", info.dtype,
            "; this pipeline is configured for ", to_string(dtype_of<W>), " weights");
    }
    auto v = file_->template view<W, Rank>(name);
    check_shape(name, v.extents(), shape);
    return v;
  }

  template <class Extents, std::size_t Rank>
  static void check_shape(const std::string& name, const Extents& e,
                          const std::array<std::size_t, Rank>& shape) {
    for (std::size_t r = 0; r < Rank; ++r) {
      if (e.extent(r) != shape[r]) {
        raise(error_code::corrupt_data, "causal_lm: ", name, " has shape ",
              npullm::detail::format_extents(e), ", the config implies ",
              npullm::detail::format_list(shape));
      }
    }
  }

  // A safetensors matrix: stored quantized (metadata entry, see quantized_io.hpp), or dense W,
  // quantized here when q asks.
  projection<W> safetensors_matrix(const std::string& name, std::size_t rows, std::size_t cols,
                                   const std::optional<quantization>& q) {
    projection<W> p;
    const io::safetensors_file& f = file_->file_of(name);
    const auto meta = f.header().metadata.find(io::quantized_metadata_key(name));
    if (meta != f.header().metadata.end()) {
      p.quantized = stored_quantized(f, name, meta->second, rows, cols);
      return p;
    }
    const auto dense = mapped<2>(name, {rows, cols});
    if (!q) {
      p.w = dense;
      return p;
    }
    auto owned = std::make_shared<detail::owned_bytes>();
    p.quantized = detail::quantize_matrix<W>(dense, *q, *owned);
    owned_.push_back(std::move(owned));
    return p;
  }

  // A matrix npullm_quantize stored (io/quantized_safetensors.hpp): `name` holds the codes
  // (bytes, any integer dtype), `name.scales` the symmetric formats' scales.
  ops::quantized_view stored_quantized(const io::safetensors_file& f, const std::string& name,
                                       const std::string& meta, std::size_t rows,
                                       std::size_t cols) {
    const io::quantized_metadata_fields q =
        io::parse_quantized_metadata(meta, "safetensors " + f.path() + ": tensor '" + name + "'");
    check_shape(name, dextents<2>(q.rows, q.cols), std::array<std::size_t, 2>{rows, cols});
    const auto data = raw_bytes(f, name);
    if (ops::is_block_format(q.format)) return ops::quantized_view(q.format, q.rows, q.cols, data);
    return ops::quantized_view(q.format, q.rows, q.cols, data, raw_bytes(f, name + ".scales"),
                               q.group, q.scale_type);
  }

  // A tensor's bytes in its file, through a second mapping of that file (safetensors_file
  // hands out views of float types only).
  std::span<const std::byte> raw_bytes(const io::safetensors_file& f, const std::string& name) {
    const io::tensor_info& t = f.info(name);
    auto it = maps_.find(f.path());
    if (it == maps_.end())
      it = maps_.emplace(f.path(), std::make_shared<io::mapped_file>(f.path())).first;
    return it->second->bytes().subspan(f.header().data_offset + t.begin, t.bytes());
  }

  // ---- GGUF ----

  // The GGUF tensor of an HF name, counted as read.
  const io::gguf_tensor_info& gguf_info(const std::string& hf_name) const {
    const std::string name = gguf_tensor_name(hf_name, config_.family);
    const io::gguf_tensor_info& t = gguf_->info(name);
    if (gguf_used_ != nullptr) gguf_used_->insert(std::string(t.name));
    return t;
  }
  void gguf_check_shape(const io::gguf_tensor_info& t, std::vector<std::size_t> want) const {
    if (t.shape() != want) {
      raise(error_code::corrupt_data, "GGUF ", gguf_->path(), ": tensor '", t.name, "' has shape ",
            npullm::detail::format_list(t.shape()), ", the hyperparameters imply ",
            npullm::detail::format_list(want));
    }
  }

  // The row HF row r lies in (Llama's Q and K are stored permuted; see gguf_model.hpp).
  std::size_t gguf_row(const std::string& hf_name, std::size_t r) const {
    return gguf_rows_permuted(config_.family, hf_name) ? llama_permuted_row(r, config_.head_dim)
                                                       : r;
  }

  projection<W> gguf_matrix(const std::string& hf_name, std::size_t rows, std::size_t cols) {
    const io::gguf_tensor_info& t = gguf_info(hf_name);
    gguf_check_shape(t, {rows, cols});
    const bool permuted = gguf_rows_permuted(config_.family, hf_name);
    projection<W> p;
    if (const auto fmt = gguf_weight_format(t.type)) {
      auto data = gguf_->bytes(t);
      if (permuted) {  // whole rows of blocks into HF order
        auto owned = std::make_shared<detail::owned_bytes>();
        const std::size_t rb = t.row_bytes();
        owned->data.resize(data.size());
        for (std::size_t r = 0; r < rows; ++r)
          std::copy_n(data.data() + gguf_row(hf_name, r) * rb, rb, owned->data.data() + r * rb);
        data = owned->data;
        owned_.push_back(std::move(owned));
      }
      p.quantized.emplace(*fmt, rows, cols, data);
      return p;
    }
    if (io::ggml_storage(t.type) != dtype_of<W>) {
      raise(error_code::unsupported, "GGUF ", gguf_->path(), ": tensor '", t.name, "' is ",
            io::ggml_type_name(t.type), "; model_weights<", to_string(dtype_of<W>),
            "> reads dense matrices stored as ", to_string(dtype_of<W>));
    }
    p.w = gguf_->template view<W, 2>(t.name);
    if (permuted) {
      auto owned = std::make_shared<tensor<W, 2>>(rows, cols);
      for (std::size_t r = 0; r < rows; ++r)
        std::copy_n(&p.w(gguf_row(hf_name, r), 0), cols, owned->data() + r * cols);
      p.w = dense_view<const W, 2>(owned->data(), rows, cols);
      owned_.push_back(std::move(owned));
    }
    return p;
  }

  // Every expert's (rows, cols) matrix of layer l's 3-D tensor (`part`: gate, up, down), each
  // a zero-copy view of its slab.
  std::vector<projection<W>> gguf_experts(std::size_t l, std::string_view part, std::size_t rows,
                                          std::size_t cols) {
    const std::string name = gguf_expert_tensor_name(l, part);
    const io::gguf_tensor_info& t = gguf_->info(name);
    if (gguf_used_ != nullptr) gguf_used_->insert(name);
    const std::size_t n = config_.moe.experts;
    gguf_check_shape(t, {n, rows, cols});
    std::vector<projection<W>> out(n);
    if (const auto fmt = gguf_weight_format(t.type)) {
      const auto data = gguf_->bytes(t);
      const std::size_t slab = rows * t.row_bytes();
      for (std::size_t e = 0; e < n; ++e)
        out[e].quantized.emplace(*fmt, rows, cols, data.subspan(e * slab, slab));
      return out;
    }
    if (io::ggml_storage(t.type) != dtype_of<W>) {
      raise(error_code::unsupported, "GGUF ", gguf_->path(), ": tensor '", t.name, "' is ",
            io::ggml_type_name(t.type), "; model_weights<", to_string(dtype_of<W>),
            "> reads dense matrices stored as ", to_string(dtype_of<W>));
    }
    const auto all = gguf_->template view<W, 3>(t.name);
    for (std::size_t e = 0; e < n; ++e)
      out[e].w = dense_view<const W, 2>(&all(e, 0, 0), rows, cols);
    return out;
  }

  // A float matrix (F32 / F16 / BF16) as f32, owned here; a (1, cols) one may be stored 1-D.
  dense_view<const float, 2> gguf_float_matrix(const std::string& hf_name, std::size_t rows,
                                               std::size_t cols) {
    const io::gguf_tensor_info& t = gguf_info(hf_name);
    if (!(rows == 1 && t.shape() == std::vector<std::size_t>{cols}))
      gguf_check_shape(t, {rows, cols});
    if (!io::ggml_storage(t.type)) {
      raise(error_code::unsupported, "GGUF ", gguf_->path(), ": tensor '", t.name, "' is ",
            io::ggml_type_name(t.type), " (the router must be F32, F16 or BF16)");
    }
    const auto v = detail::gguf_tensor_values(t, gguf_->bytes(t));
    auto owned = std::make_shared<tensor<float, 2>>(rows, cols);
    for (std::size_t i = 0; i < rows * cols; ++i) owned->data()[i] = static_cast<float>(v[i]);
    const dense_view<const float, 2> out(owned->data(), rows, cols);
    owned_.push_back(std::move(owned));
    return out;
  }

  // A 1-D float tensor's values as f32 (in HF row order).
  std::vector<float> gguf_floats(const std::string& hf_name, std::size_t n) const {
    const io::gguf_tensor_info& t = gguf_info(hf_name);
    gguf_check_shape(t, {n});
    if (!io::ggml_storage(t.type)) {
      raise(error_code::unsupported, "GGUF ", gguf_->path(), ": tensor '", t.name, "' is ",
            io::ggml_type_name(t.type), " (a vector must be F32, F16 or BF16)");
    }
    std::vector<float> out(n);
    auto read = [&](auto tag) {
      using T = decltype(tag);
      const auto v = gguf_->template view<T, 1>(t.name);
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(v(gguf_row(hf_name, i)));
    };
    switch (*io::ggml_storage(t.type)) {
      case npullm::dtype::f32: read(float{}); break;
      case npullm::dtype::f16: read(float16{}); break;
      case npullm::dtype::bf16: read(bfloat16{}); break;
    }
    return out;
  }

  dense_view<const W, 1> gguf_vector(const std::string& hf_name, std::size_t n) {
    const io::gguf_tensor_info& t = gguf_info(hf_name);
    if (io::ggml_storage(t.type) == dtype_of<W> && !gguf_rows_permuted(config_.family, hf_name)) {
      gguf_check_shape(t, {n});
      return gguf_->template view<W, 1>(t.name);
    }
    const auto f = gguf_floats(hf_name, n);  // converted to W once (norms: small)
    auto owned = std::make_shared<tensor<W, 1>>(n);
    for (std::size_t i = 0; i < n; ++i) owned->data()[i] = from_float<W>(f[i]);
    const dense_view<const W, 1> v(owned->data(), n);
    owned_.push_back(std::move(owned));
    return v;
  }

  std::span<const float> gguf_bias(const std::string& hf_name, std::size_t n) {
    const auto f = gguf_floats(hf_name, n);
    auto owned = std::make_shared<tensor<float, 1>>(n);
    std::copy(f.begin(), f.end(), owned->data());
    const std::span<const float> out(owned->data(), n);
    owned_.push_back(std::move(owned));
    return out;
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
  std::shared_ptr<const io::safetensors_model> file_;        // the mapping the views point into
  std::shared_ptr<const io::gguf_file> gguf_;                // or the GGUF file's
  std::set<std::string, std::less<>>* gguf_used_ = nullptr;  // during load_gguf: tensors read
  std::map<std::string, std::shared_ptr<const io::mapped_file>> maps_;  // quantized safetensors
  // Biases; matrices quantized or permuted at load; converted norms; device copies' buffers.
  std::vector<std::shared_ptr<const void>> owned_;
};

// The element type W that model_weights<W>::load_gguf needs for a GGUF file: that of its dense
// matrices (2-D F32 / F16 / BF16 tensors, which load_gguf requires stored as W), or f32 when
// every matrix is quantized (W is then only the norms' type; llama.cpp stores them F32, so they
// are read zero-copy).
inline npullm::dtype stored_weight_type(const io::gguf_file& file) {
  for (const io::gguf_tensor_info& t : file.tensors()) {
    if (t.n_dims < 2) continue;
    if (const auto d = io::ggml_storage(t.type)) return *d;
  }
  return npullm::dtype::f32;
}

// The element type a model stores its weights in: what to instantiate a pipeline for. `path` is
// a model directory (config.json + safetensors: the type of its embedding matrix, which load()
// checks every other matrix against; a quantized model's W is that of its norms) or a GGUF file
// (see the overload above).
inline npullm::dtype stored_weight_type(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) return stored_weight_type(*io::gguf_file::open(path));
  const io::safetensors_model file = io::safetensors_model::open(path);
  // A quantized embedding (npullm_quantize): the final norm's type is W.
  const bool quantized =
      file.file_of("model.embed_tokens.weight")
          .header()
          .metadata.contains(io::quantized_metadata_key("model.embed_tokens.weight"));
  const io::tensor_info& info =
      file.info(quantized ? "model.norm.weight" : "model.embed_tokens.weight");
  const auto d = info.storage();
  if (!d) {
    raise(error_code::unsupported, "model ", path.string(), ": ", info.name, " is stored as ",
          info.dtype, " (npullm reads F32, F16 and BF16)");
  }
  return *d;
}

// Loads the weights in the type the files store and calls fn(std::shared_ptr<const
// model_weights<W>>) with that W, one of float, float16 and bfloat16: the caller's pipeline
// type follows from decltype, so nobody opens the safetensors header to choose it. `path` is a
// model directory (load) or a GGUF file (load_gguf).
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
decltype(auto) with_stored_weights(const std::filesystem::path& path, Fn&& fn) {
  const bool gguf = std::filesystem::is_regular_file(path);
  auto load = [&](auto tag) {
    using W = decltype(tag);
    return gguf ? model_weights<W>::load_gguf(path) : model_weights<W>::load(path);
  };
  switch (stored_weight_type(path)) {
    case npullm::dtype::f32: return fn(load(float{}));
    case npullm::dtype::f16: return fn(load(float16{}));
    case npullm::dtype::bf16: break;
  }
  return fn(load(bfloat16{}));
}

}  // namespace npullm::model
