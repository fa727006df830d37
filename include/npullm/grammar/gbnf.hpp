// gbnf: llama.cpp's GBNF grammar text -> grammar (grammar.hpp).
//
// The syntax as llama.cpp's users write it (its grammars/README.md):
//   rule      name ::= alternatives          name: [A-Za-z0-9_-]+; the start rule is `root`
//   alts      seq ("|" seq)*                 an empty sequence is allowed (ws ::= | " ")
//   seq       (item postfix?)*               postfix: * + ? {m} {m,} {m,n} {,n}
//   item      "literal" | [class] | [^class] | name | ( alts ) | .   (. is any code point)
//   escapes   \xHH \uHHHH \UHHHHHHHH \t \n \r \\ \" \[ \] \- \^ (in literals and classes)
//   comments  # to the end of the line
// A rule ends at a newline unless inside parentheses or right after "::=" or "|", as in
// llama.cpp. Text is UTF-8; literals and classes are code points.
//
// Errors: invalid_argument, "GBNF line L, column C: <what>" for malformed text; a rule
// referenced but not defined names the rule and where it is first used; a rule defined twice,
// a missing root and left recursion (grammar.hpp's policy: refused) are refused too.
// Bounds (grammar_limits, grammar.hpp): nesting deeper than max_depth expression levels
// (groups, repetition operators) and a grammar over the compile budget are capacity_exhausted,
// found while parsing (the parser recurses only on groups, each taking the budget); counts in
// {m,n} are at most max_repetition_count (2^32 - 2), each one element of the grammar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/grammar.hpp"

namespace npullm::grammar {

namespace detail {

class gbnf_parser {
 public:
  gbnf_parser(std::string_view text, grammar_limits limits) : s_(text), b_(limits) {}

  grammar parse() {
    skip_space(true);
    while (pos_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
    for (std::uint32_t r = 0; r < first_use_.size(); ++r) {
      if (first_use_[r] != npos && !b_.defined(r))
        fail_at(first_use_[r], "rule '", b_.name(r), "' is referenced but never defined");
    }
    if (!has_root_) raise(error_code::invalid_argument, "GBNF: no rule named 'root'");
    return std::move(b_).build(b_.rule("root"));
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t at, const Parts&... parts) const {
    fail_with(error_code::invalid_argument, at, parts...);
  }
  template <class... Parts>
  [[noreturn]] void fail_with(error_code code, std::size_t at, const Parts&... parts) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    raise(code, "GBNF line ", line, ", column ", col, ": ", parts...);
  }
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    fail_at(pos_, parts...);
  }

  [[nodiscard]] bool at_end() const { return pos_ >= s_.size(); }
  [[nodiscard]] char peek(std::size_t k = 0) const {
    return pos_ + k < s_.size() ? s_[pos_ + k] : '\0';
  }
  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view parse_name() {
    const std::size_t b = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    if (pos_ == b) fail("expected a rule name");
    return s_.substr(b, pos_ - b);
  }

  void parse_rule() {
    const std::size_t at = pos_;
    const std::string_view name = parse_name();
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '", name, "'");
    pos_ += 3;
    skip_space(true);
    const std::uint32_t r = b_.rule(name);
    if (b_.defined(r)) fail_at(at, "rule '", name, "' is defined twice");
    if (name == "root") has_root_ = true;
    const expr body = parse_alternatives(false);
    b_.define(r, body);
    if (!at_end() && peek() != '\n' && peek() != '\r')
      fail("unexpected '", std::string(1, peek()), "' in rule '", name, "'");
  }

  expr parse_alternatives(bool nested) {
    std::vector<expr> alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts.size() == 1 ? std::move(alts[0]) : expr::choice(std::move(alts));
  }

