// config_reader: config.json read key by key for parse_config (config.hpp): detail::config_reader
// (typed reads naming the key and the file, which keys were consumed, the refusal of every key
// left unread), the hidden_act and the rope_scaling / rope_parameters readers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/model/config_types.hpp"
#include "npullm/ops/rope.hpp"

namespace npullm::model {

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

}  // namespace npullm::model
