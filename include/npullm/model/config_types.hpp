// config_types: model_config, the run-time shapes and architecture switches of a decoder (its
// family, sizes, RoPE, MLP activation, attention windows, per-family switches, the mixture of
// experts' moe_config), the config.json keys that cannot change the forward pass, and the
// config's RoPE table. What the fields mean per family, their defaults and how config.json is
// read: config.hpp (parse_config, load_config), whose parsing helpers are in config_reader.hpp.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/ops/rope.hpp"

namespace npullm::model {

enum class model_family { qwen2, llama, qwen3, mistral, phi3, gemma2 };

// The MLP's gate activation: silu(gate) * up, or gelu_tanh(gate) * up (Gemma 2), with
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
enum class activation_kind { silu, gelu_tanh };

// A mixture-of-experts MLP (experts == 0: every layer's MLP is dense). Per token:
//   p = softmax(x W_router^T) over the experts;  S = the k largest (ties: the lower index)
//   w_e = p_e, or p_e / sum_{S} p  (normalize_top_k: Mixtral, Qwen3-MoE; not Qwen2-MoE)
//   y = sum_{e in S} w_e down_e(act(gate_e x) * up_e x)
//     + sigmoid(w_shared . x) down_s(act(gate_s x) * up_s x)   (Qwen2-MoE's shared expert)
struct moe_config {
  std::size_t experts = 0;            // n; 0: no experts (dense MLPs)
  std::size_t experts_per_token = 0;  // k, 1 <= k <= n
  std::size_t expert_intermediate_size = 0;
  bool normalize_top_k = false;
  std::size_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  // [num_hidden_layers]: whether layer l's MLP is the mixture (Qwen2/3-MoE's decoder_sparse_step
  // and mlp_only_layers make some dense); empty with experts > 0: every layer.
  std::vector<bool> layers;

  [[nodiscard]] bool in_layer(std::size_t l) const noexcept {
    return experts != 0 && (layers.empty() || (l < layers.size() && layers[l]));
  }
};

struct model_config {
  model_family family = model_family::qwen2;
  std::size_t hidden_size = 0;
  std::size_t intermediate_size = 0;
  std::size_t num_hidden_layers = 0;
  std::size_t num_attention_heads = 0;
  std::size_t num_key_value_heads = 0;
  std::size_t head_dim = 0;  // hidden_size / num_attention_heads unless given (or the family's)
  std::size_t vocab_size = 0;
  std::size_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  // q/k/v projection biases: Qwen2 always, others when attention_bias is true.
  bool attention_bias = false;
  // An o_proj bias: attention_bias in llama, qwen3 and gemma2 (HF puts it on all four
  // projections there); never in qwen2, mistral, phi3.
  bool attention_output_bias = false;
  npullm::dtype torch_dtype = npullm::dtype::f32;

  // --- RoPE ---
  ops::rope_scaling rope_scaling;      // kind none unless the file has rope_scaling
  double partial_rotary_factor = 1.0;  // phi3 only; rotary_dim() = head_dim * this

  // --- MLP ---
  activation_kind hidden_act = activation_kind::silu;

  // --- attention windows ---
  // [num_hidden_layers] (parse_config always fills it; empty = every layer full attention, as a
  // config built in code may leave it): 0 = full attention, W > 0 = a query at position p sees
  // the keys at positions (p - W, p], the W most recent including itself (HF's sliding-window
  // mask). A window >= the pipeline's capacity computes exactly what full attention does.
  std::vector<std::size_t> layer_windows;

  // --- per-family switches (implied by model_type; see parse_config) ---
  bool qk_norm = false;  // qwen3: RMSNorm over head_dim on each q and k head, before RoPE
  // gemma2: embeddings multiplied by sqrt(hidden_size) (HF rounds that constant to the
  // activations' dtype: exactly 48 for hidden 2304); 1.0 elsewhere.
  double embedding_scale = 1.0;
  bool norm_unit_offset = false;  // gemma2: every RMSNorm scales by (1 + w), not w
  // gemma2: post_attention_layernorm normalises the attention output before its residual add,
  // and pre_feedforward_layernorm / post_feedforward_layernorm wrap the MLP the same way.
  bool sandwich_norms = false;
  double attn_logit_softcapping = 0.0;   // > 0: logits = c tanh(logits / c) before the mask
  double final_logit_softcapping = 0.0;  // > 0: the LM head's logits, the same way
  double query_pre_attn_scalar = 0.0;    // > 0: attention scale 1 / sqrt(this), not head_dim

