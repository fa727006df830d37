// gguf_model: what a llama.cpp GGUF file of a Qwen2 or Llama decoder means to npullm's pipeline:
// its hyperparameters as a model_config, its tensor names as the Hugging Face names the
// pipeline binds, its tensor types as weight formats, and llama.cpp's Q/K row permutation.
//
//   gguf_model_config(file)      general.architecture = qwen2 | llama and the <arch>.* keys
//   gguf_tensor_name(hf_name)    "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"
//   gguf_weight_format(type)     Q8_0, Q4_0/1, Q5_0/1, Q2_K..Q6_K, IQ4_NL/XS -> ops::weight_format
//   llama_permuted_row(r, D)     where HF row r of a Q or K projection lies in a llama GGUF
//
// Keys read (<arch> = general.architecture): block_count, embedding_length,
// feed_forward_length, attention.head_count, attention.head_count_kv (default: head_count),
// attention.layer_norm_rms_epsilon, rope.freq_base (default 10000), context_length (default
// 2048), attention.key_length / value_length and rope.dimension_count (when present, each must
// equal the head dim). vocab_size is the token embedding's row count. Refused (unsupported,
// naming the key or tensor): another architecture; rope.scaling.type other than none, and a
// rope_freqs tensor (llama.cpp's Llama 3 RoPE factors: not implemented here); expert_count > 0.
// Tokenizer metadata is ignored.
//
// llama.cpp's converter stores Llama's Q and K weights (and biases) with the rows of each head
// permuted for its interleaved (GPT-J style) RoPE: a head's rows, viewed as (2, D/2) (HF's
// rotate-half pairs i and i + D/2), are transposed to (D/2, 2), so that the pair becomes two
// adjacent rows. HF row h·D + i·D/2 + j (i in {0, 1}, j < D/2) is GGUF row h·D + 2j + i. K
// uses the KV head count. Qwen2 is converted without it (llama.cpp runs it with NEOX RoPE,
// which is rotate-half).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "npullm/core/error.hpp"
#include "npullm/model/config.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/ops/quant.hpp"

