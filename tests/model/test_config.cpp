#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace
