// model_config: the run-time shapes and architecture switches of a decoder of one of the
// families below, read from a Hugging Face config.json. Element types and policies are
// compile-time; these are not.
//
//   parse_config(json_text, name[, accept])   from the file's text (`name` labels errors)
//   load_config(dir_or_file[, accept])         reads <dir>/config.json (or the file given)
//   make_rope_table(config, n)      the config's rope_table for positions [0, n)
//
// This header is the reading; the structs (model_config, moe_config), the ignorable keys and
// make_rope_table are in config_types.hpp, the key-by-key reader in config_reader.hpp (both
// included here).
//
// Families (model_type): qwen2 (Qwen2, Qwen2.5), qwen3, llama, mistral, phi3, gemma2; anything
// else is unsupported naming the value. Mixtures of experts are their dense family's layers with
// an MoE MLP (model_config::moe): mixtral (mistral's), qwen2_moe (qwen2's, with a shared expert)
// and qwen3_moe (qwen3's).
//
// Strictness: every key of the file is either read into model_config, or listed in
// ignorable_config_keys below (it cannot change the forward pass), or refused: a key in neither
// list is unsupported naming it, because a key nobody has classified might change the math.
// Tools add keys of their own to fine-tuned checkpoints (`unsloth_version`, provenance keys
// starting with `_`); a caller who knows such a key cannot change the forward pass accepts it
// by name: the `accept` list (load_options::accept_keys in weights.hpp) holds key names, or
// prefixes ending in '*' ("_*": every key starting with '_'). The refusal says so.
// A key read for one family and meaningless in another (sliding_window for llama,
// query_pre_attn_scalar outside gemma2, ...) is refused there unless its value is neutral (null,
// false, 1.0). Values that contradict each other are unsupported naming both.
//
// Error codes: missing required sizes, values of the wrong JSON type and out-of-range numbers
// are corrupt_data naming the key (and the file); valid values this library does not implement
// (a model_type, rope_type, hidden_act, torch_dtype, mlp_bias true, an unclassified key) are
// unsupported naming the key and the value.
//
// Defaults for absent keys are the HF config classes' (Qwen2Config, Qwen3Config, LlamaConfig,
// MistralConfig, Phi3Config, Gemma2Config), except that hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads and vocab_size are required: HF's defaults there
// describe some 7B model no file means by omission. Notable defaults: qwen3 head_dim 128 and
// gemma2 head_dim 256 (not hidden / heads); num_key_value_heads 32 (qwen2, qwen3), 8 (mistral),
// 4 (gemma2), num_attention_heads (llama, phi3); max_position_embeddings 32768 (qwen2, qwen3),
// 2048 (llama), 131072 (mistral), 4096 (phi3), 8192 (gemma2); rms_norm_eps 1e-5 for phi3, 1e-6
// otherwise; tie_word_embeddings true for gemma2 only; mistral's sliding_window 4096 and
// gemma2's 4096 apply when the key is absent (null means none). The mixtures (MixtralConfig,
// Qwen2MoeConfig, Qwen3MoeConfig): num_key_value_heads 8 / 16 / 4; mixtral rope_theta 1e6,
// rms_norm_eps 1e-5, no window by default, num_local_experts 8, num_experts_per_tok 2, experts of
// intermediate_size, top-k renormalized; qwen2_moe num_experts 60, k 4, moe_intermediate_size
// 1408, shared_expert_intermediate_size 5632; qwen3_moe num_experts 128, k 8,
// moe_intermediate_size 768; both Qwen ones norm_topk_prob false, decoder_sparse_step 1.
// router_jitter_noise other than 0 is refused.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/model/config_reader.hpp"
#include "npullm/model/config_types.hpp"
#include "npullm/ops/rope.hpp"

