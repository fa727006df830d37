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
//            and different from every named key), patternProperties and propertyNames (keys
//            sorted by the patterns they match: key_automaton.hpp; a named key takes its
//            schema merged with each pattern it matches), minProperties / maxProperties
//            (members counted), dependencies / dependentRequired (lists, or schemas listing
//            only required: names written tracked along the properties)
//   array    items (a schema, or a list: draft 4-7 prefix), prefixItems, additionalItems,
//            minItems, maxItems, uniqueItems over a few constants (an enum / const of at
//            most 8 values that are no objects, booleans)
//   string   minLength, maxLength, pattern (a regex subset, Python's re.search semantics: a
//            pattern not anchored with ^ / $ may have text around its match), format
//            (date-time, date, time, uuid, email, uri, ipv4; the other formats JSON Schema
//            defines are refused, names it does not define (int32, byte, path) are
//            annotations); a pattern or a format with lengths (its automaton with a count of
//            characters); pattern and format not together
//   integer  minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft 4 booleans too),
//            multipleOf a whole number up to 1000 (listed in a range of at most 1000
//            multiples, else a remainder automaton without a maximum); integers are written
//            without a fraction (1.0 is refused); bounds past +-1e18 narrow to +-1e18
//   number   minimum / maximum / exclusive* up to 1e15, any decimals (written without an
//            exponent when bounded, compared digit by digit); a whole multipleOf narrows to
//            integers, other multipleOf is refused
//   enum, const (each value as JSON, whitespace as the options say); beside other keywords,
//            only the values the rest of the schema's grammar accepts
//   not      of a boolean / empty schema, of a 'not', of a 'type' (the other types), of one
//            required name (an object without it); other forms are refused
//   anyOf, oneOf (only when its alternatives cannot overlap: different types or constants, or
//   made disjoint by narrowing objects: a property both fix to different constants becomes
//   required, or a property one requires becomes forbidden in the other; string
//   alternatives that overlap: the strings exactly one accepts),
//   allOf (merged: properties and required united, type intersected, equal other keywords;
//   annotations and unknown names (x-...) need not agree),
//   $ref to "#", "#/definitions/...", "#/$defs/..." and any JSON pointer in the document
//   (recursive schemas become recursive rules); siblings of $ref merge as allOf.
// Refused (unsupported): other forms of not, if / then / else, dependentSchemas, unevaluated*,
// contains, other uniqueItems, other multipleOf, bounds past 1e15 on numbers, remote $ref,
// unicode property classes and look-around / back-references in patterns, key patterns
// that tell non-ASCII characters apart.
//
// Parts: schema_common.hpp (options, errors, keyword tables), schema_document.hpp (parsing),
// schema_merge.hpp (allOf / $ref / oneOf / not rewriting), json_text.hpp (JSON text rules,
// formats, keys), schema_object.hpp (arrays, objects), key_automaton.hpp (key and string
// languages), regex.hpp (pattern), number_range.hpp (numeric ranges).
//
// Whitespace (options.whitespace): JSON's [ \t\n\r]* between tokens (none before or after the
// value, so that a generation ends with it), json.dumps' ", " and ": " only, or none.
#pragma once
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/automaton.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/key_automaton.hpp"
#include "npullm/grammar/number_range.hpp"
#include "npullm/grammar/regex.hpp"
#include "npullm/grammar/schema_common.hpp"
#include "npullm/grammar/schema_document.hpp"
#include "npullm/grammar/schema_merge.hpp"
#include "npullm/grammar/schema_object.hpp"

namespace npullm::grammar {

namespace detail {

class schema_compiler : public schema_structures {
 public:
  schema_compiler(const json& root, json_schema_options opt) : schema_structures(root, opt) {}

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

