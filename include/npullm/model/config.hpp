// model_config: the run-time shapes and architecture switches of a decoder of one of the
// families below, read from a Hugging Face config.json. Element types and policies are
// compile-time; these are not.
//
//   parse_config(json_text, name[, accept])   from the file's text (`name` labels errors)
//   load_config(dir_or_file[, accept])         reads <dir>/config.json (or the file given)
//   make_rope_table(config, n)      the config's rope_table for positions [0, n)
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

namespace detail {

// Reads one config.json, remembering which keys it consumed.
class config_reader {
 public:
  config_reader(const nlohmann::json& j, std::string_view name,
                std::span<const std::string> accept = {})
      : j_(j), name_(name), accept_(accept) {}

  template <class... Args>
  [[noreturn]] void corrupt(const Args&... args) const {
    raise(error_code::corrupt_data, "config ", name_, ": ", args...);
  }
  template <class... Args>
  [[noreturn]] void refuse(const Args&... args) const {
    raise(error_code::unsupported, "config ", name_, ": ", args...);
  }

  // The key's value, or nullptr when absent or null; marks the key as read either way.
  const nlohmann::json* get(const std::string& key) {
    read_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[nodiscard]] bool present(const std::string& key) const {
    const auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }

  std::size_t size(const std::string& key, std::optional<std::size_t> fallback) {
    const auto* v = get(key);
    if (!v) {
      if (!fallback) corrupt("missing ", key);
      return *fallback;
    }
    return positive_size(*v, key);
  }
  std::size_t positive_size(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() == 0)
      corrupt(key, " is not a positive integer: ", v.dump());
    return static_cast<std::size_t>(v.get<std::uint64_t>());
  }
  double number(const std::string& key, double fallback) {
    const auto* v = get(key);
    return v ? as_number(*v, key) : fallback;
  }
  double as_number(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_number()) corrupt(key, " is not a number: ", v.dump());
    return v.get<double>();
  }
  bool flag(const std::string& key, bool fallback) {
    const auto* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) corrupt(key, " is not a boolean: ", v->dump());
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) {
    const auto* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) corrupt(key, " is not a string: ", v->dump());
    return v->get<std::string>();
  }

  // Every key neither read, ignorable nor accepted by the caller: unsupported naming it.
  void refuse_unread() const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) == 0 && !is_ignorable_config_key(key) && !key_accepted(key, accept_)) {
        refuse("key '", key, "' (value ", value.dump(), ") is not one npullm reads or ignores",
               accept_hint(key));
      }
    }
  }

  [[nodiscard]] std::string_view name() const noexcept { return name_; }

 private:
  const nlohmann::json& j_;
  std::string_view name_;
  std::span<const std::string> accept_;
  std::set<std::string> read_;
};

inline activation_kind parse_activation(const config_reader& r, const std::string& key,
                                        const std::string& value) {
  if (value == "silu" || value == "swish") return activation_kind::silu;
  // gelu_new is HF's name for the same tanh approximation.
  if (value == "gelu_pytorch_tanh" || value == "gelu_tanh" || value == "gelu_new")
    return activation_kind::gelu_tanh;
  r.refuse(key, " '", value, "' (npullm implements silu and gelu_pytorch_tanh)");
}