namespace npullm::model {

// accept: keys to take unread (see the top).
inline model_config parse_config(std::string_view text, std::string_view name,
                                 std::span<const std::string> accept = {}) {
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    raise(error_code::corrupt_data, "config ", name, ": not a JSON object");
  detail::config_reader r(j, name, accept);
  model_config c;

  // --- family ---
  const auto* type = r.get("model_type");
  if (!type || !type->is_string()) r.corrupt("no model_type string");
  const std::string model_type = type->get<std::string>();
  using F = model_family;
  // The mixtures: their dense family, with experts.
  const bool mixtral = model_type == "mixtral", qwen2_moe = model_type == "qwen2_moe",
             qwen3_moe = model_type == "qwen3_moe";
  if (model_type == "qwen2" || qwen2_moe) {
    c.family = F::qwen2;
  } else if (mixtral) {
    c.family = F::mistral;
  } else if (model_type == "qwen3" || qwen3_moe) {
    c.family = F::qwen3;
  } else if (model_type == "llama") {
    c.family = F::llama;
  } else if (model_type == "qwen3") {
    c.family = F::qwen3;
  } else if (model_type == "mistral") {
    c.family = F::mistral;
  } else if (model_type == "phi3") {
    c.family = F::phi3;
  } else if (model_type == "gemma2") {
    c.family = F::gemma2;
  } else {
    r.refuse("model_type '", model_type,
             "' (npullm reads qwen2, qwen3, llama, mistral, phi3, gemma2, and the mixtures of "
             "experts mixtral, qwen2_moe, qwen3_moe)");
  }
  const F f = c.family;
  const bool gemma2 = f == F::gemma2, phi3 = f == F::phi3, qwen = f == F::qwen2 || f == F::qwen3;

  // A head other than the causal LM's (classification, token classification) computes
  // something else.
  if (const auto* a = r.get("architectures")) {
    if (!a->is_array()) r.corrupt("architectures is not a list: ", a->dump());
    for (const auto& e : *a) {
      if (!e.is_string()) r.corrupt("architectures holds a non-string: ", e.dump());
      const auto s = e.get<std::string>();
      const std::string_view suffix = "ForCausalLM";
      if (s.size() < suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix))
        r.refuse("architectures '", s, "' (npullm runs *ForCausalLM models)");
    }
  }