  // Keywords that constrain instances and that value() does not encode.
  static void refuse_unsupported(const json& s, const std::string& path) {
    for (const char* k : {"not", "if", "then", "else", "dependentSchemas", "unevaluatedProperties",
                          "unevaluatedItems", "contains", "minContains", "maxContains",
                          "$dynamicRef", "$recursiveRef", "contentSchema"}) {
      if (s.contains(k)) {
        const json& v = s[k];
        // Empty forms constrain nothing.
        if ((v.is_object() && v.empty() && std::string_view(k) != "not") ||
            (std::string_view(k) == "dependencies" && v.is_object() && v.empty()))
          continue;
        refuse(path, k);
      }
    }
  }

  // A schema's instances. Never returns never() for a schema that accepts something.
  expr value(const json& s, const std::string& path) override {
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
        if (auto e = strings_one_of(seen, path)) return std::move(*e);
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

  // Numbers with bounds that are whole numbers (|bound| <= 1e15), written without an
  // exponent when bounded (a narrowing); other bounds are refused.
  expr number(const json& s, const std::string& path) {
    // A whole multipleOf: integers only (a narrowing: 10.0 is a multiple of 5 too).
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || std::floor(m.get<double>()) != m.get<double>())
        refuse(path, "multipleOf", "a step that is not a whole number");
      return integer(s, path);
    }
    struct bound {
      double v;
      bool exclusive;
    };
    std::optional<bound> lo, hi;
    const auto read = [&](const char* k) -> double {
      const double d = s[k].get<double>();
      if (!(std::fabs(d) <= 1e15)) refuse(path, k, "a bound past 1e15 on non-integer numbers");
      return d;
    };
    const auto tighter_lo = [&](bound b) {
      if (!lo || b.v > lo->v || (b.v == lo->v && b.exclusive)) lo = b;
    };
    const auto tighter_hi = [&](bound b) {
      if (!hi || b.v < hi->v || (b.v == hi->v && b.exclusive)) hi = b;
    };
    const bool d4_xmin = s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true;
    const bool d4_xmax = s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true;
    if (num(s, "minimum", path)) tighter_lo({read("minimum"), d4_xmin});
    if (num(s, "maximum", path)) tighter_hi({read("maximum"), d4_xmax});
    if (num(s, "exclusiveMinimum", path)) tighter_lo({read("exclusiveMinimum"), true});
    if (num(s, "exclusiveMaximum", path)) tighter_hi({read("exclusiveMaximum"), true});
    if (!lo && !hi) return number_text();
    // Bounded: decimal texts without an exponent (number_range.hpp), each part a magnitude.
    const auto mag = [](const bound& x) { return *decimal_of(x.v, x.exclusive); };
    std::vector<expr> out;
    // x >= 0 part: magnitudes in [max(lo, 0), hi].
    if (!hi || hi->v >= 0) {
      const decimal_bound mlo = lo && lo->v >= 0 ? mag(*lo) : decimal_bound{};
      if (auto e = decimal_magnitude(mlo, hi ? std::optional(mag(*hi)) : std::nullopt, b_))
        out.push_back(std::move(*e));
    }
    // x < 0 part: "-" and magnitudes in [max(-hi, 0), -lo].
    if (!lo || lo->v < 0) {
      const decimal_bound mlo = hi && hi->v < 0 ? mag(*hi) : decimal_bound{0, "", true};
      const std::optional<decimal_bound> mhi = lo ? std::optional(mag(*lo)) : std::nullopt;
      if (auto e = decimal_magnitude(mlo, mhi, b_))
        out.push_back(expr::sequence({lit("-"), std::move(*e)}));
    }
    if (out.empty()) return never();
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  expr integer(const json& s, const std::string& path) {
    // multipleOf: a whole number up to 1000 (an integer's remainder is exact).
    std::int64_t step = 1;
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || !(m.get<double>() > 0)) invalid(path, "'multipleOf' must be > 0");
      const double d = m.get<double>();
      if (std::floor(d) != d || d > 1000)
        refuse(path, "multipleOf", "on integers, other than a whole number up to 1000");
      step = static_cast<std::int64_t>(d);
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
    if (min && max && *min > *max) return never();
    if (step > 1) return multiples(step, min, max, path);
    if (!min && !max) return integer_text();
    return int_range(min, max);
  }

