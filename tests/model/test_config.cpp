#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/model/config.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

using namespace npullm;
using namespace npullm::model;

// The published Qwen2-0.5B config.json fields.
constexpr const char* qwen2_05b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

TEST(Config, Qwen2) {
  const auto c = parse_config(qwen2_05b, "qwen2.json");
  EXPECT_EQ(c.family, model_family::qwen2);
  EXPECT_EQ(c.hidden_size, 896u);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.num_key_value_heads, 2u);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, npullm::dtype::bf16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  // The generator's preset has the same shapes.
  const auto p = preset("qwen2-0.5b").config;
  EXPECT_EQ(p.hidden_size, c.hidden_size);
  EXPECT_EQ(p.intermediate_size, c.intermediate_size);
  EXPECT_EQ(p.vocab_size, c.vocab_size);
}

TEST(Config, LlamaWithHeadDimAndDefaults) {
  const auto c = parse_config(R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
    "head_dim":128,"rope_theta":500000.0,"attention_bias":false})",
                              "llama.json");
  EXPECT_EQ(c.family, model_family::llama);
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048u);  // default when absent
}

TEST(Config, GeneratedConfigRoundTrips) {
  for (const char* name : {"tiny", "tiny-llama", "qwen2-0.5b"}) {
    const auto spec = preset(name, npullm::dtype::f16);
    const auto c = parse_config(config_json(spec.config).dump(), name);
    EXPECT_EQ(c.family, spec.config.family);
    EXPECT_EQ(c.num_hidden_layers, spec.config.num_hidden_layers);
    EXPECT_EQ(c.head_dim, spec.config.head_dim);
    EXPECT_EQ(c.attention_bias, spec.config.attention_bias);
    EXPECT_EQ(c.tie_word_embeddings, spec.config.tie_word_embeddings);
    EXPECT_EQ(c.torch_dtype, npullm::dtype::f16);
  }
}

void expect_error(const std::string& json, error_code code, const std::string& fragment) {
  try {
    (void)parse_config(json, "bad.json");
    FAIL() << "expected error: " << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

TEST(Config, EnsureModelWritesOnlyWhenStale) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("npullm_ensure_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto spec = preset("tiny", npullm::dtype::f32);
  EXPECT_TRUE(ensure_model(dir, spec));   // missing: written
  EXPECT_FALSE(ensure_model(dir, spec));  // up to date: kept
  {
    std::ofstream out(dir / "config.json");
    out << R"({"model_type":"qwen2"})";  // an older generator's: no version
  }
  EXPECT_TRUE(ensure_model(dir, spec));
  EXPECT_EQ(load_config(dir).hidden_size, 128u);
  std::filesystem::remove_all(dir);
}

TEST(Config, Errors) {
  expect_error(R"({"model_type":"gpt2"})", error_code::unsupported, "model_type 'gpt2'");
  expect_error("nope", error_code::corrupt_data, "not a JSON object");
  expect_error(R"({"hidden_size":8})", error_code::corrupt_data, "no model_type");
  expect_error(
      R"({"model_type":"qwen2","intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9})",
      error_code::corrupt_data, "missing hidden_size");
  expect_error(
      R"({"model_type":"qwen2","hidden_size":"64","intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9})",
      error_code::corrupt_data, "hidden_size is not a positive integer");
  expect_error(
      R"({"model_type":"qwen2","hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":6,"num_key_value_heads":4,"vocab_size":9,"head_dim":16})",
      error_code::corrupt_data, "not a multiple of num_key_value_heads 4");
  expect_error(
      R"({"model_type":"llama","hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9,"torch_dtype":"int8"})",
      error_code::unsupported, "torch_dtype 'int8'");
  EXPECT_THROW((void)load_config("/nonexistent/dir"), error);
}

// ---- the published configs, one per family (tests/model/configs) ----

const std::filesystem::path configs_dir = std::filesystem::path(__FILE__).parent_path() / "configs";

nlohmann::json read_json(const std::string& file) {
  std::ifstream in(configs_dir / file);
  EXPECT_TRUE(in) << file;
  return nlohmann::json::parse(in);
}

