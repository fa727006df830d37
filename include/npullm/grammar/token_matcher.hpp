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
// Thread safety: matchers on several threads may share one token_grammar (a server's cached
// grammar, grammar_cache.hpp) and compute their masks in parallel: the walk reads the
// automaton without a lock (automaton.hpp: only a transition not yet known locks), the loop
// information per state is published once in pages that never move, and the mask cache takes
// its own short lock (a lookup, not a copy). State ids are the automaton's, the same for every
// matcher. One token_matcher is used by one thread at a time.
//
// Memory (grammar_memory): cached masks are kept under a byte budget (mask_bytes, default
// 16 MiB: 1,000 masks of Llama 3's 128k vocabulary), the least recently used leaving first;
// the automaton under its own (automaton_bytes, default 64 MiB: automaton.hpp). bytes() adds
// them up (what grammar_cache's budget counts).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
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
// Whether id is in the mask; false for an id outside it (a vocabulary without an EOS id has
// eos = -1: not a token, never allowed).
inline bool mask_test(std::span<const std::uint64_t> mask, std::int32_t id) noexcept {
  if (id < 0 || static_cast<std::size_t>(id) >> 6 >= mask.size()) return false;
  return (mask[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
}

// A compiled grammar's memory budgets (see the top).
struct grammar_memory {
  std::size_t mask_bytes = std::size_t{16} << 20;  // cached masks, least recently used evicted
  std::size_t automaton_bytes = byte_automaton::default_max_bytes;  // automaton.hpp
};

class token_grammar {
 public:
  using state_id = byte_automaton::state_id;
  // Reserved state of a matcher past an end-of-generation token.
  static constexpr state_id finished = 0xFFFFFFFEu;

  token_grammar(grammar g, std::shared_ptr<const token_index> index, grammar_memory memory = {})
      : automaton_(std::move(g), memory.automaton_bytes),
        index_(std::move(index)),
        max_mask_bytes_(memory.mask_bytes) {
    if (!index_) raise(error_code::invalid_argument, "token_grammar: no token_index");
    words_ = mask_words(index_->size());
  }
  // A budget of max_cached_masks masks (0: none cached).
  token_grammar(grammar g, std::shared_ptr<const token_index> index, std::size_t max_cached_masks)
      : token_grammar(
            std::move(g), index,
            grammar_memory{.mask_bytes =
                               index ? max_cached_masks * mask_entry_bytes(index->size()) : 0}) {}
  token_grammar(const token_grammar&) = delete;
  token_grammar& operator=(const token_grammar&) = delete;

  [[nodiscard]] const token_index& index() const noexcept { return *index_; }
  [[nodiscard]] std::size_t words() const noexcept { return words_; }
  // The state before any token.
  [[nodiscard]] state_id start() const noexcept { return automaton_.start(); }
  // States the automaton has built so far (it grows as masks are asked for).
  [[nodiscard]] std::size_t state_count() const noexcept { return automaton_.state_count(); }
  // Bytes held: the automaton's, the cached masks' and the loop information's (not the
  // token_index's: one per vocabulary, shared).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return automaton_.bytes() + mask_bytes() + loop_pages_bytes_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t mask_bytes() const noexcept {
    return cache_bytes_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t cached_masks() const {
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    return cache_.size();
  }

  // The mask of state s into out (words() words).
  void fill_mask(state_id s, std::span<std::uint64_t> out) {
    if (out.size() != words_)
      raise(error_code::invalid_shape, "token mask of ", out.size(), " words for a vocabulary of ",
            index_->size(), " tokens (", words_, " words)");
    if (s == finished) {
      std::fill(out.begin(), out.end(), 0);
      return;
    }
    if (const auto m = find_cached(s)) {
      std::copy(m->begin(), m->end(), out.begin());  // outside the lock
      return;
    }
    compute(s, out);
    if (max_mask_bytes_ > 0) keep(s, out);
  }

  // The state after token id from s (byte_automaton::dead when the grammar forbids it;
  // `finished` for an end-of-generation token where the grammar can end).
  state_id next(state_id s, std::int32_t id) {
    index_->check(id);
    if (s == finished) return byte_automaton::dead;
    if (index_->is_eog(id)) return automaton_.can_end(s) ? finished : byte_automaton::dead;
    if (!index_->has_bytes(id)) return byte_automaton::dead;
    return automaton_.next(s, index_->bytes(id));
  }

  [[nodiscard]] bool can_end(state_id s) const {
    if (s == finished) return true;
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
    bool big = false;  // enough loop bytes for the walk to use them
    std::array<std::uint64_t, 2> ascii{};
    bool non_ascii = false;
    state_id step = byte_automaton::dead;
    std::uint32_t budget = 0;  // unlimited for a self loop, else 0 (budget_of finds it)
  };
  // Published once per state: `known` (release) after `info`; `budget` found later by
  // budget_of (0 until then; every thread finds the same).
  struct loop_slot {
    std::atomic<bool> known{false};
    loop_info info;
    std::atomic<std::uint32_t> budget{0};
  };
  // Slots by state in pages that never move, under a fixed directory (no lock to read): 2,048
  // pages of 512 states (1M states; a state past that has its loop found on each call).
  static constexpr std::size_t loop_page_states = 512, loop_pages = 2048;
  struct loop_page {
    loop_slot slots[loop_page_states];
  };
  loop_slot* loop_slot_of(state_id s) {
    const std::size_t k = s / loop_page_states;
    if (k >= loop_pages) return nullptr;
    loop_page* p = loop_dir_[k].load(std::memory_order_acquire);
    if (p == nullptr) {
      const std::lock_guard<std::mutex> lock(loop_mutex_);
      p = loop_dir_[k].load(std::memory_order_relaxed);
      if (p == nullptr) {
        auto fresh = std::make_unique<loop_page>();
        p = fresh.get();
        loop_owned_.push_back(std::move(fresh));
        loop_pages_bytes_.fetch_add(sizeof(loop_page), std::memory_order_relaxed);
        loop_dir_[k].store(p, std::memory_order_release);
      }
    }
    return &p->slots[s % loop_page_states];
  }
  loop_info find_loop(state_id s) {
    loop_info l;
    // The dead state leads to itself on every byte, but allows nothing.
    if (s == byte_automaton::dead || !automaton_.between_characters(s)) return l;
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
    return l;
  }
  // s's loop, found once and kept (`spare` holds it for a state past the slots). Two
  // threads may find it at once: the same result, the first kept.
  const loop_info& loops_of(state_id s, loop_info& spare) {
    loop_slot* slot = loop_slot_of(s);
    if (slot != nullptr && slot->known.load(std::memory_order_acquire)) return slot->info;
    spare = find_loop(s);
    if (slot == nullptr) return spare;
    const std::lock_guard<std::mutex> lock(loop_mutex_);
    if (!slot->known.load(std::memory_order_relaxed)) {
      slot->info = spare;
      slot->known.store(true, std::memory_order_release);
    }
    return slot->info;  // immutable once known
  }
  // The budget of s (loop_info): how many times in a row every one of its loop bytes (and
  // characters) leads from one state to one next live state, capped at index().max_depth()
  // (unlimited from there on: no token is longer). Each step is checked on the stacks
  // (byte_automaton::next_on_all): one transition per step, not 128.
  std::uint32_t budget_of(state_id s, const loop_info& l) {
    if (!l.big) return 0;
    if (l.budget != 0) return l.budget;
    loop_slot* slot = loop_slot_of(s);
    if (slot != nullptr) {
      if (const std::uint32_t b = slot->budget.load(std::memory_order_relaxed); b != 0) return b;
    }
    const std::size_t cap = index_->max_depth();
    std::uint32_t steps = 1;  // s -> l.step
    for (state_id cur = l.step; steps <= cap; ++steps) {
      cur = automaton_.next_on_all(cur, l.ascii, l.non_ascii);
      if (cur == byte_automaton::dead || cur == byte_automaton::mixed) break;
    }
    const std::uint32_t budget = steps > cap ? unlimited : steps;
    if (slot != nullptr) slot->budget.store(budget, std::memory_order_relaxed);
    return budget;
  }

  // The cached mask of s (null if none), now the most recently used.
  std::shared_ptr<const std::vector<std::uint64_t>> find_cached(state_id s) {
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(s);
    if (it == cache_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.used);
    return it->second.mask;
  }
  // Keeps s's mask, the least recently used leaving while over the budget (a mask in use by
  // a reader stays alive with it: shared_ptr).
  void keep(state_id s, std::span<const std::uint64_t> mask) {
    const std::size_t cost = entry_bytes();
    if (cost > max_mask_bytes_) return;
    auto m = std::make_shared<const std::vector<std::uint64_t>>(mask.begin(), mask.end());
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.count(s) != 0) return;  // another thread computed it meanwhile (the same mask)
    std::size_t total = cache_bytes_.load(std::memory_order_relaxed);
    while (!lru_.empty() && total + cost > max_mask_bytes_) {
      cache_.erase(lru_.back());
      lru_.pop_back();
      total -= cost;
    }
    lru_.push_front(s);
    cache_.emplace(s, cached_mask{std::move(m), lru_.begin()});
    cache_bytes_.store(total + cost, std::memory_order_relaxed);
  }
  // A cached mask's bytes: its words, the vector, the shared_ptr block, map and list nodes.
  static constexpr std::size_t mask_entry_bytes(std::size_t tokens) noexcept {
    return mask_words(tokens) * 8 + 160;
  }
  std::size_t entry_bytes() const noexcept { return mask_entry_bytes(index_->size()); }

  // The walk (see the top). From a state with many self loops, the tokens made only of loop
  // bytes come from loop_mask, and a subtree whose paths all stay in the loop (its bytes,
  // its UTF-8 validity, from a prefix that stayed in it) is skipped whole: inside a string
  // the walk visits only tokens with a quote, a backslash or a control byte.
  void compute(state_id s, std::span<std::uint64_t> out) {
    loop_info spare_s, spare_p;
    // The last parent state's loop: siblings share their parent (one lookup for a run of them).
    state_id last_p = finished;
    const loop_info* last_lp = nullptr;
    const loop_info& l = loops_of(s, spare_s);
    const std::uint32_t budget = budget_of(s, l);
    const bool fast = l.big;
    if (fast) {
      const auto base = index_->loop_mask(l.ascii, l.non_ascii);  // kept alive while read
      if (budget == unlimited) {
        std::copy(base->begin(), base->end(), out.begin());
      } else {
        const auto& len = index_->length_mask(budget);
        for (std::size_t w = 0; w < words_; ++w) out[w] = (*base)[w] & len[w];
      }
    } else {
      std::fill(out.begin(), out.end(), 0);
    }
    const auto nodes = index_->nodes();
    const auto sums = index_->summaries();
    const auto ids = index_->ids();
    // The walk's state and loop-path UTF-8 state (-1: left it) per trie depth: the thread's
    // own, so that threads walk at once (kept between calls: no allocation per mask).
    thread_local std::vector<state_id> states;
    thread_local std::vector<int> dec;
    if (states.size() < index_->max_depth() + 1) {
      states.resize(index_->max_depth() + 1);
      dec.resize(index_->max_depth() + 1);
    }
    states[0] = s;
    dec[0] = 0;
    const std::size_t n = nodes.size();
    const std::uint64_t l0 = ~l.ascii[0], l1 = ~l.ascii[1];
    for (std::size_t i = 0; i < n;) {
      const token_index::node& nd = nodes[i];
      const int prev = dec[nd.depth - 1u];
      if (fast && prev == 0 && (sums[i].ascii[0] & l0) == 0 && (sums[i].ascii[1] & l1) == 0 &&
          (!sums[i].non_ascii || (l.non_ascii && (sums[i].utf8_ok & 1))) &&
          sums[i].max_len <= budget) {
        i = nd.end;  // all in loop_mask
        continue;
      }
      // A state met on the way with many self loops (a free key after its first character):
      // a subtree that stays in its loop is allowed whole, its tokens a contiguous run.
      const state_id p = states[nd.depth - 1u];
      if (nd.depth > 1 && nd.depth <= 4 && p != s) {
        if (p != last_p) {
          last_lp = &loops_of(p, spare_p);
          last_p = p;
        }
        const loop_info& lp = *last_lp;
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
      states[nd.depth] = t;
      int d = -1;
      if (fast && prev >= 0) {
        if (nd.byte < 0x80) {
          if (prev == 0 && ((l.ascii[nd.byte >> 6] >> (nd.byte & 63)) & 1)) d = 0;
        } else if (l.non_ascii) {
          d = token_index::utf8_step(prev, nd.byte);
        }
      }
      dec[nd.depth] = d;
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

  byte_automaton automaton_;  // thread-safe itself
  std::shared_ptr<const token_index> index_;
  std::size_t words_ = 0;
  std::size_t max_mask_bytes_ = 0;
  // Loop information by state (loop_slot_of); loop_mutex_ guards making a page and publishing
  // a slot.
  std::mutex loop_mutex_;
  std::unique_ptr<std::atomic<loop_page*>[]> loop_dir_ =
      std::make_unique<std::atomic<loop_page*>[]>(loop_pages);
  std::vector<std::unique_ptr<loop_page>> loop_owned_;
  std::atomic<std::size_t> loop_pages_bytes_{loop_pages * sizeof(void*)};
  // Cached masks by state, least recently used last in lru_ (cache_mutex_ guards both).
  struct cached_mask {
    std::shared_ptr<const std::vector<std::uint64_t>> mask;
    std::list<state_id>::iterator used;
  };
  mutable std::mutex cache_mutex_;
  std::unordered_map<state_id, cached_mask> cache_;
  std::list<state_id> lru_;
  std::atomic<std::size_t> cache_bytes_{0};
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
