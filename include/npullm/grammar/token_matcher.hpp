// token_matcher: a grammar over a vocabulary's tokens, per sequence: the allowed-token mask,
// accepting a token, can_end, rollback of n tokens (speculative decoding), fork (beams, n > 1).
//
// token_grammar binds one grammar's byte automaton (automaton.hpp) to one token_index
// (token_index.hpp) and caches masks by automaton state: a state reached again (inside a
// string, between array items) gets its mask copied, not recomputed. A mask is a bitset over
// the vocabulary, 64 tokens a word, bit (id % 64) of word (id / 64).
//
// A mask walks the token trie with the automaton: a node whose byte leads to the dead state
// skips its subtree; every token whose bytes end on a live node is allowed, partial UTF-8 at
// its end included (the grammar continues the character with the next token). The
// end-of-generation tokens are allowed exactly when the grammar can end there (and no
// character is half written); other control tokens never. After an end-of-generation token
// the matcher is finished: nothing more is allowed.
//
// A token_matcher holds its history (the automaton state after each accepted token), so
// rollback is popping and fork is a copy; matchers of one token_grammar share its caches.
// Thread safety: a token_grammar's public functions take its lock (its automaton and caches
// grow as masks are asked for), so matchers on several threads may share one (a server's
// cached grammar, grammar_cache.hpp); their masks are then computed one at a time. One
// token_matcher is used by one thread at a time.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/automaton.hpp"
#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/token_index.hpp"