// rope_scaling (HF 4.x) or rope_parameters (HF 5: also holds rope_theta and
// partial_rotary_factor) into c.rope_scaling. `top_original` is the top-level
// original_max_position_embeddings (phi3 keeps it there).
inline void parse_rope(config_reader& r, const nlohmann::json* rs, const std::string& where,
                       model_config& c, std::optional<std::size_t> top_original) {
  ops::rope_scaling s;
  if (rs == nullptr) {
    c.rope_scaling = s;
    return;
  }
  if (!rs->is_object()) r.corrupt(where, " is not an object: ", rs->dump());
  std::set<std::string> used;
  auto field = [&](const char* key) -> const nlohmann::json* {
    used.insert(key);
    const auto it = rs->find(key);
    return it == rs->end() || it->is_null() ? nullptr : &*it;
  };
  auto num = [&](const char* key) -> std::optional<double> {
    const auto* v = field(key);
    if (!v) return std::nullopt;
    return r.as_number(*v, where + "." + key);
  };
  // The kind: rope_type, or the older "type"; both present must agree.
  std::optional<std::string> type;
  for (const char* key : {"rope_type", "type"}) {
    const auto* v = field(key);
    if (!v) continue;
    if (!v->is_string()) r.corrupt(where, ".", key, " is not a string: ", v->dump());
    const auto t = v->get<std::string>();
    if (type && *type != t) r.refuse(where, " has rope_type '", *type, "' and type '", t, "'");
    type = t;
  }
  const std::string kind = type.value_or("default");
  if (kind == "default") {
    s.kind = ops::rope_kind::none;
  } else if (kind == "linear") {
    s.kind = ops::rope_kind::linear;
  } else if (kind == "dynamic") {
    s.kind = ops::rope_kind::dynamic;
  } else if (kind == "llama3") {
    s.kind = ops::rope_kind::llama3;
  } else if (kind == "yarn") {
    if (c.family == model_family::phi3)  // HF's Phi3Config renames yarn to longrope
      r.refuse(where, ".rope_type 'yarn' for phi3 (HF reads it as longrope): ambiguous");
    s.kind = ops::rope_kind::yarn;
  } else if (kind == "longrope" || kind == "su") {
    s.kind = ops::rope_kind::longrope;
  } else {
    r.refuse(where, ".rope_type '", kind,
             "' (npullm implements default, linear, dynamic, llama3, yarn, longrope/su)");
  }
  const auto mpe = static_cast<double>(c.max_position_embeddings);
  auto original = [&]() -> std::optional<std::size_t> {
    const auto* v = field("original_max_position_embeddings");
    if (!v) return std::nullopt;
    return r.positive_size(*v, where + ".original_max_position_embeddings");
  };
  switch (s.kind) {
    case ops::rope_kind::none: break;
    case ops::rope_kind::linear: {
      const auto f = num("factor");
      if (!f) r.corrupt("missing ", where, ".factor");
      s.factor = *f;
      break;
    }
    case ops::rope_kind::dynamic: {
      const auto f = num("factor");
      if (!f) r.corrupt("missing ", where, ".factor");
      s.factor = *f;
      // HF scales against max_position_embeddings; an original context that disagrees is a
      // file HF versions would read differently.
      s.original_max_position_embeddings = c.max_position_embeddings;
      if (const auto o = original(); o && *o != c.max_position_embeddings) {
        r.refuse(where, ".original_max_position_embeddings ", *o,
                 " differs from max_position_embeddings ", c.max_position_embeddings,
                 " for dynamic scaling (HF scales against the latter)");
      }
      break;
    }
    case ops::rope_kind::llama3: {
      const auto f = num("factor"), lo = num("low_freq_factor"), hi = num("high_freq_factor");
      const auto o = original();
      if (!f || !lo || !hi || !o) {
        r.corrupt(where,
                  " llama3 needs factor, low_freq_factor, high_freq_factor and "
                  "original_max_position_embeddings");
      }
      s.factor = *f;
      s.low_freq_factor = *lo;
      s.high_freq_factor = *hi;
      s.original_max_position_embeddings = *o;
      break;
    }
    case ops::rope_kind::yarn: {
      // HF 5 semantics: factor as given, else max_position_embeddings / original; the original
      // context defaults to max_position_embeddings. (HF 4.4x-4.5x replaced a given factor by
      // that ratio whenever original_max_position_embeddings was given; HF 5 fixed it.)
      const auto o = original();
      s.original_max_position_embeddings = o.value_or(c.max_position_embeddings);
      const auto f = num("factor");
      if (!f && !o) r.corrupt("missing ", where, ".factor");
      s.factor = f ? *f : mpe / static_cast<double>(*o);
      s.attention_factor = num("attention_factor");
      // HF reads beta_fast / beta_slow / mscale with `or`: 0 means the default too.
      if (const auto v = num("beta_fast"); v && *v != 0) s.beta_fast = *v;
      if (const auto v = num("beta_slow"); v && *v != 0) s.beta_slow = *v;
      s.mscale = num("mscale").value_or(0.0);
      s.mscale_all_dim = num("mscale_all_dim").value_or(0.0);
      if (const auto* v = field("truncate")) {
        if (!v->is_boolean()) r.corrupt(where, ".truncate is not a boolean: ", v->dump());
        s.truncate = v->get<bool>();
      }
      break;
    }
    case ops::rope_kind::longrope: {
      for (const char* key : {"short_factor", "long_factor"}) {
        const auto* v = field(key);
        if (!v) r.corrupt("missing ", where, ".", key);
        if (!v->is_array()) r.corrupt(where, ".", key, " is not a list: ", v->dump());
        auto& list = std::string_view(key) == "short_factor" ? s.short_factor : s.long_factor;
        for (const auto& e : *v) list.push_back(r.as_number(e, where + "." + key));
      }
      // The original context: rope_scaling's, else the top-level key phi3 keeps (both present
      // must agree), else max_position_embeddings.
      const auto o = original();
      if (o && top_original && *o != *top_original) {
        r.refuse(where, ".original_max_position_embeddings ", *o,
                 " differs from original_max_position_embeddings ", *top_original);
      }
      s.original_max_position_embeddings =
          o ? *o : top_original.value_or(c.max_position_embeddings);
      const auto f = num("factor");
      s.factor = f ? *f : mpe / static_cast<double>(s.original_max_position_embeddings);
      s.attention_factor = num("attention_factor");
      break;
    }
  }
  // Inside rope_parameters (HF 5) these two sit beside the scaling keys; parse_rope's caller
  // reads them, so they count as used here.
  if (where == "rope_parameters") {
    used.insert("rope_theta");
    used.insert("partial_rotary_factor");
  }
  for (const auto& [key, value] : rs->items()) {
    if (value.is_object()) r.refuse(where, ".", key, " is an object (per-layer-type RoPE)");
    if (used.count(key) == 0) {
      r.refuse(where, ".", key, " (value ", value.dump(), ") is not a parameter of rope_type '",
               kind, "'");
    }
  }
  c.rope_scaling = std::move(s);
}

}  // namespace detail

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

// The config's RoPE for positions [0, max_positions): its scaling, theta and rotary dim.
inline ops::rope_table make_rope_table(const model_config& c, std::size_t max_positions) {
  return ops::rope_table(c.head_dim, c.rope_theta, max_positions, c.rope_scaling, c.rotary_dim());
}

}  // namespace npullm::model
