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
// own. Repetition: x? is O ::= x | (empty), x* the right-recursive R ::= x R | (empty), x+ is
// x R (each made once per repeated element and shared); every other count, x{m,n} and x{m,}
// with m > 1, is one `rep` element (grammar::reps: the element x, m, n) whatever m and n: the
// matcher keeps the count in its stack frame (automaton.hpp), as llguidance's lexer counts,
// so "a"{0,10^9} costs one element, and "a"{0,99999} over 100 different classes 100 elements,
// where they were chains of 10^9 and 10^7 rules.
//
// Compile budget (grammar_limits): inputs come from the network, so every grammar is built
// under limits on its rules, elements and bytes, checked before anything is allocated, and
// on the nesting of the expressions (the builder, the parsers and the expressions'
// destructors recurse on it). Running out is npullm::error capacity_exhausted naming the
// limit and its value. A long counted repetition costs at match time instead: a state per
// count reached, under the automaton's byte budget.
//
// Left recursion policy: refused. A rule that can reach itself at its left edge (through
// nullable prefixes) with a continuation left to match after the reference would need an
// unbounded stack before consuming anything; build() throws invalid_argument naming the rule.
// Found in linear time: nullable rules by a worklist, then the left-edge graph's strongly
// connected components (Tarjan, iterative); a left edge with something after it inside one
// component is left recursion. A cycle made only of references in tail position
// (R ::= x R | "" with x nullable) is accepted: it consumes nothing and the matcher's closure
// visits each (position, stack) once. A root that derives no text at all (every alternative
// runs into such a cycle: a $ref cycle of a schema) is refused.
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
#include "npullm/grammar/expr.hpp"

namespace npullm::grammar {

// Builds a grammar rule by rule, under a compile budget (grammar_limits). Rules are declared
// by name (a reference may come before the definition); build() refuses undefined rules, left
// recursion and a root that derives no text.
class grammar_builder {
 public:
  explicit grammar_builder(grammar_limits limits = {}) : limits_(limits) {}

  [[nodiscard]] const grammar_limits& limits() const noexcept { return limits_; }

  // The id of the rule of this name, declared (undefined) if new.
  std::uint32_t rule(std::string_view name) {
    const auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    const std::uint32_t id = add_rule(std::string(name));
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
      return add_rule(std::move(name));
    }
  }
  [[nodiscard]] bool defined(std::uint32_t r) const { return defined_.at(r); }
  [[nodiscard]] const std::string& name(std::uint32_t r) const { return g_.rule_names.at(r); }
  [[nodiscard]] std::size_t rule_count() const noexcept { return g_.rule_names.size(); }
  [[nodiscard]] std::size_t element_count() const noexcept { return g_.elements.size(); }

  // Defines rule r as e (an alternative at the top gives the rule's alternatives).
  void define(std::uint32_t r, const expr& e) {
    check_depth(e);
    std::vector<std::vector<element>> alts;
    if (e.kind == expr::alt) {
      for (const auto& a : e.items) alts.push_back(lower_sequence(a, r));
    } else {
      alts.push_back(lower_sequence(e, r));
    }
    std::size_t n = 0;
    for (const auto& a : alts) n += a.size() + 1;
    reserve(0, n, alts.size());
    for (auto& a : alts) {
      g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
      g_.elements.insert(g_.elements.end(), a.begin(), a.end());
      g_.elements.push_back({element::end, 0});
    }
    defined_[r] = true;
  }

  // The grammar whose start rule is `root`. Throws invalid_argument for a referenced rule
  // that is not defined (naming it; `where` adds context), for left recursion and for a root
  // from which no text can be derived.
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
  // ---- the budget -----------------------------------------------------------------------------
  // About what a rule, an alternative and an element cost in the grammar and its builder.
  static constexpr std::size_t rule_bytes = 96, alt_bytes = 4, element_bytes = sizeof(element);

