// key_automaton: the keys of an object sorted by which of a few string languages they belong
// to, for patternProperties, propertyNames and additionalProperties (schema_object.hpp).
//
// Each language is a byte automaton (automaton.hpp) over a whole JSON string ("..."), made
// from a string schema ({"pattern": P} for a patternProperties entry, the propertyNames
// schema). Keys range over plain JSON strings (no escapes, no control characters: every key
// then has one spelling, so "matches no pattern" is exact) that are none of a set of names
// (the named properties, which the object grammar writes itself). The product of the automata
// and a trie of the names is walked breadth first over the symbols a key can hold (each plain
// ASCII character, each non-ASCII code point that starts a name's next step, every other
// non-ASCII code point as one symbol: each automaton must treat those alike, or the keys are
// refused); at the closing quote a key's signature is the set of languages that accept it.
// For each signature, a rule family of the product states that can still end with it: the
// keys with exactly that signature. Refused (unsupported, keyword named by the caller) past
// max_states product states or 16 languages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/automaton.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/schema_common.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::grammar::detail {

// For each signature (bit i: language i accepts the key) that some plain key outside `names`
// has, with every bit of `required` set, the expression of those keys (quotes included).
inline std::vector<std::pair<std::uint32_t, expr>> key_signatures(
    std::vector<byte_automaton*> langs, const std::set<std::string>& names, std::uint32_t required,
    grammar_builder& b, const std::string& path, std::string_view keyword,
    std::size_t max_states = 4096) {
  if (langs.size() > 16) refuse(path, keyword, "more than 16 key patterns");
  // The names' trie over code points.
  struct node {
    std::map<char32_t, std::uint32_t> next;
    bool terminal = false;
  };
  std::vector<node> trie(1);
  for (const auto& n : names) {
    std::uint32_t at = 0;
    bool plain = true;
    for (std::size_t k = 0; k < n.size();) {
      char32_t cp = 0;
      if (!next_code_point(n, k, cp) || cp < 0x20 || cp == '"' || cp == '\\') {
        plain = false;  // never a plain key: nothing to exclude
        break;
      }
      auto f = trie[at].next.find(cp);
      if (f == trie[at].next.end()) {
        trie.push_back({});
        f = trie[at].next.emplace(cp, static_cast<std::uint32_t>(trie.size() - 1)).first;
      }
      at = f->second;
    }
    if (plain) trie[at].terminal = true;
  }
  constexpr std::uint32_t off_trie = 0xFFFFFFFFu;
  using state = std::vector<std::uint32_t>;  // automata states, then the trie node
  std::map<state, std::uint32_t> ids;
  std::vector<state> states;
  struct edge {
    char32_t lo, hi;
    std::uint32_t to;
  };
  std::vector<std::vector<edge>> edges;
  std::vector<std::int64_t> end_sig;  // -1: no key ends here
  const auto utf8 = [](char32_t cp) {
    std::string s;
    text::append_utf8(s, static_cast<std::uint32_t>(cp));
    return s;
  };

  const auto intern = [&](state s) {
    const auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    if (states.size() >= max_states)
      refuse(path, keyword,
             "keys whose automaton has more than " + std::to_string(max_states) + " states");
    const auto id = static_cast<std::uint32_t>(states.size());
    ids.emplace(s, id);
    states.push_back(std::move(s));
    edges.emplace_back();
    end_sig.push_back(-1);
    return id;
  };
  const std::size_t k = langs.size();
  // A state is kept only while every required language is alive.
  const auto alive = [&](const state& s) {
    for (std::size_t i = 0; i < k; ++i)
      if ((required >> i & 1) && s[i] == byte_automaton::dead) return false;
    return true;
  };
  state first(k + 1);
  for (std::size_t i = 0; i < k; ++i) first[i] = langs[i]->next(langs[i]->start(), '"');
  first[k] = 0;
  if (!alive(first)) return {};
  intern(first);
  for (std::uint32_t at = 0; at < states.size(); ++at) {
    const state cur = states[at];
    for (std::size_t i = 0; i < k; ++i)
      if (cur[i] != byte_automaton::dead && !langs[i]->uniform_non_ascii(cur[i]))
        refuse(path, keyword, "a key pattern that tells non-ASCII characters apart");
    const std::uint32_t tn = cur[k];
    // The closing quote.
    if (tn == off_trie || !trie[tn].terminal) {
      std::uint32_t sig = 0;
      for (std::size_t i = 0; i < k; ++i)
        if (langs[i]->can_end(langs[i]->next(cur[i], '"'))) sig |= 1u << i;
      if ((sig & required) == required) end_sig[at] = sig;
    }
    const auto step = [&](std::string_view bytes, char32_t cp) -> std::int64_t {
      state nx(k + 1);
      for (std::size_t i = 0; i < k; ++i) nx[i] = langs[i]->next(cur[i], bytes);
      if (tn == off_trie) {
        nx[k] = off_trie;
      } else {
        const auto f = trie[tn].next.find(cp);
        nx[k] = f == trie[tn].next.end() ? off_trie : f->second;
      }
      if (!alive(nx)) return -1;
      return intern(std::move(nx));
    };
    // Plain ASCII characters, grouped into runs with one destination.
    std::vector<edge> out;
    for (char32_t c = 0x20; c < 0x80; ++c) {
      if (c == '"' || c == '\\') continue;
      const char ch = static_cast<char>(c);
      const std::int64_t to = step(std::string_view(&ch, 1), c);
      if (to < 0) continue;
      if (!out.empty() && out.back().hi + 1 == c && out.back().to == to)
        out.back().hi = c;
      else
        out.push_back({c, c, static_cast<std::uint32_t>(to)});
    }
    // Non-ASCII: the names' next code points each, then all the others as one.
    std::vector<char32_t> special;
    if (tn != off_trie)
      for (const auto& [cp, child] : trie[tn].next)
        if (cp >= 0x80) special.push_back(cp);
    for (const char32_t cp : special) {
      const std::int64_t to = step(utf8(cp), cp);
      if (to >= 0) out.push_back({cp, cp, static_cast<std::uint32_t>(to)});
    }
    {
      // A code point no name continues with (one exists: the specials are few).
      char32_t other = 0x80;
      while (std::find(special.begin(), special.end(), other) != special.end()) ++other;
      const std::int64_t to = step(utf8(other), 0x110000);
      if (to >= 0) {
        char32_t lo = 0x80;
        for (const char32_t cp : special) {
          if (cp > lo) out.push_back({lo, cp - 1, static_cast<std::uint32_t>(to)});
          lo = cp + 1;
        }
        if (lo <= max_code_point)
          out.push_back({lo, max_code_point, static_cast<std::uint32_t>(to)});
      }
    }
    edges[at] = std::move(out);
  }
  // Per signature: the states that can still end with it, each a rule.
  std::set<std::uint32_t> sigs;
  for (const auto s : end_sig)
    if (s >= 0) sigs.insert(static_cast<std::uint32_t>(s));
  std::vector<std::vector<std::uint32_t>> back(states.size());
  for (std::uint32_t a = 0; a < states.size(); ++a)
    for (const auto& e : edges[a]) back[e.to].push_back(a);
  std::vector<std::pair<std::uint32_t, expr>> result;
  for (const std::uint32_t sig : sigs) {
    std::vector<char> live(states.size(), 0);
    std::vector<std::uint32_t> todo;
    for (std::uint32_t a = 0; a < states.size(); ++a)
      if (end_sig[a] == sig) live[a] = 1, todo.push_back(a);
    while (!todo.empty()) {
      const std::uint32_t a = todo.back();
      todo.pop_back();
      for (const std::uint32_t p : back[a])
        if (!live[p]) live[p] = 1, todo.push_back(p);
    }
    if (!live[0]) continue;
    std::vector<std::uint32_t> rule(states.size(), 0);
    for (std::uint32_t a = 0; a < states.size(); ++a)
      if (live[a]) rule[a] = b.fresh("key");
    for (std::uint32_t a = 0; a < states.size(); ++a) {
      if (!live[a]) continue;
      std::vector<expr> alts;
      if (end_sig[a] == sig) alts.push_back(lit("\""));
      std::map<std::uint32_t, std::vector<std::pair<char32_t, char32_t>>> by_dest;
      for (const auto& e : edges[a])
        if (live[e.to]) by_dest[e.to].emplace_back(e.lo, e.hi);
      for (auto& [to, ranges] : by_dest)
        alts.push_back(expr::sequence({chars(std::move(ranges)), expr::call(rule[to])}));
      b.define(rule[a], alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
    }
    result.emplace_back(sig, expr::sequence({lit("\""), expr::call(rule[0])}));
  }
  return result;
}

// The strings of a string language (a byte automaton over "...", such as a pattern's or a
// format's) that hold min_len to max_len characters (max_len unbounded: expr::unbounded).
// The language is first walked alone over the characters a JSON string may hold (plain ASCII,
// the short escapes, \u00XX for control characters, every non-ASCII code point as one symbol:
// the automaton must treat those alike) and minimized (states with the same future are one:
// the automaton of a search pattern keeps apart states that differ only in which of its
// stacks are still alive); then its product with a count of characters (counts past min_len
// capped when there is no maximum) is made into rules. A state whose every character leads
// back to itself (the .* of ^/.*, the [a-z]* of ^[a-z]+$ after one letter) ends its chain of
// counts: what follows it is one counted repetition of its characters, not a rule per count
// (a maxLength of 4,096 made 8,000 rules). nullopt when no string fits; refused past
// max_states states of the language or of the product.
inline std::optional<expr> string_with_length(byte_automaton& lang, std::uint32_t min_len,
                                              std::uint32_t max_len, grammar_builder& b,
                                              const std::string& path, std::string_view keyword,
                                              std::size_t max_states = 20000) {
  const bool bounded = max_len != expr::unbounded;
  const std::uint32_t cap = bounded ? max_len : min_len;
  const auto too_many = [&] {
    refuse(path, keyword,
           "with minLength / maxLength, more than " + std::to_string(max_states) + " states");
  };
  // Symbols: the text of one character as JSON writes it; the last, every non-ASCII one.
  std::vector<std::string> symbols;
  for (int c = 0x20; c < 0x80; ++c)
    if (c != '"' && c != '\\') symbols.emplace_back(1, static_cast<char>(c));
  for (const char* e : {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"})
    symbols.emplace_back(e);
  static constexpr char hexd[] = "0123456789abcdefABCDEF";
  for (int hi = 0; hi < 2; ++hi)
    for (int lo = 0; lo < 22; ++lo) symbols.push_back(std::string("\\u00") + hexd[hi] + hexd[lo]);
  symbols.emplace_back("\xC2\x80");
  const std::size_t n_sym = symbols.size();
  const std::size_t non_ascii = n_sym - 1;

  // The language's states reachable inside a string: next[state * n_sym + symbol] (-1: dead).
  const auto s0 = lang.next(lang.start(), '"');
  if (s0 == byte_automaton::dead) return std::nullopt;
  std::map<byte_automaton::state_id, std::uint32_t> ids{{s0, 0}};
  std::vector<byte_automaton::state_id> order{s0};
  std::vector<std::int32_t> next;
  std::vector<char> ends;
  for (std::uint32_t at = 0; at < order.size(); ++at) {
    const auto s = order[at];
    ends.push_back(lang.can_end(lang.next(s, '"')));
    for (std::size_t k = 0; k < n_sym; ++k) {
      const auto t = lang.next(s, symbols[k]);
      if (t == byte_automaton::dead) {
        next.push_back(-1);
        continue;
      }
      if (k == non_ascii && !lang.uniform_non_ascii(s))
        refuse(path, keyword, "with minLength / maxLength, a class that tells non-ASCII apart");
      const auto [it, fresh] = ids.emplace(t, static_cast<std::uint32_t>(order.size()));
      if (fresh) {
        if (order.size() >= max_states) too_many();
        order.push_back(t);
      }
      next.push_back(static_cast<std::int32_t>(it->second));
    }
  }
  // Minimized by refinement (Moore): states apart while their ends or their successors'
  // blocks differ. A round costs every state and takes at most one more state apart, so a
  // chain (^x{5000}$) needs as many rounds as states: past a budget of rounds x states the
  // states stay as they are (exact, only larger; 5,000 states refined took 13 s).
  const std::size_t n = order.size();
  std::vector<std::uint32_t> block(n);
  for (std::size_t a = 0; a < n; ++a) block[a] = ends[a];
  constexpr std::size_t max_refine_work = 300000;  // rounds x states, about 0.1 s
  for (std::size_t blocks = 0, work = 0;; work += n) {
    if (work + n > max_refine_work) {
      for (std::size_t a = 0; a < n; ++a) block[a] = static_cast<std::uint32_t>(a);
      break;
    }
    std::map<std::vector<std::int32_t>, std::uint32_t> by_signature;
    std::vector<std::uint32_t> refined(n);
    std::vector<std::int32_t> sig(n_sym + 1);
    for (std::size_t a = 0; a < n; ++a) {
      sig[0] = static_cast<std::int32_t>(block[a]);
      for (std::size_t k = 0; k < n_sym; ++k) {
        const std::int32_t t = next[a * n_sym + k];
        sig[k + 1] = t < 0 ? -1 : static_cast<std::int32_t>(block[static_cast<std::size_t>(t)]);
      }
      refined[a] =
          by_signature.emplace(sig, static_cast<std::uint32_t>(by_signature.size())).first->second;
    }
    block = std::move(refined);
    if (by_signature.size() == blocks) break;
    blocks = by_signature.size();
  }
  // Per block: its characters grouped by the block they lead to, each group's expression
  // made once (the plain ones one class, the escapes a choice); a block whose one group
  // leads back to itself is a loop.
  std::uint32_t n_blocks = 0;
  for (const std::uint32_t q : block) n_blocks = std::max(n_blocks, q + 1);
  std::vector<std::uint32_t> rep_of(n_blocks);
  std::vector<char> block_ends(n_blocks);
  for (std::size_t a = n; a-- > 0;) rep_of[block[a]] = static_cast<std::uint32_t>(a);
  for (std::uint32_t q = 0; q < n_blocks; ++q) block_ends[q] = ends[rep_of[q]];
  struct group {
    std::uint32_t to;  // a block
    expr characters;
  };
  std::vector<std::vector<group>> groups(n_blocks);
  std::vector<char> loop(n_blocks, 0);
  for (std::uint32_t q = 0; q < n_blocks; ++q) {
    std::map<std::uint32_t, std::vector<std::size_t>> by_dest;
    for (std::size_t k = 0; k < n_sym; ++k)
      if (const std::int32_t t = next[rep_of[q] * n_sym + k]; t >= 0)
        by_dest[block[static_cast<std::size_t>(t)]].push_back(k);
    for (const auto& [to, ks] : by_dest) {
      std::vector<expr> alts;
      std::vector<std::pair<char32_t, char32_t>> ranges;
      for (const std::size_t k : ks) {
        if (k == non_ascii) {
          ranges.emplace_back(0x80, max_code_point);
        } else if (symbols[k].size() == 1) {
          const auto ch = static_cast<char32_t>(symbols[k][0]);
          ranges.emplace_back(ch, ch);
        } else {
          alts.push_back(lit(symbols[k]));
        }
      }
      if (!ranges.empty()) alts.insert(alts.begin(), chars(std::move(ranges)));
      groups[q].push_back({to, alts.size() == 1 ? alts[0] : expr::choice(std::move(alts))});
    }
    loop[q] = groups[q].size() == 1 && groups[q][0].to == q;
  }

  // The product with the count: (block, count) states, an edge per group; a loop block's
  // state is a tail (no edges: its rest is one repetition).
  std::unordered_map<std::uint64_t, std::uint32_t> pids;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> states;
  std::vector<std::vector<std::uint32_t>> edges;  // per state: per group of its block, the state
  std::vector<char> pends, tail;
  const auto intern = [&](std::uint32_t q, std::uint32_t c) {
    const auto [it, fresh] =
        pids.emplace((std::uint64_t{q} << 32) | c, static_cast<std::uint32_t>(states.size()));
    if (fresh) {
      if (states.size() >= max_states) too_many();
      states.emplace_back(q, c);
      edges.emplace_back();
      pends.push_back(0);
      tail.push_back(0);
    }
    return it->second;
  };
  intern(block[0], 0);
  for (std::uint32_t at = 0; at < states.size(); ++at) {
    const auto [q, c] = states[at];
    if ((!bounded || c < max_len) && loop[q]) {
      tail[at] = 1;
      pends[at] = block_ends[q];  // after the repetition's min_len - c characters
      continue;
    }
    pends[at] = c >= min_len && block_ends[q];
    if (bounded && c >= max_len) continue;
    const std::uint32_t nc = bounded ? c + 1 : std::min(c + 1, cap);
    std::vector<std::uint32_t> out;
    out.reserve(groups[q].size());
    for (const group& g : groups[q]) out.push_back(intern(g.to, nc));
    edges[at] = std::move(out);
  }
  std::vector<std::vector<std::uint32_t>> back(states.size());
  for (std::uint32_t a = 0; a < states.size(); ++a)
    for (const std::uint32_t to : edges[a]) back[to].push_back(a);
  std::vector<char> live(states.size(), 0);
  std::vector<std::uint32_t> todo;
  for (std::uint32_t a = 0; a < states.size(); ++a)
    if (pends[a]) live[a] = 1, todo.push_back(a);
  while (!todo.empty()) {
    const std::uint32_t a = todo.back();
    todo.pop_back();
    for (const std::uint32_t p : back[a])
      if (!live[p]) live[p] = 1, todo.push_back(p);
  }
  if (!live[0]) return std::nullopt;

  // Rules: a state's alternatives are its block's groups, each to the state it leads to.
  std::map<std::uint32_t, std::uint32_t> loop_chars;  // loop block -> its characters' rule
  std::vector<std::uint32_t> rule(states.size(), 0);
  for (std::uint32_t a = 0; a < states.size(); ++a)
    if (live[a]) rule[a] = b.fresh("str");
  for (std::uint32_t a = 0; a < states.size(); ++a) {
    if (!live[a]) continue;
    const auto [q, c] = states[a];
    if (tail[a]) {
      // The rest from a loop at count c: its characters min_len - c to max_len - c times.
      auto [it, fresh] = loop_chars.emplace(q, 0);
      if (fresh) {
        it->second = b.fresh("strchar");
        b.define(it->second, groups[q][0].characters);
      }
      const std::uint32_t lo = c < min_len ? min_len - c : 0;
      const std::uint32_t hi = bounded ? max_len - c : expr::unbounded;
      b.define(rule[a], expr::sequence({expr::repeat(expr::call(it->second), lo, hi), lit("\"")}));
      continue;
    }
    std::vector<expr> alts;
    if (pends[a]) alts.push_back(lit("\""));
    for (std::size_t g = 0; g < edges[a].size(); ++g)
      if (live[edges[a][g]])
        alts.push_back(expr::sequence({groups[q][g].characters, expr::call(rule[edges[a][g]])}));
    b.define(rule[a], alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
  }
  return expr::sequence({lit("\""), expr::call(rule[0])});
}

}  // namespace npullm::grammar::detail
