// Writing loaded (typically quantized-at-load) weights back to disk, so a quantized model is
// reused without quantizing again (npullm_quantize is the program):
//
//   auto w = model_weights<bfloat16>::load(dir, {.projections = quantization{int4_sym, 128}});
//   save_safetensors(*w, "out-dir");   // config.json + model.safetensors, read by load("out-dir")
//   save_gguf(*w, "model.gguf");       // llama.cpp's layout: q8_0 / q4_0 / dense matrices
//
// Quantized matrices are named as io/quantized_safetensors.hpp says (read back by
// model_weights::load, zero-copy).
// Dense tensors keep their names and W's dtype; biases are written in W (they came from W).
// Tensors are ordered F32, then 16-bit, then bytes, so each lies aligned with no gaps.
//
// GGUF: general.architecture qwen2 | qwen3 | llama (their mixtures of experts: qwen2moe,
// qwen3moe, llama with expert_count, as llama.cpp names them: each layer's experts of one part
// in one 3-D tensor, the router F32) and the <arch>.* keys gguf_model_config reads; F32
// norms and biases; matrices as their GGUF type (Q8_0, Q4_0, Q4_K, Q6_K) or dense W; Llama's
// Q and K (weights and biases) row-permuted as llama.cpp's converter stores them. int8_sym /
// int4_sym matrices have no GGUF type (unsupported). Tokenizer metadata is written only when a
// vocabulary file is given: every `tokenizer.*` key of that GGUF (a model or a vocabulary-only
// file, e.g. the original model's), so that text/tokenizer.hpp and llama.cpp can read it; its
// token count must not exceed the model's vocab_size (invalid_argument).
// Phi-3's fused matrices and the other families are refused (unsupported). safetensors: a
// mixture's experts by HF name (Mixtral's block_sparse_moe.experts.N.w1 / w3 / w2, the Qwen
// ones' mlp.experts.N.*_proj), its router in W.
#pragma once

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/io/gguf_writer.hpp"
#include "npullm/io/quantized_safetensors.hpp"
#include "npullm/model/gguf_model.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/model/weights.hpp"

