// expr: what the grammar builder (grammar.hpp) takes and makes: expressions (sequences,
// alternatives, character classes, references, counted repetitions), sets of code points
// (char_class), the flat grammar form the matchers run (grammar: rules, elements, classes),
// the compile budget (grammar_limits), and the UTF-8 decoder the front ends share.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::grammar {

inline constexpr char32_t max_code_point = 0x10FFFF;

// The largest count a repetition takes (GBNF's {m,n}, maxLength, minItems, ...): a count is
// one element of the grammar whatever its value (grammar.hpp), 2^32 - 1 meaning unbounded.
inline constexpr std::uint32_t max_repetition_count = 4'294'967'294u;

// The compile budget of one grammar (see the top). The defaults hold every MaskBench schema
// and llama.cpp grammar with a wide margin (the largest MaskBench grammar: about 40,000 rules
// and 300,000 elements) and keep a hostile input under about 200 MB and a second.
struct grammar_limits {
  // Levels of nesting: of the expressions of a GBNF grammar or a pattern (a group is about
  // three: group, alternatives, sequence; a repetition operator one), of a schema's JSON
  // document (an object or array one) and of its subschemas (two each, as in the document).
  std::uint32_t max_depth = 1024;
  std::size_t max_rules = std::size_t{1} << 20;     // 1,048,576 rules
  std::size_t max_elements = std::size_t{1} << 23;  // 8,388,608 elements (8 bytes each)
  std::size_t max_bytes = std::size_t{256} << 20;   // the grammar's memory, about: 256 MiB
  // JSON Schema: steps of $ref / allOf / oneOf expansion (a subschema compiled, two merged
  // (charged by their sizes), an alternative pair compared): bounds fan-out and cycles.
  std::size_t max_schema_work = 2'000'000;
  bool operator==(const grammar_limits&) const = default;
};

// A set of code points: sorted, disjoint, non-adjacent inclusive ranges, with an ASCII bitmap
// for the common test.
class char_class {
 public:
  char_class() = default;
  // The union of the ranges (any order, overlapping allowed), complemented over
  // [0, max_code_point] when negated.
  explicit char_class(std::vector<std::pair<char32_t, char32_t>> ranges, bool negated = false) {
    std::sort(ranges.begin(), ranges.end());
    for (const auto& [lo, hi] : ranges) {
      if (lo > hi) continue;
      if (!ranges_.empty() && lo <= ranges_.back().second + 1) {
        ranges_.back().second = std::max(ranges_.back().second, hi);
      } else {
        ranges_.emplace_back(lo, hi);
      }
    }
    if (negated) {
      std::vector<std::pair<char32_t, char32_t>> out;
      char32_t next = 0;
      for (const auto& [lo, hi] : ranges_) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
      }
      if (next <= max_code_point) out.emplace_back(next, max_code_point);
      ranges_ = std::move(out);
    }
    for (const auto& [lo, hi] : ranges_)
      for (char32_t c = lo; c <= std::min<char32_t>(hi, 127); ++c)
        ascii_[c >> 6] |= 1ull << (c & 63);
  }
  static char_class single(char32_t c) { return char_class({{c, c}}); }
  static char_class any() { return char_class({{0, max_code_point}}); }

  [[nodiscard]] bool contains(char32_t c) const noexcept {
    if (c < 128) return (ascii_[c >> 6] >> (c & 63)) & 1;
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c,
                               [](char32_t v, const auto& r) { return v < r.first; });
    return it != ranges_.begin() && c <= std::prev(it)->second;
  }
  // Whether some code point of [lo, hi] is in the class.
  [[nodiscard]] bool intersects(char32_t lo, char32_t hi) const noexcept {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), hi,
                               [](char32_t v, const auto& r) { return v < r.first; });
    return it != ranges_.begin() && std::prev(it)->second >= lo;
  }
  // Whether every code point of [lo, hi] is in the class.
  [[nodiscard]] bool contains_all(char32_t lo, char32_t hi) const noexcept {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), lo,
                               [](char32_t v, const auto& r) { return v < r.first; });
    return it != ranges_.begin() && std::prev(it)->second >= hi;
  }
  [[nodiscard]] bool empty() const noexcept { return ranges_.empty(); }
  [[nodiscard]] const auto& ranges() const noexcept { return ranges_; }
  // Its ASCII code points: bit c % 64 of word c / 64.
  [[nodiscard]] const std::array<std::uint64_t, 2>& ascii() const noexcept { return ascii_; }
  bool operator==(const char_class& o) const noexcept { return ranges_ == o.ranges_; }

 private:
  std::vector<std::pair<char32_t, char32_t>> ranges_;
  std::array<std::uint64_t, 2> ascii_{};
};

struct element {
  enum kind_t : std::uint8_t { cls, ref, end, rep };
  kind_t kind = end;
  std::uint32_t value = 0;  // class index (cls), rule id (ref) or repetition index (rep)
};

