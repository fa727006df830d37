// grammar: a context-free grammar over Unicode code points, flattened for the matcher
// (matcher.hpp), and the builder that GBNF (gbnf.hpp) and JSON Schema (json_schema.hpp) lower
// their expressions into.
//
// Flat form: `elements` holds every alternative of every rule as a run of elements ended by an
// `end` element; a position is an index into it. An element is a character class (index into
// `classes`), a reference to a rule, or the end of an alternative. A rule is the list of the
// start positions of its alternatives (an empty alternative is a lone `end`).
//
// The builder lowers expressions (sequences, alternatives, classes, references, repetitions
// {min, max}) into that form: a group or alternative inside a sequence becomes a rule of its
// own, x{m,n} becomes m copies of x then a chain of n - m optional rules, x{m,} m copies then
// a right-recursive rule R ::= x R | (empty).
//
// Left recursion policy: refused. A rule that can reach itself at its left edge (through
// nullable prefixes) with a continuation left to match after the reference would need an
// unbounded stack before consuming anything; build() throws invalid_argument naming the rule.
// A cycle made only of references in tail position (R ::= x R | "" with x nullable) is
// accepted: it consumes nothing and the matcher's closure visits each (position, stack) once.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"

namespace npullm::grammar {

inline constexpr char32_t max_code_point = 0x10FFFF;

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
  enum kind_t : std::uint8_t { cls, ref, end };
  kind_t kind = end;
  std::uint32_t value = 0;  // class index (cls) or rule id (ref)
};

struct grammar {
  std::vector<std::string> rule_names;                // by rule id
  std::vector<std::vector<std::uint32_t>> rule_alts;  // by rule id: alternatives' start positions
  std::vector<element> elements;                      // every alternative, each ended by `end`
  std::vector<char_class> classes;
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
    // (x{a,A}){b,B} with a <= 1 is x{a*b, A*B}: the counts it allows are contiguous. Nested
    // stars of a nullable x would otherwise give the matcher exponentially many stacks.
    const expr* inner = &x;
    while (inner->kind == seq && inner->items.size() == 1) inner = &inner->items[0];
    if (inner->kind == rep && inner->min <= 1 && inner->max >= 1 && hi >= 1 && lo <= 1) {
      const std::uint32_t a = inner->min, b = inner->max;
      const std::uint64_t top = static_cast<std::uint64_t>(b) * hi;
      const std::uint32_t new_hi = (b == unbounded || hi == unbounded || top >= unbounded)
                                       ? unbounded
                                       : static_cast<std::uint32_t>(top);
      expr y = inner->items[0];
      return repeat(std::move(y), a * lo, new_hi);
    }
    expr e = make(rep, {});
    e.items.push_back(std::move(x));
    e.min = lo;
    e.max = hi;
    return e;
  }
  static expr make(kind_t k, std::vector<expr> parts) {
    expr e;
    e.kind = k;
    e.items = std::move(parts);
    return e;
  }
  static expr optional(expr x) { return repeat(std::move(x), 0, 1); }
  // The code points of a UTF-8 string, in order.
  static expr literal(std::string_view utf8);
};

