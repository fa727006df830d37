// json_schema: a JSON Schema (nlohmann::json) compiled to a grammar (grammar.hpp) of the JSON
// texts it accepts.
//
// Rule: a schema is compiled to exactly its instances or to fewer (a narrower grammar can
// only refuse a valid text), never to more: a keyword that constrains instances in a way this
// compiler cannot encode is refused (npullm::error `unsupported`, naming the keyword and the
// schema path), never ignored. Keywords that only annotate (title, description, default,
// examples, $schema, $id, $comment, readOnly, deprecated, ...) and names that are no JSON
// Schema keyword are ignored.
//
// Supported:
//   type (one or a list), true / false / {} schemas
//   object   properties (in the order written; each optional one may be left out),
//            required (names outside properties come after them, any value), additionalProperties
//            (false / true / a schema; extra keys after the named ones, written without escapes
//            and different from every named key), minProperties / maxProperties only where the
//            required set and property count already imply them
//   array    items (a schema, or a list: draft 4-7 prefix), prefixItems, additionalItems,
//            minItems, maxItems
//   string   minLength, maxLength, pattern (a regex subset, Python's re.search semantics: a
//            pattern not anchored with ^ / $ may have text around its match), format
//            (date-time, date, time, uuid, email, uri, ipv4; the other formats JSON Schema
//            defines are refused, names it does not define (int32, byte, path) are
//            annotations); pattern, format and lengths one at a time
//   integer  minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft 4 booleans too),
//            multipleOf 1; integers are written without a fraction (1.0 is refused);
//            bounds past +-1e18 narrow to +-1e18
//   number   minimum / maximum / exclusive* that are whole numbers (|bound| <= 1e15): then
//            written without an exponent; other bounds and multipleOf are refused
//   enum, const (each value as JSON, whitespace as the options say); beside other keywords,
//            only the values the rest of the schema's grammar accepts
//   not      of a boolean / empty schema, of a 'not', of a 'type' (the other types), of one
//            required name (an object without it); other forms are refused
//   anyOf, oneOf (only when its alternatives cannot overlap: different types or constants, or
//   made disjoint by narrowing objects: a property both fix to different constants becomes
//   required, or a property one requires becomes forbidden in the other),
//   allOf (merged: properties and required united, type intersected, equal other keywords;
//   annotations and unknown names (x-...) need not agree),
//   $ref to "#", "#/definitions/...", "#/$defs/..." and any JSON pointer in the document
//   (recursive schemas become recursive rules); siblings of $ref merge as allOf.
// Refused (unsupported): other forms of not, if / then / else, patternProperties, propertyNames,
// dependencies / dependentRequired / dependentSchemas, unevaluated*, contains, uniqueItems
// true, multipleOf other than integer 1, non-whole number bounds, remote $ref,
// unicode property classes and look-around / back-references in patterns.
//
// Whitespace (options.whitespace): JSON's [ \t\n\r]* between tokens (none before or after the
// value, so that a generation ends with it), json.dumps' ", " and ": " only, or none.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/automaton.hpp"
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

class schema_compiler {
 public:
  schema_compiler(const json& root, json_schema_options opt)
      : root_(root), opt_(opt), b_(opt.limits), work_(&own_work_) {}

  // The compact grammar of a subschema of the document (nullopt when it accepts nothing).
  std::optional<grammar> compile_at(const json& s, const std::string& path) {
    const std::uint32_t r = b_.rule("root");
    const expr body = value(s, path);
    if (is_never(body)) return std::nullopt;
    b_.define(r, body);
    return std::move(b_).build(r);
  }

  grammar compile() {
    const std::uint32_t r = b_.rule("root");
    const expr body = value(root_, "#");
    if (is_never(body)) fail_unsat("#", "the schema accepts no value");
    // No whitespace around the value: after it only the end of the text may come.
    b_.define(r, body);
    return std::move(b_).build(r);
  }

 private:
  // ---- errors -------------------------------------------------------------------------------
  [[noreturn]] static void refuse(const std::string& path, std::string_view keyword,
                                  std::string_view why = {}) {
    raise(error_code::unsupported, "JSON Schema at ", path, ": keyword '", keyword,
          "' is not supported", why.empty() ? "" : " (", why, why.empty() ? "" : ")");
  }
  [[noreturn]] static void invalid(const std::string& path, std::string_view what) {
    raise(error_code::invalid_argument, "JSON Schema at ", path, ": ", what);
  }
  [[noreturn]] static void fail_unsat(const std::string& path, std::string_view what) {
    raise(error_code::unsupported, "JSON Schema at ", path, ": ", what);
  }

  // An expression that matches nothing (false schemas): an empty alternative set.
  static expr never() { return expr::choice({}); }
  static bool is_never(const expr& e) { return e.kind == expr::alt && e.items.empty(); }

  static expr lit(std::string_view s) { return expr::literal(s); }
  static expr chars(std::vector<std::pair<char32_t, char32_t>> r, bool negated = false) {
    return expr::of(char_class(std::move(r), negated));
  }
  static expr star(expr e) { return expr::repeat(std::move(e), 0, expr::unbounded); }
  static expr plus(expr e) { return expr::repeat(std::move(e), 1, expr::unbounded); }

  // A shared rule made once by name.
  template <class F>
  expr shared(const std::string& name, F&& body) {
    const auto it = shared_.find(name);
    if (it != shared_.end()) return expr::call(it->second);
    const std::uint32_t r = b_.rule(name);
    shared_.emplace(name, r);
    b_.define(r, body());
    return expr::call(r);
  }

  expr ws() {
    if (opt_.whitespace != json_whitespace::flexible) return expr::sequence();
    return shared("ws", [] {
      return star(chars({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}));
    });
  }

  expr item_sep() {
    if (opt_.whitespace == json_whitespace::separators) return lit(", ");
    return expr::sequence({ws(), lit(","), ws()});
  }
  expr key_sep() {
    if (opt_.whitespace == json_whitespace::separators) return lit(": ");
    return expr::sequence({ws(), lit(":"), ws()});
  }