  // --- mixture of experts (mixtral, qwen2_moe, qwen3_moe) ---
  moe_config moe;

  [[nodiscard]] std::size_t q_size() const noexcept { return num_attention_heads * head_dim; }
  [[nodiscard]] std::size_t kv_size() const noexcept { return num_key_value_heads * head_dim; }
  // The rotated dims of each head (HF: int(head_dim * partial_rotary_factor)).
  [[nodiscard]] std::size_t rotary_dim() const noexcept {
    return static_cast<std::size_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // Layer l's window (0 = full attention).
  [[nodiscard]] std::size_t window(std::size_t layer) const noexcept {
    return layer < layer_windows.size() ? layer_windows[layer] : 0;
  }
  // The softmax scale of q . k.
  [[nodiscard]] double attention_scale() const noexcept {
    return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                     : static_cast<double>(head_dim));
  }
};

inline std::string_view to_string(model_family f) noexcept {
  switch (f) {
    case model_family::qwen2: return "qwen2";
    case model_family::llama: return "llama";
    case model_family::qwen3: return "qwen3";
    case model_family::mistral: return "mistral";
    case model_family::phi3: return "phi3";
    case model_family::gemma2: return "gemma2";
  }
  return "unknown";
}

inline std::string_view to_string(activation_kind a) noexcept {
  return a == activation_kind::silu ? "silu" : "gelu_tanh";
}

// Keys that cannot change the forward pass, with the reason. parse_config skips these and
// nothing else.
struct ignorable_key {
  std::string_view key;
  std::string_view reason;
};

inline constexpr std::array<ignorable_key, 23> ignorable_config_keys{{
    {"_name_or_path", "where the checkpoint was loaded from: provenance"},
    {"transformers_version", "the library version that wrote the file"},
    {"auto_map", "remote-code class names; the math is model_type's published definition"},
    {"use_cache", "whether HF keeps a KV cache: same outputs either way"},
    {"cache_implementation", "HF's cache class; the windows come from sliding_window/layer_types"},
    {"initializer_range", "weight initialisation for training"},
    {"attention_dropout", "dropout is the identity at inference"},
    {"resid_pdrop", "dropout is the identity at inference"},
    {"embd_pdrop", "dropout is the identity at inference"},
    {"hidden_dropout", "dropout is the identity at inference"},
    {"bos_token_id", "a token id for tokenisation and generation, not the forward pass"},
    {"eos_token_id", "a token id (or list) for stopping generation, not the forward pass"},
    {"pad_token_id", "a token id for batching in HF, not the forward pass"},
    {"pretraining_tp", "tensor-parallel slicing in training: the same matmuls, split"},
    {"npullm_generator_version", "npullm's synthetic-model generator stamp"},
    {"output_attentions", "HF returns attention maps: an output option"},
    {"output_hidden_states", "HF returns hidden states: an output option"},
    {"return_dict", "HF's output container type"},
    {"use_return_dict", "HF's output container type"},
    {"_attn_implementation_autoset", "whether HF picked its attention kernel itself: a flag"},
    {"unsloth_version", "the version of the Unsloth tool that saved the checkpoint"},
    {"output_router_logits", "HF returns the MoE router's logits: an output option"},
    {"router_aux_loss_coef", "the weight of the MoE load-balancing loss in training"},
}};

constexpr bool is_ignorable_config_key(std::string_view key) noexcept {
  for (const auto& k : ignorable_config_keys)
    if (k.key == key) return true;
  return false;
}

// Whether a caller's accept list (key names, or prefixes ending in '*') holds `key`: config.json
// keys and GGUF metadata keys alike (see the top).
inline bool key_accepted(std::string_view key, std::span<const std::string> accept) noexcept {
  for (const std::string& a : accept) {
    const std::string_view p(a);
    if (!p.empty() && p.back() == '*' ? key.substr(0, p.size() - 1) == p.substr(0, p.size() - 1)
                                      : key == p)
      return true;
  }
  return false;
}

// What a refusal of an unclassified key adds: how to accept it.
inline std::string accept_hint(std::string_view key) {
  return "; if it cannot change the forward pass, accept it with load_options::accept_keys = "
         "{\"" +
         std::string(key) + "\"} (or a prefix such as \"_*\")";
}

// The config's RoPE for positions [0, max_positions): its scaling, theta and rotary dim.
inline ops::rope_table make_rope_table(const model_config& c, std::size_t max_positions) {
  return ops::rope_table(c.head_dim, c.rope_theta, max_positions, c.rope_scaling, c.rotary_dim());
}

}  // namespace npullm::model