namespace npullm::model {

// The quantized format of a GGUF tensor type the pipeline runs.
constexpr std::optional<ops::weight_format> gguf_weight_format(io::ggml_type t) noexcept {
  switch (t) {
    case io::ggml_type::q8_0: return ops::weight_format::q8_0;
    case io::ggml_type::q4_0: return ops::weight_format::q4_0;
    case io::ggml_type::q4_k: return ops::weight_format::q4_k;
    case io::ggml_type::q6_k: return ops::weight_format::q6_k;
    case io::ggml_type::q4_1: return ops::weight_format::q4_1;
    case io::ggml_type::q5_0: return ops::weight_format::q5_0;
    case io::ggml_type::q5_1: return ops::weight_format::q5_1;
    case io::ggml_type::q5_k: return ops::weight_format::q5_k;
    case io::ggml_type::q3_k: return ops::weight_format::q3_k;
    case io::ggml_type::q2_k: return ops::weight_format::q2_k;
    case io::ggml_type::iq4_nl: return ops::weight_format::iq4_nl;
    case io::ggml_type::iq4_xs: return ops::weight_format::iq4_xs;
    default: return std::nullopt;
  }
}

// The GGUF type of a block format (the symmetric formats have none).
constexpr std::optional<io::ggml_type> ggml_type_of(ops::weight_format f) noexcept {
  switch (f) {
    case ops::weight_format::q8_0: return io::ggml_type::q8_0;
    case ops::weight_format::q4_0: return io::ggml_type::q4_0;
    case ops::weight_format::q4_k: return io::ggml_type::q4_k;
    case ops::weight_format::q6_k: return io::ggml_type::q6_k;
    case ops::weight_format::q4_1: return io::ggml_type::q4_1;
    case ops::weight_format::q5_0: return io::ggml_type::q5_0;
    case ops::weight_format::q5_1: return io::ggml_type::q5_1;
    case ops::weight_format::q5_k: return io::ggml_type::q5_k;
    case ops::weight_format::q3_k: return io::ggml_type::q3_k;
    case ops::weight_format::q2_k: return io::ggml_type::q2_k;
    case ops::weight_format::iq4_nl: return io::ggml_type::iq4_nl;
    case ops::weight_format::iq4_xs: return io::ggml_type::iq4_xs;
    case ops::weight_format::int8_sym:
    case ops::weight_format::int4_sym: return std::nullopt;
  }
  return std::nullopt;
}

// The row of a llama GGUF Q/K projection (head_dim D) that holds HF row r (see the top).
constexpr std::size_t llama_permuted_row(std::size_t r, std::size_t head_dim) noexcept {
  const std::size_t half = head_dim / 2, h = r / head_dim, i = (r % head_dim) / half, j = r % half;
  return h * head_dim + 2 * j + i;
}

// The GGUF name of a tensor the pipeline binds by its Hugging Face name ("" for a name with
// no GGUF counterpart).
inline std::string gguf_tensor_name(std::string_view hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  constexpr std::string_view layers = "model.layers.";
  if (hf.substr(0, layers.size()) != layers) return "";
  const std::string_view rest = hf.substr(layers.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return "";
  const std::string_view layer = rest.substr(0, dot), part = rest.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> parts[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [from, to] : parts) {
    if (part == from) return "blk." + std::string(layer) + "." + std::string(to);
  }
  return "";
}

// Whether HF tensor `hf` of a model of family f is stored row-permuted in a GGUF file.
inline bool gguf_rows_permuted(model_family f, std::string_view hf) {
  if (f != model_family::llama) return false;
  auto ends = [&](std::string_view s) {
    return hf.size() >= s.size() && hf.substr(hf.size() - s.size()) == s;
  };
  return ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias") ||
         ends("self_attn.k_proj.weight") || ends("self_attn.k_proj.bias");
}

inline model_config gguf_model_config(const io::gguf_file& f) {
  const std::string file = f.path();
  auto refuse = [&](const auto&... args) {
    raise(error_code::unsupported, "GGUF ", file, ": ", args...);
  };
  const std::string arch(f.get<std::string_view>("general.architecture"));
  model_config c;
  if (arch == "qwen2") {
    c.family = model_family::qwen2;
  } else if (arch == "llama") {
    c.family = model_family::llama;
  } else {
    refuse("general.architecture '", arch, "' (npullm reads qwen2 and llama GGUF files)");
  }
  const std::string p = arch + ".";
  auto size = [&](const std::string& key) {
    const std::uint64_t v = f.get_uint(p + key);
    if (v == 0) raise(error_code::corrupt_data, "GGUF ", file, ": ", p + key, " is 0");
    return static_cast<std::size_t>(v);
  };
  c.num_hidden_layers = size("block_count");
  c.hidden_size = size("embedding_length");
  c.intermediate_size = size("feed_forward_length");
  c.num_attention_heads = size("attention.head_count");
  c.num_key_value_heads = f.find_uint(p + "attention.head_count_kv")
                              ? size("attention.head_count_kv")
                              : c.num_attention_heads;
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    raise(error_code::corrupt_data, "GGUF ", file, ": head_count ", c.num_attention_heads,
          " is not a multiple of head_count_kv ", c.num_key_value_heads);
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  if (f.find_uint(p + "attention.key_length")) c.head_dim = size("attention.key_length");
  if (f.find_uint(p + "attention.value_length") && size("attention.value_length") != c.head_dim) {
    refuse(p, "attention.value_length ", size("attention.value_length"),
           " differs from key_length ", c.head_dim);
  }
  if (f.find_uint(p + "rope.dimension_count") && size("rope.dimension_count") != c.head_dim) {
    refuse(p, "rope.dimension_count ", size("rope.dimension_count"),
           " (npullm rotates whole heads of ", c.head_dim, ")");
  }
  if (c.head_dim % 2 != 0)
    raise(error_code::corrupt_data, "GGUF ", file, ": odd head dim ", c.head_dim);
  c.max_position_embeddings = f.find_uint(p + "context_length") ? size("context_length") : 2048;
  c.rms_norm_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!(c.rms_norm_eps > 0)) {
    raise(error_code::corrupt_data, "GGUF ", file, ": ", p, "attention.layer_norm_rms_epsilon ",
          c.rms_norm_eps, " (want > 0)");
  }
  c.rope_theta = f.find_float(p + "rope.freq_base").value_or(10000.0);
  if (!(c.rope_theta > 1)) {
    raise(error_code::corrupt_data, "GGUF ", file, ": ", p, "rope.freq_base ", c.rope_theta);
  }
  if (const auto s = f.find<std::string_view>(p + "rope.scaling.type"); s && *s != "none") {
    refuse(p, "rope.scaling.type '", *s, "' (not implemented for GGUF files)");
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr) {
    refuse(
        "tensor 'rope_freqs.weight' (llama.cpp's Llama 3 RoPE factors: not implemented for "
        "GGUF files)");
  }
  if (const auto e = f.find_uint(p + "expert_count"); e && *e > 0) {
    refuse(p, "expert_count ", *e, " (mixture of experts)");
  }
  const io::gguf_tensor_info& embd = f.info("token_embd.weight");
  const auto shape = embd.shape();
  if (shape.size() != 2 || shape[1] != c.hidden_size) {
    raise(error_code::corrupt_data, "GGUF ", file, ": token_embd.weight has shape ",
          npullm::detail::format_list(shape), ", want [vocab, ", c.hidden_size, "]");
  }
  c.vocab_size = shape[0];
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (c.family == model_family::qwen2) {
    c.attention_bias = true;
  } else {
    c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.attention_output_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  }
  c.torch_dtype = npullm::dtype::f32;
  c.layer_windows.assign(c.num_hidden_layers, 0);
  return c;
}

}  // namespace npullm::model
