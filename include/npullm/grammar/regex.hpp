// regex: JSON Schema's `pattern` (a regex subset, Python's re.search semantics) compiled to an
// expression over the JSON text of a string's characters (between the quotes): each code point
// of a class as JSON writes it (plain, or the escape json.dumps writes). Refused by name
// (unsupported, keyword 'pattern'): look-around, back-references, anchors inside the pattern,
// word boundaries, Unicode property classes, possessive quantifiers.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/schema_common.hpp"

namespace npullm::grammar {

namespace detail {

inline expr escaped(char32_t x) {
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

// Code points of a class as JSON string text: plain where JSON allows it, the escape
// json.dumps writes otherwise (\" \\ \n \t \r \b \f \u00XX).
inline expr json_chars(const char_class& c, const std::string&) {
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

// A pattern's body, parsed by recursive descent (groups nested at most 64 deep).
struct regex_parser {
  std::string_view s;
  std::size_t i = 0;
  const std::string& path;
  std::uint32_t max_depth;  // grammar_limits::max_depth
  int depth = 0;            // open groups

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
      if (a.depth > max_depth)  // a{2}{2}{2}...: one level each
        raise(error_code::capacity_exhausted, "JSON Schema at ", path, ": pattern nested ", a.depth,
              " levels deep, deeper than grammar_limits::max_depth ", max_depth);
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
                   (s.substr(i, 2) == "?<" && s.substr(i, 3) != "?<=" && s.substr(i, 3) != "?<!")) {
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
    if (ch == '[') return json_chars(char_set(), path);
    if (ch == '.') {
      ++i;
      return json_chars(char_class({{'\n', '\n'}}, true), path);
    }
    if (ch == '^' || ch == '$') no("an anchor inside the pattern");
    if (ch == ')') no("an unbalanced ')'");
    if (ch == '*' || ch == '+' || ch == '?') no("a quantifier with nothing before it");
    if (ch == '\\') {
      std::vector<std::pair<char32_t, char32_t>> r;
      bool neg = false;
      escape(r, neg, false);
      return json_chars(char_class(std::move(r), neg), path);
    }
    char32_t cp = 0;
    if (!next_code_point(s, i, cp)) no("invalid UTF-8");
    return json_chars(char_class::single(cp), path);
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

// The inside of t when t is one group as a whole ("(...)", "(?:...)", "(?P<name>...)" with no
// quantifier after it), else nothing: a search for "(A|B)" is a search for "A|B", so the
// anchors of A and B stand at the pattern's edges.
inline std::optional<std::string> whole_group(const std::string& t) {
  if (t.size() < 2 || t[0] != '(' || t.back() != ')') return std::nullopt;
  std::size_t open = 1;
  if (t[1] == '?') {
    if (t.compare(1, 2, "?:") == 0) {
      open = 3;
    } else if (t.compare(1, 3, "?P<") == 0 ||
               (t.compare(1, 2, "?<") == 0 && t.compare(1, 3, "?<=") != 0 &&
                t.compare(1, 3, "?<!") != 0)) {
      const std::size_t close = t.find('>');
      if (close == std::string::npos) return std::nullopt;
      open = close + 1;
    } else {
      return std::nullopt;  // look-around or flags: the parser refuses them by name
    }
  }
  // The group opened at 0 must close at the last character.
  int depth = 0;
  bool in_class = false;
  for (std::size_t k = 0; k < t.size(); ++k) {
    const char ch = t[k];
    if (ch == '\\') {
      ++k;
    } else if (in_class) {
      if (ch == ']') in_class = false;
    } else if (ch == '[') {
      in_class = true;
      if (k + 1 < t.size() && t[k + 1] == '^') ++k;
      if (k + 1 < t.size() && t[k + 1] == ']') ++k;  // a ']' first in a class is literal
    } else if (ch == '(') {
      ++depth;
    } else if (ch == ')' && --depth == 0) {
      if (k + 1 != t.size()) return std::nullopt;
    }
  }
  if (depth != 0 || in_class) return std::nullopt;
  return t.substr(open, t.size() - 1 - open);
}

// p split at its top-level '|' (outside groups and classes).
inline std::vector<std::string> top_alternatives(const std::string& p) {
  std::vector<std::string> tops;
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
  return tops;
}

// The string body (between the quotes) that pattern matches somewhere (re.search).
inline expr pattern_body(const std::string& p, const std::string& path, const expr& any_char,
                         std::uint32_t max_depth) {
  // Top-level alternatives, each with its own anchors; an alternative that is one group as a
  // whole, "(^...$)", stands for its own alternatives (at most 64 groups opened so: the
  // parser's own bound on nesting, and each opening costs a scan of the text).
  std::vector<std::string> tops;
  {
    std::vector<std::string> todo = top_alternatives(p);
    std::reverse(todo.begin(), todo.end());
    int opened = 0;
    while (!todo.empty()) {
      std::string t = std::move(todo.back());
      todo.pop_back();
      std::optional<std::string> inner;
      if (opened < 64 && (inner = whole_group(t))) {
        ++opened;
        std::vector<std::string> parts = top_alternatives(*inner);
        todo.insert(todo.end(), parts.rbegin(), parts.rend());
      } else {
        tops.push_back(std::move(t));
      }
    }
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
    regex_parser rp{t, 0, path, max_depth};
    expr body = rp.alternatives();
    if (!rp.end()) rp.no("an unbalanced ')'");
    std::vector<expr> seq;
    if (!start) seq.push_back(star(any_char));
    seq.push_back(std::move(body));
    if (!finish) seq.push_back(star(any_char));
    alts.push_back(expr::sequence(std::move(seq)));
  }
  return alts.size() == 1 ? std::move(alts[0]) : expr::choice(std::move(alts));
}

}  // namespace detail

}  // namespace npullm::grammar