namespace npullm::grammar {

// Words of a mask over n tokens.
constexpr std::size_t mask_words(std::size_t n) noexcept {
  return (n + 63) / 64;
}
inline bool mask_test(std::span<const std::uint64_t> mask, std::int32_t id) noexcept {
  return (mask[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
}

class token_grammar {
 public:
  using state_id = byte_automaton::state_id;
  // Reserved state of a matcher past an end-of-generation token.
  static constexpr state_id finished = 0xFFFFFFFEu;

  // max_cached_masks: masks kept per grammar (each mask_words(vocab) * 8 bytes); the cache is
  // emptied when full.
  token_grammar(grammar g, std::shared_ptr<const token_index> index,
                std::size_t max_cached_masks = 4096)
      : automaton_(std::move(g)), index_(std::move(index)), max_cached_(max_cached_masks) {
    if (!index_) raise(error_code::invalid_argument, "token_grammar: no token_index");
    words_ = mask_words(index_->size());
    states_.resize(index_->max_depth() + 1);
    dec_.resize(index_->max_depth() + 1);
  }

  [[nodiscard]] const token_index& index() const noexcept { return *index_; }
  [[nodiscard]] std::size_t words() const noexcept { return words_; }
  // The state before any token.
  [[nodiscard]] state_id start() const noexcept { return automaton_.start(); }
  // States the automaton has built so far (it grows as masks are asked for).
  [[nodiscard]] std::size_t state_count() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return automaton_.state_count();
  }

  // The mask of state s into out (words() words).
  void fill_mask(state_id s, std::span<std::uint64_t> out) {
    if (out.size() != words_)
      raise(error_code::invalid_shape, "token mask of ", out.size(), " words for a vocabulary of ",
            index_->size(), " tokens (", words_, " words)");
    const std::lock_guard<std::mutex> lock(mutex_);
    if (s == finished) {
      std::fill(out.begin(), out.end(), 0);
      return;
    }
    if (const auto it = cache_.find(s); it != cache_.end()) {
      const std::uint64_t* src = cached(it->second);
      std::copy(src, src + words_, out.begin());
      return;
    }
    compute(s, out);
    if (cache_.size() >= max_cached_) cache_.clear();  // the pages stay for the next masks
    if (max_cached_ > 0) {
      const std::size_t k = cache_.size();
      if (k / page_masks >= pages_.size())
        pages_.push_back(std::make_unique<std::uint64_t[]>(page_masks * words_));
      std::copy(out.begin(), out.end(), cached(k));
      cache_.emplace(s, k);
    }
  }

  // The state after token id from s (byte_automaton::dead when the grammar forbids it;
  // `finished` for an end-of-generation token where the grammar can end).
  state_id next(state_id s, std::int32_t id) {
    index_->check(id);
    const std::lock_guard<std::mutex> lock(mutex_);
    if (s == finished) return byte_automaton::dead;
    if (index_->is_eog(id)) return automaton_.can_end(s) ? finished : byte_automaton::dead;
    if (!index_->has_bytes(id)) return byte_automaton::dead;
    return automaton_.next(s, index_->bytes(id));
  }

  [[nodiscard]] bool can_end(state_id s) const {
    if (s == finished) return true;
    const std::lock_guard<std::mutex> lock(mutex_);
    return automaton_.can_end(s);
  }

 private:
  // A state's loop: the ASCII bytes that all lead to one same state `step` (s itself when s
  // loops on them: inside an unbounded JSON string, all but '"', '\\' and controls), and whether
  // every non-ASCII character leads there too. `budget`: every token made only of those bytes
  // and characters with at most that many bytes is allowed from s; unlimited for a self loop,
  // and for a bounded repetition (a string's maxLength, x{m,n}) the copies left, found by
  // following `step` while every stack of the next state takes all of those bytes or none
  // (budget_of).
  static constexpr std::uint32_t unlimited = 0xFFFFFFFFu;
  static constexpr int min_loop_bytes = 16;  // fewer: the walk over them is short anyway
  struct loop_info {
    bool known = false;
    bool big = false;  // enough loop bytes for the walk to use them
    std::array<std::uint64_t, 2> ascii{};
    bool non_ascii = false;
    state_id step = byte_automaton::dead;
    std::uint32_t budget = 0;  // 0: not yet known (see budget_of)
  };
  const loop_info& loops_of(state_id s) {
    if (loops_.size() <= s) loops_.resize(automaton_.state_count());
    if (loops_[s].known) return loops_[s];
    loop_info l;
    l.known = true;
    // The dead state leads to itself on every byte, but allows nothing.
    if (s != byte_automaton::dead && automaton_.between_characters(s)) {
      // The loop's target: s itself if some byte leads back to it, else the live state the
      // most ASCII bytes lead to.
      std::array<state_id, 128> to{};
      for (unsigned b = 0; b < 128; ++b) to[b] = automaton_.next(s, static_cast<unsigned char>(b));
      state_id step = byte_automaton::dead;
      if (std::find(to.begin(), to.end(), s) != to.end()) {
        step = s;
      } else {
        std::array<state_id, 128> sorted = to;
        std::sort(sorted.begin(), sorted.end());
        std::size_t best = 0;
        for (std::size_t i = 0; i < 128;) {
          std::size_t j = i;
          while (j < 128 && sorted[j] == sorted[i]) ++j;
          if (sorted[i] != byte_automaton::dead && j - i > best) best = j - i, step = sorted[i];
          i = j;
        }
      }
      if (step != byte_automaton::dead) {
        for (unsigned b = 0; b < 128; ++b)
          if (to[b] == step) l.ascii[b >> 6] |= std::uint64_t{1} << (b & 63);
        l.non_ascii = automaton_.uniform_non_ascii(s) && automaton_.next(s, "\xc2\x80") == step;
        l.step = step;
        l.big = std::popcount(l.ascii[0]) + std::popcount(l.ascii[1]) >= min_loop_bytes;
        if (step == s) l.budget = unlimited;
      }
    }
    loops_[s] = l;  // loops_ holds s (sized above; it only grows)
    return loops_[s];
  }
  // The budget of s (loop_info): how many times in a row every one of its loop bytes (and
  // characters) leads from one state to one next live state, capped at index().max_depth()
  // (unlimited from there on: no token is longer). Each step is checked on the stacks
  // (byte_automaton::next_on_all): one transition per step, not 128.
  std::uint32_t budget_of(state_id s) {
    const loop_info& l = loops_of(s);
    if (!l.big) return 0;
    if (l.budget != 0) return l.budget;
    const std::size_t cap = index_->max_depth();
    const auto ascii = l.ascii;
    const bool non_ascii = l.non_ascii;
    std::uint32_t steps = 1;  // s -> l.step
    for (state_id cur = l.step; steps <= cap; ++steps) {
      cur = automaton_.next_on_all(cur, ascii, non_ascii);
      if (cur == byte_automaton::dead || cur == byte_automaton::mixed) break;
    }
    const std::uint32_t budget = steps > cap ? unlimited : steps;
    loops_[s].budget = budget;
    return budget;
  }

  // The walk (see the top). From a state with many self loops, the tokens made only of loop
  // bytes come from loop_mask, and a subtree whose paths all stay in the loop (its bytes,
  // its UTF-8 validity, from a prefix that stayed in it) is skipped whole: inside a string
  // the walk visits only tokens with a quote, a backslash or a control byte.
  void compute(state_id s, std::span<std::uint64_t> out) {
    const std::uint32_t budget = budget_of(s);
    const loop_info l = loops_of(s);  // a copy: loops_ grows below
    const bool fast = l.big;
    if (fast) {
      const auto& base = index_->loop_mask(l.ascii, l.non_ascii);
      if (budget == unlimited) {
        std::copy(base.begin(), base.end(), out.begin());
      } else {
        const auto& len = index_->length_mask(budget);
        for (std::size_t w = 0; w < words_; ++w) out[w] = base[w] & len[w];
      }
    } else {
      std::fill(out.begin(), out.end(), 0);
    }
    const auto nodes = index_->nodes();
    const auto sums = index_->summaries();
    const auto ids = index_->ids();
    states_[0] = s;
    dec_[0] = 0;
    const std::size_t n = nodes.size();
    const std::uint64_t l0 = ~l.ascii[0], l1 = ~l.ascii[1];
    for (std::size_t i = 0; i < n;) {
      const token_index::node& nd = nodes[i];
      const int prev = dec_[nd.depth - 1u];
      if (fast && prev == 0 && (sums[i].ascii[0] & l0) == 0 && (sums[i].ascii[1] & l1) == 0 &&
          (!sums[i].non_ascii || (l.non_ascii && (sums[i].utf8_ok & 1))) &&
          sums[i].max_len <= budget) {
        i = nd.end;  // all in loop_mask
        continue;
      }
      // A state met on the way with many self loops (a free key after its first character):
      // a subtree that stays in its loop is allowed whole, its tokens a contiguous run.
      const state_id p = states_[nd.depth - 1u];
      if (nd.depth > 1 && nd.depth <= 4 && p != s) {
        const loop_info& lp = loops_of(p);
        if (lp.big && lp.budget == unlimited && (sums[i].ascii[0] & ~lp.ascii[0]) == 0 &&
            (sums[i].ascii[1] & ~lp.ascii[1]) == 0 &&
            (!sums[i].non_ascii || (lp.non_ascii && (sums[i].utf8_ok & 1)))) {
          const std::uint32_t end =
              nd.end < n ? nodes[nd.end].tok_begin : static_cast<std::uint32_t>(ids.size());
          for (std::uint32_t k = nd.tok_begin; k < end; ++k) {
            const auto id = static_cast<std::uint32_t>(ids[k]);
            out[id >> 6] |= std::uint64_t{1} << (id & 63);
          }
          i = nd.end;
          continue;
        }
      }
      const state_id t = automaton_.next(p, nd.byte);
      if (t == byte_automaton::dead) {
        i = nd.end;
        continue;
      }
      states_[nd.depth] = t;
      int d = -1;
      if (fast && prev >= 0) {
        if (nd.byte < 0x80) {
          if (prev == 0 && ((l.ascii[nd.byte >> 6] >> (nd.byte & 63)) & 1)) d = 0;
        } else if (l.non_ascii) {
          d = token_index::utf8_step(prev, nd.byte);
        }
      }
      dec_[nd.depth] = d;
      for (std::uint32_t k = nd.tok_begin; k < nd.tok_end; ++k) {
        const auto id = static_cast<std::uint32_t>(ids[k]);
        out[id >> 6] |= std::uint64_t{1} << (id & 63);
      }
      ++i;
    }
    if (automaton_.can_end(s)) {
      for (const std::int32_t e : index_->eog()) {
        const auto id = static_cast<std::uint32_t>(e);
        out[id >> 6] |= std::uint64_t{1} << (id & 63);
      }
    }
  }

  mutable std::mutex mutex_;  // guards everything below but index_ and words_
  byte_automaton automaton_;
  std::shared_ptr<const token_index> index_;
  std::size_t words_ = 0;
  std::size_t max_cached_ = 0;
  std::vector<state_id> states_;  // the walk's state per trie depth
  std::vector<int> dec_;          // the walk's loop-path UTF-8 state per depth (-1: left it)
  std::vector<loop_info> loops_;  // by state
  // Cached masks by state: mask k in pages_, page_masks a page, so that caching one more never
  // copies the others (4,096 masks of Llama 3's vocabulary are 64 MB).
  static constexpr std::size_t page_masks = 16;
  std::unordered_map<state_id, std::size_t> cache_;
  std::vector<std::unique_ptr<std::uint64_t[]>> pages_;
  std::uint64_t* cached(std::size_t k) {
    return pages_[k / page_masks].get() + (k % page_masks) * words_;
  }
};

class token_matcher {
 public:
  using state_id = token_grammar::state_id;

  explicit token_matcher(std::shared_ptr<token_grammar> g) : g_(std::move(g)) {
    if (!g_) raise(error_code::invalid_argument, "token_matcher: no token_grammar");
    history_.push_back(g_->start());
  }

  // The allowed tokens now, as a bitset of words() words.
  void fill_mask(std::span<std::uint64_t> out) { g_->fill_mask(history_.back(), out); }
  [[nodiscard]] std::vector<std::uint64_t> mask() {
    std::vector<std::uint64_t> m(g_->words());
    fill_mask(m);
    return m;
  }
  [[nodiscard]] std::size_t words() const noexcept { return g_->words(); }
  // The grammar and vocabulary it runs on (shared with its forks).
  [[nodiscard]] token_grammar& compiled() const noexcept { return *g_; }

  // Accepts the token if the grammar allows it (true) or leaves the matcher as it was (false).
  bool try_accept(std::int32_t id) {
    const state_id t = g_->next(history_.back(), id);
    if (t == byte_automaton::dead) return false;
    history_.push_back(t);
    return true;
  }
  // Accepts the token; invalid_argument (the matcher unchanged) if the grammar forbids it.
  void accept(std::int32_t id) {
    if (!try_accept(id))
      raise(error_code::invalid_argument, "token ", id, " is not allowed by the grammar after ",
            accepted(), " tokens");
  }

  // Whether the tokens so far are a whole sentence (an end-of-generation token may come).
  [[nodiscard]] bool can_end() const { return g_->can_end(history_.back()); }
  // Whether an end-of-generation token was accepted.
  [[nodiscard]] bool finished() const noexcept {
    return history_.back() == token_grammar::finished;
  }
  [[nodiscard]] std::size_t accepted() const noexcept { return history_.size() - 1; }
  // The automaton state now (token_grammar::finished after an end-of-generation token).
  [[nodiscard]] state_id state() const noexcept { return history_.back(); }

  // Forgets the last n accepted tokens; out_of_range (unchanged) past the start.
  void rollback(std::size_t n) {
    if (n > accepted())
      raise(error_code::out_of_range, "rollback of ", n, " tokens past the ", accepted(),
            " accepted");
    history_.resize(history_.size() - n);
  }
  // An independent matcher at the same point (sharing the grammar's caches).
  [[nodiscard]] token_matcher fork() const { return *this; }

 private:
  std::shared_ptr<token_grammar> g_;
  std::vector<state_id> history_;  // state at the start, then after each accepted token
};

}  // namespace npullm::grammar