  // Multiples of step in [min, max]: listed when there are at most 1000 of them, otherwise
  // (no maximum, and a minimum of at most step: every multiple >= 0 or > 0, or none, any
  // sign) the digits read by an automaton of the remainder mod step, one rule a remainder.
  expr multiples(std::int64_t step, std::optional<std::int64_t> min,
                 std::optional<std::int64_t> max, const std::string& path) {
    if (min && max) {
      const std::int64_t first =
          *min >= 0 ? (*min + step - 1) / step * step : -((-*min) / step * step);
      if (*max < first) return never();
      if ((*max - first) / step > 1000)
        refuse(path, "multipleOf", "with bounds holding more than 1000 multiples");
      std::vector<expr> out;
      for (std::int64_t v = first; v <= *max; v += step) out.push_back(lit(std::to_string(v)));
      return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
    }
    if (max || (min && *min > step))
      refuse(path, "multipleOf", "with a maximum, or a minimum above the step");
    // R(r): the digits still to come after a prefix with remainder r.
    const auto rules = shared("multiple-of-" + std::to_string(step), [&] {
      std::vector<std::uint32_t> r(static_cast<std::size_t>(step));
      for (auto& x : r) x = b_.fresh("mod");
      for (std::int64_t q = 0; q < step; ++q) {
        std::vector<expr> alts;
        if (q == 0) alts.push_back(expr::sequence());
        std::map<std::int64_t, std::vector<std::pair<char32_t, char32_t>>> by;
        for (int d = 0; d <= 9; ++d)
          by[(q * 10 + d) % step].emplace_back(static_cast<char32_t>('0' + d),
                                               static_cast<char32_t>('0' + d));
        for (auto& [to, ds] : by)
          alts.push_back(
              expr::sequence({chars(std::move(ds)), expr::call(r[static_cast<std::size_t>(to)])}));
        b_.define(r[static_cast<std::size_t>(q)],
                  alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
      }
      // A positive multiple: a first digit 1-9, then R of its remainder.
      std::vector<expr> first;
      for (int d = 1; d <= 9; ++d)
        first.push_back(
            expr::sequence({digit(static_cast<char>('0' + d), static_cast<char>('0' + d)),
                            expr::call(r[static_cast<std::size_t>(d % step)])}));
      return expr::choice(std::move(first));
    });
    std::vector<expr> out{rules};
    if (!min || *min <= 0) out.push_back(lit("0"));
    if (!min) out.push_back(expr::sequence({lit("-"), rules}));
    return expr::choice(std::move(out));
  }

  expr string(const json& s, const std::string& path) {
    const auto min_len = count(s, "minLength", path);
    const auto max_len = count(s, "maxLength", path);
    const bool lengths = (min_len && *min_len > 0) || max_len;
    // A format JSON Schema does not define is an annotation: as if absent.
    const bool has_format = s.contains("format") && (!s["format"].is_string() ||
                                                     known_format(s["format"].get<std::string>()));
    if ((s.contains("pattern") || has_format) && lengths) {
      // A pattern's or a format's language counted by characters (key_automaton.hpp).
      const char* kw = s.contains("pattern") ? "pattern" : "format";
      if (s.contains("pattern") && has_format) refuse(path, "pattern", "together with format");
      if (!s[kw].is_string()) invalid(path, std::string("'") + kw + "' must be a string");
      const std::uint32_t lo = min_len.value_or(0);
      const std::uint32_t hi = max_len ? *max_len : expr::unbounded;
      if (hi != expr::unbounded && hi < lo) return never();
      json only = json::object();
      only["type"] = "string";
      only[kw] = s[kw];
      const auto lang = key_language(only, path);
      if (!lang) return never();
      auto e = string_with_length(*lang, lo, hi, b_, path, kw);
      return e ? std::move(*e) : never();
    }
    if (s.contains("pattern")) {
      if (has_format) refuse(path, "pattern", "together with format");
      if (!s["pattern"].is_string()) invalid(path, "'pattern' must be a string");
      return expr::sequence({lit("\""), pattern(s["pattern"].get<std::string>(), path), lit("\"")});
    }
    if (has_format) {
      if (!s["format"].is_string()) invalid(path, "'format' must be a string");
      return expr::sequence({lit("\""), format(s["format"].get<std::string>(), path), lit("\"")});
    }
    if (!lengths) return any_string();
    const std::uint32_t lo = min_len.value_or(0);
    const std::uint32_t hi = max_len ? *max_len : expr::unbounded;
    if (hi != expr::unbounded && hi < lo) return never();
    return expr::sequence({lit("\""), expr::repeat(string_char(), lo, hi), lit("\"")});
  }

  // The string body (between the quotes) that pattern matches somewhere (re.search).
  expr pattern(const std::string& p, const std::string& path) {
    return pattern_body(p, path, string_char(), opt_.limits.max_depth);
  }

  // oneOf whose alternatives are all string schemas that may overlap: the strings exactly
  // one alternative accepts, from the product of their automata (key_automaton.hpp; strings
  // written without escapes: a narrowing). nullopt when some alternative is no string schema
  // or none overlap (anyOf then is exact).
  std::optional<expr> strings_one_of(const std::vector<json>& parts, const std::string& path) {
    if (parts.size() < 2 || parts.size() > 16) return std::nullopt;
    for (const auto& p : parts)
      if (!p.is_object() || p.contains("$ref") || p.contains("anyOf") || p.contains("oneOf") ||
          p.contains("allOf") || p.contains("not") || types_of(p, path) != t_str)
        return std::nullopt;
    bool overlap = false;
    for (std::size_t i = 0; i < parts.size(); ++i)
      for (std::size_t j = i + 1; j < parts.size(); ++j)
        overlap = overlap || !disjoint(parts[i], parts[j], path);
    if (!overlap) return std::nullopt;
    std::vector<std::unique_ptr<byte_automaton>> langs;
    std::vector<byte_automaton*> ptrs;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      langs.push_back(key_language(parts[i], path + "/oneOf/" + std::to_string(i)));
      if (!langs.back()) return std::nullopt;  // accepts nothing: anyOf of the others
      ptrs.push_back(langs.back().get());
    }
    std::vector<expr> out;
    for (auto& [sig, e] : key_signatures(ptrs, {}, 0, b_, path, "oneOf"))
      if (std::has_single_bit(sig)) out.push_back(std::move(e));
    if (out.empty()) return never();
    return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
  }