namespace npullm::model {

namespace detail {

// Every tensor of a (non-Phi-3) decoder by HF name: a matrix, a W vector, an f32 bias, or an
// f32 matrix (a router; a shared expert's gate as (1, hidden)). An expert's matrix also says
// which (layer, part, expert) it is: GGUF stores a layer's experts of one part as one tensor.
template <storage_type W>
struct named_tensor {
  std::string name;
  const projection<W>* matrix = nullptr;
  dense_view<const W, 1> vector;
  std::span<const float> bias;
  dense_view<const float, 2> f32 = {};
  const std::vector<projection<W>>* experts = nullptr;  // the part's experts (matrix: one)
  std::size_t layer = 0, expert = 0;
  std::string_view part = {};  // "gate", "up", "down"
};

template <storage_type W>
std::vector<named_tensor<W>> named_tensors(const model_weights<W>& w, std::string_view what) {
  const model_config& c = w.config();
  if (c.family == model_family::phi3) {
    raise(error_code::unsupported, what, ": Phi-3's fused matrices are not written");
  }
  std::vector<named_tensor<W>> t;
  t.push_back({"model.embed_tokens.weight", &w.embed, {}, {}});
  for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
    const layer_weights<W>& lw = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", nullptr, lw.input_norm, {}});
    t.push_back({p + "self_attn.q_proj.weight", &lw.q, {}, {}});
    t.push_back({p + "self_attn.k_proj.weight", &lw.k, {}, {}});
    t.push_back({p + "self_attn.v_proj.weight", &lw.v, {}, {}});
    if (!lw.q_bias.empty()) {
      t.push_back({p + "self_attn.q_proj.bias", nullptr, {}, lw.q_bias});
      t.push_back({p + "self_attn.k_proj.bias", nullptr, {}, lw.k_bias});
      t.push_back({p + "self_attn.v_proj.bias", nullptr, {}, lw.v_bias});
    }
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", nullptr, lw.q_norm, {}});
      t.push_back({p + "self_attn.k_norm.weight", nullptr, lw.k_norm, {}});
    }
    t.push_back({p + "self_attn.o_proj.weight", &lw.o, {}, {}});
    if (!lw.o_bias.empty()) t.push_back({p + "self_attn.o_proj.bias", nullptr, {}, lw.o_bias});
    if (c.sandwich_norms) {
      t.push_back({p + "post_attention_layernorm.weight", nullptr, lw.attn_out_norm, {}});
      t.push_back({p + "pre_feedforward_layernorm.weight", nullptr, lw.post_norm, {}});
      t.push_back({p + "post_feedforward_layernorm.weight", nullptr, lw.mlp_out_norm, {}});
    } else {
      t.push_back({p + "post_attention_layernorm.weight", nullptr, lw.post_norm, {}});
    }
    if (!lw.moe.present()) {
      t.push_back({p + "mlp.gate_proj.weight", &lw.gate, {}, {}});
      t.push_back({p + "mlp.up_proj.weight", &lw.up, {}, {}});
      t.push_back({p + "mlp.down_proj.weight", &lw.down, {}, {}});
      continue;
    }
    // A mixture: the router, each expert's matrices (Mixtral's names for a Llama / Mistral
    // one), the shared expert and its gate.
    const moe::moe_weights<W>& m = lw.moe;
    const bool mixtral = c.family == model_family::llama || c.family == model_family::mistral;
    const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
    t.push_back({block + "gate.weight", nullptr, {}, {}, m.router});
    const std::pair<std::string_view, const std::vector<projection<W>>*> parts[] = {
        {"gate", &m.gate}, {"up", &m.up}, {"down", &m.down}};
    for (std::size_t e = 0; e < m.gate.size(); ++e) {
      const std::string x = block + "experts." + std::to_string(e) + ".";
      for (const auto& [part, list] : parts) {
        const std::string hf = mixtral ? (part == "gate" ? "w1"
                                          : part == "up" ? "w3"
                                                         : "w2")
                                       : std::string(part) + "_proj";
        t.push_back({x + hf + ".weight", &(*list)[e], {}, {}, {}, list, l, e, part});
      }
    }
    if (m.shared_gate.rows() != 0) {
      t.push_back({p + "mlp.shared_expert.gate_proj.weight", &m.shared_gate, {}, {}});
      t.push_back({p + "mlp.shared_expert.up_proj.weight", &m.shared_up, {}, {}});
      t.push_back({p + "mlp.shared_expert.down_proj.weight", &m.shared_down, {}, {}});
      t.push_back({p + "mlp.shared_expert_gate.weight",
                   nullptr,
                   {},
                   {},
                   dense_view<const float, 2>(m.shared_expert_gate.data(), 1, c.hidden_size)});
    }
  }
  t.push_back({"model.norm.weight", nullptr, w.final_norm, {}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", &w.lm_head, {}, {}});
  return t;
}

inline std::span<const std::byte> as_bytes_of(const void* p, std::size_t n) {
  return {static_cast<const std::byte*>(p), n};
}

inline std::string safetensors_dtype_name(npullm::dtype d) {
  return d == npullm::dtype::f32 ? "F32" : d == npullm::dtype::f16 ? "F16" : "BF16";
}

}  // namespace detail

// config.json + model.safetensors in dir (created if needed; each written under a temporary
// name and renamed).
template <storage_type W>
void save_safetensors(const model_weights<W>& w, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  struct entry {
    std::string name, dtype;
    std::vector<std::size_t> shape;
    std::span<const std::byte> bytes;
    int order;  // 0: 4-byte elements, 1: 2-byte, 2: bytes
  };
  std::vector<entry> entries;
  std::vector<std::vector<std::byte>> converted;  // biases and routers in W
  converted.reserve(6 * w.config().num_hidden_layers + 1);
  nlohmann::json meta = {{"format", "pt"}, {"generator", "npullm_quantize"}};
  const std::string wname = detail::safetensors_dtype_name(dtype_of<W>);
  const int worder = sizeof(W) == 4 ? 0 : 1;
  for (const auto& t : detail::named_tensors(w, "save_safetensors")) {
    if (t.matrix != nullptr && t.matrix->quantized) {
      const ops::quantized_view& q = *t.matrix->quantized;
      const bool i8 = q.format == ops::weight_format::int8_sym;
      entries.push_back({t.name, i8 ? "I8" : "U8", {q.rows, q.row_bytes()}, q.data, 2});
      if (!ops::is_block_format(q.format)) {
        const bool f16 = q.scale_type == npullm::dtype::f16;
        entries.push_back(
            {t.name + ".scales", f16 ? "F16" : "F32", {q.rows, q.groups()}, q.scales, f16 ? 1 : 0});
      }
      meta[io::quantized_metadata_key(t.name)] = io::quantized_metadata(q);
    } else if (t.matrix != nullptr) {
      const auto& v = t.matrix->w;
      entries.push_back({t.name,
                         wname,
                         {v.extent(0), v.extent(1)},
                         detail::as_bytes_of(v.data_handle(), v.size() * sizeof(W)),
                         worder});
    } else if (t.f32.data_handle() != nullptr) {  // a router: in W, as the checkpoint had it
      auto& b = converted.emplace_back(t.f32.size() * sizeof(W));
      for (std::size_t i = 0; i < t.f32.size(); ++i) {
        const W x = from_float<W>(t.f32.data_handle()[i]);
        std::memcpy(b.data() + i * sizeof(W), &x, sizeof(W));
      }
      entries.push_back({t.name, wname, {t.f32.extent(0), t.f32.extent(1)}, b, worder});
    } else if (!t.bias.empty()) {
      auto& b = converted.emplace_back(t.bias.size() * sizeof(W));
      for (std::size_t i = 0; i < t.bias.size(); ++i) {
        const W x = from_float<W>(t.bias[i]);
        std::memcpy(b.data() + i * sizeof(W), &x, sizeof(W));
      }
      entries.push_back({t.name, wname, {t.bias.size()}, b, worder});
    } else {
      entries.push_back({t.name,
                         wname,
                         {t.vector.extent(0)},
                         detail::as_bytes_of(t.vector.data_handle(), t.vector.size() * sizeof(W)),
                         worder});
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const entry& a, const entry& b) { return a.order < b.order; });
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = meta;
  std::size_t offset = 0;
  for (const entry& e : entries) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) raise(error_code::io, "cannot create ", dir.string(), ": ", ec.message());
  auto write_file = [&](const fs::path& final_path, auto&& body) {
    const fs::path tmp = fs::path(final_path).concat(".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) raise(error_code::io, "cannot write ", tmp.string());
      body(out);
      if (!out) raise(error_code::io, "writing ", tmp.string(), " failed");
    }
    fs::rename(tmp, final_path, ec);
    if (ec) raise(error_code::io, "cannot rename ", tmp.string(), ": ", ec.message());
  };
  write_file(dir / "model.safetensors", [&](std::ofstream& out) {
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const entry& e : entries) {
      out.write(reinterpret_cast<const char*>(e.bytes.data()),
                static_cast<std::streamsize>(e.bytes.size()));
    }
  });
  model_config c = w.config();
  c.torch_dtype = dtype_of<W>;
  write_file(dir / "config.json",
             [&](std::ofstream& out) { out << config_json(c).dump(2) << '\n'; });
}