// What each file must read as, beside the values the walk below checks key by key.
struct expected_family {
  const char* file;
  model_family family;
  std::vector<std::size_t> windows;  // [num_hidden_layers]
  ops::rope_kind rope;
  std::size_t rotary_dim;
};

std::vector<std::size_t> repeat(std::size_t n, std::size_t w) {
  return std::vector<std::size_t>(n, w);
}
std::vector<std::size_t> alternate(std::size_t n, std::size_t w) {
  std::vector<std::size_t> v(n, 0);
  for (std::size_t l = 0; l < n; l += 2) v[l] = w;
  return v;
}

const std::vector<expected_family> families = {
    {"qwen2.5-0.5b-instruct.json", model_family::qwen2, repeat(24, 0), ops::rope_kind::none, 64},
    {"qwen3-0.6b.json", model_family::qwen3, repeat(28, 0), ops::rope_kind::none, 128},
    {"llama-3.2-1b-instruct.json", model_family::llama, repeat(16, 0), ops::rope_kind::llama3, 64},
    {"mistral-7b-v0.1.json", model_family::mistral, repeat(32, 4096), ops::rope_kind::none, 128},
    {"phi-3-mini-4k-instruct.json", model_family::phi3, repeat(32, 2047), ops::rope_kind::none, 96},
    {"phi-3-mini-128k-instruct.json", model_family::phi3, repeat(32, 262144),
     ops::rope_kind::longrope, 96},
    {"gemma-2-2b-it.json", model_family::gemma2, alternate(26, 4096), ops::rope_kind::none, 256},
};

using check_fn = std::function<void(const nlohmann::json&, const model_config&)>;

activation_kind activation_named(const std::string& s) {
  return s == "silu" ? activation_kind::silu : activation_kind::gelu_tanh;
}