  // --- shapes ---
  c.hidden_size = r.size("hidden_size", std::nullopt);
  c.intermediate_size = r.size("intermediate_size", std::nullopt);
  c.num_hidden_layers = r.size("num_hidden_layers", std::nullopt);
  c.num_attention_heads = r.size("num_attention_heads", std::nullopt);
  const std::size_t kv_default = qwen2_moe                        ? 16
                                 : f == F::qwen2 || f == F::qwen3 ? (qwen3_moe ? 4 : 32)
                                 : f == F::mistral                ? 8
                                 : gemma2                         ? 4
                                                                  : c.num_attention_heads;
  c.num_key_value_heads = r.size("num_key_value_heads", kv_default);
  c.vocab_size = r.size("vocab_size", std::nullopt);
  c.max_position_embeddings = r.size("max_position_embeddings", qwen              ? 32768
                                                                : f == F::llama   ? 2048
                                                                : f == F::mistral ? 131072
                                                                : phi3            ? 4096
                                                                                  : 8192);
  const std::optional<std::size_t> head_default = f == F::qwen3 ? 128
                                                  : gemma2      ? 256
                                                                : std::optional<std::size_t>{};
  if (!head_default && !r.present("head_dim") && c.hidden_size % c.num_attention_heads != 0) {
    r.corrupt("hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ",
              c.num_attention_heads, " and no head_dim is given");
  }
  c.head_dim = r.size("head_dim", head_default.value_or(c.hidden_size / c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.corrupt("num_attention_heads ", c.num_attention_heads,
              " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  }

  // --- norms, embeddings ---
  c.rms_norm_eps = r.number("rms_norm_eps", phi3 || mixtral ? 1e-5 : 1e-6);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    r.corrupt("rms_norm_eps must be > 0, got ", c.rms_norm_eps);
  c.tie_word_embeddings = r.flag("tie_word_embeddings", gemma2);

  // --- activation ---
  {
    const auto act = r.string("hidden_act");
    const auto activation = r.string("hidden_activation");
    // gemma2 reads hidden_activation, the others hidden_act; the other spelling, if present,
    // must name the same function.
    const auto& primary = gemma2 ? activation : act;
    const auto& secondary = gemma2 ? act : activation;
    const std::string primary_key = gemma2 ? "hidden_activation" : "hidden_act";
    const std::string secondary_key = gemma2 ? "hidden_act" : "hidden_activation";
    c.hidden_act = detail::parse_activation(
        r, primary_key, primary.value_or(gemma2 ? "gelu_pytorch_tanh" : "silu"));
    if (secondary && detail::parse_activation(r, secondary_key, *secondary) != c.hidden_act) {
      r.refuse(secondary_key, " '", *secondary, "' contradicts ", primary_key, " '",
               primary.value_or(std::string(to_string(c.hidden_act))), "'");
    }
  }

  // --- RoPE ---
  std::optional<std::size_t> top_original;
  if (const auto* v = r.get("original_max_position_embeddings"))
    top_original = r.positive_size(*v, "original_max_position_embeddings");
  const auto* rope_parameters = r.get("rope_parameters");
  const auto* rope_scaling = r.get("rope_scaling");
  if (rope_parameters && rope_scaling) r.refuse("both rope_scaling and rope_parameters");
  if (rope_parameters && !rope_parameters->is_object())
    r.corrupt("rope_parameters is not an object: ", rope_parameters->dump());
  auto inner = [&](const char* key) -> const nlohmann::json* {
    if (!rope_parameters) return nullptr;
    const auto it = rope_parameters->find(key);
    return it == rope_parameters->end() || it->is_null() ? nullptr : &*it;
  };
  c.rope_theta = r.number("rope_theta", mixtral ? 1e6 : 10000.0);
  if (const auto* v = inner("rope_theta")) {
    const double t = r.as_number(*v, "rope_parameters.rope_theta");
    if (r.present("rope_theta") && t != c.rope_theta)
      r.refuse("rope_theta ", c.rope_theta, " and rope_parameters.rope_theta ", t);
    c.rope_theta = t;
  }
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta))
    r.corrupt("rope_theta must be > 1, got ", c.rope_theta);
  c.partial_rotary_factor = r.number("partial_rotary_factor", 1.0);
  if (const auto* v = inner("partial_rotary_factor")) {
    const double p = r.as_number(*v, "rope_parameters.partial_rotary_factor");
    if (r.present("partial_rotary_factor") && p != c.partial_rotary_factor) {
      r.refuse("partial_rotary_factor ", c.partial_rotary_factor,
               " and rope_parameters.partial_rotary_factor ", p);
    }
    c.partial_rotary_factor = p;
  }
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    r.corrupt("partial_rotary_factor must be in (0, 1], got ", c.partial_rotary_factor);
  if (c.partial_rotary_factor != 1 && !phi3) {
    // HF's llama-style attention rotates whole heads: a partial factor breaks its shapes.
    r.refuse("partial_rotary_factor ", c.partial_rotary_factor, " for ", model_type,
             " (only phi3 rotates part of a head)");
  }
  if (c.rotary_dim() == 0 || c.rotary_dim() % 2 != 0) {
    r.refuse("partial_rotary_factor ", c.partial_rotary_factor, " gives rotary dim ",
             c.rotary_dim(), " of head_dim ", c.head_dim, " (must be even and > 0)");
  }
  detail::parse_rope(r, rope_parameters ? rope_parameters : rope_scaling,
                     rope_parameters ? "rope_parameters" : "rope_scaling", c, top_original);
  try {
    ops::validate_rope_scaling(c.rope_scaling, c.rotary_dim());
  } catch (const error& e) {
    r.corrupt(e.message());
  }

  // --- biases ---
  {
    const bool bias = r.flag("attention_bias", false);
    if (f == F::qwen2) {
      c.attention_bias = true;  // Qwen2 always has q/k/v biases; HF ignores the key
      // Qwen2MoeConfig's switch for the same biases (true by default): npullm's Qwen2 has them.
      if (!r.flag("qkv_bias", true)) r.refuse("qkv_bias false (Qwen2's q/k/v have biases)");
    } else if (f == F::mistral || phi3) {
      if (bias) r.refuse("attention_bias true for ", model_type, " (its projections have no bias)");
    } else {
      c.attention_bias = c.attention_output_bias = bias;
    }
    if (r.flag("mlp_bias", false)) r.refuse("mlp_bias true (npullm's MLP has no biases)");
  }

  // --- attention windows ---
  {
    const std::size_t L = c.num_hidden_layers;
    // The window size: null (or absent where the family has none) means no window.
    std::optional<std::size_t> window;
    if (const auto* v = r.get("sliding_window")) {
      window = r.positive_size(*v, "sliding_window");
    } else if (!j.contains("sliding_window") && (qwen || f == F::mistral || gemma2) && !mixtral) {
      window =
          4096;  // Qwen2Config, Qwen3Config, MistralConfig, Gemma2Config default (Mixtral: none)
    }
    const bool use_sliding = r.flag("use_sliding_window", false);
    std::optional<std::size_t> max_window_layers;
    if (const auto* v = r.get("max_window_layers")) {
      // Qwen2's "the first max_window_layers layers attend fully" may be 0.
      if (!v->is_number_unsigned()) r.corrupt("max_window_layers is not an integer: ", v->dump());
      max_window_layers = static_cast<std::size_t>(v->get<std::uint64_t>());
    }
    if (!qwen) {
      if (use_sliding) r.refuse("use_sliding_window true for ", model_type);
      if (max_window_layers) r.refuse("max_window_layers for ", model_type);
    }
    // The family's rule: which layers use the window.
    std::vector<bool> sliding(L, false);
    if (qwen) {
      if (!use_sliding) window.reset();  // HF: sliding_window is None unless use_sliding_window
      for (std::size_t l = 0; l < L; ++l)
        sliding[l] = window && l >= max_window_layers.value_or(28);
    } else if (f == F::mistral || phi3) {
      for (std::size_t l = 0; l < L; ++l) sliding[l] = window.has_value();
    } else if (gemma2) {
      for (std::size_t l = 0; l < L; ++l) sliding[l] = l % 2 == 0;  // 0, 2, 4, ...: local
    } else if (window) {
      r.refuse("sliding_window ", *window, " for ", model_type, " (it has no sliding window)");
    }
    if (const auto* v = r.get("layer_types")) {
      if (!v->is_array() || v->size() != L)
        r.corrupt("layer_types is not a list of ", L, " strings: ", v->dump());
      std::vector<bool> given(L);
      for (std::size_t l = 0; l < L; ++l) {
        const auto& e = (*v)[l];
        if (!e.is_string()) r.corrupt("layer_types[", l, "] is not a string: ", e.dump());
        const auto s = e.get<std::string>();
        if (s != "sliding_attention" && s != "full_attention")
          r.refuse("layer_types[", l, "] '", s,
                   "' (npullm reads sliding_attention and full_attention)");
        given[l] = s == "sliding_attention";
      }
      // qwen2, qwen3 and gemma2 read layer_types; elsewhere it must say what the family does.
      if (qwen || gemma2) {
        sliding = given;
      } else if (given != sliding) {
        r.refuse("layer_types contradicts ", model_type, "'s rule",
                 window ? " (a window on every layer)" : " (no window)");
      }
    }
    c.layer_windows.assign(L, 0);
    for (std::size_t l = 0; l < L; ++l) {
      if (!sliding[l]) continue;
      if (!window) {
        r.refuse("layer ", l, " is a sliding_attention layer but there is no sliding_window",
                 qwen ? " (use_sliding_window is false)" : "");
      }
      c.layer_windows[l] = *window;
    }
  }

  // --- gemma2's attention and logits ---
  {
    auto optional_positive = [&](const std::string& key, double fallback) -> double {
      const bool absent = !j.contains(key);
      const auto* v = r.get(key);
      if (!gemma2) {
        if (v) r.refuse(key, " ", v->dump(), " for ", model_type, " (a gemma2 parameter)");
        return 0.0;
      }
      if (!v) return absent ? fallback : 0.0;  // null: none
      const double x = r.as_number(*v, key);
      if (!(x > 0) || !std::isfinite(x)) r.corrupt(key, " must be > 0, got ", v->dump());
      return x;
    };
    c.attn_logit_softcapping = optional_positive("attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = optional_positive("final_logit_softcapping", 30.0);
    c.query_pre_attn_scalar = optional_positive("query_pre_attn_scalar", 256.0);
    // HF's Gemma 2 takes query_pre_attn_scalar ** -0.5: null has no meaning there.
    if (gemma2 && c.query_pre_attn_scalar == 0) r.corrupt("query_pre_attn_scalar is null");
  }

  // --- implied by model_type ---
  c.qk_norm = f == F::qwen3;
  if (gemma2) {
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.norm_unit_offset = true;
    c.sandwich_norms = true;
  }

  // --- mixture of experts ---
  if (mixtral || qwen2_moe || qwen3_moe) {
    moe_config& m = c.moe;
    m.experts =
        r.size(mixtral ? "num_local_experts" : "num_experts", mixtral ? 8 : (qwen2_moe ? 60 : 128));
    m.experts_per_token = r.size("num_experts_per_tok", mixtral ? 2 : (qwen2_moe ? 4 : 8));
    if (m.experts_per_token > m.experts) {
      r.corrupt("num_experts_per_tok ", m.experts_per_token, " exceeds the ", m.experts,
                " experts");
    }
    if (mixtral) {
      m.expert_intermediate_size = c.intermediate_size;  // w1 / w3: (intermediate, hidden)
      m.normalize_top_k = true;
    } else {
      m.expert_intermediate_size = r.size("moe_intermediate_size", qwen2_moe ? 1408 : 768);
      m.normalize_top_k = r.flag("norm_topk_prob", false);  // both HF configs' default
    }
    if (qwen2_moe) {
      m.shared_expert_intermediate_size = r.size("shared_expert_intermediate_size", 5632);
    }
    // A router that adds noise in training: the identity at inference only when it is 0.
    const double jitter = r.number("router_jitter_noise", 0.0);
    if (jitter != 0) {
      r.refuse("router_jitter_noise ", jitter,
               " (HF applies it in training only, but npullm does not guess that a checkpoint "
               "with it was meant to run without)");
    }
    if (!mixtral) {
      // Layer l is sparse when (l + 1) % decoder_sparse_step == 0 and l is not in
      // mlp_only_layers (HF's Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer).
      const std::size_t step = r.size("decoder_sparse_step", 1);
      m.layers.assign(c.num_hidden_layers, false);
      for (std::size_t l = 0; l < c.num_hidden_layers; ++l) m.layers[l] = (l + 1) % step == 0;
      if (const auto* v = r.get("mlp_only_layers")) {
        if (!v->is_array()) r.corrupt("mlp_only_layers is not a list: ", v->dump());
        for (const auto& e : *v) {
          if (!e.is_number_unsigned() || e.get<std::uint64_t>() >= c.num_hidden_layers) {
            r.corrupt("mlp_only_layers holds ", e.dump(), " (want layer indices below ",
                      c.num_hidden_layers, ")");
          }
          m.layers[static_cast<std::size_t>(e.get<std::uint64_t>())] = false;
        }
      }
    }
  } else {
    for (const char* key :
         {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
          "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
          "mlp_only_layers", "router_jitter_noise"}) {
      if (const auto* v = r.get(key)) {
        r.refuse(key, " ", v->dump(), " for ", model_type,
                 " (a mixture-of-experts key; npullm reads it for mixtral, qwen2_moe and "
                 "qwen3_moe)");
      }
    }
  }

  // --- dtype (torch_dtype; HF 5 writes dtype) ---
  {
    std::optional<npullm::dtype> d;
    for (const char* key : {"torch_dtype", "dtype"}) {
      const auto s = r.string(key);
      if (!s) continue;
      npullm::dtype v{};
      if (*s == "float32") {
        v = npullm::dtype::f32;
      } else if (*s == "float16") {
        v = npullm::dtype::f16;
      } else if (*s == "bfloat16") {
        v = npullm::dtype::bf16;
      } else {
        r.refuse(key, " '", *s, "'");
      }
      if (d && *d != v) r.refuse("torch_dtype and dtype disagree");
      d = v;
    }
    if (d) c.torch_dtype = *d;
  }

  r.refuse_unread();
  return c;
}

inline model_config load_config(const std::filesystem::path& path,
                                std::span<const std::string> accept = {}) {
  std::error_code ec;  // a path that cannot be inspected is read as a file: the open fails (io)
  const auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) raise(error_code::io, "cannot read ", file.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file.string(), accept);
}

}  // namespace npullm::model
