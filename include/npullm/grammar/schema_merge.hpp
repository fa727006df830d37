// schema_merge: JSON Schemas rewritten into equivalent schemas before they are compiled
// (json_schema.hpp): allOf parts merged (properties and required united, types intersected,
// bounds tightened, other keywords equal), $ref inlined for merging (recursion bounded),
// oneOf's alternatives narrowed until no value matches two, and `not` rewritten where exact.
// Each step is charged to grammar_limits::max_schema_work.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/schema_common.hpp"

namespace npullm::grammar {

namespace detail {

// Schemas rewritten as schemas: allOf parts merged into one, $ref inlined for merging, oneOf
// alternatives narrowed until disjoint, `not` rewritten where exact. Holds the document, the
// options and the work budget that every expansion is charged to.
class schema_merger {
 public:
  schema_merger(const json& root, json_schema_options opt)
      : root_(root), opt_(opt), work_(&own_work_) {}
  schema_merger(const schema_merger&) = delete;
  schema_merger& operator=(const schema_merger&) = delete;

 protected:
  ~schema_merger() = default;

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

  // A schema with its $ref (and nested allOf) resolved, for merging.
  json inline_refs(const json& s, const std::string& path, int depth = 0) {
    if (depth > 32) refuse(path, "$ref", "a chain of more than 32 references to merge");
    charge(1, path);
    if (!s.is_object() || !s.contains("$ref")) return s;
    if (!s["$ref"].is_string()) invalid(path, "'$ref' must be a string");
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

  const json& root_;
  json_schema_options opt_;
  std::size_t own_work_ = 0;
  std::size_t* work_;  // own_work_, or the work of the compiler this one checks enums for
  int merge_depth_ = 0;
};

}  // namespace detail

}  // namespace npullm::grammar