// Key -> a check that model_config reflects the file's value. A key of a file that is neither
// here nor in ignorable_config_keys fails the walk.
std::map<std::string, check_fn> reflected_keys() {
  std::map<std::string, check_fn> m;
  auto size_key = [&](const char* key, std::size_t model_config::*field) {
    m[key] = [field, key](const nlohmann::json& v, const model_config& c) {
      EXPECT_EQ(c.*field, v.get<std::size_t>()) << key;
    };
  };
  size_key("hidden_size", &model_config::hidden_size);
  size_key("intermediate_size", &model_config::intermediate_size);
  size_key("num_hidden_layers", &model_config::num_hidden_layers);
  size_key("num_attention_heads", &model_config::num_attention_heads);
  size_key("num_key_value_heads", &model_config::num_key_value_heads);
  size_key("head_dim", &model_config::head_dim);
  size_key("vocab_size", &model_config::vocab_size);
  size_key("max_position_embeddings", &model_config::max_position_embeddings);
  m["model_type"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_EQ(to_string(c.family), v.get<std::string>());
  };
  m["architectures"] = [](const nlohmann::json& v, const model_config&) {
    for (const auto& a : v) EXPECT_NE(a.get<std::string>().find("ForCausalLM"), std::string::npos);
  };
  m["rms_norm_eps"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, v.get<double>());
  };
  m["rope_theta"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_DOUBLE_EQ(c.rope_theta, v.get<double>());
  };
  m["tie_word_embeddings"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_EQ(c.tie_word_embeddings, v.get<bool>());
  };
  m["attention_bias"] = [](const nlohmann::json& v, const model_config& c) {
    if (c.family == model_family::qwen2) {
      EXPECT_TRUE(c.attention_bias);  // implied
    } else {
      EXPECT_EQ(c.attention_bias, v.get<bool>());
      EXPECT_EQ(c.attention_output_bias, v.get<bool>());
    }
  };
  m["mlp_bias"] = [](const nlohmann::json& v, const model_config&) {
    EXPECT_FALSE(v.get<bool>());  // true is refused
  };
  m["hidden_act"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_EQ(c.hidden_act, activation_named(v.get<std::string>()));
  };
  m["hidden_activation"] = m["hidden_act"];
  m["torch_dtype"] = [](const nlohmann::json& v, const model_config& c) {
    const auto s = v.get<std::string>();
    EXPECT_EQ(c.torch_dtype, s == "float32"   ? npullm::dtype::f32
                             : s == "float16" ? npullm::dtype::f16
                                              : npullm::dtype::bf16);
  };
  m["rope_scaling"] = [](const nlohmann::json& v, const model_config& c) {
    if (v.is_null()) {
      EXPECT_EQ(c.rope_scaling.kind, ops::rope_kind::none);
      return;
    }
    const auto& s = c.rope_scaling;
    const auto type = v.contains("rope_type") ? v["rope_type"] : v["type"];
    EXPECT_EQ(ops::to_string(s.kind), type.get<std::string>());
    for (const auto& [key, value] : v.items()) {
      if (key == "rope_type" || key == "type") continue;
      if (key == "factor") {
        EXPECT_DOUBLE_EQ(s.factor, value.get<double>());
      } else if (key == "low_freq_factor") {
        EXPECT_DOUBLE_EQ(s.low_freq_factor, value.get<double>());
      } else if (key == "high_freq_factor") {
        EXPECT_DOUBLE_EQ(s.high_freq_factor, value.get<double>());
      } else if (key == "original_max_position_embeddings") {
        EXPECT_EQ(s.original_max_position_embeddings, value.get<std::size_t>());
      } else if (key == "short_factor") {
        EXPECT_EQ(s.short_factor, value.get<std::vector<double>>());
      } else if (key == "long_factor") {
        EXPECT_EQ(s.long_factor, value.get<std::vector<double>>());
      } else {
        ADD_FAILURE() << "rope_scaling." << key << " not checked";
      }
    }
  };
  // Read by longrope; without rope_scaling it must not extend anything.
  m["original_max_position_embeddings"] = [](const nlohmann::json& v, const model_config& c) {
    if (c.rope_scaling.kind == ops::rope_kind::longrope) {
      EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, v.get<std::size_t>());
      EXPECT_DOUBLE_EQ(c.rope_scaling.factor,
                       static_cast<double>(c.max_position_embeddings) / v.get<double>());
    } else {
      EXPECT_EQ(c.max_position_embeddings, v.get<std::size_t>());
    }
  };
  // The windows: checked against expected_family::windows; here, that each windowed layer has
  // the file's value.
  m["sliding_window"] = [](const nlohmann::json& v, const model_config& c) {
    for (std::size_t w : c.layer_windows)
      if (w != 0) {
        EXPECT_EQ(w, v.get<std::size_t>());
      }
  };
  m["use_sliding_window"] = [](const nlohmann::json& v, const model_config& c) {
    if (!v.get<bool>()) {
      for (std::size_t w : c.layer_windows) EXPECT_EQ(w, 0u);
    }
  };
  m["max_window_layers"] = [](const nlohmann::json& v, const model_config& c) {
    for (std::size_t l = 0; l < v.get<std::size_t>() && l < c.num_hidden_layers; ++l)
      EXPECT_EQ(c.window(l), 0u);
  };
  m["attn_logit_softcapping"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, v.get<double>());
  };
  m["final_logit_softcapping"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_DOUBLE_EQ(c.final_logit_softcapping, v.get<double>());
  };
  m["query_pre_attn_scalar"] = [](const nlohmann::json& v, const model_config& c) {
    EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, v.get<double>());
    EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(v.get<double>()));
  };
  return m;
}

TEST(ConfigFamilies, EveryKeyIsReadOrIgnorable) {
  const auto checks = reflected_keys();
  for (const auto& e : families) {
    SCOPED_TRACE(e.file);
    const auto j = read_json(e.file);
    const auto c = load_config(configs_dir / e.file);
    EXPECT_EQ(c.family, e.family);
    EXPECT_EQ(c.layer_windows, e.windows);
    EXPECT_EQ(c.rope_scaling.kind, e.rope);
    EXPECT_EQ(c.rotary_dim(), e.rotary_dim);
    for (const auto& [key, value] : j.items()) {
      SCOPED_TRACE(key);
      if (const auto it = checks.find(key); it != checks.end()) {
        it->second(value, c);
      } else {
        EXPECT_TRUE(is_ignorable_config_key(key)) << "neither read nor ignorable";
      }
    }
  }
}

