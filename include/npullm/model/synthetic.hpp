// Synthetic models: writes a complete Hugging Face style model directory (config.json +
// model.safetensors) with deterministic, seeded random weights, for tests, benchmarks and the
// demo (no weights are downloaded anywhere in npullm).
//
//   preset("tiny")          Qwen2 family, 2 layers, hidden 128, 4/2 heads: ~1.7 MB in f32
//   preset("tiny-llama")    the same sizes, Llama family (no q/k/v biases, untied head)
//   preset("tiny-llama3")   Llama 3.x: llama3 RoPE scaling (factor 32, original 8192)
//   preset("tiny-qwen3")    Qwen 3: q/k head norms, head_dim 48 (not hidden / heads), tied
//   preset("tiny-qwen2-window")  Qwen2 with use_sliding_window: layer 1 (max_window_layers 1)
//                           has a 32-token window, layer 0 attends to everything
//   preset("tiny-mistral")  Mistral: a 32-token sliding window on every layer
//   preset("tiny-qwen2moe") Qwen2-MoE: "tiny" with a mixture in every layer (8 experts of 64,
//                           top 2, not renormalized, a shared expert of 128 with its gate)
//   preset("tiny-phi3")     Phi-3: fused qkv_proj and gate_up_proj, LongRoPE (original 64),
//                           a 48-token sliding window
//   preset("tiny-gemma2")   Gemma 2: (1 + w) norms, sandwich norms, GELU-tanh, scaled
//                           embeddings, query_pre_attn_scalar, attention (cap 2) and final
//                           logit soft-capping, a 32-token window on layers 0, 2, ... (4 layers)
//   preset("qwen2-0.5b")    the real Qwen2-0.5B shapes: 24 layers, hidden 896, 14/2 heads,
//                           intermediate 4864, vocab 151936, tied embeddings
//   preset("llama-3.2-1b"), preset("qwen3-0.6b"), preset("mistral-7b"), preset("phi-3-mini"),
//   preset("gemma-2-2b"): the real shapes (7B at f32 is 29 GB: mind the disk)
//   write_model(dir, spec)
//
// Every tensor has its own random stream (seeded by the spec's seed and the tensor's name),
// so its values do not depend on what else is written. Scales keep activations in a realistic
// range: projections N(0, 1/sqrt(fan_in)) (output projections also / sqrt(2 layers)), layer
// norm weights 1 + N(0, 0.05), biases N(0, 0.02), embeddings N(0, 0.1)
// (small beside what the layers add, so a model does not just repeat its input token), and
// the final norm weight scaled so logits have a standard deviation of about 4.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/model/config.hpp"

