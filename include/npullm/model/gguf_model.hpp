// gguf_model: what a llama.cpp GGUF file of a decoder means to npullm's pipeline: its
// hyperparameters as a model_config of one of the families config.json also gives (config.hpp),
// its tensor names as the Hugging Face names the pipeline binds, its tensor types as weight
// formats, and llama.cpp's conventions that differ from Hugging Face's.
//
//   read_gguf_model(header, bytes_of, accept)   the config, and the tensors the config consumed
//   gguf_model_config(file, accept)             the config alone
//   gguf_tensor_name(hf_name, family)   "model.layers.3.self_attn.q_proj.weight" ->
//                                       "blk.3.attn_q.weight"
//   gguf_weight_format(type)            Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS
//                                       -> ops::weight_format (else nothing)
//   llama_permuted_row(r, D)            where HF row r of a Q or K projection lies in a llama GGUF
//
// Architectures (general.architecture -> family):
//   llama   -> llama    Llama 2 and 3.x, and Mistral (llama.cpp's converter writes Mistral as
//                       llama, without its sliding window: llama.cpp runs it without one too).
//                       Q/K rows permuted (below). Llama 3.1+'s RoPE scaling is the tensor
//                       rope_freqs.weight [rotary_dim / 2]: per-frequency divisors (what HF's
//                       llama3 rope_type computes from factor, low/high_freq_factor and the
//                       original context), applied as such: rope_scaling longrope with equal long
//                       and short lists and magnitude 1, which divides each frequency by its
//                       factor and nothing else.
//   qwen2   -> qwen2    q/k/v biases.
//   qwen3   -> qwen3    qwen2's layout without biases, plus attn_q_norm / attn_k_norm [head_dim].
//   gemma2  -> gemma2   llama.cpp's converter stores every RMSNorm weight with the 1 already
//                       added (1 + w, rounded to f32, as HF computes it): the config has
//                       norm_unit_offset false and the norms scale by the stored values, which
//                       are HF's multipliers exactly. post_attention_norm, ffn_norm (HF's
//                       pre_feedforward_layernorm) and post_ffw_norm are the sandwich norms;
//                       embeddings times sqrt(hidden); soft-caps from attn_logit_softcapping /
//                       final_logit_softcapping (default 50 / 30, as llama.cpp); the window
//                       attention.sliding_window (default 4096) on even layers. The attention
//                       scale has no key: llama.cpp uses 1 / sqrt(head_dim), except for 46
//                       layers (Gemma 2 27B) 1 / sqrt(hidden / heads); so does this reader
//                       (query_pre_attn_scalar).
//   qwen2moe -> qwen2   with experts: ffn_gate_inp (the router), ffn_{gate,up,down}_exps (3-D,
//                       one slab per expert), a shared expert ffn_{gate,up,down}_shexp scaled by
//                       sigmoid(ffn_gate_inp_shexp . x); expert_feed_forward_length,
//                       expert_shared_feed_forward_length; the top-k weights not renormalized.
//   qwen3moe -> qwen3   with experts (no shared one), top-k renormalized.
//   llama with expert_count > 0 is Mixtral: experts of feed_forward_length, renormalized.
//   (llama.cpp's rule per architecture; expert_weights_norm, when present, says it instead.)
//   phi3    -> phi3     fused attn_qkv (HF's qkv_proj) and ffn_up holding gate and up (HF's
//                       gate_up_proj); LongRoPE from the tensors rope_factors_long / _short
//                       [rotary_dim / 2], rope.scaling.original_context_length and
//                       rope.scaling.attn_factor (the magnitude; derived as HF does when
//                       absent); attention.sliding_window > 0 on every layer (0: none);
//                       rope.dimension_count < head_dim is HF's partial_rotary_factor.
//
// Strictness, as for config.json: every metadata key is read, or listed in ignorable_gguf_keys
// (it cannot change the forward pass: names, licences, the tokenizer, ...), or accepted by the
// caller by name (`accept`: key names or prefixes ending in '*'; load_options::accept_keys), or
// refused as unsupported naming it and saying how to accept it. Every tensor of the file is
// read by the model or refused (model_weights::load_gguf): a tensor nobody reads might be part
// of the math (llama.cpp refuses such files too).
//
// Keys read (<arch>. prefix): block_count, embedding_length, feed_forward_length,
// attention.head_count, attention.head_count_kv (default: head_count),
// attention.layer_norm_rms_epsilon, context_length (default 2048), rope.freq_base (default
// 10000), attention.key_length (default hidden / heads) and attention.value_length (must equal
// it), rope.dimension_count (the head dim, or phi3's rotary dims), vocab_size (must equal
// token_embd's rows), expert_count / expert_used_count, expert_feed_forward_length,
// expert_shared_feed_forward_length, expert_weights_norm, expert_gating_func (softmax only),
// attention.sliding_window (gemma2,
// phi3; 0 elsewhere), rope.scaling.type (none, linear, yarn) with rope.scaling.factor,
// rope.scaling.original_context_length, rope.scaling.attn_factor, rope.scaling.yarn_beta_fast /
// yarn_beta_slow; gemma2's attn_logit_softcapping and final_logit_softcapping. Besides:
// general.architecture, general.type (model), general.quantization_version (2),
// general.alignment (the reader's), split.count (1), split.no, split.tensors.count.
// yarn: llama.cpp multiplies attn_factor by HF's default magnitude 1 + 0.1 ln(factor); the
// config's attention_factor is that product.
//
// llama.cpp's converter stores Llama's Q and K rows permuted per head for its interleaved RoPE:
// gguf_names.hpp says how (llama_permuted_row).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/gguf_names.hpp"
#include "npullm/ops/quant_format.hpp"
#include "npullm/ops/rope.hpp"