  // One character of a JSON string, any (escapes included).
  expr string_char() {
    return shared("char", [] {
      const expr hex = chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
      return expr::choice(
          {chars({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true),
           expr::sequence(
               {lit("\\"), expr::choice({chars({{'"', '"'},
                                                {'\\', '\\'},
                                                {'/', '/'},
                                                {'b', 'b'},
                                                {'f', 'f'},
                                                {'n', 'n'},
                                                {'r', 'r'},
                                                {'t', 't'}}),
                                         expr::sequence({lit("u"), hex, hex, hex, hex})})})});
    });
  }
  expr any_string() {
    return shared("string", [&] {
      return expr::sequence({lit("\""), star(string_char()), lit("\"")});
    });
  }
  expr integer_text() {
    return shared("integer", [] {
      return expr::sequence(
          {expr::optional(lit("-")),
           expr::choice(
               {lit("0"), expr::sequence({chars({{'1', '9'}}), star(chars({{'0', '9'}}))})})});
    });
  }
  expr number_text() {
    return shared("number", [&] {
      const expr digits = plus(chars({{'0', '9'}}));
      return expr::sequence({integer_text(), expr::optional(expr::sequence({lit("."), digits})),
                             expr::optional(expr::sequence(
                                 {chars({{'e', 'e'}, {'E', 'E'}}),
                                  expr::optional(chars({{'+', '+'}, {'-', '-'}})), digits}))});
    });
  }
  expr any_value() {
    const auto it = shared_.find("value");
    if (it != shared_.end()) return expr::call(it->second);
    const std::uint32_t r = b_.rule("value");
    shared_.emplace("value", r);
    const expr v = expr::call(r);
    const expr member = expr::sequence({any_string(), key_sep(), v});
    const expr object = expr::sequence(
        {lit("{"), ws(),
         expr::optional(expr::sequence({member, star(expr::sequence({item_sep(), member}))})), ws(),
         lit("}")});
    const expr array = expr::sequence(
        {lit("["), ws(), expr::optional(expr::sequence({v, star(expr::sequence({item_sep(), v}))})),
         ws(), lit("]")});
    b_.define(r, expr::choice({object, array, any_string(), number_text(), lit("true"),
                               lit("false"), lit("null")}));
    return v;
  }

  // ---- JSON values as literal text ------------------------------------------------------------
  expr json_literal(const json& v) {
    if (v.is_object()) {
      std::vector<expr> parts{lit("{"), ws()};
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) parts.insert(parts.end(), {item_sep()});
        first = false;
        parts.insert(parts.end(), {lit(json(k).dump()), key_sep(), json_literal(x)});
      }
      parts.insert(parts.end(), {ws(), lit("}")});
      return expr::sequence(std::move(parts));
    }
    if (v.is_array()) {
      std::vector<expr> parts{lit("["), ws()};
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i > 0) parts.insert(parts.end(), {item_sep()});
        parts.push_back(json_literal(v[i]));
      }
      parts.insert(parts.end(), {ws(), lit("]")});
      return expr::sequence(std::move(parts));
    }
    return lit(v.dump());
  }

  // ---- $ref -----------------------------------------------------------------------------------
  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#')
      refuse(path, "$ref", "only references inside the document ('#...') are resolved: " + ref);
    std::string pointer = ref.substr(1);
    // URI fragment decoding of %XX.
    std::string decoded;
    for (std::size_t i = 0; i < pointer.size(); ++i) {
      const auto hexv = [](char h) {
        return h >= '0' && h <= '9'   ? h - '0'
               : h >= 'a' && h <= 'f' ? h - 'a' + 10
               : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                      : -1;
      };
      if (pointer[i] == '%' && i + 2 < pointer.size() && hexv(pointer[i + 1]) >= 0 &&
          hexv(pointer[i + 2]) >= 0) {
        decoded += static_cast<char>(hexv(pointer[i + 1]) * 16 + hexv(pointer[i + 2]));
        i += 2;
      } else {
        decoded += pointer[i];
      }
    }
    try {
      const json::json_pointer p(decoded);
      if (!root_.contains(p)) invalid(path, "$ref '" + ref + "' points at nothing");
      return root_.at(p);
    } catch (const json::exception&) {
      invalid(path, "$ref '" + ref + "' is not a JSON pointer");
    }
  }

  expr ref_rule(const std::string& ref, const std::string& path) {
    const auto it = refs_.find(ref);
    if (it != refs_.end()) return expr::call(it->second);
    const json& target = resolve(ref, path);
    const std::uint32_t r = b_.fresh("ref");
    refs_.emplace(ref, r);
    const expr body = value(target, ref);
    if (is_never(body)) fail_unsat(path, "$ref '" + ref + "' accepts no value");
    b_.define(r, body);
    return expr::call(r);
  }

  // ---- keywords -------------------------------------------------------------------------------
  static constexpr std::uint8_t t_null = 1, t_bool = 2, t_int = 4, t_num = 8, t_str = 16,
                                t_arr = 32, t_obj = 64, t_all = 127;

  static std::uint8_t type_bit(const json& t, const std::string& path) {
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
  static std::uint8_t types_of(const json& s, const std::string& path) {
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
    for (const char* k :
         {"properties", "required", "additionalProperties", "minProperties", "maxProperties"})
      if (s.contains(k)) m |= t_obj;
    for (const char* k : {"items", "prefixItems", "minItems", "maxItems", "additionalItems"})
      if (s.contains(k)) m |= t_arr;
    for (const char* k : {"minLength", "maxLength", "pattern", "format"})
      if (s.contains(k)) m |= t_str;
    for (const char* k :
         {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
      if (s.contains(k)) m |= t_num | t_int;
    return m == 0 ? t_all : m;
  }

  static bool value_has_type(const json& v, std::uint8_t types) {
    if (v.is_null()) return types & t_null;
    if (v.is_boolean()) return types & t_bool;
    if (v.is_number_integer() || v.is_number_unsigned()) return types & (t_int | t_num);
    if (v.is_number_float()) return types & t_num;  // 1.0 is not written as an integer
    if (v.is_string()) return types & t_str;
    if (v.is_array()) return types & t_arr;
    return types & t_obj;
  }

  // Keywords that constrain instances and that value() does not encode.
  static void refuse_unsupported(const json& s, const std::string& path) {
    for (const char* k : {"not", "if", "then", "else", "patternProperties", "propertyNames",
                          "dependencies", "dependentRequired", "dependentSchemas",
                          "unevaluatedProperties", "unevaluatedItems", "contains", "minContains",
                          "maxContains", "$dynamicRef", "$recursiveRef", "contentSchema"}) {
      if (s.contains(k)) {
        const json& v = s[k];
        // Empty forms constrain nothing.
        if ((v.is_object() && v.empty() && std::string_view(k) != "not") ||
            (std::string_view(k) == "dependencies" && v.is_object() && v.empty()))
          continue;
        refuse(path, k);
      }
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) refuse(path, "uniqueItems");
  }

  // A schema's instances. Never returns never() for a schema that accepts something.
  expr value(const json& s, const std::string& path) {
    // Two levels a subschema, as in its document ("properties": {"a": {...}}); $ref may
    // reach deeper than the document itself.
    depth_ += 2;
    struct leave {
      std::uint32_t& d;
      ~leave() { d -= 2; }
    } guard{depth_};
    if (depth_ > opt_.limits.max_depth)
      raise(error_code::capacity_exhausted, "JSON Schema at ", path, ": subschemas nested ",
            depth_ / 2, " deep, deeper than grammar_limits::max_depth ", opt_.limits.max_depth,
            " allows");
    charge(1, path);
    if (s.is_boolean()) return s.get<bool>() ? any_value() : never();
    if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) invalid(path, "'$ref' must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      json rest = s;
      rest.erase("$ref");
      for (const char* k : {"$schema", "$id", "id", "definitions", "$defs", "title", "description",
                            "$comment", "default", "examples"})
        rest.erase(k);
      if (rest.empty()) return ref_rule(ref, path);
      json merged = json::object();
      merged["allOf"] = json::array({json{{"$ref", ref}}, rest});
      return value(merged, path);
    }
    if (s.contains("not")) return value(without_not(s, path), path);
    refuse_unsupported(s, path);
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.empty()) invalid(path, "'allOf' must be a non-empty array");
      json merged = s;
      merged.erase("allOf");
      for (std::size_t i = 0; i < all.size(); ++i) {
        json part = inline_refs(all[i], path + "/allOf/" + std::to_string(i));
        if (part.is_boolean()) {
          if (!part.get<bool>()) return never();
          continue;
        }
        if (part.contains("allOf")) {
          // Flatten nested allOf by compiling it merged first.
          json inner = part["allOf"];
          part.erase("allOf");
          for (const auto& x : inner) merged = merge(merged, inline_refs(x, path), path);
        }
        merged = merge(merged, part, path + "/allOf/" + std::to_string(i));
      }
      return value(merged, path);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const bool one = !s.contains("anyOf");
      if (s.contains("anyOf") && s.contains("oneOf")) refuse(path, "oneOf", "with anyOf beside it");
      const char* key = one ? "oneOf" : "anyOf";
      const json& alts = s[key];
      if (!alts.is_array() || alts.empty())
        invalid(path, std::string("'") + key + "' must be a non-empty array");
      json rest = s;
      rest.erase(key);
      for (const char* k : {"$schema", "$id", "id", "definitions", "$defs", "title", "description",
                            "$comment", "default", "examples"})
        rest.erase(k);
      // Alternatives stay as written ($ref compiles to a shared rule, recursion included)
      // unless siblings merge into them; oneOf's check looks through one $ref level.
      std::vector<json> parts;
      for (std::size_t i = 0; i < alts.size(); ++i) {
        const std::string at = path + "/" + key + "/" + std::to_string(i);
        if (rest.empty()) {
          parts.push_back(alts[i]);
          continue;
        }
        json a = inline_refs(alts[i], at);
        if (a.is_boolean()) {
          if (!a.get<bool>()) continue;
          a = json::object();
        }
        parts.push_back(merge(rest, a, at));
      }
      if (one) {
        std::vector<json> seen;
        for (std::size_t i = 0; i < parts.size(); ++i)
          seen.push_back(inline_refs(parts[i], path + "/" + key + "/" + std::to_string(i)));
        if (make_disjoint(seen, path)) parts = std::move(seen);
      }
      std::vector<expr> out;
      for (std::size_t i = 0; i < parts.size(); ++i) {
        expr e = value(parts[i], path + "/" + key + "/" + std::to_string(i));
        if (!is_never(e)) out.push_back(std::move(e));
      }
      if (out.empty()) return never();
      return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
    }
    std::uint8_t types = types_of(s, path);
    if (s.contains("enum") || s.contains("const")) {
      std::vector<json> values;
      if (s.contains("const")) values.push_back(s["const"]);
      if (s.contains("enum")) {
        if (!s["enum"].is_array()) invalid(path, "'enum' must be an array");
        if (s.contains("const")) refuse(path, "enum", "with const beside it");
        for (const auto& v : s["enum"]) values.push_back(v);
      }
      // Other keywords beside: the values are checked against them, by the grammar of the
      // rest of the schema (which accepts a value only if the schema does).
      json rest = s;
      rest.erase("enum");
      rest.erase("const");
      bool constrained = false;
      for (const auto& [k, v] : rest.items())
        constrained = constrained || (k != "type" && !annotation(k) && known_keyword(k));
      std::optional<byte_automaton> check;
      if (constrained) {
        // The same budget: its depth and work go on from ours.
        json_schema_options sub_opt = opt_;
        sub_opt.whitespace = json_whitespace::compact;
        schema_compiler sub(root_, sub_opt);
        sub.depth_ = depth_;
        sub.work_ = work_;
        auto g = sub.compile_at(rest, path);
        if (!g) return never();
        check.emplace(std::move(*g));
      }
      std::vector<expr> out;
      for (const auto& v : values)
        if (value_has_type(v, types) && (!check || check->matches(v.dump())))
          out.push_back(json_literal(v));
      if (out.empty()) return never();
      return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
    }
    std::vector<expr> out;
    if (types & t_null) out.push_back(lit("null"));
    if (types & t_bool) out.push_back(expr::choice({lit("true"), lit("false")}));
    if (types & t_num) {
      out.push_back(number(s, path));
    } else if (types & t_int) {
      out.push_back(integer(s, path));
    }
    if (types & t_str) out.push_back(string(s, path));
    if (types & t_arr) {
      expr a = array(s, path);
      if (!is_never(a)) out.push_back(std::move(a));
    }
    if (types & t_obj) {
      expr o = object(s, path);
      if (!is_never(o)) out.push_back(std::move(o));
    }
    if (out.empty()) return never();
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  // s with its 'not' rewritten as other keywords, where that is exact: not of a boolean or
  // an empty schema, of a 'not', of a 'type' (the other types), of one required name (an
  // object without it); refused otherwise.
  json without_not(const json& s, const std::string& path) {
    json rest = s;
    json n = rest["not"];
    rest.erase("not");
    if (n.is_object()) {
      for (auto it = n.begin(); it != n.end();)
        it = annotation(it.key()) ? n.erase(it) : std::next(it);
    }
    if (n.is_boolean() || (n.is_object() && n.empty())) {
      if (n == false) return rest.empty() ? json(true) : rest;
      return json(false);
    }
    if (!n.is_object()) invalid(path, "'not' must be a schema");
    if (n.size() == 1 && n.contains("not")) {
      json all = json::object();
      all["allOf"] = json::array({rest, n["not"]});
      return all;
    }
    if (n.size() == 1 && n.contains("type")) {
      const std::uint8_t excluded = types_of(n, path);
      std::uint8_t m = types_of(rest, path) & static_cast<std::uint8_t>(~excluded);
      if ((excluded & t_int) && !(excluded & t_num) && (m & t_num))
        refuse(path, "not", "numbers that are not integers");
      json list = json::array();
      for (const auto& [bit, name] :
           std::vector<std::pair<std::uint8_t, const char*>>{{t_null, "null"},
                                                             {t_bool, "boolean"},
                                                             {t_str, "string"},
                                                             {t_arr, "array"},
                                                             {t_obj, "object"}}) {
        if (m & bit) list.push_back(name);
      }
      if (m & t_num)
        list.push_back("number");
      else if (m & t_int)
        list.push_back("integer");
      if (list.empty()) return json(false);
      rest["type"] = list;
      return rest;
    }
    if (n.size() == 1 && n.contains("required") && n["required"].is_array() &&
        n["required"].size() == 1 && n["required"][0].is_string()) {
      const std::string name = n["required"][0].get<std::string>();
      const std::uint8_t m = types_of(rest, path) & t_obj;
      if (m == 0) return json(false);
      rest["type"] = "object";
      if (rest.contains("required") && std::find(rest["required"].begin(), rest["required"].end(),
                                                 json(name)) != rest["required"].end())
        return json(false);
      rest["properties"][name] = false;
      return rest;
    }
    refuse(path, "not");
  }

  static bool annotation(std::string_view k) {
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
  static bool known_keyword(std::string_view k) {
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

  // A schema with its $ref (and nested allOf) resolved, for merging.
  json inline_refs(const json& s, const std::string& path, int depth = 0) {
    if (depth > 32) refuse(path, "$ref", "a chain of more than 32 references to merge");
    charge(1, path);
    if (!s.is_object() || !s.contains("$ref")) return s;
    json rest = s;
    const std::string ref = rest["$ref"].get<std::string>();
    rest.erase("$ref");
    const json target = inline_refs(resolve(ref, path), path, depth + 1);
    if (target.is_boolean()) {
      if (!target.get<bool>()) return target;
      return rest;
    }
    // A recursive target (refers to itself further down) merges fine: its inner $ref stays.
    return merge(target, rest, path);
  }

  // allOf of two schemas (objects) as one, where expressible.
  json merge(const json& a, const json& b, const std::string& path) {
    if (a.is_boolean() || b.is_boolean()) invalid(path, "allOf of boolean schemas");
    charge(1 + a.size() + b.size(), path);  // the copy below
    // Merging recursive schemas would unroll them without end.
    if (++merge_depth_ > 32) {
      merge_depth_ = 0;
      refuse(path, "allOf", "parts that merge recursive schemas more than 32 levels deep");
    }
    struct leave {
      int& d;
      ~leave() { d = d > 0 ? d - 1 : 0; }
    } guard{merge_depth_};
    json out = a;
    for (const auto& [k, v] : b.items()) {
      if (k == "additionalProperties" || k == "properties") continue;  // below
      // Annotations and names that are no keyword (x-intellij-html-description, ...) constrain
      // nothing: the first part's stay, the parts need not agree on them.
      if (!out.contains(k) || annotation(k) || !known_keyword(k)) {
        if (!out.contains(k)) out[k] = v;
        continue;
      }
      // No reference into `out` is kept across an insertion into it: an ordered_json keeps its
      // members in a vector, which the insertion may move (a use-after-free found by ASan on a
      // schema whose definitions refer to each other through oneOf).
      if (out[k] == v) continue;
      if (k == "type") {
        const json& cur = out[k];
        const std::uint8_t m =
            types_of(json{{"type", cur}}, path) & types_of(json{{"type", v}}, path);
        json list = json::array();
        for (const auto& [bit, name] :
             std::vector<std::pair<std::uint8_t, const char*>>{{t_null, "null"},
                                                               {t_bool, "boolean"},
                                                               {t_str, "string"},
                                                               {t_arr, "array"},
                                                               {t_obj, "object"}}) {
          if (m & bit) list.push_back(name);
        }
        if ((m & t_num) && (m & t_int)) {
          list.push_back("number");
        } else if (m & t_int) {
          list.push_back("integer");
        }
        const bool none = list.empty();
        if (none) list.push_back("null");
        out[k] = std::move(list);  // `cur` is not used from here on
        if (none) out["enum"] = json::array();
      } else if (k == "required") {
        json& cur = out[k];  // only this array changes while `cur` is held
        if (!cur.is_array() || !v.is_array()) invalid(path, "'required' must be an array");
        for (const auto& x : v)
          if (std::find(cur.begin(), cur.end(), x) == cur.end()) cur.push_back(x);
      } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "minProperties") {
        json& cur = out[k];
        if (!v.is_number() || !cur.is_number()) invalid(path, "'" + k + "' must be a number");
        if (v.get<double>() > cur.get<double>()) cur = v;
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties") {
        json& cur = out[k];
        if (!v.is_number() || !cur.is_number()) invalid(path, "'" + k + "' must be a number");
        if (v.get<double>() < cur.get<double>()) cur = v;
      } else if (k == "anyOf" || k == "oneOf" || k == "enum") {
        refuse(path, "allOf", "two parts with different '" + k + "'");
      } else {
        refuse(path, "allOf", "parts with different '" + k + "'");
      }
    }
    // Properties: the union; a name one side does not list is checked by that side's
    // additionalProperties (false drops it, a schema merges into it).
    const json none = json::object();
    const json& pa = a.contains("properties") ? a["properties"] : none;
    const json& pb = b.contains("properties") ? b["properties"] : none;
    const json xa = a.contains("additionalProperties") ? a["additionalProperties"] : json(true);
    const json xb = b.contains("additionalProperties") ? b["additionalProperties"] : json(true);
    if (!pa.empty() || !pb.empty()) {
      json props = json::object();
      for (const json* side : {&pa, &pb}) {
        for (const auto& [pk, pv] : side->items()) {
          if (props.contains(pk)) continue;
          json v = pa.contains(pk) ? pa[pk] : xa;
          if (pb.contains(pk))
            v = merge_schema(v, pb[pk], path + "/properties/" + pk);
          else
            v = merge_schema(v, xb, path + "/properties/" + pk);
          if (v == false) continue;
          props[pk] = v;
        }
      }
      out["properties"] = props;
    }
    if (a.contains("additionalProperties") || b.contains("additionalProperties"))
      out["additionalProperties"] = merge_schema(xa, xb, path + "/additionalProperties");
    return out;
  }
  json merge_schema(const json& a, const json& b, const std::string& path) {
    if (a == b) return a;
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    if (b.is_boolean()) return b.get<bool>() ? a : b;
    return merge(inline_refs(a, path), inline_refs(b, path), path);
  }

  // oneOf as anyOf needs alternatives no instance matches twice.
  // Makes oneOf's alternatives match no value twice: each alternative is narrowed until it
  // excludes every other alternative as written (then a value it accepts matches it alone).
  // Objects narrow by a property both fix to different constants (required in it), else by
  // a property the other requires and it does not (forbidden in it). Returns whether it
  // changed any; refuses an alternative it cannot narrow so.
  bool make_disjoint(std::vector<json>& parts, const std::string& path) {
    const std::vector<json> orig = parts;
    bool changed = false;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      charge(parts.size(), path);  // quadratic in the alternatives
      for (std::size_t j = 0; j < parts.size(); ++j) {
        if (i == j || disjoint(parts[i], orig[j], path)) continue;
        if (exclude(parts[i], orig[j], path)) {
          changed = true;
          continue;
        }
        refuse(path, "oneOf",
               "alternatives " + std::to_string(std::min(i, j)) + " and " +
                   std::to_string(std::max(i, j)) + " may both match one value");
      }
    }
    return changed;
  }
  static bool is_object_schema(const json& s, const std::string& path) {
    return s.is_object() && !has_values(s) && !s.contains("anyOf") && !s.contains("oneOf") &&
           !s.contains("allOf") && !s.contains("$ref") && types_of(s, path) == t_obj;
  }
  // Narrows a so that no value it accepts matches b; false if it cannot.
  bool exclude(json& a, const json& b, const std::string& path) {
    if (!is_object_schema(a, path) || !is_object_schema(b, path)) return false;
    // Copies: a changes below.
    const json pa = a.contains("properties") ? a["properties"] : json::object();
    const json pb = b.contains("properties") ? b["properties"] : json::object();
    for (const auto& [name, x] : pa.items()) {
      if (!pb.contains(name)) continue;
      const json& y = pb[name];
      if (!x.is_object() || !y.is_object() || !has_values(x) || !has_values(y)) continue;
      bool overlap = false;
      for (const auto& u : values_of(x))
        for (const auto& w : values_of(y)) overlap = overlap || u == w;
      if (overlap) continue;
      if (!a.contains("required")) a["required"] = json::array();
      json& r = a["required"];
      if (std::find(r.begin(), r.end(), json(name)) == r.end()) r.push_back(name);
      return true;
    }
    const json ra = a.contains("required") ? a["required"] : json::array();
    const json rb = b.contains("required") ? b["required"] : json::array();
    for (const auto& r : rb) {
      if (!r.is_string() || std::find(ra.begin(), ra.end(), r) != ra.end()) continue;
      a["properties"][r.get<std::string>()] = false;
      return true;
    }
    return false;
  }
  bool disjoint(const json& a, const json& b, const std::string& path) {
    if (a.is_boolean() || b.is_boolean()) return (a == false) || (b == false);
    if (has_values(a) && has_values(b)) {
      for (const auto& x : values_of(a))
        for (const auto& y : values_of(b))
          if (x == y) return false;
      return true;
    }
    const std::uint8_t ta = has_values(a) ? value_types(a) : types_of(a, path);
    const std::uint8_t tb = has_values(b) ? value_types(b) : types_of(b, path);
    const auto norm = [](std::uint8_t t) {
      return (t & t_num) ? static_cast<std::uint8_t>(t | t_int) : t;
    };
    if ((norm(ta) & norm(tb)) == 0) return true;
    if (ta == t_obj && tb == t_obj) return objects_disjoint(a, b) || objects_disjoint(b, a);
    return false;
  }
  static bool has_values(const json& s) { return s.contains("enum") || s.contains("const"); }
  static std::vector<json> values_of(const json& s) {
    if (s.contains("const")) return {s["const"]};
    return s["enum"].get<std::vector<json>>();
  }
  static std::uint8_t value_types(const json& s) {
    std::uint8_t m = 0;
    for (const auto& v : values_of(s)) {
      for (std::uint8_t bit = 1; bit < 128; bit <<= 1)
        if (value_has_type(v, bit)) m |= bit;
    }
    return m;
  }
  // a requires a property that b cannot have, or both fix one property to different constants.
  static bool objects_disjoint(const json& a, const json& b) {
    if (!a.contains("required")) return false;
    const json bp = b.contains("properties") ? b["properties"] : json::object();
    const bool b_closed = b.contains("additionalProperties") && b["additionalProperties"] == false;
    for (const auto& r : a["required"]) {
      if (!r.is_string()) continue;
      const std::string name = r.get<std::string>();
      if (b_closed && !bp.contains(name)) return true;
      const json ap = a.contains("properties") ? a["properties"] : json::object();
      if (ap.contains(name) && bp.contains(name) && b.contains("required") &&
          std::find(b["required"].begin(), b["required"].end(), r) != b["required"].end()) {
        const json& x = ap[name];
        const json& y = bp[name];
        if (x.is_object() && y.is_object() && has_values(x) && has_values(y)) {
          bool overlap = false;
          for (const auto& u : values_of(x))
            for (const auto& w : values_of(y)) overlap = overlap || u == w;
          if (!overlap) return true;
        }
      }
    }
    return false;
  }

  // ---- numbers --------------------------------------------------------------------------------
  static std::optional<double> num(const json& s, const char* k, const std::string& path) {
    if (!s.contains(k)) return std::nullopt;
    if (s[k].is_boolean()) return std::nullopt;  // draft 4 exclusive flags
    if (!s[k].is_number()) invalid(path, std::string("'") + k + "' must be a number");
    return s[k].get<double>();
  }

  // Numbers with bounds that are whole numbers (|bound| <= 1e15), written without an
  // exponent when bounded (a narrowing); other bounds are refused.
  expr number(const json& s, const std::string& path) {
    if (s.contains("multipleOf")) refuse(path, "multipleOf");
    struct bound {
      std::int64_t v;
      bool exclusive;
    };
    std::optional<bound> lo, hi;
    const auto whole = [&](const char* k) -> std::int64_t {
      const double d = s[k].get<double>();
      if (std::floor(d) != d || std::fabs(d) > 1e15)
        refuse(path, k, "a bound on non-integer numbers that is not a whole number");
      return static_cast<std::int64_t>(d);
    };
    const auto tighter_lo = [&](bound b) {
      if (!lo || b.v > lo->v || (b.v == lo->v && b.exclusive)) lo = b;
    };
    const auto tighter_hi = [&](bound b) {
      if (!hi || b.v < hi->v || (b.v == hi->v && b.exclusive)) hi = b;
    };
    const bool d4_xmin = s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true;
    const bool d4_xmax = s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true;
    if (num(s, "minimum", path)) tighter_lo({whole("minimum"), d4_xmin});
    if (num(s, "maximum", path)) tighter_hi({whole("maximum"), d4_xmax});
    if (num(s, "exclusiveMinimum", path)) tighter_lo({whole("exclusiveMinimum"), true});
    if (num(s, "exclusiveMaximum", path)) tighter_hi({whole("exclusiveMaximum"), true});
    if (!lo && !hi) return number_text();
    std::vector<expr> out;
    // x >= 0 part: magnitudes in [max(lo, 0), hi].
    if (!hi || hi->v >= 0) {
      const bound mlo = lo && lo->v >= 0 ? *lo : bound{0, false};
      if (auto e = magnitude(mlo, hi ? std::optional<bound>(*hi) : std::nullopt))
        out.push_back(std::move(*e));
    }
    // x < 0 part: "-" and magnitudes in [max(-hi, 0), -lo].
    if (!lo || lo->v < 0) {
      const bound mlo = hi && hi->v < 0 ? bound{-hi->v, hi->exclusive} : bound{0, true};
      const std::optional<bound> mhi =
          lo ? std::optional<bound>(bound{-lo->v, lo->exclusive}) : std::nullopt;
      if (auto e = magnitude(mlo, mhi)) out.push_back(expr::sequence({lit("-"), std::move(*e)}));
    }
    if (out.empty()) return never();
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }
  // Decimal texts I or I.F (no exponent) whose value m is in [lo, hi] (each side inclusive or
  // exclusive; hi open when absent), lo >= 0; nullopt when none.
  template <class Bound>
  std::optional<expr> magnitude(Bound lo, std::optional<Bound> hi) {
    const expr digits = plus(digit('0', '9'));
    const expr any_frac = expr::optional(expr::sequence({lit("."), digits}));
    const expr zero_frac = expr::optional(expr::sequence({lit("."), plus(digit('0', '0'))}));
    const expr nonzero_frac =
        expr::sequence({lit("."), star(digit('0', '9')), digit('1', '9'), star(digit('0', '9'))});
    std::vector<expr> out;
    if (hi && (hi->v < lo.v || (hi->v == lo.v && (lo.exclusive || hi->exclusive))))
      return std::nullopt;
    if (hi && hi->v == lo.v) return expr::sequence({int_range(lo.v, lo.v), zero_frac});
    // Whole part strictly between: any fraction.
    if (!hi || hi->v - lo.v >= 2)
      out.push_back(expr::sequence(
          {int_range(lo.v + 1, hi ? std::optional<std::int64_t>(hi->v - 1) : std::nullopt),
           any_frac}));
    out.push_back(expr::sequence({int_range(lo.v, lo.v), lo.exclusive ? nonzero_frac : any_frac}));
    if (hi && !hi->exclusive) out.push_back(expr::sequence({int_range(hi->v, hi->v), zero_frac}));
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  expr integer(const json& s, const std::string& path) {
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!(m.is_number() && m.get<double>() == 1.0)) refuse(path, "multipleOf");
    }
    constexpr double limit = 1e18;
    std::optional<double> lo = num(s, "minimum", path), hi = num(s, "maximum", path);
    const bool draft4_xmin = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() &&
                             s["exclusiveMinimum"].get<bool>();
    const bool draft4_xmax = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() &&
                             s["exclusiveMaximum"].get<bool>();
    std::optional<std::int64_t> min, max;
    if (lo)
      min = static_cast<std::int64_t>(std::ceil(std::max(-limit, *lo)) +
                                      (draft4_xmin && std::ceil(*lo) == *lo ? 1 : 0));
    if (hi)
      max = static_cast<std::int64_t>(std::floor(std::min(limit, *hi)) -
                                      (draft4_xmax && std::floor(*hi) == *hi ? 1 : 0));
    if (const auto x = num(s, "exclusiveMinimum", path)) {
      const auto v = static_cast<std::int64_t>(std::floor(std::max(-limit, *x)) + 1);
      min = min ? std::max(*min, v) : v;
    }
    if (const auto x = num(s, "exclusiveMaximum", path)) {
      const auto v = static_cast<std::int64_t>(std::ceil(std::min(limit, *x)) - 1);
      max = max ? std::min(*max, v) : v;
    }
    if (!min && !max) return integer_text();
    if (min && max && *min > *max) return never();
    return int_range(min, max);
  }

  // Integers in [min, max] (either side open), without leading zeros.
  expr int_range(std::optional<std::int64_t> min, std::optional<std::int64_t> max) {
    std::vector<expr> out;
    // Negative part: -[max(1, -max) .. -min].
    if (!min || *min < 0) {
      const std::int64_t a = max ? std::max<std::int64_t>(1, -*max) : 1;
      const std::optional<std::int64_t> b = min ? std::optional<std::int64_t>(-*min) : std::nullopt;
      if (!b || a <= *b) out.push_back(expr::sequence({lit("-"), nonneg_range(a, b)}));
    }
    if (!max || *max >= 0) {
      const std::int64_t a = min ? std::max<std::int64_t>(0, *min) : 0;
      if (!max || a <= *max) out.push_back(nonneg_range(a, max));
    }
    if (out.empty()) return never();
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  static expr digit(char lo, char hi) {
    return chars({{static_cast<char32_t>(lo), static_cast<char32_t>(hi)}});
  }

  // Decimal numbers in [a, b] (b open when absent), a >= 0.
  expr nonneg_range(std::int64_t a, std::optional<std::int64_t> b) {
    const std::string sa = std::to_string(a);
    std::vector<expr> out;
    const std::size_t la = sa.size();
    const std::size_t lb = b ? std::to_string(*b).size() : la;
    for (std::size_t len = la; len <= lb; ++len) {
      std::string lo(len, '0');  // the smallest of len digits, or a
      lo[0] = '1';
      if (len == la) lo = sa;
      std::string hi = (b && len == lb) ? std::to_string(*b) : std::string(len, '9');
      out.push_back(same_length(lo, hi));
    }
    if (!b) {
      // More digits than a: any.
      out.push_back(expr::sequence(
          {digit('1', '9'),
           expr::repeat(digit('0', '9'), static_cast<std::uint32_t>(la), expr::unbounded)}));
    }
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }
  // Digit strings of one length in [lo, hi].
  static expr same_length(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return expr::sequence();
    const std::size_t rest = lo.size() - 1;
    if (lo[0] == hi[0])
      return expr::sequence({digit(lo[0], lo[0]), same_length(lo.substr(1), hi.substr(1))});
    const bool lo_zeros = lo.substr(1) == std::string(rest, '0');
    const bool hi_nines = hi.substr(1) == std::string(rest, '9');
    std::vector<expr> out;
    char first = lo[0], last = hi[0];
    if (!lo_zeros) {
      out.push_back(
          expr::sequence({digit(lo[0], lo[0]), same_length(lo.substr(1), std::string(rest, '9'))}));
      ++first;
    }
    if (!hi_nines) --last;
    if (first <= last)
      out.push_back(expr::sequence(
          {digit(first, last), expr::repeat(digit('0', '9'), static_cast<std::uint32_t>(rest),
                                            static_cast<std::uint32_t>(rest))}));
    if (!hi_nines)
      out.push_back(
          expr::sequence({digit(hi[0], hi[0]), same_length(std::string(rest, '0'), hi.substr(1))}));
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  // ---- strings --------------------------------------------------------------------------------
  static std::optional<std::uint32_t> count(const json& s, const char* k, const std::string& path) {
    if (!s.contains(k)) return std::nullopt;
    const json& v = s[k];
    if (!v.is_number() || v.get<double>() < 0)
      invalid(path, std::string("'") + k + "' must be a non-negative number");
    const double d = v.get<double>();
    if (d > 100000) refuse(path, k, "above 100000");
    return static_cast<std::uint32_t>(std::ceil(d));
  }

  expr string(const json& s, const std::string& path) {
    const auto min_len = count(s, "minLength", path);
    const auto max_len = count(s, "maxLength", path);
    const bool lengths = (min_len && *min_len > 0) || max_len;
    // A format JSON Schema does not define is an annotation: as if absent.
    const bool has_format = s.contains("format") && (!s["format"].is_string() ||
                                                     known_format(s["format"].get<std::string>()));
    if (s.contains("pattern")) {
      if (lengths) refuse(path, "pattern", "together with minLength / maxLength");
      if (has_format) refuse(path, "pattern", "together with format");
      if (!s["pattern"].is_string()) invalid(path, "'pattern' must be a string");
      return expr::sequence({lit("\""), pattern(s["pattern"].get<std::string>(), path), lit("\"")});
    }
    if (has_format) {
      if (!s["format"].is_string()) invalid(path, "'format' must be a string");
      if (lengths) refuse(path, "format", "together with minLength / maxLength");
      return expr::sequence({lit("\""), format(s["format"].get<std::string>(), path), lit("\"")});
    }
    if (!lengths) return any_string();
    const std::uint32_t lo = min_len.value_or(0);
    const std::uint32_t hi = max_len ? *max_len : expr::unbounded;
    if (hi != expr::unbounded && hi < lo) return never();
    return expr::sequence({lit("\""), expr::repeat(string_char(), lo, hi), lit("\"")});
  }

  // The formats JSON Schema defines (a validator may assert them: refused unless format()
  // encodes them); any other name (OpenAPI's int32 or byte, "path", "topic") is an annotation.
  static bool known_format(const std::string& f) {
    static constexpr std::string_view names[] = {
        "date-time",    "date",          "time",
        "duration",     "email",         "idn-email",
        "hostname",     "idn-hostname",  "ipv4",
        "ipv6",         "uri",           "uri-reference",
        "iri",          "iri-reference", "uuid",
        "uri-template", "json-pointer",  "relative-json-pointer",
        "regex"};
    return std::find(std::begin(names), std::end(names), f) != std::end(names);
  }
  expr format(const std::string& f, const std::string& path) {
    const auto d = [](int n) {
      return expr::repeat(digit('0', '9'), static_cast<std::uint32_t>(n),
                          static_cast<std::uint32_t>(n));
    };
    const auto hex = [] { return chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}); };
    if (f == "date" || f == "date-time") {
      const expr date = shared("date", [&] {
        // Days per month; 29 February only in leap years.
        const expr d01_28 = expr::choice({expr::sequence({digit('0', '0'), digit('1', '9')}),
                                          expr::sequence({digit('1', '1'), digit('0', '9')}),
                                          expr::sequence({digit('2', '2'), digit('0', '8')})});
        const expr d29 = lit("29"), d30 = lit("30"), d31 = lit("31");
        const expr m31 = expr::choice(
            {lit("01"), lit("03"), lit("05"), lit("07"), lit("08"), lit("10"), lit("12")});
        const expr m30 = expr::choice({lit("04"), lit("06"), lit("09"), lit("11")});
        const expr leap_tail = expr::choice(
            {expr::sequence({digit('0', '0'), chars({{'4', '4'}, {'8', '8'}})}),
             expr::sequence({chars({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}),
                             chars({{'0', '0'}, {'4', '4'}, {'8', '8'}})}),
             expr::sequence({chars({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}),
                             chars({{'2', '2'}, {'6', '6'}})})});
        const expr leap = expr::choice(
            {expr::sequence({d(2), leap_tail}), expr::sequence({leap_tail, lit("00")})});
        return expr::choice({
            expr::sequence({d(4), lit("-"), m31, lit("-"), expr::choice({d01_28, d29, d30, d31})}),
            expr::sequence({d(4), lit("-"), m30, lit("-"), expr::choice({d01_28, d29, d30})}),
            expr::sequence({d(4), lit("-02-"), d01_28}),
            expr::sequence({leap, lit("-02-29")}),
        });
      });
      if (f == "date") return date;
      return expr::sequence({date, lit("T"), time_expr()});
    }
    if (f == "time") return time_expr();
    if (f == "uuid") {
      return expr::sequence({expr::repeat(hex(), 8, 8), lit("-"), expr::repeat(hex(), 4, 4),
                             lit("-"), expr::repeat(hex(), 4, 4), lit("-"),
                             expr::repeat(hex(), 4, 4), lit("-"), expr::repeat(hex(), 12, 12)});
    }
    if (f == "email") {
      const expr local = plus(chars({{'a', 'z'},
                                     {'A', 'Z'},
                                     {'0', '9'},
                                     {'.', '.'},
                                     {'_', '_'},
                                     {'%', '%'},
                                     {'+', '+'},
                                     {'-', '-'}}));
      const expr label = plus(chars({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}}));
      return expr::sequence({local, lit("@"), label, plus(expr::sequence({lit("."), label}))});
    }
    if (f == "uri") {
      const expr scheme = expr::sequence(
          {chars({{'a', 'z'}, {'A', 'Z'}}),
           star(chars({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'+', '+'}, {'.', '.'}, {'-', '-'}}))});
      const expr plain =
          chars({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}, {'.', '.'}, {'_', '_'},
                 {'~', '~'}, {':', ':'}, {'/', '/'}, {'?', '?'}, {'#', '#'}, {'[', '['},
                 {']', ']'}, {'@', '@'}, {'!', '!'}, {'$', '$'}, {'&', '&'}, {'\'', '\''},
                 {'(', ')'}, {'*', '*'}, {'+', '+'}, {',', ','}, {';', ';'}, {'=', '='}});
      return expr::sequence(
          {scheme, lit(":"),
           star(expr::choice({plain, expr::sequence({lit("%"), hex(), hex()})}))});
    }
    if (f == "ipv4") {
      const expr octet =
          expr::choice({digit('0', '9'), expr::sequence({digit('1', '9'), digit('0', '9')}),
                        expr::sequence({lit("1"), d(2)}),
                        expr::sequence({lit("2"), digit('0', '4'), digit('0', '9')}),
                        expr::sequence({lit("25"), digit('0', '5')})});
      return expr::sequence({octet, lit("."), octet, lit("."), octet, lit("."), octet});
    }
    refuse(path, "format", "format '" + f + "'");
  }
  expr time_expr() {
    return shared("time", [&] {
      const auto d = [](char lo, char hi) { return digit(lo, hi); };
      const expr hh = expr::choice(
          {expr::sequence({d('0', '1'), d('0', '9')}), expr::sequence({d('2', '2'), d('0', '3')})});
      const expr mm = expr::sequence({d('0', '5'), d('0', '9')});
      const expr frac = expr::optional(expr::sequence({lit("."), plus(d('0', '9'))}));
      const expr offset = expr::choice(
          {lit("Z"), expr::sequence({chars({{'+', '+'}, {'-', '-'}}), hh, lit(":"), mm})});
      return expr::sequence({hh, lit(":"), mm, lit(":"), mm, frac, offset});
    });
  }

  // ---- patterns (a regex subset) over JSON-encoded string characters -------------------------
  struct regex_parser {
    std::string_view s;
    std::size_t i = 0;
    const std::string& path;
    schema_compiler& c;
    int depth = 0;  // open groups

    [[noreturn]] void no(std::string_view what) const {
      refuse(path, "pattern", std::string(what) + " in '" + std::string(s) + "'");
    }
    bool end() const { return i >= s.size(); }
    char peek() const { return i < s.size() ? s[i] : '\0'; }

    expr alternatives() {
      std::vector<expr> alts{sequence()};
      while (peek() == '|') {
        ++i;
        alts.push_back(sequence());
      }
      return alts.size() == 1 ? std::move(alts[0]) : expr::choice(std::move(alts));
    }
    expr sequence() {
      std::vector<expr> items;
      while (!end() && peek() != '|' && peek() != ')') {
        expr a = atom();
        items.push_back(quantified(std::move(a)));
      }
      return expr::sequence(std::move(items));
    }
    expr quantified(expr a) {
      for (;;) {
        std::uint32_t lo = 0, hi = 0;
        const char q = peek();
        if (q == '*') {
          lo = 0, hi = expr::unbounded;
          ++i;
        } else if (q == '+') {
          lo = 1, hi = expr::unbounded;
          ++i;
        } else if (q == '?') {
          lo = 0, hi = 1;
          ++i;
        } else if (q == '{' && i + 1 < s.size() &&
                   (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == ',')) {
          const std::size_t close = s.find('}', i);
          if (close == std::string_view::npos) no("an unterminated '{'");
          const std::string body(s.substr(i + 1, close - i - 1));
          const std::size_t comma = body.find(',');
          const auto to_n = [&](const std::string& t) -> std::uint32_t {
            if (t.empty() || t.size() > 5 ||
                !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
              no("a repetition count '{" + body + "}'");
            return static_cast<std::uint32_t>(std::stoul(t));
          };
          if (comma == std::string::npos) {
            lo = hi = to_n(body);
          } else {
            lo = comma == 0 ? 0 : to_n(body.substr(0, comma));
            hi = comma + 1 == body.size() ? expr::unbounded : to_n(body.substr(comma + 1));
          }
          if (hi < lo) no("a repetition with max < min");
          i = close + 1;
        } else {
          return a;
        }
        if (peek() == '?') ++i;  // lazy: the same language
        if (peek() == '+') no("a possessive quantifier");
        a = expr::repeat(std::move(a), lo, hi);
        if (a.depth > c.opt_.limits.max_depth)  // a{2}{2}{2}...: one level each
          raise(error_code::capacity_exhausted, "JSON Schema at ", path, ": pattern nested ",
                a.depth, " levels deep, deeper than grammar_limits::max_depth ",
                c.opt_.limits.max_depth);
      }
    }
    expr atom() {
      const char ch = peek();
      if (ch == '(') {
        if (++depth > 64) no("groups nested deeper than 64");
        ++i;
        if (peek() == '?') {
          if (s.substr(i, 2) == "?:") {
            i += 2;
          } else if (s.substr(i, 3) == "?P<" ||
                     (s.substr(i, 2) == "?<" && s.substr(i, 3) != "?<=" &&
                      s.substr(i, 3) != "?<!")) {
            const std::size_t close = s.find('>', i);
            if (close == std::string_view::npos) no("an unterminated group name");
            i = close + 1;
          } else {
            no("a look-around or flag group '(?'");
          }
        }
        expr inner = alternatives();
        if (peek() != ')') no("an unbalanced '('");
        ++i;
        --depth;
        return expr::sequence({std::move(inner)});
      }
      if (ch == '[') return c.json_chars(char_set(), path);
      if (ch == '.') {
        ++i;
        return c.json_chars(char_class({{'\n', '\n'}}, true), path);
      }
      if (ch == '^' || ch == '$') no("an anchor inside the pattern");
      if (ch == ')') no("an unbalanced ')'");
      if (ch == '*' || ch == '+' || ch == '?') no("a quantifier with nothing before it");
      if (ch == '\\') {
        std::vector<std::pair<char32_t, char32_t>> r;
        bool neg = false;
        escape(r, neg, false);
        return c.json_chars(char_class(std::move(r), neg), path);
      }
      char32_t cp = 0;
      if (!next_code_point(s, i, cp)) no("invalid UTF-8");
      return c.json_chars(char_class::single(cp), path);
    }
    // An escape at s[i] == '\\' into ranges (a class escape may be negated: \S).
    void escape(std::vector<std::pair<char32_t, char32_t>>& r, bool& neg, bool in_class) {
      ++i;
      if (end()) no("a trailing '\\'");
      const char e = s[i++];
      static const std::vector<std::pair<char32_t, char32_t>> space = {
          {'\t', '\r'},     {' ', ' '},       {0x1C, 0x1F},     {0x85, 0x85},
          {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
      switch (e) {
        case 'd': r.push_back({'0', '9'}); return;
        case 'w': r.insert(r.end(), {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}}); return;
        case 's': r.insert(r.end(), space.begin(), space.end()); return;
        case 'S':
          if (in_class) no("'\\S' inside a class");
          r.insert(r.end(), space.begin(), space.end());
          neg = true;
          return;
        case 'D':
        case 'W': no(std::string("'\\") + e + "' (its Unicode meaning)");
        case 'b':
        case 'B': no("a word boundary");
        case 'n': r.push_back({'\n', '\n'}); return;
        case 't': r.push_back({'\t', '\t'}); return;
        case 'r': r.push_back({'\r', '\r'}); return;
        case 'f': r.push_back({'\f', '\f'}); return;
        case 'v': r.push_back({'\v', '\v'}); return;
        case 'x':
        case 'u': {
          const int n = e == 'x' ? 2 : 4;
          if (i + static_cast<std::size_t>(n) > s.size()) no("a short hex escape");
          char32_t v = 0;
          for (int k = 0; k < n; ++k) {
            const char h = s[i++];
            int dv = -1;
            if (h >= '0' && h <= '9') dv = h - '0';
            if (h >= 'a' && h <= 'f') dv = h - 'a' + 10;
            if (h >= 'A' && h <= 'F') dv = h - 'A' + 10;
            if (dv < 0) no("a bad hex escape");
            v = v * 16 + static_cast<char32_t>(dv);
          }
          r.push_back({v, v});
          return;
        }
        default:
          if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            no(std::string("the escape '\\") + e + "'");
          r.push_back({static_cast<unsigned char>(e), static_cast<unsigned char>(e)});
          return;
      }
    }
    char_class char_set() {
      ++i;  // '['
      bool negated = false;
      if (peek() == '^') {
        negated = true;
        ++i;
      }
      std::vector<std::pair<char32_t, char32_t>> r;
      bool first = true;
      while (first || peek() != ']') {
        if (end()) no("an unterminated '['");
        first = false;
        if (s.substr(i, 2) == "[:") no("a POSIX class");
        char32_t lo = 0;
        if (peek() == '\\') {
          std::vector<std::pair<char32_t, char32_t>> e;
          bool neg = false;
          escape(e, neg, true);
          if (e.size() != 1 || e[0].first != e[0].second) {
            r.insert(r.end(), e.begin(), e.end());
            continue;
          }
          lo = e[0].first;
        } else if (!next_code_point(s, i, lo)) {
          no("invalid UTF-8");
        }
        char32_t hi = lo;
        if (peek() == '-' && i + 1 < s.size() && s[i + 1] != ']') {
          ++i;
          if (peek() == '\\') {
            std::vector<std::pair<char32_t, char32_t>> e;
            bool neg = false;
            escape(e, neg, true);
            if (e.size() != 1 || e[0].first != e[0].second) no("a range to a class escape");
            hi = e[0].first;
          } else if (!next_code_point(s, i, hi)) {
            no("invalid UTF-8");
          }
          if (hi < lo) no("a reversed range");
        }
        r.emplace_back(lo, hi);
      }
      ++i;
      return char_class(std::move(r), negated);
    }
  };

  // Code points of a class as JSON string text: plain where JSON allows it, the escape
  // json.dumps writes otherwise (\" \\ \n \t \r \b \f \u00XX).
  expr json_chars(const char_class& c, const std::string&) {
    std::vector<std::pair<char32_t, char32_t>> plain;
    std::vector<expr> alts;
    for (const auto& [lo, hi] : c.ranges()) {
      for (char32_t x = lo; x <= std::min<char32_t>(hi, 0x5C); ++x) {
        if (x < 0x20 || x == '"' || x == '\\') {
          alts.push_back(escaped(x));
        } else {
          plain.emplace_back(x, x);
        }
      }
      if (hi > 0x5C) plain.emplace_back(std::max<char32_t>(lo, 0x5D), hi);
    }
    if (!plain.empty()) alts.insert(alts.begin(), expr::of(char_class(std::move(plain))));
    if (alts.empty()) return never();
    return alts.size() == 1 ? std::move(alts[0]) : expr::choice(std::move(alts));
  }
  static expr escaped(char32_t x) {
    switch (x) {
      case '"': return lit("\\\"");
      case '\\': return lit("\\\\");
      case '\n': return lit("\\n");
      case '\t': return lit("\\t");
      case '\r': return lit("\\r");
      case '\b': return lit("\\b");
      case '\f': return lit("\\f");
      default: {
        static constexpr char hexd[] = "0123456789abcdef";
        const char lo = hexd[x & 15];
        const char hi = hexd[(x >> 4) & 15];
        return expr::sequence({lit("\\u00"),
                               chars({{static_cast<char32_t>(hi), static_cast<char32_t>(hi)}}),
                               chars({{static_cast<char32_t>(lo), static_cast<char32_t>(lo)},
                                      {static_cast<char32_t>(std::toupper(lo)),
                                       static_cast<char32_t>(std::toupper(lo))}})});
      }
    }
  }

  // The string body (between the quotes) that pattern matches somewhere (re.search).
  expr pattern(const std::string& p, const std::string& path) {
    // Top-level alternatives, each with its own anchors.
    std::vector<std::string> tops;
    {
      int depth = 0;
      bool in_class = false;
      std::string cur;
      for (std::size_t k = 0; k < p.size(); ++k) {
        const char ch = p[k];
        if (ch == '\\' && k + 1 < p.size()) {
          cur += ch;
          cur += p[++k];
          continue;
        }
        if (in_class) {
          if (ch == ']') in_class = false;
        } else if (ch == '[') {
          in_class = true;
          if (k + 1 < p.size() && p[k + 1] == ']') {
            cur += ch;
            cur += p[++k];
            continue;
          }
          if (k + 2 < p.size() && p[k + 1] == '^' && p[k + 2] == ']') {
            cur += "[^]";
            k += 2;
            continue;
          }
        } else if (ch == '(') {
          ++depth;
        } else if (ch == ')') {
          --depth;
        } else if (ch == '|' && depth == 0) {
          tops.push_back(cur);
          cur.clear();
          continue;
        }
        cur += ch;
      }
      tops.push_back(cur);
    }
    std::vector<expr> alts;
    for (std::string t : tops) {
      bool start = false, finish = false;
      if (!t.empty() && t[0] == '^') {
        start = true;
        t.erase(0, 1);
      }
      if (!t.empty() && t.back() == '$') {
        std::size_t bs = 0;
        for (std::size_t k = t.size() - 1; k > 0 && t[k - 1] == '\\'; --k) ++bs;
        if (bs % 2 == 0) {
          finish = true;
          t.pop_back();
        }
      }
      regex_parser rp{t, 0, path, *this};
      expr body = rp.alternatives();
      if (!rp.end()) rp.no("an unbalanced ')'");
      std::vector<expr> seq;
      if (!start) seq.push_back(star(string_char()));
      seq.push_back(std::move(body));
      if (!finish) seq.push_back(star(string_char()));
      alts.push_back(expr::sequence(std::move(seq)));
    }
    return alts.size() == 1 ? std::move(alts[0]) : expr::choice(std::move(alts));
  }

  // ---- arrays ---------------------------------------------------------------------------------
  expr array(const json& s, const std::string& path) {
    std::vector<expr> prefix;
    std::optional<expr> rest;  // nullopt: no items after the prefix
    const auto item_of = [&](const json& x, const std::string& p) { return value(x, p); };
    json items = s.contains("items") ? s["items"] : json(true);
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) invalid(path, "'prefixItems' must be an array");
      for (std::size_t k = 0; k < s["prefixItems"].size(); ++k)
        prefix.push_back(item_of(s["prefixItems"][k], path + "/prefixItems/" + std::to_string(k)));
    } else if (items.is_array()) {
      for (std::size_t k = 0; k < items.size(); ++k)
        prefix.push_back(item_of(items[k], path + "/items/" + std::to_string(k)));
      items = s.contains("additionalItems") ? s["additionalItems"] : json(true);
    }
    expr it = item_of(items, path + "/items");
    if (!is_never(it)) rest = std::move(it);
    std::uint32_t min = count(s, "minItems", path).value_or(0);
    std::uint32_t max = s.contains("maxItems") ? *count(s, "maxItems", path) : expr::unbounded;
    // A prefix item that accepts nothing caps the length before it.
    for (std::size_t k = 0; k < prefix.size(); ++k) {
      if (is_never(prefix[k])) {
        max = std::min<std::uint32_t>(max, static_cast<std::uint32_t>(k));
        prefix.resize(k);
        rest.reset();
        break;
      }
    }
    if (!rest) max = std::min<std::uint32_t>(max, static_cast<std::uint32_t>(prefix.size()));
    if (min > max) return never();
    // The item schema once as a rule: the rules below refer to it rather than copy it.
    if (rest && rest->kind != expr::ref && rest->kind != expr::cls) {
      const std::uint32_t r = b_.fresh("item");
      b_.define(r, *rest);
      rest = expr::call(r);
    }
    const auto element = [&](std::uint32_t k) -> expr {
      return k < prefix.size() ? prefix[k] : *rest;
    };
    const expr sep = item_sep();
    // tail(k): the items after k items written, k >= 1. From `fixed` items on (the prefix
    // and minItems written), every further item is optional and the same: a counted
    // repetition (the builder's shared chain, its size checked against the budget before it
    // is made), not a rule per item.
    const std::uint32_t fixed = std::max<std::uint32_t>(
        1, std::min(max, std::max<std::uint32_t>(static_cast<std::uint32_t>(prefix.size()), min)));
    expr tail = expr::sequence();
    if (max == expr::unbounded) {
      tail = star(expr::sequence({sep, *rest}));
    } else if (max > fixed) {
      tail = expr::repeat(expr::sequence({sep, *rest}), 0, max - fixed);
    }
    for (std::uint32_t k = fixed - 1; k >= 1; --k) {
      // After k items: item k+1 then tail(k+1), or stop when k >= min.
      const std::uint32_t r = b_.fresh("array");
      std::vector<expr> alts;
      alts.push_back(expr::sequence({sep, element(k), tail}));
      if (k >= min) alts.push_back(expr::sequence());
      b_.define(r, alts.size() == 1 ? alts[0] : expr::choice(alts));
      tail = expr::call(r);
    }
    std::vector<expr> body_alts;
    if (max >= 1) body_alts.push_back(expr::sequence({element(0), tail}));
    if (min == 0) body_alts.push_back(expr::sequence());
    return expr::sequence({lit("["), ws(),
                           body_alts.size() == 1 ? body_alts[0] : expr::choice(body_alts), ws(),
                           lit("]")});
  }

  // ---- objects --------------------------------------------------------------------------------
  expr object(const json& s, const std::string& path) {
    struct prop {
      std::string name;
      expr value;
      bool required;
    };
    std::vector<prop> props;
    std::set<std::string> names;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) invalid(path, "'required' must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) invalid(path, "'required' entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) invalid(path, "'properties' must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        expr e = value(v, path + "/properties/" + k);
        names.insert(k);
        if (is_never(e)) {
          if (required.count(k)) return never();
          continue;  // may not appear
        }
        props.push_back({k, std::move(e), required.count(k) > 0});
      }
    }
    json additional = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    for (const auto& r : s.contains("required") ? s["required"] : json::array()) {
      const std::string name = r.get<std::string>();
      if (names.count(name)) continue;
      expr e = value(additional, path + "/additionalProperties");
      if (is_never(e)) return never();
      names.insert(name);
      props.push_back({name, std::move(e), true});
    }
    std::optional<expr> extra;
    {
      expr e = value(additional, path + "/additionalProperties");
      if (!is_never(e)) extra = std::move(e);
    }
    // minProperties / maxProperties: only where already implied.
    std::size_t n_required = 0;
    for (const auto& p : props) n_required += p.required;
    if (s.contains("minProperties")) {
      const auto m = count(s, "minProperties", path).value_or(0);
      if (m > n_required) refuse(path, "minProperties", "more than the required properties");
    }
    if (s.contains("maxProperties")) {
      const auto m = count(s, "maxProperties", path).value_or(0);
      if (extra || m < props.size()) {
        if (m < n_required) return never();
        refuse(path, "maxProperties", "fewer than the properties that may appear");
      }
    }
    const expr sep = item_sep();
    const auto member = [&](const std::string& name, const expr& v) {
      return expr::sequence({lit(json(name).dump()), key_sep(), v});
    };
    std::optional<expr> extra_member;
    if (extra) extra_member = expr::sequence({other_key(names), key_sep(), *extra});
    // after(i): properties from i on, at least one written before; start(i): none yet.
    expr after = extra_member ? star(expr::sequence({sep, *extra_member})) : expr::sequence();
    expr start =
        extra_member ? expr::optional(expr::sequence({*extra_member, after})) : expr::sequence();
    // Many properties: each member a rule of its own, lowered once for its two places (100,000
    // properties: 2.0 -> 0.6 s); a few: inline, one frame fewer for the matcher.
    const bool member_rules = props.size() > 64;
    for (std::size_t i = props.size(); i-- > 0;) {
      const std::uint32_t ra = b_.fresh("obj");
      const std::uint32_t rs = b_.fresh("obj");
      expr m = member(props[i].name, props[i].value);
      if (member_rules) {
        const std::uint32_t rm = b_.fresh("member");
        b_.define(rm, m);
        m = expr::call(rm);
      }
      std::vector<expr> aa, sa;
      aa.push_back(expr::sequence({sep, m, after}));
      sa.push_back(expr::sequence({std::move(m), after}));
      if (!props[i].required) {
        aa.push_back(after);
        sa.push_back(start);
      }
      b_.define(ra, aa.size() == 1 ? aa[0] : expr::choice(std::move(aa)));
      b_.define(rs, sa.size() == 1 ? sa[0] : expr::choice(std::move(sa)));
      after = expr::call(ra);
      start = expr::call(rs);
    }
    return expr::sequence({lit("{"), ws(), start, ws(), lit("}")});
  }

  // A JSON string key without escapes that is none of `names`.
  expr other_key(const std::set<std::string>& names) {
    std::string key = "key";
    for (const auto& n : names) key += "\x1f" + n;
    const auto it = other_keys_.find(key);
    if (it != other_keys_.end()) return expr::call(it->second);
    // A trie of the names' code points; K(node) = the rest of a key (closing quote included)
    // that does not complete a name.
    struct node {
      std::map<char32_t, std::size_t> next;
      bool terminal = false;
    };
    std::vector<node> trie(1);
    for (const auto& n : names) {
      std::size_t at = 0;
      for (std::size_t k = 0; k < n.size();) {
        char32_t cp = 0;
        if (!next_code_point(n, k, cp)) break;
        auto f = trie[at].next.find(cp);
        if (f == trie[at].next.end()) {
          trie.push_back({});
          f = trie[at].next.emplace(cp, trie.size() - 1).first;
        }
        at = f->second;
      }
      trie[at].terminal = true;
    }
    const std::vector<std::pair<char32_t, char32_t>> specials = {
        {'"', '"'}, {'\\', '\\'}, {0, 0x1F}};
    const expr free_rest = shared("key-rest", [&] {
      return expr::sequence({star(chars(specials, true)), lit("\"")});
    });
    std::vector<std::uint32_t> rules(trie.size());
    for (auto& r : rules) r = b_.fresh("key");
    for (std::size_t k = 0; k < trie.size(); ++k) {
      std::vector<expr> alts;
      if (!trie[k].terminal) alts.push_back(lit("\""));
      std::vector<std::pair<char32_t, char32_t>> excluded = specials;
      for (const auto& [cp, child] : trie[k].next) {
        alts.push_back(
            expr::sequence({expr::of(char_class::single(cp)), expr::call(rules[child])}));
        excluded.emplace_back(cp, cp);
      }
      alts.push_back(expr::sequence({chars(excluded, true), free_rest}));
      b_.define(rules[k], expr::choice(alts));
    }
    const std::uint32_t r = b_.fresh("key");
    b_.define(r, expr::sequence({lit("\""), expr::call(rules[0])}));
    other_keys_.emplace(key, r);
    return expr::call(r);
  }

  // Work (grammar_limits::max_schema_work): $ref / allOf / oneOf expansion is exponential in
  // the worst case (allOf of two references to a definition that is itself such an allOf,
  // 40 deep: 2^40 merges); each step is charged and the budget refused by name.
  void charge(std::size_t units, const std::string& path) {
    *work_ += units;
    if (*work_ > opt_.limits.max_schema_work)
      raise(error_code::capacity_exhausted, "JSON Schema at ", path,
            ": expanding $ref / allOf / oneOf took more than grammar_limits::max_schema_work ",
            opt_.limits.max_schema_work, " steps");
  }

  const json& root_;
  json_schema_options opt_;
  grammar_builder b_;
  std::size_t own_work_ = 0;
  std::size_t* work_;  // own_work_, or the work of the compiler this one checks enums for
  std::map<std::string, std::uint32_t> shared_;
  std::map<std::string, std::uint32_t> refs_;
  std::map<std::string, std::uint32_t> other_keys_;
  std::uint32_t depth_ = 0;
  int merge_depth_ = 0;
};