TEST(ConfigFamilies, ImpliedByModelType) {
  const auto qwen3 = load_config(configs_dir / "qwen3-0.6b.json");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.q_size(), 16u * 128u);  // head_dim independent of hidden / heads
  EXPECT_FALSE(qwen3.attention_bias);
  const auto gemma = load_config(configs_dir / "gemma-2-2b-it.json");
  EXPECT_EQ(gemma.hidden_act, activation_kind::gelu_tanh);
  EXPECT_DOUBLE_EQ(gemma.embedding_scale, 48.0);
  EXPECT_TRUE(gemma.norm_unit_offset);
  EXPECT_TRUE(gemma.sandwich_norms);
  EXPECT_TRUE(gemma.tie_word_embeddings);  // Gemma2Config's default: the file omits it
  EXPECT_DOUBLE_EQ(gemma.attention_scale(), 1.0 / 16.0);
  for (const char* other : {"qwen2.5-0.5b-instruct.json", "llama-3.2-1b-instruct.json",
                            "mistral-7b-v0.1.json", "phi-3-mini-4k-instruct.json"}) {
    const auto c = load_config(configs_dir / other);
    EXPECT_FALSE(c.qk_norm || c.norm_unit_offset || c.sandwich_norms) << other;
    EXPECT_EQ(c.embedding_scale, 1.0) << other;
    EXPECT_EQ(c.attn_logit_softcapping, 0.0) << other;
    EXPECT_EQ(c.final_logit_softcapping, 0.0) << other;
    EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    EXPECT_EQ(c.hidden_act, activation_kind::silu) << other;
  }
  // Phi-3-mini-128k: long factors beyond 4096 positions, magnitude sqrt(1 + ln 32 / ln 4096).
  const auto phi = load_config(configs_dir / "phi-3-mini-128k-instruct.json");
  const auto long_table = make_rope_table(phi, 8192);
  EXPECT_TRUE(long_table.uses_long_factor());
  EXPECT_NEAR(long_table.attention_factor(), std::sqrt(1 + std::log(32.0) / std::log(4096.0)),
              1e-12);
  EXPECT_FALSE(make_rope_table(phi, 4096).uses_long_factor());
  // Llama 3.2: the llama3 frequencies, not plain RoPE.
  const auto llama = load_config(configs_dir / "llama-3.2-1b-instruct.json");
  const auto t = make_rope_table(llama, 16);
  EXPECT_NEAR(t.inv_freq()[31], std::pow(500000.0, -62.0 / 64.0) / 32.0, 1e-18);
}

// A minimal config of the family: only the required sizes.
std::string minimal(const std::string& type, const std::string& extra = "") {
  return R"({"model_type":")" + type +
         R"(","hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,)"
         R"("num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100)" +
         (extra.empty() ? "" : "," + extra) + "}";
}

TEST(ConfigFamilies, HfDefaults) {
  auto c = parse_config(minimal("qwen3"), "q3");
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_EQ(c.max_position_embeddings, 32768u);
  EXPECT_EQ(c.layer_windows, repeat(4, 0));  // use_sliding_window false
  c = parse_config(minimal("mistral"), "m");
  EXPECT_EQ(c.head_dim, 16u);
  EXPECT_EQ(c.max_position_embeddings, 131072u);
  EXPECT_EQ(c.layer_windows, repeat(4, 4096));  // MistralConfig's sliding_window 4096
  EXPECT_EQ(parse_config(minimal("mistral", R"("sliding_window":null)"), "m").layer_windows,
            repeat(4, 0));
  c = parse_config(minimal("phi3"), "p");
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.layer_windows, repeat(4, 0));
  c = parse_config(minimal("gemma2"), "g");
  EXPECT_EQ(c.head_dim, 256u);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, activation_kind::gelu_tanh);
  EXPECT_EQ(c.layer_windows, alternate(4, 4096));
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(parse_config(minimal("gemma2", R"("final_logit_softcapping":null)"), "g")
                .final_logit_softcapping,
            0.0);
  // num_key_value_heads absent: Qwen2Config's 32, LlamaConfig's num_attention_heads.
  const std::string no_kv = R"({"model_type":"%","hidden_size":64,"intermediate_size":8,)"
                            R"("num_hidden_layers":1,"num_attention_heads":32,"vocab_size":9})";
  auto with = [&](const char* type) {
    auto s = no_kv;
    s.replace(s.find('%'), 1, type);
    return parse_config(s, type);
  };
  EXPECT_EQ(with("qwen2").num_key_value_heads, 32u);
  EXPECT_EQ(with("llama").num_key_value_heads, 32u);
  EXPECT_EQ(with("mistral").num_key_value_heads, 8u);
}

