// json_text: the rules of JSON text that the JSON Schema compiler (json_schema.hpp) builds on:
// whitespace as the options say, any string / integer / number / value, a JSON value as literal
// text, the string formats (date-time, date, time, uuid, email, uri, ipv4), and object keys
// that are none of a set of names (a trie of the names). Each shared rule is made once.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/schema_common.hpp"
#include "npullm/grammar/schema_merge.hpp"

namespace npullm::grammar {

namespace detail {

// The shared rules of JSON text (whitespace, strings, numbers, any value), literal values, the
// string formats and keys outside a set of names, made once per grammar in the builder b_.
class json_text_rules : public schema_merger {
 public:
  json_text_rules(const json& root, json_schema_options opt)
      : schema_merger(root, opt), b_(opt.limits) {}

 protected:
  ~json_text_rules() = default;

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
    // Children before parents (a child is pushed after its parent). A node's rule depends on
    // its subtree alone, so nodes with equal subtrees share one rule, across objects too
    // (the suffixes of names such as apiVersion or metadata recur in every object of a
    // schema): a node is its terminal flag and its children's code points and rules.
    std::vector<std::uint32_t> rules(trie.size());
    for (std::size_t k = trie.size(); k-- > 0;) {
      std::vector<std::uint32_t> sig{trie[k].terminal};
      for (const auto& [cp, child] : trie[k].next) {
        sig.push_back(static_cast<std::uint32_t>(cp));
        sig.push_back(rules[child]);
      }
      const auto [it, fresh] = key_nodes_.emplace(std::move(sig), 0);
      if (!fresh) {
        rules[k] = it->second;
        continue;
      }
      rules[k] = it->second = b_.fresh("key");
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

  grammar_builder b_;
  std::map<std::string, std::uint32_t> shared_;
  std::map<std::string, std::uint32_t> other_keys_;
  std::map<std::vector<std::uint32_t>, std::uint32_t> key_nodes_;  // other_key's trie nodes
};

}  // namespace detail

}  // namespace npullm::grammar