namespace npullm::model {

struct model_spec {
  model_config config;
  npullm::dtype weights = npullm::dtype::f32;
  std::uint64_t seed = 1;
};

inline model_spec preset(std::string_view name, npullm::dtype weights = npullm::dtype::f32,
                         std::uint64_t seed = 1) {
  model_spec s;
  s.weights = weights;
  s.seed = seed;
  model_config& c = s.config;
  c.torch_dtype = weights;
  // hidden, intermediate, layers, query heads, KV heads, head_dim, vocabulary, max positions,
  // rms_norm_eps, rope_theta.
  auto sizes = [&](std::size_t hidden, std::size_t inter, std::size_t layers, std::size_t heads,
                   std::size_t kv_heads, std::size_t head_dim, std::size_t vocab,
                   std::size_t max_positions, double eps, double theta) {
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv_heads;
    c.head_dim = head_dim;
    c.vocab_size = vocab;
    c.max_position_embeddings = max_positions;
    c.rms_norm_eps = eps;
    c.rope_theta = theta;
  };
  auto llama3_scaling = [&] {  // Llama 3.1 / 3.2's rope_scaling
    c.rope_scaling.kind = ops::rope_kind::llama3;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
  };
  auto gemma2 = [&](double query_pre_attn_scalar, double attn_cap, std::size_t window) {
    c.family = model_family::gemma2;
    c.hidden_act = activation_kind::gelu_tanh;
    c.tie_word_embeddings = true;
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.norm_unit_offset = true;
    c.sandwich_norms = true;
    c.query_pre_attn_scalar = query_pre_attn_scalar;
    c.attn_logit_softcapping = attn_cap;
    c.final_logit_softcapping = 30.0;
    c.layer_windows.assign(c.num_hidden_layers, 0);
    for (std::size_t l = 0; l < c.num_hidden_layers; l += 2) c.layer_windows[l] = window;
  };
  const bool tiny = name.starts_with("tiny");
  if (tiny) sizes(128, 256, 2, 4, 2, 32, 512, 4096, 1e-6, 10000.0);
  if (name == "tiny" || name == "tiny-llama") {
    const bool llama = name == "tiny-llama";
    c.family = llama ? model_family::llama : model_family::qwen2;
    c.rope_theta = llama ? 10000.0 : 1000000.0;
    c.tie_word_embeddings = !llama;
    c.attention_bias = !llama;
  } else if (name == "qwen2-0.5b") {
    c.family = model_family::qwen2;
    sizes(896, 4864, 24, 14, 2, 64, 151936, 32768, 1e-6, 1000000.0);
    c.tie_word_embeddings = true;
    c.attention_bias = true;
  } else if (name == "tiny-llama3") {
    c.family = model_family::llama;
    c.rope_theta = 500000.0;
    c.max_position_embeddings = 131072;
    llama3_scaling();
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen2-window") {
    c.family = model_family::qwen2;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
    c.attention_bias = true;
    c.layer_windows = {0, 32};  // use_sliding_window, max_window_layers 1
  } else if (name == "tiny-qwen3") {
    c.family = model_family::qwen3;
    c.head_dim = 48;
    c.rope_theta = 1000000.0;
    c.qk_norm = true;
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen2moe") {
    c.family = model_family::qwen2;
    c.rope_theta = 1000000.0;
    c.attention_bias = true;
    c.moe = {8, 2, 64, false, 128, {}};
  } else if (name == "tiny-mistral") {
    c.family = model_family::mistral;
    c.layer_windows.assign(c.num_hidden_layers, 32);
  } else if (name == "tiny-phi3") {
    c.family = model_family::phi3;
    c.rms_norm_eps = 1e-5;
    c.rope_scaling.kind = ops::rope_kind::longrope;
    c.rope_scaling.original_max_position_embeddings = 64;
    for (std::size_t i = 0; i < c.head_dim / 2; ++i) {
      c.rope_scaling.short_factor.push_back(1.0 + 0.05 * static_cast<double>(i));
      c.rope_scaling.long_factor.push_back(1.0 + 0.5 * static_cast<double>(i));
    }
    c.layer_windows.assign(c.num_hidden_layers, 48);
  } else if (name == "tiny-gemma2") {
    c.num_hidden_layers = 4;
    // Gemma 2's attention cap is 50; at this size the attention logits stay within a few
    // units, so a cap of 2 is what makes the soft-cap change the result (tested).
    gemma2(48.0, 2.0, 32);
  } else if (name == "llama-3.2-1b") {
    c.family = model_family::llama;
    sizes(2048, 8192, 16, 32, 8, 64, 128256, 131072, 1e-5, 500000.0);
    llama3_scaling();
    c.tie_word_embeddings = true;
  } else if (name == "qwen3-0.6b") {
    c.family = model_family::qwen3;
    sizes(1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e-6, 1000000.0);
    c.qk_norm = true;
    c.tie_word_embeddings = true;
  } else if (name == "mistral-7b") {  // Mistral-7B-v0.1
    c.family = model_family::mistral;
    sizes(4096, 14336, 32, 32, 8, 128, 32000, 32768, 1e-5, 10000.0);
    c.layer_windows.assign(c.num_hidden_layers, 4096);
  } else if (name == "phi-3-mini") {  // Phi-3-mini-4k-instruct
    c.family = model_family::phi3;
    sizes(3072, 8192, 32, 32, 32, 96, 32064, 4096, 1e-5, 10000.0);
    c.layer_windows.assign(c.num_hidden_layers, 2047);
  } else if (name == "gemma-2-2b") {
    sizes(2304, 9216, 26, 8, 4, 256, 256000, 8192, 1e-6, 10000.0);
    gemma2(256.0, 50.0, 4096);
  } else {
    raise(error_code::invalid_argument, "preset: unknown model preset '", name,
          "' (tiny, tiny-llama, tiny-llama3, tiny-qwen2-window, tiny-qwen3, tiny-qwen2moe, "
          "tiny-mistral, "
          "tiny-phi3, tiny-gemma2, qwen2-0.5b, llama-3.2-1b, qwen3-0.6b, mistral-7b, phi-3-mini, "
          "gemma-2-2b)");
  }
  if (c.layer_windows.empty()) c.layer_windows.assign(c.num_hidden_layers, 0);
  return s;
}

// The Hugging Face tensor names and shapes of a decoder of the config's family, in file order.
inline std::vector<std::pair<std::string, std::vector<std::size_t>>> tensor_list(
    const model_config& c) {
  std::vector<std::pair<std::string, std::vector<std::size_t>>> t;
  const std::size_t h = c.hidden_size, inter = c.intermediate_size;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {h}});
    if (c.family == model_family::phi3) {
      t.push_back({p + "self_attn.qkv_proj.weight", {c.q_size() + 2 * c.kv_size(), h}});
    } else {
      t.push_back({p + "self_attn.q_proj.weight", {c.q_size(), h}});
      t.push_back({p + "self_attn.k_proj.weight", {c.kv_size(), h}});
      t.push_back({p + "self_attn.v_proj.weight", {c.kv_size(), h}});
    }
    if (c.attention_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {c.q_size()}});
      t.push_back({p + "self_attn.k_proj.bias", {c.kv_size()}});
      t.push_back({p + "self_attn.v_proj.bias", {c.kv_size()}});
    }
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    t.push_back({p + "self_attn.o_proj.weight", {h, c.q_size()}});
    if (c.attention_output_bias) t.push_back({p + "self_attn.o_proj.bias", {h}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.sandwich_norms) {
      t.push_back({p + "pre_feedforward_layernorm.weight", {h}});
      t.push_back({p + "post_feedforward_layernorm.weight", {h}});
    }
    if (const moe_config& m = c.moe; m.in_layer(l)) {  // the names bind_moe reads
      const bool mixtral = c.family == model_family::llama || c.family == model_family::mistral;
      const std::string b = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const std::size_t f = m.expert_intermediate_size, sf = m.shared_expert_intermediate_size;
      t.push_back({b + "gate.weight", {m.experts, h}});
      for (std::size_t e = 0; e < m.experts; ++e) {
        const std::string x = b + "experts." + std::to_string(e) + ".";
        t.push_back({x + (mixtral ? "w1.weight" : "gate_proj.weight"), {f, h}});
        t.push_back({x + (mixtral ? "w3.weight" : "up_proj.weight"), {f, h}});
        t.push_back({x + (mixtral ? "w2.weight" : "down_proj.weight"), {h, f}});
      }
      if (sf != 0) {
        t.push_back({p + "mlp.shared_expert.gate_proj.weight", {sf, h}});
        t.push_back({p + "mlp.shared_expert.up_proj.weight", {sf, h}});
        t.push_back({p + "mlp.shared_expert.down_proj.weight", {h, sf}});
        t.push_back({p + "mlp.shared_expert_gate.weight", {1, h}});
      }
      continue;
    }
    if (c.family == model_family::phi3) {
      t.push_back({p + "mlp.gate_up_proj.weight", {2 * inter, h}});
    } else {
      t.push_back({p + "mlp.gate_proj.weight", {inter, h}});
      t.push_back({p + "mlp.up_proj.weight", {inter, h}});
    }
    t.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  t.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  return t;
}