// A GGUF file llama.cpp's loader reads the tensors of (see the top for what is refused).
template <storage_type W>
void save_gguf(const model_weights<W>& w, const std::filesystem::path& path,
               const std::filesystem::path& vocabulary = {}) {
  const model_config& c = w.config();
  detail::named_tensors(w, "save_gguf");  // refuses what is not written, before anything else
  const moe_config& moe = c.moe;
  const bool mixtral = moe.experts != 0 && c.family == model_family::mistral;  // as llama
  const model_family file_family = mixtral ? model_family::llama : c.family;   // Q/K permuted
  if (c.family != model_family::qwen2 && c.family != model_family::llama &&
      c.family != model_family::qwen3 && !mixtral) {
    raise(error_code::unsupported, "save_gguf: family ", to_string(c.family),
          " (npullm writes qwen2, qwen3 and llama GGUF files, and their mixtures of experts)");
  }
  if (!moe.layers.empty()) {
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!moe.in_layer(l)) {
        raise(error_code::unsupported, "save_gguf: layer ", l,
              " is dense in a mixture of experts (GGUF's experts are in every layer)");
      }
    }
  }
  if (c.rope_scaling.kind != ops::rope_kind::none) {
    raise(error_code::unsupported, "save_gguf: rope scaling ", ops::to_string(c.rope_scaling.kind),
          " is not written");
  }
  for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.window(l) != 0)
      raise(error_code::unsupported, "save_gguf: a sliding window on layer ", l);
  }
  const std::string arch =
      mixtral ? "llama"
              : std::string(to_string(c.family)) +
                    (moe.experts != 0 && c.family != model_family::llama ? "moe" : "");
  const std::string p = arch + ".";
  io::gguf_writer g;
  g.add("general.architecture", arch);
  g.add("general.name", "npullm_quantize");
  g.add(p + "block_count", static_cast<std::uint32_t>(c.num_hidden_layers));
  g.add(p + "context_length", static_cast<std::uint32_t>(c.max_position_embeddings));
  g.add(p + "embedding_length", static_cast<std::uint32_t>(c.hidden_size));
  g.add(p + "feed_forward_length", static_cast<std::uint32_t>(c.intermediate_size));
  g.add(p + "attention.head_count", static_cast<std::uint32_t>(c.num_attention_heads));
  g.add(p + "attention.head_count_kv", static_cast<std::uint32_t>(c.num_key_value_heads));
  g.add(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  g.add(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  g.add(p + "rope.dimension_count", static_cast<std::uint32_t>(c.head_dim));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    g.add(p + "attention.key_length", static_cast<std::uint32_t>(c.head_dim));
    g.add(p + "attention.value_length", static_cast<std::uint32_t>(c.head_dim));
  }
  if (moe.experts != 0) {
    g.add(p + "expert_count", static_cast<std::uint32_t>(moe.experts));
    g.add(p + "expert_used_count", static_cast<std::uint32_t>(moe.experts_per_token));
    const bool llama = arch == "llama";
    if (llama && moe.expert_intermediate_size != c.intermediate_size) {
      raise(error_code::unsupported,
            "save_gguf: a llama file's experts are of "
            "feed_forward_length ",
            c.intermediate_size, ", not ", moe.expert_intermediate_size);
    }
    if (!llama) {
      g.add(p + "expert_feed_forward_length",
            static_cast<std::uint32_t>(moe.expert_intermediate_size));
    }
    if (moe.shared_expert_intermediate_size != 0) {
      if (arch != "qwen2moe") {
        raise(error_code::unsupported, "save_gguf: a shared expert in a ", arch, " file");
      }
      g.add(p + "expert_shared_feed_forward_length",
            static_cast<std::uint32_t>(moe.shared_expert_intermediate_size));
    }
    // The reader's (and llama.cpp's) rule per architecture, unless the key says otherwise.
    if (moe.normalize_top_k != (arch != "qwen2moe"))
      g.add(p + "expert_weights_norm", moe.normalize_top_k);
  }
  g.add("general.quantization_version", std::uint32_t{2});
  std::unique_ptr<io::gguf_file> vocab;  // its keys' bytes stay mapped until g.write
  if (!vocabulary.empty()) {
    vocab = io::gguf_file::open(vocabulary);
    const auto* tokens = vocab->find_value("tokenizer.ggml.tokens");
    const auto* list = tokens ? std::get_if<io::gguf_array>(tokens) : nullptr;
    if (list == nullptr) {
      raise(error_code::invalid_argument, "save_gguf: vocabulary ", vocabulary.string(),
            " has no tokenizer.ggml.tokens array");
    }
    if (list->size() > c.vocab_size) {
      raise(error_code::invalid_argument, "save_gguf: vocabulary ", vocabulary.string(), " has ",
            list->size(), " tokens, more than the model's vocab_size ", c.vocab_size);
    }
    for (const auto& kv : vocab->header().metadata) {
      if (kv.key.starts_with("tokenizer."))
        g.add(std::string(kv.key), io::gguf_meta::from(kv.value));
    }
  }
  // Row r of the HF tensor goes to row dst(r) of the file.
  auto dst_row = [&](const std::string& hf, std::size_t r) {
    return gguf_rows_permuted(file_family, hf) ? llama_permuted_row(r, c.head_dim) : r;
  };
  // A matrix's GGUF type and bytes (rb: bytes per row).
  auto matrix_bytes = [&](const std::string& hf, const projection<W>& m, io::ggml_type& type,
                          std::size_t& rb) -> std::span<const std::byte> {
    if (m.quantized) {
      const auto gt = ggml_type_of(m.quantized->format);
      if (!gt) {
        raise(error_code::unsupported, "save_gguf: ", hf, " is ",
              ops::to_string(m.quantized->format),
              ", which GGUF has no type for (quantize to q8_0 or q4_0)");
      }
      type = *gt;
      rb = m.quantized->row_bytes();
      return m.quantized->data;
    }
    type = dtype_of<W> == npullm::dtype::f32   ? io::ggml_type::f32
           : dtype_of<W> == npullm::dtype::f16 ? io::ggml_type::f16
                                               : io::ggml_type::bf16;
    rb = m.cols() * sizeof(W);
    return detail::as_bytes_of(m.w.data_handle(), m.w.size() * sizeof(W));
  };
  for (const auto& t : detail::named_tensors(w, "save_gguf")) {
    if (t.experts != nullptr) {  // the layer's experts of this part, as one 3-D tensor
      if (t.expert != 0) continue;
      const projection<W>& first = t.experts->front();
      io::ggml_type type{};
      std::size_t rb = 0;
      std::vector<std::byte> all;
      for (const projection<W>& e : *t.experts) {
        io::ggml_type et{};
        const auto bytes = matrix_bytes(t.name, e, et, rb);
        if (et != (all.empty() ? et : type)) {
          raise(error_code::unsupported, "save_gguf: layer ", t.layer, "'s ", t.part,
                " experts are of different types (GGUF holds them in one tensor)");
        }
        type = et;
        all.insert(all.end(), bytes.begin(), bytes.end());
      }
      g.add_tensor(gguf_expert_tensor_name(t.layer, t.part), type,
                   {t.experts->size(), first.rows(), first.cols()}, std::move(all));
      continue;
    }
    const std::string name = gguf_tensor_name(t.name);
    if (t.f32.data_handle() != nullptr) {  // the router, the shared expert's gate: F32
      const bool vector = t.f32.extent(0) == 1;
      std::vector<std::byte> out(t.f32.size() * 4);
      std::memcpy(out.data(), t.f32.data_handle(), out.size());
      if (vector) {
        g.add_tensor(name, io::ggml_type::f32, {t.f32.extent(1)}, std::move(out));
      } else {
        g.add_tensor(name, io::ggml_type::f32, {t.f32.extent(0), t.f32.extent(1)}, std::move(out));
      }
      continue;
    }
    if (t.matrix != nullptr) {
      const projection<W>& m = *t.matrix;
      io::ggml_type type{};
      std::size_t rb = 0;
      const std::span<const std::byte> bytes = matrix_bytes(t.name, m, type, rb);
      if (gguf_rows_permuted(file_family, t.name)) {
        std::vector<std::byte> out(bytes.size());
        for (std::size_t r = 0; r < m.rows(); ++r)
          std::memcpy(out.data() + dst_row(t.name, r) * rb, bytes.data() + r * rb, rb);
        g.add_tensor(name, type, {m.rows(), m.cols()}, std::move(out));
      } else {
        g.add_tensor(name, type, {m.rows(), m.cols()}, bytes);
      }
      continue;
    }
    // Vectors as F32 (llama.cpp keeps norms and biases in F32).
    const std::size_t n = t.bias.empty() ? t.vector.extent(0) : t.bias.size();
    std::vector<std::byte> out(n * 4);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = t.bias.empty() ? to_float(t.vector(i)) : t.bias[i];
      std::memcpy(out.data() + dst_row(t.name, i) * 4, &x, 4);
    }
    g.add_tensor(name, io::ggml_type::f32, {n}, std::move(out));
  }
  g.write(path);
}

}  // namespace npullm::model