// Parses JSON text into an ordered_json in linear time, refusing nesting past max_depth before
// building it: nlohmann's own parser inserts each member of an ordered_json object by a linear
// search of the members before it (a schema of 100,000 properties took 20 s to parse). A
// member is appended to the object's vector with an index of its keys beside it (a repeated
// key keeps its first place and its last value, as nlohmann's parser does). Only the
// innermost open container grows while it is open, so the pointers to the open ones stay valid.
class linear_json_parser : public nlohmann::json_sax<json> {
 public:
  explicit linear_json_parser(std::uint32_t max_depth) : max_depth_(max_depth) {}

  json parse(std::string_view text) {
    json::sax_parse(text.begin(), text.end(), this);
    return std::move(root_);
  }

  bool null() override { return put(json(nullptr)); }
  bool boolean(bool v) override { return put(json(v)); }
  bool number_integer(number_integer_t v) override { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)); }
  bool string(string_t& v) override { return put(json(std::move(v))); }
  bool binary(binary_t&) override { return put(json()); }  // not in JSON text
  bool start_object(std::size_t) override { return open(json::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    raise(error_code::invalid_argument, "JSON Schema is not valid JSON: ", e.what());
  }

 private:
  struct frame {
    json* v;
    std::unordered_map<std::string, std::size_t> keys;  // objects: member -> place
  };
  json* place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    frame& f = open_.back();
    if (f.v->is_array()) {
      auto& a = f.v->get_ref<json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    auto& o = f.v->get_ref<json::object_t&>();
    const auto [it, inserted] = f.keys.emplace(key_, o.size());
    if (!inserted) {
      auto& member = (o.begin() + static_cast<std::ptrdiff_t>(it->second))->second;
      member = std::move(v);
      return &member;
    }
    o.emplace_back(std::move(key_), std::move(v));  // the vector's own: no search
    return &o.back().second;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (open_.size() + 1 > max_depth_)
      raise(error_code::capacity_exhausted, "JSON Schema: the document is nested deeper than ",
            max_depth_, " levels (grammar_limits::max_depth)");
    json* p = place(std::move(v));
    open_.push_back({p, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::uint32_t max_depth_;
  json root_;
  std::string key_;
  std::vector<frame> open_;
};

// Refuses a document nested deeper than max_depth (objects and arrays), without recursion: the
// compiler, nlohmann's dump() and comparisons recurse on a schema's values (a const of
// 100,000 nested arrays), and they run only on documents within the depth budget.
inline void check_json_depth(const json& doc, std::uint32_t max_depth) {
  std::vector<std::pair<const json*, std::uint32_t>> todo{{&doc, 1}};
  while (!todo.empty()) {
    const auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (d > max_depth)
      raise(error_code::capacity_exhausted, "JSON Schema: the document is nested deeper than ",
            max_depth, " levels (grammar_limits::max_depth)");
    for (const auto& x : *v)
      if (x.is_structured()) todo.emplace_back(&x, d + 1);
  }
}

}  // namespace detail

// The grammar of the JSON texts a schema accepts (see the top); unsupported for keywords it
// cannot honour, invalid_argument for a malformed schema. Properties come in the order of the
// schema's text: pass an ordered_json (or the text); a nlohmann::json has sorted its keys.
inline grammar json_schema_grammar(const nlohmann::ordered_json& schema,
                                   json_schema_options opt = {}) {
  detail::check_json_depth(schema, opt.limits.max_depth);
  return detail::schema_compiler(schema, opt).compile();
}
inline grammar json_schema_grammar(std::string_view schema_text, json_schema_options opt = {}) {
  nlohmann::ordered_json schema;
  try {
    schema = detail::linear_json_parser(opt.limits.max_depth).parse(schema_text);
  } catch (const nlohmann::ordered_json::exception& e) {
    raise(error_code::invalid_argument, "JSON Schema is not valid JSON: ", e.what());
  }
  return json_schema_grammar(schema, opt);
}
// Text arguments are the schema's text, not a JSON string value.
inline grammar json_schema_grammar(const char* schema_text, json_schema_options opt = {}) {
  return json_schema_grammar(std::string_view(schema_text), opt);
}
inline grammar json_schema_grammar(const std::string& schema_text, json_schema_options opt = {}) {
  return json_schema_grammar(std::string_view(schema_text), opt);
}

}  // namespace npullm::grammar