  [[noreturn]] static void exhausted(std::string_view what, std::size_t needed,
                                     std::string_view limit, std::size_t value) {
    raise(error_code::capacity_exhausted, "grammar: compile budget exhausted: ", what, " needs ",
          needed, " ", limit == "max_bytes" ? "bytes" : limit.substr(4), ", over the limit of ",
          value, " (grammar_limits::", limit, ")");
  }
  // Checks that rules, elements and alternatives more fit the budget, before allocating them.
  void reserve(std::size_t rules, std::size_t elements, std::size_t alts,
               std::string_view what = "the grammar") {
    const std::size_t r = g_.rule_names.size() + rules, e = g_.elements.size() + elements;
    if (r > limits_.max_rules) exhausted(what, r, "max_rules", limits_.max_rules);
    if (e > limits_.max_elements) exhausted(what, e, "max_elements", limits_.max_elements);
    bytes_ += rules * rule_bytes + elements * element_bytes + alts * alt_bytes;
    if (bytes_ > limits_.max_bytes) exhausted(what, bytes_, "max_bytes", limits_.max_bytes);
  }
  void check_depth(const expr& e) const {
    if (e.depth > limits_.max_depth)
      raise(error_code::capacity_exhausted, "grammar: an expression nested ", e.depth,
            " levels deep, deeper than ", limits_.max_depth, " (grammar_limits::max_depth)");
  }
  std::uint32_t add_rule(std::string name) {
    reserve(1, 0, 0);
    bytes_ += name.size();
    const auto id = static_cast<std::uint32_t>(g_.rule_names.size());
    g_.rule_names.push_back(std::move(name));
    g_.rule_alts.emplace_back();
    defined_.push_back(false);
    return id;
  }