namespace detail {

// splitmix64: a small, portable generator (std::normal_distribution differs between
// standard libraries; these streams must not).
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
};

inline std::uint64_t name_hash(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Mean and standard deviation of each kind of tensor.
inline std::pair<double, double> init_of(std::string_view name,
                                         const std::vector<std::size_t>& shape,
                                         const model_config& c) {
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  constexpr double embed_std = 0.1;
  // Gemma 2 stores norm weights as w - 1 (it scales by 1 + w).
  const double offset = c.norm_unit_offset ? 1.0 : 0.0;
  if (name == "model.norm.weight") {
    // Logits = E . (normed h * w): w sets their scale; std(logits) ~ embed_std sqrt(hidden) w.
    const double w = 4.0 / (embed_std * std::sqrt(static_cast<double>(c.hidden_size)));
    return {w - offset, 0.05 * w};
  }
  if (ends("layernorm.weight") || ends("_norm.weight")) return {1.0 - offset, 0.05};
  if (ends(".bias")) return {0.0, 0.02};
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return {0.0, embed_std};
  double std = 1.0 / std::sqrt(static_cast<double>(shape.back()));  // fan_in
  if (ends("o_proj.weight") || ends("down_proj.weight") || ends(".w2.weight")) {
    std /= std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
  }
  return {0.0, std};
}

template <class T>
void write_values(std::ofstream& out, std::size_t count, double mean, double std, splitmix64& rng) {
  std::vector<T> buf(std::min<std::size_t>(count, 1 << 16));
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(buf.size(), count - done);
    for (std::size_t i = 0; i < n; i += 2) {
      // Box-Muller: two normals from two uniforms.
      const double r = std::sqrt(-2.0 * std::log(rng.uniform()));
      const double a = 6.283185307179586 * rng.uniform();
      buf[i] = from_float<T>(static_cast<float>(mean + std * r * std::cos(a)));
      if (i + 1 < n) buf[i + 1] = from_float<T>(static_cast<float>(mean + std * r * std::sin(a)));
    }
    out.write(reinterpret_cast<const char*>(buf.data()),
              static_cast<std::streamsize>(n * sizeof(T)));
    done += n;
  }
}

}  // namespace detail

