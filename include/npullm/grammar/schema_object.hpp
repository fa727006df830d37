// schema_object: the grammar of JSON Schema arrays (items, prefixItems, additionalItems,
// minItems, maxItems: a counted repetition after the fixed items) and objects (properties in
// the order written, each optional one may be left out; required; additionalProperties as
// keys outside the named ones after them), for the compiler in json_schema.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/automaton.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/json_text.hpp"
#include "npullm/grammar/key_automaton.hpp"
#include "npullm/grammar/schema_common.hpp"

namespace npullm::grammar {

namespace detail {

// Arrays and objects of a schema; their items and property values come from value(), the
// compiler's (json_schema.hpp).
class schema_structures : public json_text_rules {
 public:
  schema_structures(const json& root, json_schema_options opt) : json_text_rules(root, opt) {}

 protected:
  ~schema_structures() = default;

  // A subschema's instances (never() when it accepts nothing).
  virtual expr value(const json& s, const std::string& path) = 0;
  // A schema's language as a byte automaton (compact whitespace): over the whole JSON
  // string ("...") for keys (patternProperties, propertyNames) and string lengths; null
  // when it accepts nothing.
  virtual std::unique_ptr<byte_automaton> key_language(const json& s, const std::string& path) = 0;

  // ---- arrays ---------------------------------------------------------------------------------
  // uniqueItems over a few constants (an enum or const of at most 8 values that are no
  // objects, or booleans): a rule per set of values written so far, each value at most once.
  [[gnu::noinline]] expr unique_array(const json& s, const std::string& path) {
    if (s.contains("prefixItems") || (s.contains("items") && s["items"].is_array()))
      refuse(path, "uniqueItems", "with a prefix of items");
    const json items = inline_refs(s.contains("items") ? s["items"] : json(true), path + "/items");
    std::vector<json> domain;
    if (items.is_object() && has_values(items)) {
      domain = values_of(items);
    } else if (items.is_object() && items.contains("type") && items["type"] == "boolean") {
      domain = {json(true), json(false)};
    } else if (items.is_object() && items.contains("type") && items["type"] == "null") {
      domain = {json(nullptr)};
    } else {
      refuse(path, "uniqueItems", "items other than a few constants (enum, const, boolean)");
    }
    const auto lang = key_language(items, path + "/items");
    std::vector<json> vals;
    for (const auto& v : domain) {
      if (v.is_object()) refuse(path, "uniqueItems", "object items");
      if (!lang || !lang->matches(v.dump())) continue;
      for (const auto& w : vals)
        if (w == v || (v.is_number() && w.is_number() && v.get<double>() == w.get<double>()))
          refuse(path, "uniqueItems", "items equal as numbers but written apart");
      vals.push_back(v);
    }
    if (vals.size() > 8) refuse(path, "uniqueItems", "more than 8 distinct items");
    const std::uint32_t d = static_cast<std::uint32_t>(vals.size());
    const std::uint32_t min = count(s, "minItems", path).value_or(0);
    const std::uint32_t max =
        std::min<std::uint32_t>(d, s.contains("maxItems") ? *count(s, "maxItems", path) : d);
    if (min > max) return never();
    const expr sep = item_sep();
    std::vector<expr> lits;
    for (const auto& v : vals) lits.push_back(json_literal(v));
    // R(mask): after the items of mask, at least one written.
    std::vector<std::uint32_t> rule(std::size_t{1} << d, 0);
    for (std::uint32_t m = 1; m < (1u << d); ++m) rule[m] = b_.fresh("unique");
    for (std::uint32_t m = 1; m < (1u << d); ++m) {
      const auto n = static_cast<std::uint32_t>(std::popcount(m));
      std::vector<expr> alts;
      if (n >= min) alts.push_back(expr::sequence());
      if (n < max)
        for (std::uint32_t k = 0; k < d; ++k)
          if (!(m >> k & 1))
            alts.push_back(expr::sequence({sep, lits[k], expr::call(rule[m | 1u << k])}));
      if (alts.empty()) alts.push_back(never());
      b_.define(rule[m], alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
    }
    std::vector<expr> first;
    if (min == 0) first.push_back(expr::sequence());
    if (max > 0)
      for (std::uint32_t k = 0; k < d; ++k)
        first.push_back(expr::sequence({lits[k], expr::call(rule[1u << k])}));
    if (first.empty()) return never();
    return expr::sequence(
        {lit("["), ws(), first.size() == 1 ? first[0] : expr::choice(first), ws(), lit("]")});
  }

  expr array(const json& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) return unique_array(s, path);
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

  // The key languages of an object: patternProperties' patterns (with their schemas) and
  // propertyNames last; null automata accept no string.
  struct key_rules {
    std::vector<std::pair<std::string, json>> patterns;
    bool check_names = false;
    bool no_keys = false;  // propertyNames accepts no string
    std::vector<std::unique_ptr<byte_automaton>> langs;

    // The schema a named key's value takes (false: the key may not appear): its own (named)
    // or additionalProperties' (base) merged with each pattern the key matches.
    json schema_of(schema_structures& c, const std::string& name, const json& base, bool named,
                   const std::string& at) const {
      if (langs.empty()) return base;
      if (no_keys) return json(false);
      const std::string text = json(name).dump();
      if (check_names && !langs.back()->matches(text)) return json(false);
      json v = named ? base : json(true);
      bool any = false;
      for (std::size_t i = 0; i < patterns.size(); ++i) {
        if (!langs[i] || !langs[i]->matches(text)) continue;
        any = true;
        v = c.merge_schema(v, patterns[i].second, at);
      }
      return named || any ? v : base;
    }
  };
  [[gnu::noinline]] std::unique_ptr<key_rules> read_key_rules(const json& s,
                                                              const std::string& path) {
    auto k = std::make_unique<key_rules>();
    if (s.contains("patternProperties")) {
      if (!s["patternProperties"].is_object())
        invalid(path, "'patternProperties' must be an object");
      for (const auto& [p, v] : s["patternProperties"].items()) k->patterns.emplace_back(p, v);
    }
    const json names_schema = s.contains("propertyNames") ? s["propertyNames"] : json(true);
    k->check_names = !(names_schema == true || (names_schema.is_object() && names_schema.empty()));
    for (const auto& [p, v] : k->patterns) {
      json ps = json::object();
      ps["type"] = "string";
      ps["pattern"] = p;
      k->langs.push_back(key_language(ps, path + "/patternProperties"));
    }
    if (k->check_names) {
      k->langs.push_back(key_language(names_schema, path + "/propertyNames"));
      k->no_keys = k->langs.back() == nullptr;
    }
    return k;
  }

  // dependencies (draft 4-7: a list, or a schema that only lists `required`) and
  // dependentRequired: a name present requires others.
  [[gnu::noinline]] std::vector<std::pair<std::string, std::vector<std::string>>> read_dependencies(
      const json& s, const std::string& path) {
    std::vector<std::pair<std::string, std::vector<std::string>>> deps;
    for (const char* k : {"dependencies", "dependentRequired"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_object()) invalid(path, std::string("'") + k + "' must be an object");
      for (const auto& [a, v] : s[k].items()) {
        json list = v;
        if (v.is_object()) {
          json rest = v;
          for (auto it = rest.begin(); it != rest.end();)
            it = annotation(it.key()) ? rest.erase(it) : std::next(it);
          if (rest.empty()) continue;
          if (rest.size() != 1 || !rest.contains("required"))
            refuse(path, k, "a schema dependency other than a list of required names");
          list = rest["required"];
        } else if (v.is_boolean()) {
          if (v == true) continue;
          refuse(path, k, "a false schema dependency");
        }
        if (!list.is_array()) invalid(path, std::string("'") + k + "' values must be arrays");
        std::vector<std::string> need;
        for (const auto& x : list) {
          if (!x.is_string()) invalid(path, std::string("'") + k + "' names must be strings");
          need.push_back(x.get<std::string>());
        }
        if (!need.empty()) deps.emplace_back(a, std::move(need));
      }
    }
    return deps;
  }

  // The members after the named ones: keys classed by the patterns they match (with
  // patternProperties / propertyNames), else any key outside `names`; nullopt when none.
  [[gnu::noinline]] std::optional<expr> extra_members(const key_rules& keys,
                                                      const std::set<std::string>& names,
                                                      const json& additional,
                                                      const std::string& path) {
    std::optional<expr> extra_member;
    const auto& langs = keys.langs;
    const auto& patterns = keys.patterns;
    const bool no_keys = keys.no_keys, check_names = keys.check_names;
    const std::size_t n_patterns = keys.patterns.size();
    if (!langs.empty()) {
      if (!no_keys) {
        std::vector<byte_automaton*> ptrs;
        std::vector<std::size_t> which;  // ptrs index -> pattern index (n_patterns: names)
        for (std::size_t i = 0; i < langs.size(); ++i)
          if (langs[i]) ptrs.push_back(langs[i].get()), which.push_back(i);
        std::uint32_t need = 0;
        if (check_names) need = 1u << (ptrs.size() - 1);
        const auto sigs = key_signatures(ptrs, names, need, b_, path,
                                         n_patterns ? "patternProperties" : "propertyNames");
        std::vector<expr> alts;
        for (const auto& [sig, key] : sigs) {
          json v = json(true);
          bool any = false;
          for (std::size_t j = 0; j < ptrs.size(); ++j) {
            if (!(sig >> j & 1) || which[j] >= n_patterns) continue;
            any = true;
            v = merge_schema(v, patterns[which[j]].second, path + "/patternProperties");
          }
          expr e = value(any ? v : additional,
                         path + (any ? "/patternProperties" : "/additionalProperties"));
          if (is_never(e)) continue;
          alts.push_back(expr::sequence({key, key_sep(), std::move(e)}));
        }
        if (!alts.empty()) {
          const std::uint32_t r = b_.fresh("member");
          b_.define(r, alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
          extra_member = expr::call(r);
        }
      }
    } else {
      expr e = value(additional, path + "/additionalProperties");
      if (!is_never(e)) extra_member = expr::sequence({other_key(names), key_sep(), std::move(e)});
    }
    return extra_member;
  }

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
    // patternProperties and propertyNames (on the heap: value() recurses through this frame
    // once per nesting level, so it is kept small).
    const std::unique_ptr<key_rules> keys = read_key_rules(s, path);
    const auto key_schema = [&](const std::string& name, const json& base, bool named,
                                const std::string& at) {
      return keys->schema_of(*this, name, base, named, at);
    };
    json additional = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) invalid(path, "'properties' must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        const std::string at = path + "/properties/" + k;
        expr e = value(key_schema(k, v, true, at), at);
        names.insert(k);
        if (is_never(e)) {
          if (required.count(k)) return never();
          continue;  // may not appear
        }
        props.push_back({k, std::move(e), required.count(k) > 0});
      }
    }
    for (const auto& r : s.contains("required") ? s["required"] : json::array()) {
      const std::string name = r.get<std::string>();
      if (names.count(name)) continue;
      expr e = value(key_schema(name, additional, false, path + "/additionalProperties"),
                     path + "/additionalProperties");
      if (is_never(e)) return never();
      names.insert(name);
      props.push_back({name, std::move(e), true});
    }
    // dependencies / dependentRequired: the names involved become optional named properties
    // (valued as an extra key would be), tracked by dependent_object().
    const auto deps = read_dependencies(s, path);
    for (const auto& [a, need] : deps) {
      std::vector<std::string> all = need;
      all.push_back(a);
      for (const auto& name : all) {
        if (names.count(name)) continue;
        names.insert(name);
        expr e = value(key_schema(name, additional, false, path + "/additionalProperties"),
                       path + "/additionalProperties");
        if (!is_never(e)) props.push_back({name, std::move(e), false});
      }
    }
    const std::optional<expr> extra_member = extra_members(*keys, names, additional, path);
    // minProperties / maxProperties: counted (below) where not already implied.
    std::size_t n_required = 0;
    for (const auto& p : props) n_required += p.required;
    const std::size_t min_props =
        s.contains("minProperties") ? count(s, "minProperties", path).value_or(0) : 0;
    std::optional<std::size_t> max_props;
    if (s.contains("maxProperties")) max_props = count(s, "maxProperties", path).value_or(0);
    if (max_props && *max_props < n_required) return never();
    const expr sep = item_sep();
    const auto member = [&](const std::string& name, const expr& v) {
      return expr::sequence({lit(json(name).dump()), key_sep(), v});
    };
    const bool counted =
        min_props > n_required || (max_props && (extra_member || *max_props < props.size()));
    if (counted && !deps.empty())
      refuse(path, "dependencies", "together with minProperties / maxProperties");
    if (counted) return counted_object(props, extra_member, min_props, max_props, path);
    // after(i): properties from i on, at least one written before; start(i): none yet.
    expr after = extra_member ? star(expr::sequence({sep, *extra_member})) : expr::sequence();
    expr start =
        extra_member ? expr::optional(expr::sequence({*extra_member, after})) : expr::sequence();
    if (!deps.empty()) return dependent_object(props, deps, after, start, path);
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