namespace detail {

// Decodes one UTF-8 sequence of s at i (i moves past it); false for invalid UTF-8.
inline bool next_code_point(std::string_view s, std::size_t& i, char32_t& cp) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  char32_t min = 0;
  if (b0 < 0x80) {
    cp = b0;
    ++i;
    return true;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 1, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 2, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    return false;
  }
  if (i + n >= s.size()) return false;  // truncated
  for (std::size_t k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > max_code_point || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  i += n + 1;
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

// Builds a grammar rule by rule. Rules are declared by name (a reference may come before the
// definition); build() refuses undefined rules and left recursion.
class grammar_builder {
 public:
  // The id of the rule of this name, declared (undefined) if new.
  std::uint32_t rule(std::string_view name) {
    const auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(g_.rule_names.size());
    g_.rule_names.emplace_back(name);
    g_.rule_alts.emplace_back();
    defined_.push_back(false);
    ids_.emplace(std::string(name), id);
    return id;
  }
  // A new rule named base-N (a name no rule has so far), for the builder's own rules: it is
  // not registered by name, so rule(name) never returns it (a rule of that name declared
  // later is another rule), and a grammar with 100,000 of them (a maxLength) keeps no lookup
  // entry for each.
  std::uint32_t fresh(std::string_view base) {
    for (;;) {
      std::string name = std::string(base) + "-" + std::to_string(++counter_);
      if (ids_.find(name) != ids_.end()) continue;
      const auto id = static_cast<std::uint32_t>(g_.rule_names.size());
      g_.rule_names.push_back(std::move(name));
      g_.rule_alts.emplace_back();
      defined_.push_back(false);
      return id;
    }
  }
  [[nodiscard]] bool defined(std::uint32_t r) const { return defined_.at(r); }
  [[nodiscard]] const std::string& name(std::uint32_t r) const { return g_.rule_names.at(r); }

  // Defines rule r as e (an alternative at the top gives the rule's alternatives).
  void define(std::uint32_t r, const expr& e) {
    std::vector<std::vector<element>> alts;
    if (e.kind == expr::alt) {
      for (const auto& a : e.items) alts.push_back(lower_sequence(a, r));
    } else {
      alts.push_back(lower_sequence(e, r));
    }
    for (auto& a : alts) {
      g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
      g_.elements.insert(g_.elements.end(), a.begin(), a.end());
      g_.elements.push_back({element::end, 0});
    }
    defined_[r] = true;
  }

  // The grammar whose start rule is `root`. Throws invalid_argument for a referenced rule
  // that is not defined (naming it; `where` adds context) and for left recursion.
  grammar build(std::uint32_t root) && {
    for (std::uint32_t r = 0; r < g_.rule_names.size(); ++r) {
      if (!defined_[r])
        raise(error_code::invalid_argument, "grammar: rule '", g_.rule_names[r],
              "' is referenced but never defined");
    }
    g_.root = root;
    check_left_recursion();
    return std::move(g_);
  }

 private:
  std::uint32_t class_index(const char_class& c) {
    // Interned: JSON grammars repeat the same few classes thousands of times.
    std::string key;
    for (const auto& [lo, hi] : c.ranges()) {
      key.append(reinterpret_cast<const char*>(&lo), sizeof lo);
      key.append(reinterpret_cast<const char*>(&hi), sizeof hi);
    }
    const auto [it, inserted] =
        class_ids_.emplace(std::move(key), static_cast<std::uint32_t>(g_.classes.size()));
    if (inserted) g_.classes.push_back(c);
    return it->second;
  }

  // One element standing for e (a class, a reference, or a new rule holding e).
  element lower_one(const expr& e, std::uint32_t owner) {
    if (e.kind == expr::cls) return {element::cls, class_index(e.chars)};
    if (e.kind == expr::ref) return {element::ref, e.rule};
    if (e.kind == expr::seq && e.items.size() == 1) return lower_one(e.items[0], owner);
    const std::uint32_t r = fresh(g_.rule_names[owner]);
    define(r, e);
    return {element::ref, r};
  }

  void lower_into(const expr& e, std::uint32_t owner, std::vector<element>& out) {
    switch (e.kind) {
      case expr::seq:
        for (const auto& x : e.items) lower_into(x, owner, out);
        return;
      case expr::cls:
      case expr::ref:
      case expr::alt: out.push_back(lower_one(e, owner)); return;
      case expr::rep: {
        const expr& x = e.items.at(0);
        if (e.max != expr::unbounded && e.max < e.min)
          raise(error_code::invalid_argument, "grammar: repetition {", e.min, ",", e.max,
                "} has max < min");
        if (e.max == 0) return;
        const element one = lower_one(x, owner);
        for (std::uint32_t i = 0; i < e.min; ++i) out.push_back(one);
        if (e.max == expr::unbounded) {
          // R ::= x R | (empty): right recursive, so the matcher's stack stays flat.
          const std::uint32_t r = fresh(g_.rule_names[owner]);
          g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
          g_.elements.push_back(one);
          g_.elements.push_back({element::ref, r});
          g_.elements.push_back({element::end, 0});
          g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
          g_.elements.push_back({element::end, 0});
          defined_[r] = true;
          out.push_back({element::ref, r});
        } else if (e.max > e.min) {
          // O_k ::= x O_{k-1} | (empty), O_1 ::= x | (empty).
          std::uint32_t prev = 0;
          bool have_prev = false;
          for (std::uint32_t k = 1; k <= e.max - e.min; ++k) {
            const std::uint32_t r = fresh(g_.rule_names[owner]);
            g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
            g_.elements.push_back(one);
            if (have_prev) g_.elements.push_back({element::ref, prev});
            g_.elements.push_back({element::end, 0});
            g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
            g_.elements.push_back({element::end, 0});
            defined_[r] = true;
            prev = r;
            have_prev = true;
          }
          out.push_back({element::ref, prev});
        }
        return;
      }
    }
  }

  std::vector<element> lower_sequence(const expr& e, std::uint32_t owner) {
    std::vector<element> out;
    lower_into(e, owner, out);
    return out;
  }

  void check_left_recursion() const {
    const std::size_t n = g_.rule_names.size();
    // Nullable rules, by fixpoint.
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const std::uint32_t a : g_.rule_alts[r]) {
          bool all = true;
          for (std::uint32_t p = a; g_.elements[p].kind != element::end; ++p) {
            const auto& el = g_.elements[p];
            if (el.kind == element::cls || !nullable[el.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Left edges r -> s; `push` when something follows the reference in its alternative.
    std::vector<std::vector<std::uint32_t>> edges(n);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> push_edges;
    for (std::uint32_t r = 0; r < n; ++r) {
      for (const std::uint32_t a : g_.rule_alts[r]) {
        for (std::uint32_t p = a; g_.elements[p].kind != element::end; ++p) {
          const auto& el = g_.elements[p];
          if (el.kind == element::cls) break;
          edges[r].push_back(el.value);
          if (g_.elements[p + 1].kind != element::end) push_edges.emplace_back(r, el.value);
          if (!nullable[el.value]) break;
        }
      }
    }
    // A push edge r -> s on a cycle (s reaches r) is left recursion.
    std::vector<std::uint32_t> seen(n, 0), todo;
    std::uint32_t stamp = 0;
    for (const auto& [r, s] : push_edges) {
      ++stamp;
      todo.assign(1, s);
      seen[s] = stamp;
      while (!todo.empty()) {
        const std::uint32_t x = todo.back();
        todo.pop_back();
        if (x == r)
          raise(error_code::invalid_argument, "grammar: rule '", g_.rule_names[r],
                "' is left recursive (it reaches itself through '", g_.rule_names[s],
                "' before matching any character); rewrite it with repetition, e.g. "
                "a ::= b (op b)*");
        for (const std::uint32_t y : edges[x]) {
          if (seen[y] != stamp) {
            seen[y] = stamp;
            todo.push_back(y);
          }
        }
      }
    }
  }

  grammar g_;
  std::unordered_map<std::string, std::uint32_t> ids_;
  std::unordered_map<std::string, std::uint32_t> class_ids_;
  std::vector<bool> defined_;
  std::uint32_t counter_ = 0;
};

}  // namespace npullm::grammar
