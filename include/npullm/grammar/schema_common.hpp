// schema_common: what the JSON Schema compiler's parts share (json_schema.hpp, schema_merge.hpp,
// json_text.hpp, schema_object.hpp, regex.hpp, number_range.hpp): the options, errors naming
// the keyword and the schema path, small expression helpers, the type bits of a schema and the
// keyword tables (annotations, known keywords), and the readers of counts and bounds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/grammar.hpp"

namespace npullm::grammar {

// Whitespace between a JSON text's tokens.
enum class json_whitespace {
  flexible,    // any JSON whitespace ([ \t\n\r]*) between tokens
  separators,  // exactly ", " and ": " (Python's json.dumps), none elsewhere: for generation,
               // where a model could otherwise emit whitespace without end
  compact,     // none: "," and ":"
};

struct json_schema_options {
  json_whitespace whitespace = json_whitespace::flexible;
  grammar_limits limits{};  // the compile budget (grammar.hpp): depth, rules, bytes, work
};

namespace detail {

using json = nlohmann::ordered_json;  // properties keep the order they are written in

[[noreturn]] inline void refuse(const std::string& path, std::string_view keyword,
                                std::string_view why = {}) {
  raise(error_code::unsupported, "JSON Schema at ", path, ": keyword '", keyword,
        "' is not supported", why.empty() ? "" : " (", why, why.empty() ? "" : ")");
}
[[noreturn]] inline void invalid(const std::string& path, std::string_view what) {
  raise(error_code::invalid_argument, "JSON Schema at ", path, ": ", what);
}
[[noreturn]] inline void fail_unsat(const std::string& path, std::string_view what) {
  raise(error_code::unsupported, "JSON Schema at ", path, ": ", what);
}

// An expression that matches nothing (false schemas): an empty alternative set.
inline expr never() {
  return expr::choice({});
}
inline bool is_never(const expr& e) {
  return e.kind == expr::alt && e.items.empty();
}

inline expr lit(std::string_view s) {
  return expr::literal(s);
}
inline expr chars(std::vector<std::pair<char32_t, char32_t>> r, bool negated = false) {
  return expr::of(char_class(std::move(r), negated));
}
inline expr star(expr e) {
  return expr::repeat(std::move(e), 0, expr::unbounded);
}
inline expr plus(expr e) {
  return expr::repeat(std::move(e), 1, expr::unbounded);
}

inline expr digit(char lo, char hi) {
  return chars({{static_cast<char32_t>(lo), static_cast<char32_t>(hi)}});
}

inline constexpr std::uint8_t t_null = 1, t_bool = 2, t_int = 4, t_num = 8, t_str = 16, t_arr = 32,
                              t_obj = 64, t_all = 127;

inline std::uint8_t type_bit(const json& t, const std::string& path) {
  if (!t.is_string()) invalid(path, "'type' entries must be strings");
  const std::string s = t.get<std::string>();
  if (s == "null") return t_null;
  if (s == "boolean") return t_bool;
  if (s == "integer") return t_int;
  if (s == "number") return t_num | t_int;
  if (s == "string") return t_str;
  if (s == "array") return t_arr;
  if (s == "object") return t_obj;
  invalid(path, "unknown type '" + s + "'");
}

// The types a schema allows, from 'type' or, without it, from the keywords present (a
// narrowing: {"properties": ...} alone is taken as an object).
inline std::uint8_t types_of(const json& s, const std::string& path) {
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_array()) {
      std::uint8_t m = 0;
      for (const auto& x : t) m |= type_bit(x, path);
      return m;
    }
    return type_bit(t, path);
  }
  std::uint8_t m = 0;
  for (const char* k : {"properties", "required", "additionalProperties", "minProperties",
                        "maxProperties", "patternProperties", "propertyNames"})
    if (s.contains(k)) m |= t_obj;
  for (const char* k : {"items", "prefixItems", "minItems", "maxItems", "additionalItems"})
    if (s.contains(k)) m |= t_arr;
  for (const char* k : {"minLength", "maxLength", "pattern", "format"})
    if (s.contains(k)) m |= t_str;
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
    if (s.contains(k)) m |= t_num | t_int;
  return m == 0 ? t_all : m;
}