  std::uint32_t class_index(const char_class& c) {
    // Interned: JSON grammars repeat the same few classes thousands of times.
    std::string key;
    for (const auto& [lo, hi] : c.ranges()) {
      key.append(reinterpret_cast<const char*>(&lo), sizeof lo);
      key.append(reinterpret_cast<const char*>(&hi), sizeof hi);
    }
    const auto [it, inserted] =
        class_ids_.emplace(std::move(key), static_cast<std::uint32_t>(g_.classes.size()));
    if (inserted) {
      bytes_ += sizeof(char_class) + 2 * c.ranges().size() * 8;
      if (bytes_ > limits_.max_bytes)
        exhausted("the grammar's classes", bytes_, "max_bytes", limits_.max_bytes);
      g_.classes.push_back(c);
    }
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

  // x? and x*, for the element x, each made once per element (key: kind, value, star):
  // O ::= x | (empty), and R ::= x R | (empty), right recursive so the matcher's stack stays
  // flat.
  std::uint32_t repeat_rule(element one, std::uint32_t owner, bool star) {
    const std::uint64_t key = (static_cast<std::uint64_t>(one.kind) << 33) |
                              (static_cast<std::uint64_t>(star) << 32) | one.value;
    const auto [it, inserted] = repeat_rules_.emplace(key, 0);
    if (!inserted) return it->second;
    const std::uint32_t r = fresh(g_.rule_names[owner]);
    reserve(0, star ? 4 : 3, 2);
    g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
    g_.elements.push_back(one);
    if (star) g_.elements.push_back({element::ref, r});
    g_.elements.push_back({element::end, 0});
    g_.rule_alts[r].push_back(static_cast<std::uint32_t>(g_.elements.size()));
    g_.elements.push_back({element::end, 0});
    defined_[r] = true;
    it->second = r;
    return r;
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
        if (e.min <= 1 && (e.max <= 1 || e.max == expr::unbounded)) {
          // x, x?, x*, x+: the rules every grammar is made of, as they were.
          if (e.min == 1) out.push_back(one);
          if (e.max == expr::unbounded) {
            out.push_back({element::ref, repeat_rule(one, owner, true)});
          } else if (e.max > e.min) {
            out.push_back({element::ref, repeat_rule(one, owner, false)});
          }
          return;
        }
        // A count: one element, x{m,n} or x{m,} (repetition::unbounded is expr::unbounded).
        reserve(0, 1, 0, "a counted repetition");
        bytes_ += sizeof(repetition);
        g_.reps.push_back({one, e.min, e.max});
        out.push_back({element::rep, static_cast<std::uint32_t>(g_.reps.size() - 1)});
        return;
      }
    }
  }

  std::vector<element> lower_sequence(const expr& e, std::uint32_t owner) {
    std::vector<element> out;
    lower_into(e, owner, out);
    return out;
  }

  // What an element needs matched for its alternative to derive anything: itself, or a
  // repetition's element when the count must reach 1 (an `end` element: nothing).
  [[nodiscard]] element required(element el) const {
    if (el.kind != element::rep) return el;
    const repetition& rp = g_.reps[el.value];
    return rp.min > 0 ? rp.item : element{element::end, 0};
  }

  // Linear: nullable rules by a worklist over the alternatives, then Tarjan's strongly
  // connected components of the left-edge graph (iterative: rule chains go 10^5 deep).
  void check_left_recursion() const {
    const std::size_t n = g_.rule_names.size();
    // Alternatives: (rule, start); for each rule, the alternatives that mention it.
    std::vector<std::uint32_t> alt_rule, alt_start, pending;
    std::vector<std::vector<std::uint32_t>> used_in(n);
    for (std::uint32_t r = 0; r < n; ++r) {
      for (const std::uint32_t a : g_.rule_alts[r]) {
        const auto id = static_cast<std::uint32_t>(alt_rule.size());
        alt_rule.push_back(r);
        alt_start.push_back(a);
        std::uint32_t refs = 0;
        bool has_class = false;
        for (std::uint32_t p = a; g_.elements[p].kind != element::end; ++p) {
          // A repetition counts as its element when it needs one (min > 0), else not at all.
          const element el = required(g_.elements[p]);
          if (el.kind == element::cls) {
            has_class = true;
          } else if (el.kind == element::ref) {
            ++refs;
            used_in[el.value].push_back(id);
          }
        }
        // A class makes the alternative non-nullable for good: never counted down to 0.
        pending.push_back(has_class ? std::numeric_limits<std::uint32_t>::max() : refs);
      }
    }
    std::vector<char> nullable(n, 0);
    std::vector<std::uint32_t> todo;
    const auto found = [&](std::uint32_t r) {
      if (!nullable[r]) {
        nullable[r] = 1;
        todo.push_back(r);
      }
    };
    for (std::size_t a = 0; a < alt_rule.size(); ++a)
      if (pending[a] == 0) found(alt_rule[a]);
    while (!todo.empty()) {
      const std::uint32_t r = todo.back();
      todo.pop_back();
      // Each mention of r in an alternative is one reference fewer to wait for.
      for (const std::uint32_t a : used_in[r])
        if (pending[a] != std::numeric_limits<std::uint32_t>::max() && --pending[a] == 0)
          found(alt_rule[a]);
    }
    // Left edges r -> s; `push` when something follows the reference in its alternative.
    std::vector<std::uint32_t> edge_begin(n + 1, 0), edge_to;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> push_edges;
    for (std::uint32_t r = 0; r < n; ++r) {
      edge_begin[r] = static_cast<std::uint32_t>(edge_to.size());
      for (const std::uint32_t a : g_.rule_alts[r]) {
        for (std::uint32_t p = a; g_.elements[p].kind != element::end; ++p) {
          const auto& el = g_.elements[p];
          if (el.kind == element::rep) {
            // Its element is entered with a frame to count (a push edge); the repetition is
            // nullable when it may stop at 0 or its element is.
            const repetition& rp = g_.reps[el.value];
            if (rp.item.kind == element::ref) {
              edge_to.push_back(rp.item.value);
              push_edges.emplace_back(r, rp.item.value);
              if (rp.min > 0 && !nullable[rp.item.value]) break;
            } else if (rp.min > 0) {
              break;
            }
            continue;
          }
          if (el.kind == element::cls) break;
          edge_to.push_back(el.value);
          if (g_.elements[p + 1].kind != element::end) push_edges.emplace_back(r, el.value);
          if (!nullable[el.value]) break;
        }
      }
    }
    edge_begin[n] = static_cast<std::uint32_t>(edge_to.size());
    if (!push_edges.empty()) check_components(edge_begin, edge_to, push_edges);
    // After left recursion (a left-recursive rule often derives nothing either).
    check_productive(alt_rule, alt_start, used_in);
  }

  void check_components(
      const std::vector<std::uint32_t>& edge_begin, const std::vector<std::uint32_t>& edge_to,
      const std::vector<std::pair<std::uint32_t, std::uint32_t>>& push_edges) const {
    const std::size_t n = g_.rule_names.size();
    // Tarjan's components, with an explicit call stack of (rule, next edge).
    constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
    std::vector<std::uint32_t> index(n, none), low(n, 0), comp(n, none), stack;
    std::vector<char> on_stack(n, 0);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> calls;
    std::uint32_t next_index = 0, next_comp = 0;
    for (std::uint32_t s = 0; s < n; ++s) {
      if (index[s] != none) continue;
      calls.emplace_back(s, edge_begin[s]);
      index[s] = low[s] = next_index++;
      stack.push_back(s);
      on_stack[s] = 1;
      while (!calls.empty()) {
        // Copies, not references: the push below may move `calls`.
        const std::uint32_t v = calls.back().first, e = calls.back().second;
        if (e < edge_begin[v + 1]) {
          ++calls.back().second;
          const std::uint32_t w = edge_to[e];
          if (index[w] == none) {
            index[w] = low[w] = next_index++;
            stack.push_back(w);
            on_stack[w] = 1;
            calls.emplace_back(w, edge_begin[w]);
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        const std::uint32_t done = v;
        calls.pop_back();
        if (!calls.empty()) low[calls.back().first] = std::min(low[calls.back().first], low[done]);
        if (low[done] == index[done]) {
          for (;;) {
            const std::uint32_t w = stack.back();
            stack.pop_back();
            on_stack[w] = 0;
            comp[w] = next_comp;
            if (w == done) break;
          }
          ++next_comp;
        }
      }
    }
    // A push edge r -> s on a cycle (s reaches r: one component) is left recursion.
    for (const auto& [r, s] : push_edges) {
      if (comp[r] == comp[s])
        raise(error_code::invalid_argument, "grammar: rule '", g_.rule_names[r],
              "' is left recursive (it reaches itself through '", g_.rule_names[s],
              "' before matching any character); rewrite it with repetition, e.g. "
              "a ::= b (op b)*");
    }
  }

  // Productive rules (some text derives from them), by the same worklist as nullable: the
  // root must be one.
  void check_productive(const std::vector<std::uint32_t>& alt_rule,
                        const std::vector<std::uint32_t>& alt_start,
                        const std::vector<std::vector<std::uint32_t>>& used_in) const {
    const std::size_t n = g_.rule_names.size();
    std::vector<std::uint32_t> todo;
    {
      std::vector<char> productive(n, 0);
      std::vector<std::uint32_t> wait(alt_rule.size());
      for (std::size_t a = 0; a < alt_rule.size(); ++a) {
        std::uint32_t refs = 0;
        for (std::uint32_t p = alt_start[a]; g_.elements[p].kind != element::end; ++p)
          refs += required(g_.elements[p]).kind == element::ref;
        wait[a] = refs;
      }
      const auto make = [&](std::uint32_t r) {
        if (!productive[r]) {
          productive[r] = 1;
          todo.push_back(r);
        }
      };
      for (std::size_t a = 0; a < alt_rule.size(); ++a)
        if (wait[a] == 0) make(alt_rule[a]);
      while (!todo.empty()) {
        const std::uint32_t r = todo.back();
        todo.pop_back();
        for (const std::uint32_t a : used_in[r])
          if (--wait[a] == 0) make(alt_rule[a]);
      }
      if (!productive[g_.root])
        raise(error_code::invalid_argument, "grammar: rule '", g_.rule_names[g_.root],
              "' matches no text (each of its alternatives runs into rules that only refer to "
              "each other, such as a cycle of references)");
    }
  }

  grammar g_;
  grammar_limits limits_;
  std::size_t bytes_ = 0;  // what the grammar holds so far, about (reserve())
  std::unordered_map<std::string, std::uint32_t> ids_;
  std::unordered_map<std::string, std::uint32_t> class_ids_;
  std::unordered_map<std::uint64_t, std::uint32_t> repeat_rules_;  // repeat_rule()
  std::vector<bool> defined_;
  std::uint32_t counter_ = 0;
};

}  // namespace npullm::grammar