  // An object whose properties depend on each other (dependencies): a rule per property
  // index i, set of the involved properties written so far, and whether any member was
  // written. A state is made only when the names it has written, the required ones still to
  // come, and what they require in turn (the least closure: requirements only add names)
  // fit within the names still available; at the end every dependency holds.
  template <class Prop>
  [[gnu::noinline]] expr dependent_object(
      const std::vector<Prop>& props,
      const std::vector<std::pair<std::string, std::vector<std::string>>>& deps, const expr& after,
      const expr& start, const std::string& path) {
    const std::size_t n = props.size();
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < n; ++i) index.emplace(props[i].name, i);
    std::vector<int> bit(n, -1);
    int bits = 0;
    const auto bit_of = [&](const std::string& name) -> int {
      const auto it = index.find(name);
      if (it == index.end()) return -1;
      if (bit[it->second] < 0) bit[it->second] = bits++;
      return bit[it->second];
    };
    struct rule_of {
      std::uint32_t trigger;  // a mask of one bit
      std::uint32_t need;     // 0 with `forbidden`: the trigger may not appear
      bool forbidden;
    };
    std::vector<rule_of> rules;
    for (const auto& [a, need] : deps) {
      const int ab = bit_of(a);
      if (ab < 0) continue;  // may not appear: nothing to require
      rule_of r{0, 0, false};
      for (const auto& x : need) {
        const int xb = bit_of(x);
        if (xb < 0) r.forbidden = true;
        if (bits > 16) refuse(path, "dependencies", "more than 16 properties involved");
        if (xb >= 0) r.need |= 1u << xb;
      }
      r.trigger = 1u << ab;
      rules.push_back(r);
    }
    if (bits > 16) refuse(path, "dependencies", "more than 16 properties involved");
    // Bits of the involved properties from i on: all, and the required ones.
    std::vector<std::uint32_t> rest(n + 1, 0), rest_req(n + 1, 0);
    for (std::size_t i = n; i-- > 0;) {
      const std::uint32_t m = bit[i] >= 0 ? 1u << bit[i] : 0;
      rest[i] = rest[i + 1] | m;
      rest_req[i] = rest_req[i + 1] | (props[i].required ? m : 0);
    }
    const auto ok = [&](std::size_t i, std::uint32_t mask) {
      std::uint32_t m = mask | rest_req[i];
      const std::uint32_t avail = mask | rest[i];
      for (bool grew = true; grew;) {
        grew = false;
        for (const auto& r : rules) {
          if (!(m & r.trigger)) continue;
          if (r.forbidden || (r.need & ~avail)) return false;
          if (r.need & ~m) m |= r.need, grew = true;
        }
      }
      return true;
    };
    if (!ok(0, 0)) return never();
    const expr sep = item_sep();
    std::vector<expr> member(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t rm = b_.fresh("member");
      b_.define(rm, expr::sequence({lit(json(props[i].name).dump()), key_sep(), props[i].value}));
      member[i] = expr::call(rm);
    }
    // States (i, mask, any written) in the order found; each defined once.
    std::map<std::tuple<std::size_t, std::uint32_t, bool>, std::uint32_t> ids;
    std::vector<std::tuple<std::size_t, std::uint32_t, bool>> todo;
    const auto state = [&](std::size_t i, std::uint32_t mask, bool any) {
      const auto key = std::make_tuple(i, mask, any);
      const auto it = ids.find(key);
      if (it != ids.end()) return expr::call(it->second);
      if (ids.size() >= 100000) refuse(path, "dependencies", "more than 100000 states");
      const std::uint32_t r = b_.fresh("obj");
      ids.emplace(key, r);
      todo.push_back(key);
      return expr::call(r);
    };
    const expr first = state(0, 0, false);
    while (!todo.empty()) {
      const auto [i, mask, any] = todo.back();
      todo.pop_back();
      const std::uint32_t r = ids.at(std::make_tuple(i, mask, any));
      if (i == n) {
        b_.define(r, any ? after : start);
        continue;
      }
      std::vector<expr> alts;
      const std::uint32_t m = bit[i] >= 0 ? 1u << bit[i] : 0;
      if (ok(i + 1, mask | m)) {
        std::vector<expr> seq;
        if (any) seq.push_back(sep);
        seq.push_back(member[i]);
        seq.push_back(state(i + 1, mask | m, true));
        alts.push_back(expr::sequence(std::move(seq)));
      }
      if (!props[i].required && ok(i + 1, mask)) alts.push_back(state(i + 1, mask, any));
      if (alts.empty()) alts.push_back(never());
      b_.define(r, alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
    }
    return expr::sequence({lit("{"), ws(), first, ws(), lit("}")});
  }