namespace npullm::model {

// GGUF metadata keys that cannot change the forward pass, with the reason. A key ending in '.'
// stands for every key under that prefix; "{arch}" for general.architecture's value.
struct ignorable_gguf_key {
  std::string_view key;
  std::string_view reason;
};

inline constexpr std::array<ignorable_gguf_key, 27> ignorable_gguf_keys{{
    {"general.name", "the model's name: a label"},
    {"general.basename", "the model's base name: a label"},
    {"general.finetune", "the fine-tune's name: a label"},
    {"general.size_label", "a parameter count for people: a label"},
    {"general.description", "free text"},
    {"general.author", "provenance"},
    {"general.organization", "provenance"},
    {"general.version", "the model's version: a label"},
    {"general.license", "the licence"},
    {"general.license.", "the licence's name and link"},
    {"general.url", "provenance"},
    {"general.doi", "provenance"},
    {"general.uuid", "an identifier of the file"},
    {"general.repo_url", "provenance"},
    {"general.source.", "where the model was converted from: provenance"},
    {"general.base_model.", "the models it was fine-tuned from: provenance"},
    {"general.dataset.", "the data it was trained on: provenance"},
    {"general.datasets", "the data it was trained on: provenance"},
    {"general.tags", "search tags"},
    {"general.languages", "the languages it was trained for"},
    {"general.quantized_by", "who made the file"},
    {"general.file_type", "the type most tensors have: a summary; each tensor's own type is read"},
    {"general.sampling.", "default sampling settings for generation, not the forward pass"},
    {"tokenizer.", "the tokenizer and chat template: text to token ids, not the forward pass"},
    {"quantize.imatrix.",
     "the importance matrix that weighted the quantization: the blocks are "
     "read as stored"},
    {"{arch}.rope.scaling.finetuned",
     "whether the model was fine-tuned at the scaled context: a note, not a parameter"},
    {"{arch}.tensor_data_layout",
     "an old converter's note of its source's layout; the tensors are in llama.cpp's layout, and "
     "llama.cpp does not read it"},
}};

inline bool is_ignorable_gguf_key(std::string_view key, std::string_view arch) {
  for (const auto& k : ignorable_gguf_keys) {
    std::string pattern(k.key);
    if (const auto at = pattern.find("{arch}"); at != std::string::npos)
      pattern.replace(at, 6, arch);
    if (!pattern.empty() && pattern.back() == '.' ? key.substr(0, pattern.size()) == pattern
                                                  : key == pattern)
      return true;
  }
  return false;
}

// What read_gguf_model gives: the config, and the tensors it read into the config (RoPE
// factors), which the weights do not bind.
struct gguf_model_info {
  model_config config;
  std::vector<std::string> config_tensors;
};

namespace detail {

// A metadata value in a sentence: numbers and strings as they are, arrays by size and type.
inline std::string describe_gguf_value(const io::gguf_value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::same_as<X, std::string_view>) {
          const std::string_view shown = x.substr(0, 64);
          return "\"" + io::detail::gguf_printable(shown) +
                 (shown.size() < x.size() ? "...\"" : "\"");
        } else if constexpr (std::same_as<X, io::gguf_array>) {
          return "an array of " + std::to_string(x.size()) + " " +
                 std::string(io::gguf_type_name(x.type()));
        } else if constexpr (std::same_as<X, bool>) {
          return x ? "true" : "false";
        } else if constexpr (sizeof(X) == 1) {
          return std::to_string(static_cast<int>(x));
        } else {
          std::ostringstream out;
          out << x;
          return out.str();
        }
      },
      v);
}

