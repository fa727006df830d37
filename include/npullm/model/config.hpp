// model_config: the run-time shapes of a Qwen2 or Llama family decoder, read from a Hugging
// Face config.json. Element types and policies are compile-time; these sizes are not.
//
//   parse_config(json_text, name)   from the file's text (`name` labels errors)
//   load_config(dir_or_file)        reads <dir>/config.json (or the file given)
// model_type must be "qwen2" or "llama" (anything else: unsupported). Missing required fields,
// wrong types and inconsistent sizes are corrupt_data naming the field and the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <string_view>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"

namespace npullm::model {

enum class model_family { qwen2, llama };

struct model_config {
  model_family family = model_family::qwen2;
  std::size_t hidden_size = 0;
  std::size_t intermediate_size = 0;
  std::size_t num_hidden_layers = 0;
  std::size_t num_attention_heads = 0;
  std::size_t num_key_value_heads = 0;
  std::size_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  std::size_t vocab_size = 0;
  std::size_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projection biases: Qwen2 always, Llama if configured
  npullm::dtype torch_dtype = npullm::dtype::f32;

  [[nodiscard]] std::size_t q_size() const noexcept { return num_attention_heads * head_dim; }
  [[nodiscard]] std::size_t kv_size() const noexcept { return num_key_value_heads * head_dim; }
};

inline std::string_view to_string(model_family f) noexcept {
  return f == model_family::qwen2 ? "qwen2" : "llama";
}

inline model_config parse_config(std::string_view text, std::string_view name) {
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  auto fail = [&](const std::string& what) -> void {
    raise(error_code::corrupt_data, "config ", name, ": ", what);
  };
  if (j.is_discarded() || !j.is_object()) fail("not a JSON object");
  const auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) fail("no model_type string");
  model_config c;
  const std::string model_type = type->get<std::string>();
  if (model_type == "qwen2") {
    c.family = model_family::qwen2;
  } else if (model_type == "llama") {
    c.family = model_family::llama;
  } else {
    raise(error_code::unsupported, "config ", name, ": model_type '", model_type,
          "' (npullm reads qwen2 and llama)");
  }
  auto size = [&](const char* key, bool required, std::size_t fallback) -> std::size_t {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) fail(std::string("missing ") + key);
      return fallback;
    }
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() == 0)
      fail(std::string(key) + " is not a positive integer");
    return static_cast<std::size_t>(it->get<std::uint64_t>());
  };
  auto number = [&](const char* key, double fallback) -> double {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(std::string(key) + " is not a number");
    return it->get<double>();
  };
  auto flag = [&](const char* key, bool fallback) -> bool {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(std::string(key) + " is not a boolean");
    return it->get<bool>();
  };
  c.hidden_size = size("hidden_size", true, 0);
  c.intermediate_size = size("intermediate_size", true, 0);
  c.num_hidden_layers = size("num_hidden_layers", true, 0);
  c.num_attention_heads = size("num_attention_heads", true, 0);
  c.num_key_value_heads = size("num_key_value_heads", false, c.num_attention_heads);
  c.vocab_size = size("vocab_size", true, 0);
  c.max_position_embeddings = size("max_position_embeddings", false, 2048);
  if (c.hidden_size % c.num_attention_heads != 0 && !j.contains("head_dim")) {
    fail("hidden_size " + std::to_string(c.hidden_size) +
         " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads) +
         " and no head_dim is given");
  }
  c.head_dim = size("head_dim", false, c.hidden_size / c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("num_attention_heads " + std::to_string(c.num_attention_heads) +
         " is not a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  }
  c.rms_norm_eps = number("rms_norm_eps", 1e-6);
  c.rope_theta = number("rope_theta", 10000.0);
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 1))
    fail("rms_norm_eps must be > 0 and rope_theta > 1");
  c.tie_word_embeddings = flag("tie_word_embeddings", false);
  c.attention_bias = c.family == model_family::qwen2 ? true : flag("attention_bias", false);
  if (const auto d = j.find("torch_dtype"); d != j.end() && !d->is_null()) {
    if (!d->is_string()) fail("torch_dtype is not a string");
    const std::string s = d->get<std::string>();
    if (s == "float32") {
      c.torch_dtype = npullm::dtype::f32;
    } else if (s == "float16") {
      c.torch_dtype = npullm::dtype::f16;
    } else if (s == "bfloat16") {
      c.torch_dtype = npullm::dtype::bf16;
    } else {
      raise(error_code::unsupported, "config ", name, ": torch_dtype '", s, "'");
    }
  }
  return c;
}

inline model_config load_config(const std::filesystem::path& path) {
  std::error_code ec;  // a path that cannot be inspected is read as a file: the open fails (io)
  const auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) raise(error_code::io, "cannot read ", file.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file.string());
}

}  // namespace npullm::model