  expr parse_sequence(bool nested) {
    std::vector<expr> items;
    while (!at_end()) {
      const char c = peek();
      expr item;
      if (c == '"') {
        ++pos_;
        std::vector<expr> chars;
        while (peek() != '"') {
          if (at_end() || peek() == '\n') fail("unterminated string literal");
          chars.push_back(expr::of(char_class::single(parse_char())));
        }
        ++pos_;
        item = expr::sequence(std::move(chars));
      } else if (c == '[') {
        item = expr::of(parse_class());
      } else if (c == '.') {
        ++pos_;
        item = expr::of(char_class::any());
      } else if (c == '(') {
        if (++depth_ > b_.limits().max_depth) too_deep(depth_);
        ++pos_;
        skip_space(true);
        item = parse_alternatives(true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        --depth_;
        // A group is one unit for the postfix operators that follow.
        item = expr::sequence({std::move(item)});
      } else if (is_name_char(c)) {
        const std::size_t at = pos_;
        const std::string_view name = parse_name();
        skip_space(nested);
        if (s_.substr(pos_, 3) == "::=") {
          // The next rule starts here: this sequence ended at the newline before it.
          pos_ = at;
          break;
        }
        pos_ = at;
        parse_name();
        const std::uint32_t r = b_.rule(name);
        if (r >= first_use_.size()) first_use_.resize(r + 1, npos);
        if (first_use_[r] == npos) first_use_[r] = at;
        item = expr::call(r);
      } else {
        break;
      }
      skip_space(nested);
      item = parse_postfix(std::move(item), nested);
      items.push_back(std::move(item));
    }
    return expr::sequence(std::move(items));
  }

  expr parse_postfix(expr item, bool nested) {
    if (item.depth > b_.limits().max_depth) too_deep(item.depth);
    for (;;) {
      const char c = peek();
      std::uint32_t lo = 0, hi = 0;
      if (c == '*') {
        lo = 0, hi = expr::unbounded;
        ++pos_;
      } else if (c == '+') {
        lo = 1, hi = expr::unbounded;
        ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        skip_space(nested);
        const bool has_lo = peek() >= '0' && peek() <= '9';
        lo = has_lo ? parse_int() : 0;
        skip_space(nested);
        if (peek() == ',') {
          ++pos_;
          skip_space(nested);
          hi = (peek() >= '0' && peek() <= '9') ? parse_int() : expr::unbounded;
          skip_space(nested);
        } else {
          if (!has_lo) fail("expected a number in '{...}'");
          hi = lo;
        }
        if (peek() != '}') fail("expected '}' to end a repetition");
        ++pos_;
        if (hi < lo) fail("repetition {", lo, ",", hi, "} has max < min");
      } else {
        return item;
      }
      skip_space(nested);
      item = expr::repeat(std::move(item), lo, hi);
      // Each operator nests the item one level more ("a"{2}{2}{2}... would otherwise build
      // an expression as deep as the text is long).
      if (item.depth > b_.limits().max_depth) too_deep(item.depth);
    }
  }
  [[noreturn]] void too_deep(std::uint32_t levels) const {
    fail_with(error_code::capacity_exhausted, pos_, "groups and repetitions nested ", levels,
              " levels deep, deeper than ", b_.limits().max_depth, " (grammar_limits::max_depth)");
  }

  std::uint32_t parse_int() {
    std::uint64_t v = 0;
    const std::size_t b = pos_;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<std::uint64_t>(peek() - '0');
      if (v > max_repetition_count) fail_at(b, "repetition count above ", max_repetition_count);
      ++pos_;
    }
    return static_cast<std::uint32_t>(v);
  }

  char_class parse_class() {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<char32_t, char32_t>> ranges;
    while (peek() != ']') {
      if (at_end()) fail("unterminated character class");
      const char32_t lo = parse_char();
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail("character range end below its start");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    return char_class(std::move(ranges), negated);
  }

  // One code point of a literal or class: an escape or a UTF-8 character.
  char32_t parse_char() {
    const std::size_t at = pos_;
    if (peek() == '\\') {
      const char e = peek(1);
      pos_ += 2;
      switch (e) {
        case 'x': return parse_hex(2, at);
        case 'u': return parse_hex(4, at);
        case 'U': return parse_hex(8, at);
        case 't': return '\t';
        case 'n': return '\n';
        case 'r': return '\r';
        case '\\': return '\\';
        case '"': return '"';
        case '[': return '[';
        case ']': return ']';
        case '-': return '-';
        case '^': return '^';
        default:
          fail_at(at, "unknown escape '\\", e == '\0' ? std::string() : std::string(1, e), "'");
      }
    }
    char32_t cp = 0;
    if (!next_code_point(s_, pos_, cp)) fail("invalid UTF-8");
    return cp;
  }

  char32_t parse_hex(int digits, std::size_t at) {
    char32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail_at(at, "escape needs ", digits, " hex digits");
      v = v * 16 + static_cast<char32_t>(d);
      ++pos_;
    }
    if (v > max_code_point) fail_at(at, "code point above U+10FFFF");
    return v;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  grammar_builder b_;
  std::vector<std::size_t> first_use_;
  bool has_root_ = false;
  std::uint32_t depth_ = 0;  // open groups
};

}  // namespace detail

// Parses GBNF text (see the top) into a grammar whose start rule is `root`, under `limits`.
inline grammar parse_gbnf(std::string_view text, grammar_limits limits = {}) {
  return detail::gbnf_parser(text, limits).parse();
}

}  // namespace npullm::grammar