// A 1-D F32 / F16 / BF16 tensor's values (little-endian bytes, any alignment).
inline std::vector<double> gguf_tensor_values(const io::gguf_tensor_info& t,
                                              std::span<const std::byte> bytes) {
  std::vector<double> out(t.elements);
  for (std::size_t i = 0; i < t.elements; ++i) {
    switch (t.type) {
      case io::ggml_type::f32: {
        float x;
        std::memcpy(&x, bytes.data() + 4 * i, 4);
        out[i] = x;
        break;
      }
      case io::ggml_type::f16:
      case io::ggml_type::bf16: {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = t.type == io::ggml_type::f16 ? static_cast<float>(float16::from_bits(b))
                                              : static_cast<float>(bfloat16::from_bits(b));
        break;
      }
      default: break;
    }
  }
  return out;
}

}  // namespace detail

// The model a GGUF file holds (see the top). bytes_of(const io::gguf_tensor_info&) gives a
// tensor's bytes (std::span<const std::byte>): it is asked only for the RoPE factor tensors.
// Missing keys, zero or contradictory sizes are corrupt_data; what npullm does not run (an
// architecture, a rope scaling type, a key nobody classified) is unsupported naming it.
template <class BytesOf>
gguf_model_info read_gguf_model(const io::gguf_header& h, BytesOf&& bytes_of,
                                std::span<const std::string> accept = {}) {
  const std::string& file = h.file;
  std::set<std::string, std::less<>> read;  // keys consumed
  auto refuse = [&](const auto&... args) {
    raise(error_code::unsupported, "GGUF ", file, ": ", args...);
  };
  auto corrupt = [&](const auto&... args) {
    raise(error_code::corrupt_data, "GGUF ", file, ": ", args...);
  };
  read.insert("general.architecture");
  const std::string arch(h.get<std::string_view>("general.architecture"));
  gguf_model_info out;
  model_config& c = out.config;
  using F = model_family;
  if (arch == "qwen2" || arch == "qwen2moe") {
    c.family = F::qwen2;
  } else if (arch == "llama") {
    c.family = F::llama;
  } else if (arch == "qwen3" || arch == "qwen3moe") {
    c.family = F::qwen3;
  } else if (arch == "gemma2") {
    c.family = F::gemma2;
  } else if (arch == "phi3") {
    c.family = F::phi3;
  } else {
    refuse("general.architecture '", io::detail::gguf_printable(arch),
           "' (npullm reads llama, which includes Mistral's and Mixtral's files, qwen2, qwen3, "
           "gemma2, "
           "phi3, qwen2moe and qwen3moe)");
  }
  const F f = c.family;
  const bool gemma2 = f == F::gemma2, phi3 = f == F::phi3;

  // ---- the file ----
  read.insert("general.alignment");  // the reader placed the tensors by it
  read.insert("general.type");
  if (const auto t = h.find<std::string_view>("general.type"); t && *t != "model")
    refuse("general.type '", io::detail::gguf_printable(*t), "' (npullm loads whole models)");
  read.insert("general.quantization_version");
  if (const auto v = h.find_uint("general.quantization_version"); v && *v != 2) {
    refuse("general.quantization_version ", *v,
           " (npullm reads ggml's block layouts of version 2)");
  }
  for (const char* k : {"split.count", "split.no", "split.tensors.count"}) read.insert(k);
  if (const auto n = h.find_uint("split.count"); n && *n > 1) {
    refuse("split.count ", *n,
           ": one part of a split model (join the parts with llama-gguf-split --merge)");
  }

  // ---- <arch>.* ----
  const std::string p = arch + ".";
  auto key = [&](std::string_view k) {
    std::string full = p + std::string(k);
    read.insert(full);
    return full;
  };
  auto opt_uint = [&](std::string_view k) { return h.find_uint(key(k)); };
  auto opt_float = [&](std::string_view k) { return h.find_float(key(k)); };
  auto size = [&](std::string_view k, std::optional<std::size_t> fallback = std::nullopt) {
    const auto v = opt_uint(k);
    if (!v) {
      if (!fallback) corrupt("missing key '", p, k, "'");
      return *fallback;
    }
    if (*v == 0) corrupt(p, k, " is 0");
    return static_cast<std::size_t>(*v);
  };
  c.num_hidden_layers = size("block_count");
  if (c.num_hidden_layers > h.tensors.size()) {  // every layer has tensors: a sizes' check too
    corrupt(p, "block_count ", c.num_hidden_layers, " but the file holds ", h.tensors.size(),
            " tensors");
  }
  c.hidden_size = size("embedding_length");
  c.intermediate_size = size("feed_forward_length");
  c.num_attention_heads = size("attention.head_count");
  c.num_key_value_heads = size("attention.head_count_kv", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    corrupt("head_count ", c.num_attention_heads, " is not a multiple of head_count_kv ",
            c.num_key_value_heads);
  }
  if (const auto kl = opt_uint("attention.key_length")) {
    c.head_dim = size("attention.key_length");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      corrupt("embedding_length ", c.hidden_size, " is not a multiple of head_count ",
              c.num_attention_heads, " and no attention.key_length is given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (opt_uint("attention.value_length") && size("attention.value_length") != c.head_dim) {
    refuse(p, "attention.value_length ", size("attention.value_length"),
           " differs from key_length ", c.head_dim);
  }
  if (c.head_dim % 2 != 0) corrupt("odd head dim ", c.head_dim);
  if (opt_uint("rope.dimension_count")) {
    const std::size_t r = size("rope.dimension_count");
    if (r != c.head_dim) {
      if (!phi3 || r > c.head_dim || r % 2 != 0) {
        refuse(p, "rope.dimension_count ", r, " (npullm rotates whole heads of ", c.head_dim,
               phi3 ? ", or an even part of one)" : ")");
      }
      c.partial_rotary_factor = static_cast<double>(r) / static_cast<double>(c.head_dim);
    }
  }
  c.max_position_embeddings = size("context_length", 2048);
  {
    const auto eps = opt_float("attention.layer_norm_rms_epsilon");
    if (!eps) corrupt("missing key '", p, "attention.layer_norm_rms_epsilon'");
    c.rms_norm_eps = *eps;
    if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
      corrupt(p, "attention.layer_norm_rms_epsilon ", c.rms_norm_eps, " (want > 0)");
  }
  c.rope_theta = opt_float("rope.freq_base").value_or(10000.0);
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta))
    corrupt(p, "rope.freq_base ", c.rope_theta);
  // ---- mixture of experts (see the top) ----
  {
    const bool moe_arch = arch == "qwen2moe" || arch == "qwen3moe";
    const auto n = opt_uint("expert_count");
    const auto k = opt_uint("expert_used_count");
    if (moe_arch && (!n || *n == 0)) corrupt(arch, " without ", p, "expert_count");
    if (n && *n > 0) {
      if (!moe_arch && f != F::llama) refuse(p, "expert_count ", *n, " (experts in a ", arch, ")");
      moe_config& m = c.moe;
      m.experts = static_cast<std::size_t>(*n);
      if (!k || *k == 0) corrupt(p, "expert_count ", *n, " without expert_used_count");
      if (*k > *n) corrupt(p, "expert_used_count ", *k, " exceeds expert_count ", *n);
      m.experts_per_token = static_cast<std::size_t>(*k);
      // llama (Mixtral): experts of feed_forward_length; the Qwen ones have their own key.
      m.expert_intermediate_size =
          moe_arch ? size("expert_feed_forward_length") : c.intermediate_size;
      // llama.cpp's rule per architecture, unless the file says (expert_weights_norm).
      m.normalize_top_k = arch != "qwen2moe";
      if (const auto norm = h.find<bool>(key("expert_weights_norm"))) m.normalize_top_k = *norm;
      if (const auto g = opt_uint("expert_gating_func"); g && *g != 1)
        refuse(p, "expert_gating_func ", *g, " (npullm's router is a softmax: 1)");
      if (arch == "qwen2moe") {
        if (const auto s = opt_uint("expert_shared_feed_forward_length")) {
          m.shared_expert_intermediate_size = size("expert_shared_feed_forward_length");
        } else if (const auto* t = h.find_tensor("blk.0.ffn_gate_shexp.weight")) {
          m.shared_expert_intermediate_size = t->shape().empty() ? 0 : t->shape()[0];
        }
      }
    } else if (k && *k > 0) {
      corrupt(p, "expert_used_count ", *k, " without experts");
    }
  }

  // ---- the token embedding: the vocabulary ----
  const io::gguf_tensor_info& embd = h.info("token_embd.weight");
  if (const auto shape = embd.shape(); shape.size() != 2 || shape[1] != c.hidden_size) {
    corrupt("token_embd.weight has shape ", npullm::detail::format_list(shape), ", want [vocab, ",
            c.hidden_size, "]");
  }
  c.vocab_size = embd.shape()[0];
  if (const auto v = opt_uint("vocab_size"); v && *v != c.vocab_size)
    corrupt(p, "vocab_size ", *v, " but token_embd.weight has ", c.vocab_size, " rows");
  c.tie_word_embeddings = h.find_tensor("output.weight") == nullptr;

  // ---- RoPE ----
  // A 1-D float tensor of rotary_dim / 2 values, read into the config.
  auto factors = [&](const char* name) {
    const io::gguf_tensor_info& t = h.info(name);
    if (!io::ggml_storage(t.type)) refuse("tensor '", name, "' is ", io::ggml_type_name(t.type));
    if (t.shape() != std::vector<std::size_t>{c.rotary_dim() / 2}) {
      corrupt("tensor '", name, "' has shape ", npullm::detail::format_list(t.shape()), ", want [",
              c.rotary_dim() / 2, "] (rotary dim ", c.rotary_dim(), " / 2)");
    }
    out.config_tensors.emplace_back(name);
    return detail::gguf_tensor_values(t, bytes_of(t));
  };
  ops::rope_scaling& rs = c.rope_scaling;
  const auto type = h.find<std::string_view>(key("rope.scaling.type"));
  const auto factor = opt_float("rope.scaling.factor");
  const auto original = opt_uint("rope.scaling.original_context_length");
  const auto attn_factor = opt_float("rope.scaling.attn_factor");
  const auto beta_fast = opt_float("rope.scaling.yarn_beta_fast");
  const auto beta_slow = opt_float("rope.scaling.yarn_beta_slow");
  // A scaling key the type does not read changes nothing in llama.cpp either, unless it is
  // meant for a type npullm then runs without it: refuse such a key.
  auto unused = [&](bool present, const char* k, std::string_view kind) {
    if (present) refuse(p, k, " with rope scaling '", kind, "' (which does not read it)");
  };
  const bool rope_freqs = h.find_tensor("rope_freqs.weight") != nullptr;
  const bool longrope = h.find_tensor("rope_factors_long.weight") != nullptr ||
                        h.find_tensor("rope_factors_short.weight") != nullptr;
  const std::string kind(type.value_or("none"));
  if (kind == "none") {
    if (rope_freqs) {
      if (f != F::llama) refuse("tensor 'rope_freqs.weight' in a ", arch, " file");
      // Llama 3's divisors: longrope with one list for both lengths, magnitude 1.
      rs.kind = ops::rope_kind::longrope;
      rs.long_factor = rs.short_factor = factors("rope_freqs.weight");
      rs.original_max_position_embeddings = c.max_position_embeddings;
      rs.attention_factor = 1.0;
      unused(factor.has_value(), "rope.scaling.factor", "none");
      unused(original.has_value(), "rope.scaling.original_context_length", "none");
      unused(attn_factor.has_value(), "rope.scaling.attn_factor", "none");
    } else if (longrope) {
      if (!phi3) refuse("tensors 'rope_factors_long/short.weight' in a ", arch, " file");
      rs.kind = ops::rope_kind::longrope;
      rs.long_factor = factors("rope_factors_long.weight");
      rs.short_factor = factors("rope_factors_short.weight");
      if (!original) corrupt("rope_factors without ", p, "rope.scaling.original_context_length");
      if (*original == 0) corrupt(p, "rope.scaling.original_context_length is 0");
      rs.original_max_position_embeddings = static_cast<std::size_t>(*original);
      rs.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(*original);
      rs.attention_factor = attn_factor;  // absent: derived from factor as HF does
      unused(factor.has_value(), "rope.scaling.factor", "longrope");
    } else {
      unused(factor.has_value(), "rope.scaling.factor", "none");
      unused(original.has_value(), "rope.scaling.original_context_length", "none");
      unused(attn_factor.has_value(), "rope.scaling.attn_factor", "none");
    }
    unused(beta_fast.has_value(), "rope.scaling.yarn_beta_fast", kind);
    unused(beta_slow.has_value(), "rope.scaling.yarn_beta_slow", kind);
  } else if (kind == "linear" || kind == "yarn") {
    if (rope_freqs || longrope) refuse("rope.scaling.type '", kind, "' and RoPE factor tensors");
    if (!factor) corrupt("rope.scaling.type '", kind, "' without ", p, "rope.scaling.factor");
    rs.factor = *factor;
    if (kind == "linear") {
      rs.kind = ops::rope_kind::linear;
      unused(original.has_value(), "rope.scaling.original_context_length", kind);
      unused(attn_factor.has_value(), "rope.scaling.attn_factor", kind);
      unused(beta_fast.has_value(), "rope.scaling.yarn_beta_fast", kind);
      unused(beta_slow.has_value(), "rope.scaling.yarn_beta_slow", kind);
    } else {
      rs.kind = ops::rope_kind::yarn;
      if (!original)
        corrupt("rope.scaling.type 'yarn' without rope.scaling.original_context_length");
      rs.original_max_position_embeddings = static_cast<std::size_t>(*original);
      // llama.cpp: magnitude = attn_factor (default 1) x (1 + 0.1 ln factor).
      rs.attention_factor =
          attn_factor.value_or(1.0) * (rs.factor <= 1 ? 1.0 : 1.0 + 0.1 * std::log(rs.factor));
      if (beta_fast) rs.beta_fast = *beta_fast;
      if (beta_slow) rs.beta_slow = *beta_slow;
    }
  } else {
    refuse(p, "rope.scaling.type '", io::detail::gguf_printable(kind),
           "' (npullm reads none, linear and yarn; Llama 3's and Phi-3's factors come as "
           "tensors)");
  }
  try {
    ops::validate_rope_scaling(rs, c.rotary_dim());
  } catch (const error& e) {
    corrupt(e.message());
  }

  // ---- windows ----
  c.layer_windows.assign(c.num_hidden_layers, 0);
  {
    const auto w = opt_uint("attention.sliding_window");
    if (gemma2) {
      const std::size_t window = w.value_or(4096);  // llama.cpp's default for Gemma 2
      if (window == 0) corrupt(p, "attention.sliding_window is 0 (Gemma 2 windows even layers)");
      for (std::size_t l = 0; l < c.num_hidden_layers; l += 2) c.layer_windows[l] = window;
    } else if (phi3) {
      if (w && *w > 0) c.layer_windows.assign(c.num_hidden_layers, static_cast<std::size_t>(*w));
    } else if (w && *w > 0) {
      refuse(p, "attention.sliding_window ", *w, " (llama.cpp runs ", arch,
             " without a window; npullm does not guess which layers it means)");
    }
  }

  // ---- family switches ----
  if (f == F::qwen2) {
    c.attention_bias = true;
  } else if (!phi3) {
    c.attention_bias = h.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.attention_output_bias = h.find_tensor("blk.0.attn_output.bias") != nullptr;
  }
  c.qk_norm = f == F::qwen3;
  if (gemma2) {
    c.hidden_act = activation_kind::gelu_tanh;
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.norm_unit_offset = false;  // the stored norms hold 1 + w (see the top)
    c.sandwich_norms = true;
    auto cap = [&](const char* k, double fallback) {
      const double v = opt_float(k).value_or(fallback);
      if (!(v > 0) || !std::isfinite(v)) corrupt(p, k, " ", v, " (want > 0)");
      return v;
    };
    c.attn_logit_softcapping = cap("attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = cap("final_logit_softcapping", 30.0);
    c.query_pre_attn_scalar =
        c.num_hidden_layers == 46
            ? static_cast<double>(c.hidden_size) / static_cast<double>(c.num_attention_heads)
            : static_cast<double>(c.head_dim);
  }
  c.torch_dtype = npullm::dtype::f32;

  // ---- every other key: ignorable, accepted, or refused ----
  for (const io::gguf_kv& kv : h.metadata) {
    if (read.contains(kv.key) || is_ignorable_gguf_key(kv.key, arch) ||
        key_accepted(kv.key, accept))
      continue;
    refuse("key '", io::detail::gguf_printable(kv.key), "' (",
           detail::describe_gguf_value(kv.value), ") is not one npullm reads or ignores for ", arch,
           accept_hint(kv.key));
  }
  return out;
}

// The model config of an open GGUF file (see read_gguf_model).
inline model_config gguf_model_config(const io::gguf_file& f,
                                      std::span<const std::string> accept = {}) {
  return read_gguf_model(
             f.header(), [&](const io::gguf_tensor_info& t) { return f.bytes(t); }, accept)
      .config;
}

}  // namespace npullm::model