inline bool value_has_type(const json& v, std::uint8_t types) {
  if (v.is_null()) return types & t_null;
  if (v.is_boolean()) return types & t_bool;
  if (v.is_number_integer() || v.is_number_unsigned()) return types & (t_int | t_num);
  if (v.is_number_float()) return types & t_num;  // 1.0 is not written as an integer
  if (v.is_string()) return types & t_str;
  if (v.is_array()) return types & t_arr;
  return types & t_obj;
}

inline bool annotation(std::string_view k) {
  static constexpr std::string_view names[] = {"$schema",
                                               "$id",
                                               "id",
                                               "$anchor",
                                               "$comment",
                                               "title",
                                               "description",
                                               "default",
                                               "examples",
                                               "example",
                                               "readOnly",
                                               "writeOnly",
                                               "deprecated",
                                               "definitions",
                                               "$defs",
                                               "$vocabulary",
                                               "contentMediaType",
                                               "contentEncoding",
                                               "nullable",
                                               "discriminator"};
  return std::find(std::begin(names), std::end(names), k) != std::end(names);
}
inline bool known_keyword(std::string_view k) {
  static constexpr std::string_view names[] = {"type",
                                               "enum",
                                               "const",
                                               "properties",
                                               "required",
                                               "additionalProperties",
                                               "minProperties",
                                               "maxProperties",
                                               "items",
                                               "prefixItems",
                                               "additionalItems",
                                               "minItems",
                                               "maxItems",
                                               "uniqueItems",
                                               "minLength",
                                               "maxLength",
                                               "pattern",
                                               "format",
                                               "minimum",
                                               "maximum",
                                               "exclusiveMinimum",
                                               "exclusiveMaximum",
                                               "multipleOf",
                                               "allOf",
                                               "anyOf",
                                               "oneOf",
                                               "not",
                                               "if",
                                               "then",
                                               "else",
                                               "$ref",
                                               "patternProperties",
                                               "propertyNames",
                                               "dependencies",
                                               "dependentRequired",
                                               "dependentSchemas",
                                               "contains"};
  return std::find(std::begin(names), std::end(names), k) != std::end(names);
}

inline bool has_values(const json& s) {
  return s.contains("enum") || s.contains("const");
}
inline std::vector<json> values_of(const json& s) {
  if (s.contains("const")) return {s["const"]};
  return s["enum"].get<std::vector<json>>();
}
inline std::uint8_t value_types(const json& s) {
  std::uint8_t m = 0;
  for (const auto& v : values_of(s)) {
    for (std::uint8_t bit = 1; bit < 128; bit <<= 1)
      if (value_has_type(v, bit)) m |= bit;
  }
  return m;
}

inline std::optional<double> num(const json& s, const char* k, const std::string& path) {
  if (!s.contains(k)) return std::nullopt;
  if (s[k].is_boolean()) return std::nullopt;  // draft 4 exclusive flags
  if (!s[k].is_number()) invalid(path, std::string("'") + k + "' must be a number");
  return s[k].get<double>();
}

inline std::optional<std::uint32_t> count(const json& s, const char* k, const std::string& path) {
  if (!s.contains(k)) return std::nullopt;
  const json& v = s[k];
  if (!v.is_number() || v.get<double>() < 0)
    invalid(path, std::string("'") + k + "' must be a non-negative number");
  const double d = v.get<double>();
  if (d > max_repetition_count) refuse(path, k, "above " + std::to_string(max_repetition_count));
  return static_cast<std::uint32_t>(std::ceil(d));
}

}  // namespace detail

}  // namespace npullm::grammar
