// gguf_names: how a GGUF file names and types what the pipeline binds: gguf_tensor_name (Hugging
// Face name -> GGUF name per family), gguf_expert_tensor_name (a layer's stacked experts),
// gguf_weight_format / ggml_type_of (GGUF tensor types <-> weight formats, checked against the
// reader's type table at compile time), and Llama's Q/K row permutation (llama_permuted_row,
// gguf_rows_permuted). What the file means as a model: gguf_model.hpp.
//
// llama.cpp's converter stores Llama's Q and K weights (and biases) with the rows of each head
// permuted for its interleaved (GPT-J style) RoPE: a head's rows, viewed as (2, D/2) (HF's
// rotate-half pairs i and i + D/2), are transposed to (D/2, 2), so that the pair becomes two
// adjacent rows. HF row h·D + i·D/2 + j (i in {0, 1}, j < D/2) is GGUF row h·D + 2j + i. K
// uses the KV head count. The other architectures are converted without it (llama.cpp runs
// them with NEOX RoPE, which is rotate-half).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "npullm/io/gguf_types.hpp"
#include "npullm/model/config_types.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::model {

// The quantized format of a GGUF tensor type the pipeline runs (each format's
// format_layout<F>::gguf_type).
constexpr std::optional<ops::weight_format> gguf_weight_format(io::ggml_type t) noexcept {
  return ops::weight_format_of_gguf_type(static_cast<int>(t));
}

// The GGUF type of a block format (the symmetric formats have none).
constexpr std::optional<io::ggml_type> ggml_type_of(ops::weight_format f) noexcept {
  const int t = ops::info_of(f).gguf_type;
  if (t < 0) return std::nullopt;
  return static_cast<io::ggml_type>(t);
}

// A format's GGUF type number and block agree with the GGUF reader's type table.
consteval bool gguf_formats_agree() {
  for (auto f : ops::all_weight_formats) {
    if (const auto t = ggml_type_of(f)) {
      const io::ggml_type_traits tr = io::ggml_traits(*t);
      if (tr.block_size != ops::block_values(f) || tr.block_bytes != ops::block_bytes(f)) {
        return false;
      }
    }
  }
  return true;
}
static_assert(gguf_formats_agree(),
              "a weight format's GGUF type or block disagrees with io/gguf_types.hpp");

// The row of a llama GGUF Q/K projection (head_dim D) that holds HF row r (see the top).
constexpr std::size_t llama_permuted_row(std::size_t r, std::size_t head_dim) noexcept {
  const std::size_t half = head_dim / 2, h = r / head_dim, i = (r % head_dim) / half, j = r % half;
  return h * head_dim + 2 * j + i;
}

// The GGUF name of a tensor the pipeline binds by its Hugging Face name in a model of family
// `f` ("" for a name with no GGUF counterpart). Gemma 2's post_attention_layernorm is its own
// tensor (post_attention_norm); elsewhere that name is the norm before the MLP (ffn_norm).
inline std::string gguf_tensor_name(std::string_view hf, model_family f = model_family::qwen2) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  constexpr std::string_view layers = "model.layers.";
  if (hf.substr(0, layers.size()) != layers) return "";
  const std::string_view rest = hf.substr(layers.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return "";
  const std::string_view layer = rest.substr(0, dot), part = rest.substr(dot + 1);
  auto name = [&](std::string_view to) {
    return "blk." + std::string(layer) + "." + std::string(to);
  };
  if (f == model_family::gemma2) {
    if (part == "post_attention_layernorm.weight") return name("post_attention_norm.weight");
    if (part == "pre_feedforward_layernorm.weight") return name("ffn_norm.weight");
    if (part == "post_feedforward_layernorm.weight") return name("post_ffw_norm.weight");
  }
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
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},  // Qwen 3
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  // Phi-3: rows q | k | v
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // Phi-3: rows gate | up
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Mixtures of experts: the router, the shared expert and its gate (Qwen2-MoE). The
      // experts themselves are one 3-D tensor per matrix (gguf_expert_tensor_name).
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},  // Mixtral
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
  };
  for (const auto& [from, to] : parts) {
    if (part == from) return name(to);
  }
  return "";
}

// The GGUF tensor holding every expert's gate, up or down matrix of layer `layer` (`part`:
// "gate", "up", "down"): ggml shape [cols, rows, experts], expert e's (rows, cols) matrix the
// e-th slab.
inline std::string gguf_expert_tensor_name(std::size_t layer, std::string_view part) {
  return "blk." + std::to_string(layer) + ".ffn_" + std::string(part) + "_exps.weight";
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

}  // namespace npullm::model