  // A string schema's language for keys, compiled by a compiler of its own (compact
  // whitespace, the same work budget and depth).
  std::unique_ptr<byte_automaton> key_language(const json& ks, const std::string& path) override {
    json_schema_options sub_opt = opt_;
    sub_opt.whitespace = json_whitespace::compact;
    schema_compiler sub(root_, sub_opt);
    sub.depth_ = depth_;
    sub.work_ = work_;
    auto g = sub.compile_at(ks, path);
    if (!g) return nullptr;
    return std::make_unique<byte_automaton>(std::move(*g));
  }

  std::map<std::string, std::uint32_t> refs_;
  std::uint32_t depth_ = 0;
};

}  // namespace detail

// The grammar of the JSON texts a schema accepts (see the top); unsupported for keywords it
// cannot honour, invalid_argument for a malformed schema. Properties come in the order of the
// schema's text: pass an ordered_json (or the text); a nlohmann::json has sorted its keys.
inline grammar json_schema_grammar(const nlohmann::ordered_json& schema,
                                   json_schema_options opt = {}) {
  detail::check_json_depth(schema, opt.limits.max_depth);
  try {
    return detail::schema_compiler(schema, opt).compile();
  } catch (const nlohmann::ordered_json::exception& e) {
    // A keyword of a type no check above expected (fuzz_json_schema found "$ref": [...] in
    // an allOf part): the schema is malformed, said as npullm::error like every other case.
    raise(error_code::invalid_argument, "JSON Schema is malformed: ", e.what());
  }
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
