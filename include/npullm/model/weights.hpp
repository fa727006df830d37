// model_weights: a decoder's weights, loaded once from a model directory and shared.
//
//   auto w = model_weights<bfloat16>::load("models/qwen2-0.5b");   // shared_ptr<const ...>
//   causal_lm<config> target(w, {.max_sequence = 4096});
//   causal_lm<config> verifier(w, {.max_sequence = 512, .step_rows = 64});  // same memory
//
// Sharing is by std::shared_ptr<const model_weights>: the weights are immutable once loaded,
// and the last pipeline (or draft) holding them unmaps the files. Matrices are zero-copy views
// of the mapped safetensors, but for those load_options::dense_huge_pages copies into huge
// pages (by default the ones decode reads in place); q/k/v biases are converted to f32 once. A
// backend whose device reads only its own memory (device_memory) gets a copy through
// copied_into(backend), owned by the copy.
//
// Every matrix is checked against config.json's shapes at load. One element type W for all
// matrices today; a per-tensor type (quantized weights) changes layer_weights and load() only.
//
// The parts, included here: a matrix and its products (projection.hpp), a layer's weights
// (layer_weights.hpp), a mixture's experts and their binding (moe/expert_weights.hpp), load
// options, quantization at load and stored_weight_type (load_options.hpp).
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
#include "npullm/model/layer_weights.hpp"
#include "npullm/model/load_options.hpp"
#include "npullm/model/projection.hpp"
#include "npullm/moe/expert_weights.hpp"
#include "npullm/ops/quant.hpp"

namespace npullm::model {

namespace detail {
template <storage_type W>
struct dense_huge_pages;  // dense_huge_pages.hpp: options.dense_huge_pages carried out
}  // namespace detail

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
    detail::dense_huge_pages<W>::copy(*w, options.dense_huge_pages);
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
    detail::dense_huge_pages<W>::copy(*w, options.dense_huge_pages);
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

  // Bytes of the dense matrices copied into huge-page memory at load (options.dense_huge_pages,
  // load_options.hpp); 0: every dense matrix is read in place from the file mapping.
  [[nodiscard]] std::size_t huge_page_copy_bytes() const noexcept { return huge_page_copy_bytes_; }

  projection<W> embed, lm_head;       // (vocab, hidden); lm_head may be embed (tied)
  dense_view<const W, 1> final_norm;  // (hidden)
  std::vector<layer_weights<W>> layers;

 private:
  enum class matrix_role { projection, embedding };
  friend struct detail::dense_huge_pages<W>;

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
      if (c.moe.in_layer(l)) {  // the experts (moe/expert_weights.hpp)
        moe::bind_experts<W>(
            c, p, lw.moe,
            [&](const std::string& name, std::size_t r, std::size_t k) {
              return mat(name, r, k, P);
            },
            f32, gguf_ != nullptr,
            [&](std::string_view part, std::size_t r, std::size_t k) {
              return gguf_experts(l, part, r, k);
            });
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
      owned_matrices_.emplace(owned->data(), owned_.size());
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
  std::map<const void*, std::size_t> owned_matrices_;  // a dense matrix owned: its owned_ slot
  std::size_t huge_page_copy_bytes_ = 0;
};

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

#include "npullm/model/dense_huge_pages.hpp"  // after model_weights, whose friend it is