  // An object whose members are counted for minProperties / maxProperties: a rule T(i, c) per
  // property index i (n: only extra members left) and count c of members written so far,
  // capped at max_props (or at min_props without a maximum: past it any number will do).
  // Only states from which some ending has a count within the bounds are made.
  template <class Prop>
  [[gnu::noinline]] expr counted_object(const std::vector<Prop>& props,
                                        const std::optional<expr>& extra_member,
                                        std::size_t min_props, std::optional<std::size_t> max_props,
                                        const std::string& path) {
    const std::size_t n = props.size();
    const std::size_t cap = max_props ? *max_props : min_props;
    if ((n + 1) * (cap + 1) > 100000)
      refuse(
          path, max_props ? "maxProperties" : "minProperties",
          "counting " + std::to_string(cap) + " members over " + std::to_string(n) + " properties");
    std::vector<std::size_t> req_from(n + 1, 0);
    for (std::size_t i = n; i-- > 0;) req_from[i] = req_from[i + 1] + (props[i].required ? 1 : 0);
    constexpr std::size_t many = static_cast<std::size_t>(-1) / 2;
    const auto feasible = [&](std::size_t i, std::size_t c) {
      const std::size_t most = extra_member ? many : c + (n - i);
      return most >= min_props && (!max_props || c + req_from[i] <= *max_props);
    };
    const auto inc = [&](std::size_t c) { return max_props ? c + 1 : std::min(c + 1, cap); };
    const auto writable = [&](std::size_t c) { return !max_props || c < *max_props; };
    if (!feasible(0, 0)) return never();
    const expr sep = item_sep();
    std::vector<std::uint32_t> rules((n + 1) * (cap + 1));
    for (std::size_t i = 0; i <= n; ++i)
      for (std::size_t c = 0; c <= cap; ++c)
        if (feasible(i, c)) rules[i * (cap + 1) + c] = b_.fresh("obj");
    const auto at = [&](std::size_t i, std::size_t c) {
      return expr::call(rules[i * (cap + 1) + c]);
    };
    for (std::size_t i = n + 1; i-- > 0;) {
      std::optional<expr> m;
      if (i < n) {
        const std::uint32_t rm = b_.fresh("member");
        b_.define(rm, expr::sequence({lit(json(props[i].name).dump()), key_sep(), props[i].value}));
        m = expr::call(rm);
      }
      for (std::size_t c = 0; c <= cap; ++c) {
        if (!feasible(i, c)) continue;
        std::vector<expr> alts;
        const expr* next = i < n ? &*m : extra_member ? &*extra_member : nullptr;
        const std::size_t ni = i < n ? i + 1 : n;
        if (next && writable(c) && feasible(ni, inc(c))) {
          std::vector<expr> seq;
          if (c > 0) seq.push_back(sep);
          seq.push_back(*next);
          seq.push_back(at(ni, inc(c)));
          alts.push_back(expr::sequence(std::move(seq)));
        }
        if (i == n) {
          if (c >= min_props) alts.push_back(expr::sequence());
        } else if (!props[i].required && feasible(i + 1, c)) {
          alts.push_back(at(i + 1, c));
        }
        if (alts.empty()) alts.push_back(never());
        b_.define(rules[i * (cap + 1) + c],
                  alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
      }
    }
    return expr::sequence({lit("{"), ws(), at(0, 0), ws(), lit("}")});
  }
};

}  // namespace detail

}  // namespace npullm::grammar