TEST(ConfigFamilies, Qwen2WindowRule) {
  // Layers >= max_window_layers use the window, only when use_sliding_window is true.
  auto c = parse_config(
      minimal("qwen2", R"("use_sliding_window":true,"sliding_window":512,"max_window_layers":2)"),
      "q");
  EXPECT_EQ(c.layer_windows, (std::vector<std::size_t>{0, 0, 512, 512}));
  c = parse_config(minimal("qwen2", R"("use_sliding_window":true,"sliding_window":512,)"
                                    R"("layer_types":["sliding_attention","full_attention",)"
                                    R"("full_attention","sliding_attention"])"),
                   "q");
  EXPECT_EQ(c.layer_windows, (std::vector<std::size_t>{512, 0, 0, 512}));
  expect_error(minimal("qwen2", R"("sliding_window":512,"layer_types":["sliding_attention",)"
                                R"("full_attention","full_attention","full_attention"])"),
               error_code::unsupported, "layer 0 is a sliding_attention layer");
  expect_error(minimal("mistral", R"("layer_types":["full_attention","full_attention",)"
                                  R"("full_attention","full_attention"])"),
               error_code::unsupported, "layer_types contradicts mistral");
  expect_error(minimal("llama", R"("sliding_window":4096)"), error_code::unsupported,
               "sliding_window 4096 for llama");
  expect_error(minimal("gemma2", R"("sliding_window":null)"), error_code::unsupported,
               "no sliding_window");
}

TEST(ConfigFamilies, RopeVariantsParse) {
  auto c = parse_config(minimal("qwen3", R"("max_position_embeddings":40960,"rope_scaling":)"
                                         R"({"rope_type":"yarn","factor":4.0,)"
                                         R"("original_max_position_embeddings":32768})"),
                        "q");
  EXPECT_EQ(c.rope_scaling.kind, ops::rope_kind::yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);  // as given (HF 5), not 40960 / 32768
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32768u);
  EXPECT_NEAR(make_rope_table(c, 4).attention_factor(), 1 + 0.1 * std::log(4.0), 1e-12);
  c = parse_config(minimal("llama", R"("rope_scaling":{"type":"linear","factor":2.0})"), "l");
  EXPECT_EQ(c.rope_scaling.kind, ops::rope_kind::linear);
  c = parse_config(minimal("llama", R"("max_position_embeddings":4096,)"
                                    R"("rope_scaling":{"rope_type":"dynamic","factor":2.0})"),
                   "l");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096u);
  // HF 5's rope_parameters carries theta too.
  c = parse_config(
      minimal("llama", R"("rope_parameters":{"rope_type":"default","rope_theta":5e5})"), "l");
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.rope_scaling.kind, ops::rope_kind::none);
  // Phi-3's older spelling and its partial rotary factor.
  std::string lists;
  for (int i = 0; i < 4; ++i) lists += std::string(i ? "," : "") + "1.5";
  c = parse_config(minimal("phi3", R"("partial_rotary_factor":0.5,"max_position_embeddings":8192,)"
                                   R"("original_max_position_embeddings":4096,"rope_scaling":)"
                                   R"({"type":"su","short_factor":[)" +
                                       lists + R"(],"long_factor":[)" + lists + "]}"),
                   "p");
  EXPECT_EQ(c.rope_scaling.kind, ops::rope_kind::longrope);
  EXPECT_EQ(c.rotary_dim(), 8u);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  EXPECT_EQ(make_rope_table(c, 16).rotary_dim(), 8u);
}