// Bumped whenever the generator's values change, so cached models are written again.
inline constexpr int generator_version = 4;

// config.json for a config of any family: the keys its HF config class reads, so that
// parse_config(config_json(c)) gives c back (tested).
inline nlohmann::json config_json(const model_config& c) {
  nlohmann::json j;
  const auto family = c.family;
  const char* arch = "Qwen2ForCausalLM";
  switch (family) {
    case model_family::qwen2: arch = "Qwen2ForCausalLM"; break;
    case model_family::llama: arch = "LlamaForCausalLM"; break;
    case model_family::qwen3: arch = "Qwen3ForCausalLM"; break;
    case model_family::mistral: arch = "MistralForCausalLM"; break;
    case model_family::phi3: arch = "Phi3ForCausalLM"; break;
    case model_family::gemma2: arch = "Gemma2ForCausalLM"; break;
  }
  j["architectures"] = {arch};
  j["model_type"] = std::string(to_string(family));
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (family == model_family::llama || family == model_family::qwen3 ||
      family == model_family::gemma2) {
    j["attention_bias"] = c.attention_bias;
  }
  j["torch_dtype"] = c.torch_dtype == npullm::dtype::f32   ? "float32"
                     : c.torch_dtype == npullm::dtype::f16 ? "float16"
                                                           : "bfloat16";
  j["hidden_act"] = c.hidden_act == activation_kind::gelu_tanh ? "gelu_pytorch_tanh" : "silu";
  // RoPE scaling.
  const auto& r = c.rope_scaling;
  if (r.kind == ops::rope_kind::llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  } else if (r.kind == ops::rope_kind::longrope) {
    j["rope_scaling"] = {
        {"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  } else if (r.kind != ops::rope_kind::none) {
    raise(error_code::unsupported, "config_json: rope_scaling ", ops::to_string(r.kind),
          " is not written by the generator");
  }
  // Windows, in the family's terms.
  std::size_t window = 0;
  for (std::size_t w : c.layer_windows) window = std::max(window, w);
  switch (family) {
    case model_family::qwen2:
    case model_family::qwen3: {
      // Qwen's rule: layers from max_window_layers on use the window.
      std::size_t first = c.layer_windows.size();
      while (first > 0 && c.layer_windows[first - 1] != 0) --first;
      for (std::size_t l = 0; l < first; ++l) {
        if (c.layer_windows[l] != 0) {
          raise(error_code::unsupported, "config_json: ", to_string(family),
                " windows must be on the last layers (max_window_layers)");
        }
      }
      j["use_sliding_window"] = window != 0;
      j["sliding_window"] = window != 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
      j["max_window_layers"] = window != 0 ? first : c.num_hidden_layers;
      break;
    }
    case model_family::llama: break;
    case model_family::mistral:
    case model_family::phi3:
      j["sliding_window"] = window != 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
      break;
    case model_family::gemma2:
      j["sliding_window"] = window != 0 ? window : 4096;
      j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
      j["attn_logit_softcapping"] = c.attn_logit_softcapping > 0
                                        ? nlohmann::json(c.attn_logit_softcapping)
                                        : nlohmann::json(nullptr);
      j["final_logit_softcapping"] = c.final_logit_softcapping > 0
                                         ? nlohmann::json(c.final_logit_softcapping)
                                         : nlohmann::json(nullptr);
      break;
  }
  // A mixture of experts: the mixture's model_type and keys (mixtral for a Llama / Mistral one).
  if (const moe_config& m = c.moe; m.experts != 0) {
    const bool mixtral = family == model_family::llama || family == model_family::mistral;
    if (!mixtral && family != model_family::qwen2 && family != model_family::qwen3) {
      raise(error_code::unsupported, "config_json: experts in a ", to_string(family), " model");
    }
    const bool qwen2 = family == model_family::qwen2;
    j["model_type"] = mixtral ? "mixtral" : qwen2 ? "qwen2_moe" : "qwen3_moe";
    j["architectures"] = {mixtral ? "MixtralForCausalLM"
                          : qwen2 ? "Qwen2MoeForCausalLM"
                                  : "Qwen3MoeForCausalLM"};
    j["num_experts_per_tok"] = m.experts_per_token;
    if (mixtral) {
      if (m.expert_intermediate_size != c.intermediate_size || !m.normalize_top_k ||
          m.shared_expert_intermediate_size != 0 || !m.layers.empty()) {
        raise(error_code::unsupported,
              "config_json: a Mixtral's experts are of intermediate_size, "
              "renormalized, with no shared expert, in every layer");
      }
      j["num_local_experts"] = m.experts;
      j.erase("attention_bias");
    } else {
      j["num_experts"] = m.experts;
      j["moe_intermediate_size"] = m.expert_intermediate_size;
      j["norm_topk_prob"] = m.normalize_top_k;
      if (qwen2) j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
      std::vector<std::size_t> dense;
      for (std::size_t l = 0; l < c.num_hidden_layers; ++l)
        if (!m.in_layer(l)) dense.push_back(l);
      j["mlp_only_layers"] = dense;
    }
  }
  j["npullm_generator_version"] = generator_version;
  return j;
}

// Writes config.json and model.safetensors into dir (created if needed). Each file is written
// under a temporary name and renamed, so an interrupted run leaves no half-written model.
inline void write_model(const std::filesystem::path& dir, const model_spec& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) raise(error_code::io, "cannot create ", dir.string(), ": ", ec.message());
  const model_config& c = spec.config;
  const std::string dtype_name = spec.weights == npullm::dtype::f32   ? "F32"
                                 : spec.weights == npullm::dtype::f16 ? "F16"
                                                                      : "BF16";
  const std::size_t elem = size_of(spec.weights);
  const auto tensors = tensor_list(c);

  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {
      {"format", "pt"}, {"generator", "npullm"}, {"seed", std::to_string(spec.seed)}};
  std::size_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    std::size_t count = 1;
    for (std::size_t d : shape) count *= d;
    header[name] = {
        {"dtype", dtype_name}, {"shape", shape}, {"data_offsets", {offset, offset + count * elem}}};
    offset += count * elem;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  const fs::path tmp = dir / "model.safetensors.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) raise(error_code::io, "cannot write ", tmp.string());
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, shape] : tensors) {
      std::size_t count = 1;
      for (std::size_t d : shape) count *= d;
      detail::splitmix64 rng{spec.seed ^ detail::name_hash(name)};
      const auto [mean, std] = detail::init_of(name, shape, c);
      switch (spec.weights) {
        case npullm::dtype::f32: detail::write_values<float>(out, count, mean, std, rng); break;
        case npullm::dtype::f16: detail::write_values<float16>(out, count, mean, std, rng); break;
        case npullm::dtype::bf16: detail::write_values<bfloat16>(out, count, mean, std, rng); break;
      }
    }
    if (!out) raise(error_code::io, "writing ", tmp.string(), " failed");
  }
  fs::rename(tmp, dir / "model.safetensors", ec);
  if (ec) raise(error_code::io, "cannot rename ", tmp.string(), ": ", ec.message());
  const fs::path cfg_tmp = dir / "config.json.tmp";
  {
    std::ofstream out(cfg_tmp, std::ios::trunc);
    if (!out) raise(error_code::io, "cannot write ", cfg_tmp.string());
    out << config_json(c).dump(2) << '\n';
    if (!out) raise(error_code::io, "writing ", cfg_tmp.string(), " failed");
  }
  fs::rename(cfg_tmp, dir / "config.json", ec);
  if (ec) raise(error_code::io, "cannot rename ", cfg_tmp.string(), ": ", ec.message());
}

// Writes the model into dir unless an up-to-date one (same generator version) is there.
// Returns true when it wrote one.
inline bool ensure_model(const std::filesystem::path& dir, const model_spec& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors", ec) && fs::exists(dir / "config.json", ec)) {
    std::ifstream in(dir / "config.json");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    const auto v = j.is_object() ? j.find("npullm_generator_version") : j.end();
    if (v != j.end() && v->is_number_integer() && v->get<int>() == generator_version) {
      return false;
    }
  }
  write_model(dir, spec);
  return true;
}

}  // namespace npullm::model