// A counted repetition x{min,max} as one element: x a class or a reference; the matcher
// keeps the count in the stack frame (automaton.hpp), so x{0,10^6} is one element, not a
// chain of 10^6 rules. max == unbounded: no upper bound (the count stops at min).
struct repetition {
  element item;  // cls or ref
  std::uint32_t min = 0, max = 0;
  static constexpr std::uint32_t unbounded = std::numeric_limits<std::uint32_t>::max();
};

struct grammar {
  std::vector<std::string> rule_names;                // by rule id
  std::vector<std::vector<std::uint32_t>> rule_alts;  // by rule id: alternatives' start positions
  std::vector<element> elements;                      // every alternative, each ended by `end`
  std::vector<char_class> classes;
  std::vector<repetition> reps;  // by the `value` of a rep element
  std::uint32_t root = 0;
};

// An expression of the builder: what GBNF's and JSON Schema's front ends produce.
struct expr {
  enum kind_t : std::uint8_t { seq, alt, cls, ref, rep };
  kind_t kind = seq;
  std::vector<expr> items;         // seq, alt: the parts; rep: the one repeated expression
  char_class chars;                // cls
  std::uint32_t rule = 0;          // ref
  std::uint32_t min = 0, max = 0;  // rep; max == unbounded for no upper bound
  std::uint32_t depth = 1;         // levels of nesting: 1 + the deepest part's (see grammar_limits)
  static constexpr std::uint32_t unbounded = std::numeric_limits<std::uint32_t>::max();

  static expr sequence(std::vector<expr> parts = {}) { return make(seq, std::move(parts)); }
  static expr choice(std::vector<expr> parts) { return make(alt, std::move(parts)); }
  static expr of(char_class c) {
    expr e = make(cls, {});
    e.chars = std::move(c);
    return e;
  }
  static expr call(std::uint32_t r) {
    expr e = make(ref, {});
    e.rule = r;
    return e;
  }
  static expr repeat(expr x, std::uint32_t lo, std::uint32_t hi) {
    // (x{a,A}){b,B} with a <= 1 is x{a*b, A*B}: k repetitions make every count of [k*a, k*A],
    // and with a <= 1 these ranges leave no gap between k and k + 1. Nested counts of a
    // nullable x would otherwise give the matcher a stack per way of splitting the text.
    // A product past 2^32 - 2 is capped there: narrower only for texts of over 4 GiB, which
    // no matcher reaches (the automaton's byte budget ends a run long before), where going
    // unbounded would accept more than the grammar does.
    const expr* inner = &x;
    while (inner->kind == seq && inner->items.size() == 1) inner = &inner->items[0];
    if (inner->kind == rep && inner->min <= 1 && inner->max >= 1 && hi >= 1) {
      const std::uint32_t a = inner->min, b = inner->max;
      const auto cap = [](std::uint64_t v) {
        return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, unbounded - 1));
      };
      const std::uint32_t new_lo = cap(std::uint64_t{a} * lo);
      const std::uint32_t new_hi =
          (b == unbounded || hi == unbounded) ? unbounded : cap(std::uint64_t{b} * hi);
      expr y = inner->items[0];
      return repeat(std::move(y), new_lo, new_hi);
    }
    expr e = make(rep, {});
    e.depth = x.depth + 1;
    e.items.push_back(std::move(x));
    e.min = lo;
    e.max = hi;
    return e;
  }
  static expr make(kind_t k, std::vector<expr> parts) {
    expr e;
    e.kind = k;
    e.items = std::move(parts);
    for (const expr& p : e.items) e.depth = std::max(e.depth, p.depth + 1);
    return e;
  }
  static expr optional(expr x) { return repeat(std::move(x), 0, 1); }
  // The code points of a UTF-8 string, in order.
  static expr literal(std::string_view utf8);
};

namespace detail {

// Decodes one UTF-8 sequence of s at i (i moves past it); false for invalid UTF-8 (overlong,
// surrogate, past U+10FFFF, truncated, a stray continuation byte): text/unicode.hpp's decoder.
inline bool next_code_point(std::string_view s, std::size_t& i, char32_t& cp) noexcept {
  if (i >= s.size()) return false;
  std::uint32_t v = 0;
  const std::size_t n = text::decode_utf8(s.substr(i), v);
  if (v == text::invalid_code_point) return false;
  cp = static_cast<char32_t>(v);
  i += n;
  return true;
}

}  // namespace detail

inline expr expr::literal(std::string_view utf8) {
  std::vector<expr> parts;
  for (std::size_t i = 0; i < utf8.size();) {
    char32_t cp = 0;
    if (!detail::next_code_point(utf8, i, cp))
      raise(error_code::invalid_argument, "grammar literal is not valid UTF-8 at byte ", i);
    parts.push_back(of(char_class::single(cp)));
  }
  return sequence(std::move(parts));
}

}  // namespace npullm::grammar