TEST(ConfigFamilies, Refusals) {
  // Unknown values: unsupported naming the value.
  expect_error(minimal("llama", R"("rope_scaling":{"rope_type":"ntk-by-parts","factor":2.0})"),
               error_code::unsupported, "rope_type 'ntk-by-parts'");
  expect_error(minimal("qwen2", R"("hidden_act":"relu")"), error_code::unsupported,
               "hidden_act 'relu'");
  expect_error(minimal("gemma2", R"("hidden_activation":"gelu")"), error_code::unsupported,
               "hidden_activation 'gelu'");
  expect_error(minimal("gemma", ""), error_code::unsupported, "model_type 'gemma'");
  expect_error(minimal("llama", R"("my_new_knob":3)"), error_code::unsupported,
               "key 'my_new_knob' (value 3)");
  expect_error(minimal("llama", R"("rope_scaling":{"rope_type":"llama3","factor":8.0,)"
                                R"("low_freq_factor":1.0,"high_freq_factor":4.0,)"
                                R"("original_max_position_embeddings":8192,"beta_fast":4})"),
               error_code::unsupported, "rope_scaling.beta_fast (value 4)");
  // Keys that change the math but that npullm does not implement, or meaningless in a family.
  expect_error(minimal("llama", R"("mlp_bias":true)"), error_code::unsupported, "mlp_bias true");
  expect_error(minimal("mistral", R"("attention_bias":true)"), error_code::unsupported,
               "attention_bias true for mistral");
  expect_error(minimal("llama", R"("partial_rotary_factor":0.5)"), error_code::unsupported,
               "partial_rotary_factor 0.5 for llama");
  expect_error(minimal("qwen2", R"("attn_logit_softcapping":50.0)"), error_code::unsupported,
               "attn_logit_softcapping 50.0 for qwen2");
  expect_error(minimal("llama", R"("architectures":["LlamaForSequenceClassification"])"),
               error_code::unsupported, "architectures 'LlamaForSequenceClassification'");
  expect_error(minimal("qwen2", R"("hidden_act":"silu","hidden_activation":"gelu_pytorch_tanh")"),
               error_code::unsupported, "contradicts hidden_act");
  expect_error(minimal("phi3", R"("rope_scaling":{"type":"yarn","factor":2.0})"),
               error_code::unsupported, "'yarn' for phi3");
  // Wrong value types: corrupt_data naming the key.
  expect_error(minimal("llama", R"("rope_theta":"big")"), error_code::corrupt_data,
               "rope_theta is not a number");
  expect_error(minimal("llama", R"("tie_word_embeddings":"yes")"), error_code::corrupt_data,
               "tie_word_embeddings is not a boolean");
  expect_error(minimal("llama", R"("rope_scaling":3)"), error_code::corrupt_data,
               "rope_scaling is not an object");
  expect_error(minimal("llama", R"("rope_scaling":{"rope_type":"linear","factor":"2"})"),
               error_code::corrupt_data, "rope_scaling.factor is not a number");
  expect_error(minimal("mistral", R"("sliding_window":-1)"), error_code::corrupt_data,
               "sliding_window is not a positive integer");
  expect_error(minimal("gemma2", R"("layer_types":[1,2,3,4])"), error_code::corrupt_data,
               "layer_types[0] is not a string");
  expect_error(minimal("qwen2", R"("hidden_act":7)"), error_code::corrupt_data,
               "hidden_act is not a string");
  expect_error(minimal("llama", R"("rope_scaling":{"rope_type":"llama3","factor":8.0})"),
               error_code::corrupt_data, "llama3 needs");
  expect_error(minimal("phi3", R"("rope_scaling":{"type":"longrope","short_factor":[1.0],)"
                               R"("long_factor":[1.0]})"),
               error_code::corrupt_data, "short_factor has 1 values, rotary_dim 16 needs 8");
  expect_error(minimal("llama", R"("rope_scaling":{"rope_type":"linear","factor":0})"),
               error_code::corrupt_data, "factor must be > 0, got 0");
}

}  // namespace
