// automaton: a grammar (grammar.hpp) run over bytes as a lazily built deterministic automaton.
//
// The matcher is a pushdown over the flat grammar: a stack is a chain of frames
// (position, parent frame, count), interned so that one frame id names a whole stack; a parse
// state is the set of stacks whose top position waits on a character class, plus `accept`
// when the grammar can end there. Moving past an element "settles" a stack: a reference
// pushes a frame and enters every alternative of the rule (a reference last in its
// alternative pushes nothing: it continues with its caller's parent, so x* stays flat); the
// end of an alternative pops to the caller's next position; popping the root sets accept.
// A counted repetition x{m,n} (a `rep` element) at count c may stop when c >= m and take one
// more x when c < n: a class x waits at the repetition itself with count c; a rule x is
// entered with a frame (the repetition, c + 1), so its end pops back to the repetition with
// the count advanced (x{m,}: the count stops at m). Left recursion is refused by the grammar
// builder, so settling ends; tail cycles are cut by visiting each (position, parent, count)
// once per step.
//
// Bytes: a state also holds a partial UTF-8 character (the bytes of a code point seen so far).
// A lead or continuation byte keeps only the stacks whose class holds some code point with
// that prefix; the last byte moves them past the class. Invalid UTF-8 (stray continuation,
// overlong, surrogate, past U+10FFFF) is dead.
//
// Each (state, byte) transition is computed once and cached, so a parse state is a 32-bit id and
// a byte is one table lookup after warm-up: what the token masks walk (token_matcher.hpp).
// States and frames are never freed (a state id names a state for the automaton's life: the
// matchers of a grammar keep them in their histories); memory is bounded by a byte budget
// (max_bytes, default 64 MiB, counted by bytes()): transition rows (1 KiB a state) are made
// while the automaton is under it; a state made past it has no row, so its transitions are
// computed again on each call (slower, the same states); a new state past twice the budget
// throws capacity_exhausted (never a wrong transition). A step that would visit more than
// 200,000 (position, stack) pairs (a grammar so ambiguous that its stacks multiply) throws
// capacity_exhausted, leaving the state as it was.
//
// Thread-safe, and reads do not lock: states and rows live in pages that never move (a
// directory of page pointers, replaced by a larger copy when full, the old ones kept), a
// transition is an atomic entry, so next() over known transitions, can_end() and
// between_characters() read without a lock; a transition not yet known (computing it, and
// interning the states it makes) takes the automaton's lock. So threads sharing one automaton
// walk it in parallel once it is warm, and agree on every state id.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/grammar.hpp"

namespace npullm::grammar {

class byte_automaton {
 public:
  using state_id = std::uint32_t;
  static constexpr state_id dead = 0;  // no stack left: nothing more can match

  static constexpr std::size_t default_max_bytes = std::size_t{64} << 20;

  explicit byte_automaton(grammar g, std::size_t max_bytes = default_max_bytes)
      : g_(std::move(g)), max_bytes_(max_bytes) {
    if (g_.root >= g_.rule_alts.size())
      raise(error_code::invalid_argument, "grammar: root rule ", g_.root, " of ",
            g_.rule_alts.size());
    intern({}, false, 0, 0, 0);  // dead
    std::vector<std::uint32_t> out;
    bool accept = false;
    clear_visited();
    for (const std::uint32_t a : g_.rule_alts[g_.root]) settle({a, no_parent, 0}, out, accept);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    start_ = intern(out, accept, 0, 0, 0);
  }

  [[nodiscard]] state_id start() const noexcept { return start_; }

  byte_automaton(const byte_automaton&) = delete;
  byte_automaton& operator=(const byte_automaton&) = delete;

  // The state after byte b (dead if b cannot come next). Without a lock when known.
  state_id next(state_id s, unsigned char b) {
    if (const std::uint32_t t = load_transition(s, b); t != unknown) return t;
    const std::lock_guard<std::mutex> lock(build_);
    if (const std::uint32_t t = load_transition(s, b); t != unknown) return t;  // made meanwhile
    if (b < 0x80 && info(s).need == 0 && has_row(s)) {
      fill_ascii(s);
      return load_transition(s, b);
    }
    const state_id r = compute(s, b);
    store_transition(s, b, r);
    return r;
  }
  // The state after the bytes (dead as soon as one cannot come next).
  state_id next(state_id s, std::string_view bytes) {
    for (const char c : bytes) {
      if (s == dead) return dead;
      s = next(s, static_cast<unsigned char>(c));
    }
    return s;
  }

  // One step over a set of bytes at once: when every stack of s takes all of the ASCII bytes
  // `bytes` or none of them (and, with `non_ascii`, every non-ASCII character exactly when it
  // takes them), they all lead to one state: that state (dead when no stack takes them),
  // computed once for all of them, without the other 127 transitions that next() fills.
  // `mixed` when the stacks disagree.
  static constexpr state_id mixed = 0xFFFFFFFFu;
  state_id next_on_all(state_id s, const std::array<std::uint64_t, 2>& bytes, bool non_ascii) {
    const std::lock_guard<std::mutex> lock(build_);  // reads state_frames_, which grows
    const state_info st = info(s);
    if (st.need != 0 || (bytes[0] | bytes[1]) == 0) return mixed;
    bool any = false;
    for (std::uint32_t k = 0; k < st.count; ++k) {
      const char_class& c = class_of(state_frames_[st.begin + k]);
      const auto& a = c.ascii();
      const bool all = (a[0] & bytes[0]) == bytes[0] && (a[1] & bytes[1]) == bytes[1];
      if (!all && ((a[0] & bytes[0]) | (a[1] & bytes[1])) != 0) return mixed;
      if (non_ascii) {
        const bool na_all = c.contains_all(0x80, 0xD7FF) && c.contains_all(0xE000, max_code_point);
        const bool na_none = !c.intersects(0x80, 0xD7FF) && !c.intersects(0xE000, max_code_point);
        if (all ? !na_all : !na_none) return mixed;
      }
      any = any || all;
    }
    if (!any) return dead;
    const unsigned b0 = bytes[0] != 0 ? static_cast<unsigned>(std::countr_zero(bytes[0]))
                                      : 64u + static_cast<unsigned>(std::countr_zero(bytes[1]));
    if (const std::uint32_t t = load_transition(s, static_cast<unsigned char>(b0)); t != unknown)
      return t;
    const std::vector<std::uint32_t> cur(state_frames_.begin() + st.begin,
                                         state_frames_.begin() + st.begin + st.count);
    const state_id r = advance(cur, b0);
    for (unsigned b = 0; b < 128; ++b)
      if ((bytes[b >> 6] >> (b & 63)) & 1) store_transition(s, static_cast<unsigned char>(b), r);
    return r;
  }

  // Whether the text so far is a whole sentence of the grammar.
  [[nodiscard]] bool can_end(state_id s) const noexcept {
    const state_info& st = info(s);
    return st.accept && st.need == 0;
  }
  // Whether bytes of the grammar may still follow (some stack is waiting on a class).
  [[nodiscard]] bool can_continue(state_id s) const noexcept { return info(s).count > 0; }
  // Whether s is between characters (no UTF-8 character half read).
  [[nodiscard]] bool between_characters(state_id s) const noexcept { return info(s).need == 0; }
  // Whether s is between characters and each of its stacks takes every non-ASCII code point
  // or none: then every non-ASCII character leads from s to one same state.
  [[nodiscard]] bool uniform_non_ascii(state_id s) const {
    const std::lock_guard<std::mutex> lock(build_);
    const state_info& st = info(s);
    if (st.need != 0) return false;
    for (std::uint32_t k = 0; k < st.count; ++k) {
      const char_class& c = class_of(state_frames_[st.begin + k]);
      const bool all = c.contains_all(0x80, 0xD7FF) && c.contains_all(0xE000, max_code_point);
      const bool none = !c.intersects(0x80, 0xD7FF) && !c.intersects(0xE000, max_code_point);
      if (!all && !none) return false;
    }
    return true;
  }
  // Whether the whole of `text` is a sentence of the grammar.
  [[nodiscard]] bool matches(std::string_view text) { return can_end(next(start_, text)); }

  [[nodiscard]] std::size_t state_count() const noexcept {
    return count_.load(std::memory_order_acquire);
  }
  // Bytes held by states, rows, frames and their indexes (an estimate of the allocations).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return bytes_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t max_bytes() const noexcept { return max_bytes_; }
  [[nodiscard]] const grammar& rules() const noexcept { return g_; }

 private:
  static constexpr std::uint32_t unknown = 0xFFFFFFFFu;
  static constexpr std::size_t max_visited = 200000;  // per step, see settle()
  static constexpr std::uint32_t no_parent = 0xFFFFFFFFu;

  struct frame {
    std::uint32_t pos;        // an element position
    std::uint32_t parent;     // frame id of the caller, or no_parent
    std::uint32_t count = 0;  // at a rep element: the repetitions so far (else 0)
    bool operator==(const frame&) const = default;
  };
  struct frame_hash {
    std::size_t operator()(const frame& f) const noexcept {
      std::uint64_t h =
          ((static_cast<std::uint64_t>(f.pos) << 32) | f.parent) * 0x9E3779B97F4A7C15ull;
      h ^= (h >> 29) + f.count * 0xC2B2AE3D27D4EB4Full;
      // A full finalizer (MurmurHash3's): the tables below index by the low bits.
      h ^= h >> 33;
      h *= 0xFF51AFD7ED558CCDull;
      h ^= h >> 33;
      h *= 0xC4CEB9FE1A85EC53ull;
      return static_cast<std::size_t>(h ^ (h >> 33));
    }
  };
  struct state_info {
    std::uint32_t begin = 0, count = 0;  // its frames in state_frames_
    bool accept = false;
    std::uint8_t need = 0;  // continuation bytes still expected
    std::uint8_t len = 0;   // length of the UTF-8 sequence in progress
    char32_t value = 0;     // its bits so far
  };

  // Frames by value in open addressing (linear probing, a power-of-two capacity at most half
  // full): no allocation per entry. A wide step (a state of 100,000 stacks, each settled
  // anew per byte) spent half its time in the node allocations and lookups of the standard
  // unordered containers. The frame index maps a frame to its id; the visited set is
  // cleared in O(1) by a generation stamp.
  class frame_index {
   public:
    // f's id, or `fresh` when f is new (then inserted with that id).
    std::uint32_t find_or_insert(const frame& f, std::uint32_t fresh) {
      if ((size_ + 1) * 2 > slots_.size()) grow();
      const std::size_t mask = slots_.size() - 1;
      for (std::size_t i = frame_hash{}(f)&mask;; i = (i + 1) & mask) {
        slot& s = slots_[i];
        if (s.id == empty) {
          s = {f, fresh};
          ++size_;
          return fresh;
        }
        if (s.f == f) return s.id;
      }
    }

   private:
    static constexpr std::uint32_t empty = 0xFFFFFFFFu;
    struct slot {
      frame f{0, 0, 0};
      std::uint32_t id = empty;
    };
    void grow() {
      std::vector<slot> old(std::max<std::size_t>(64, slots_.size() * 2));
      old.swap(slots_);
      size_ = 0;
      for (const slot& s : old)
        if (s.id != empty) find_or_insert(s.f, s.id);
    }
    std::vector<slot> slots_;
    std::size_t size_ = 0;
  };
  class visited_set {
   public:
    bool insert(const frame& f) {  // whether f is new this step
      if ((size_ + 1) * 2 > slots_.size()) grow();
      const std::size_t mask = slots_.size() - 1;
      for (std::size_t i = frame_hash{}(f)&mask;; i = (i + 1) & mask) {
        slot& s = slots_[i];
        if (s.gen != gen_) {
          s = {f, gen_};
          ++size_;
          return true;
        }
        if (s.f == f) return false;
      }
    }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    void clear() {
      size_ = 0;
      if (++gen_ == 0) {  // the stamps wrapped: every slot empty again
        for (slot& s : slots_) s.gen = 0;
        gen_ = 1;
      }
    }

   private:
    struct slot {
      frame f{0, 0, 0};
      std::uint32_t gen = 0;  // this step's generation: a member
    };
    void grow() {
      std::vector<slot> old(std::max<std::size_t>(64, slots_.size() * 2));
      old.swap(slots_);
      const std::uint32_t g = gen_;
      size_ = 0;
      for (const slot& s : old)
        if (s.gen == g) insert(s.f);
    }
    std::vector<slot> slots_;
    std::uint32_t gen_ = 1;
    std::size_t size_ = 0;
  };

  std::uint32_t frame_id(const frame& f) {
    const auto next_id = static_cast<std::uint32_t>(frames_.size());
    const std::uint32_t id = frame_ids_.find_or_insert(f, next_id);
    if (id == next_id) {
      frames_.push_back(f);
      add_bytes(sizeof(frame) + 48);  // the frame and its index slots (counted as before)
    }
    return id;
  }
  // The class the stack of frame f waits on (its top is a class or a repetition of one).
  std::uint32_t class_index(std::uint32_t f) const {
    element el = g_.elements[frames_[f].pos];
    if (el.kind == element::rep) el = g_.reps[el.value].item;
    return el.value;
  }
  const char_class& class_of(std::uint32_t f) const { return g_.classes[class_index(f)]; }
  // The count after one more repetition of rp from c (x{m,}: it stops at m).
  static std::uint32_t counted(const repetition& rp, std::uint32_t c) noexcept {
    return rp.max == repetition::unbounded && c >= rp.min ? rp.min : c + 1;
  }
  // Where a stack goes once the element it waits on (frame f) is matched: past it, or back
  // to its repetition with the count advanced.
  frame after(const frame& f) const {
    const element el = g_.elements[f.pos];
    if (el.kind == element::rep) return {f.pos, f.parent, counted(g_.reps[el.value], f.count)};
    return {f.pos + 1, f.parent, 0};
  }

  // Moves a stack to frame `start` (position, parent, count) and collects the frames waiting
  // on a class; a worklist, not recursion: nested nullable repetitions go deep.
  void settle(const frame& start, std::vector<std::uint32_t>& out, bool& accept) {
    work_.clear();
    work_.push_back(start);
    while (!work_.empty()) {
      frame at = work_.back();
      work_.pop_back();
      for (;;) {
        if (!visited_.insert(at)) break;
        if (visited_.size() > max_visited)
          raise(error_code::capacity_exhausted, "grammar: more than ", max_visited,
                " parse positions after one character (a very ambiguous grammar, such as nested "
                "repetitions of optional parts)");
        const element el = g_.elements[at.pos];
        if (el.kind == element::cls) {
          out.push_back(frame_id(at));
          break;
        }
        if (el.kind == element::end) {
          if (at.parent == no_parent) {
            accept = true;
            break;
          }
          // Back to the caller: past its reference, or to its repetition (count advanced).
          const frame f = frames_[at.parent];
          at = g_.elements[f.pos].kind == element::rep ? f : frame{f.pos + 1, f.parent, 0};
          continue;
        }
        if (el.kind == element::rep) {
          const repetition& rp = g_.reps[el.value];
          if (rp.max == repetition::unbounded || at.count < rp.max) {  // one more x
            if (rp.item.kind == element::cls) {
              out.push_back(frame_id(at));
            } else {
              const std::uint32_t caller = frame_id({at.pos, at.parent, counted(rp, at.count)});
              for (const std::uint32_t a : g_.rule_alts[rp.item.value])
                work_.push_back({a, caller, 0});
            }
          }
          if (at.count < rp.min) break;
          at = {at.pos + 1, at.parent, 0};  // or stop here
          continue;
        }
        // A reference: last in its alternative, it returns straight to our caller.
        const bool tail = g_.elements[at.pos + 1].kind == element::end;
        const std::uint32_t callee_parent = tail ? at.parent : frame_id(at);
        for (const std::uint32_t a : g_.rule_alts[el.value]) work_.push_back({a, callee_parent, 0});
        break;
      }
    }
  }

  state_id intern(const std::vector<std::uint32_t>& frames, bool accept, std::uint8_t need,
                  std::uint8_t len, char32_t value) {
    std::string key(frames.size() * 4 + 8, '\0');
    if (!frames.empty()) std::memcpy(key.data(), frames.data(), frames.size() * 4);
    char* tail = key.data() + frames.size() * 4;
    tail[0] = static_cast<char>(accept);
    tail[1] = static_cast<char>(need);
    tail[2] = static_cast<char>(len);
    std::memcpy(tail + 4, &value, 4);
    if (const auto it = state_ids_.find(key); it != state_ids_.end()) return it->second;
    if (state_count() >= 2 && bytes() > 2 * max_bytes_)  // dead and start always exist
      raise(error_code::capacity_exhausted, "grammar: the automaton holds ", bytes(),
            " bytes, past twice its budget of ", max_bytes_, " (", state_count(), " states)");
    const auto id = static_cast<state_id>(count_.load(std::memory_order_relaxed));
    if (id % page_states == 0) add_page(id / page_states);
    add_bytes(key.size() + 64 + frames.size() * 4);  // the key, its map node, state_frames_
    state_ids_.emplace(std::move(key), id);
    state_info st;
    st.begin = static_cast<std::uint32_t>(state_frames_.size());
    st.count = static_cast<std::uint32_t>(frames.size());
    st.accept = accept;
    st.need = need;
    st.len = len;
    st.value = value;
    state_frames_.insert(state_frames_.end(), frames.begin(), frames.end());
    // Written before count_ and any transition to id are published (release).
    dir_.load(std::memory_order_relaxed)[id / page_states].info.load(
        std::memory_order_relaxed)[id % page_states] = st;
    count_.store(id + 1, std::memory_order_release);
    return id;
  }

  // The stacks of cur moved past code point cp (any_cp: every one of them takes it).
  state_id advance(const std::vector<std::uint32_t>& cur, char32_t cp, bool any_cp = false) {
    std::vector<std::uint32_t>& out = scratch_;
    out.clear();
    bool accept = false;
    clear_visited();
    for (const std::uint32_t f : cur)
      if (any_cp || class_of(f).contains(cp)) settle(after(frames_[f]), out, accept);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    if (out.empty() && !accept) return dead;
    return intern(out, accept, 0, 0, 0);
  }

  // The stacks of cur whose class holds a code point with the given UTF-8 prefix. When the
  // prefix's code points are all valid and each stack's class holds all of them or none, the
  // exact bits no longer matter: the state keeps `any_value` instead, so that the many lead
  // bytes inside a JSON string share one state per length instead of one each.
  state_id partial(const std::vector<std::uint32_t>& cur, std::uint8_t need, std::uint8_t len,
                   char32_t value) {
    static constexpr char32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    std::vector<std::uint32_t> out;
    if (value == any_value) {
      return intern(cur, false, need, len, any_value);  // a sub-range of a range all held
    }
    const unsigned shift = 6u * need;
    const char32_t raw_lo = value << shift;
    const char32_t raw_hi = raw_lo | ((char32_t{1} << shift) - 1);
    const char32_t lo = std::max(raw_lo, min_of_len[len]);
    const char32_t hi = std::min(raw_hi, max_code_point);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return dead;
    const bool all_valid = lo == raw_lo && hi == raw_hi && (hi < 0xD800 || lo > 0xDFFF);
    bool all_or_none = all_valid;
    for (const std::uint32_t f : cur) {
      const char_class& c = class_of(f);
      if (!c.intersects(lo, hi)) continue;
      out.push_back(f);
      if (all_or_none && !c.contains_all(lo, hi)) all_or_none = false;
    }
    if (out.empty()) return dead;
    return intern(out, false, need, len, all_or_none ? any_value : value);
  }

  // All 128 ASCII transitions of s at once: bytes that the same stacks take lead to the same
  // state, so one advance per distinct set of taking stacks (inside a string: a handful for
  // the 128 bytes) instead of one per byte. Stacks waiting on one class take the same bytes,
  // so the sets are found over the state's distinct classes (a handful), not over its stacks
  // (up to 200,000 in an ambiguous grammar: 128 class tests each made every new state cost
  // seconds).
  void fill_ascii(state_id s) {
    const state_info st = info(s);
    const std::vector<std::uint32_t> cur(state_frames_.begin() + st.begin,
                                         state_frames_.begin() + st.begin + st.count);
    std::vector<std::uint32_t> classes(cur.size());
    for (std::size_t k = 0; k < cur.size(); ++k) classes[k] = class_index(cur[k]);
    std::sort(classes.begin(), classes.end());
    classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
    const std::size_t words = (classes.size() + 63) / 64;
    std::map<std::vector<std::uint64_t>, state_id> by_takers;
    std::vector<std::uint64_t> takers(words);
    for (unsigned b = 0; b < 128; ++b) {
      std::fill(takers.begin(), takers.end(), 0);
      bool any = false;
      for (std::size_t k = 0; k < classes.size(); ++k) {
        if (g_.classes[classes[k]].contains(b)) {
          takers[k >> 6] |= std::uint64_t{1} << (k & 63);
          any = true;
        }
      }
      state_id r = dead;
      if (any) {
        const auto it = by_takers.find(takers);
        if (it != by_takers.end()) {
          r = it->second;
        } else {
          r = advance(cur, b);
          by_takers.emplace(takers, r);
        }
      }
      store_transition(s, static_cast<unsigned char>(b), r);
    }
  }

  state_id compute(state_id s, unsigned char b) {
    const state_info st = info(s);
    const std::vector<std::uint32_t> cur(state_frames_.begin() + st.begin,
                                         state_frames_.begin() + st.begin + st.count);
    if (cur.empty()) return dead;
    if (st.need == 0) {
      if (b < 0x80) return advance(cur, b);
      if (b >= 0xC2 && b <= 0xDF) return partial(cur, 1, 2, b & 0x1F);
      if (b >= 0xE0 && b <= 0xEF) return partial(cur, 2, 3, b & 0x0F);
      if (b >= 0xF0 && b <= 0xF4) return partial(cur, 3, 4, b & 0x07);
      return dead;
    }
    if ((b & 0xC0) != 0x80) return dead;
    const auto need = static_cast<std::uint8_t>(st.need - 1);
    if (st.value == any_value) {
      if (need > 0) return partial(cur, need, st.len, any_value);
      return advance(cur, 0, true);
    }
    const char32_t value = (st.value << 6) | (b & 0x3F);
    if (need > 0) return partial(cur, need, st.len, value);
    static constexpr char32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (value < min_of_len[st.len] || value > max_code_point ||
        (value >= 0xD800 && value <= 0xDFFF))
      return dead;
    return advance(cur, value);
  }

  static constexpr char32_t any_value = 0xFFFFFFFFu;  // see partial()

  grammar g_;
  std::size_t max_bytes_ = default_max_bytes;
  state_id start_ = dead;
  // Written under build_ only; read under it too but for the pages (below).
  mutable std::mutex build_;
  std::vector<frame> frames_;
  frame_index frame_ids_;
  std::vector<std::uint32_t> state_frames_;
  std::unordered_map<std::string, state_id> state_ids_;
  std::atomic<std::uint32_t> count_{0};
  std::atomic<std::size_t> bytes_{0};
  void add_bytes(std::size_t n) noexcept {
    bytes_.store(bytes_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  // States by id in pages of page_states, each with its (state, byte) -> state row, `unknown`
  // until computed: a page never moves once made, so readers hold no lock (a grammar may reach
  // 100,000 states: a growing table would copy 100 MB, and move under a reader). A page made
  // past the byte budget has no row (its transitions are computed on each call). The
  // directory of pages is replaced by one twice its size when full; the old ones are kept (a
  // reader may hold one), so all of them together are at most twice the last.
  static constexpr std::size_t page_states = 64;
  // A directory entry: page k's states and row (null past the budget). Readers load the
  // directory, the entry, then the item: three dependent loads, as a vector of pages had.
  struct page_entry {
    std::atomic<state_info*> info{nullptr};
    std::atomic<std::atomic<std::uint32_t>*> row{nullptr};
  };
  std::atomic<page_entry*> dir_{nullptr};
  std::size_t dir_capacity_ = 0;                     // under build_
  std::vector<std::unique_ptr<page_entry[]>> dirs_;  // every directory made (the current last)
  std::vector<std::unique_ptr<state_info[]>> info_pages_;
  std::vector<std::unique_ptr<std::atomic<std::uint32_t>[]>> row_pages_;

  const page_entry& entry(state_id s) const noexcept {
    return dir_.load(std::memory_order_acquire)[s / page_states];
  }
  const state_info& info(state_id s) const noexcept {
    return entry(s).info.load(std::memory_order_acquire)[s % page_states];
  }
  bool has_row(state_id s) const noexcept {
    return entry(s).row.load(std::memory_order_acquire) != nullptr;
  }
  // Acquire: a reader that sees a new state's id sees its page and info, written before.
  std::uint32_t load_transition(state_id s, unsigned char b) const noexcept {
    const std::atomic<std::uint32_t>* row = entry(s).row.load(std::memory_order_acquire);
    if (row == nullptr) return unknown;
    return row[(s % page_states) * 256 + b].load(std::memory_order_acquire);
  }
  void store_transition(state_id s, unsigned char b, state_id r) noexcept {
    std::atomic<std::uint32_t>* row = entry(s).row.load(std::memory_order_relaxed);
    if (row != nullptr) row[(s % page_states) * 256 + b].store(r, std::memory_order_release);
  }
  // Page k for states k * page_states on (under build_).
  void add_page(std::size_t k) {
    page_entry* d = dir_.load(std::memory_order_relaxed);
    if (d == nullptr || k >= dir_capacity_) {
      const std::size_t capacity = std::max<std::size_t>(16, 2 * k);
      auto bigger = std::make_unique<page_entry[]>(capacity);
      for (std::size_t i = 0; i < dir_capacity_; ++i) {
        bigger[i].info.store(d[i].info.load(std::memory_order_relaxed), std::memory_order_relaxed);
        bigger[i].row.store(d[i].row.load(std::memory_order_relaxed), std::memory_order_relaxed);
      }
      add_bytes(capacity * sizeof(page_entry));
      d = bigger.get();
      dir_capacity_ = capacity;
      dirs_.push_back(std::move(bigger));
    }
    info_pages_.push_back(std::make_unique<state_info[]>(page_states));
    add_bytes(page_states * sizeof(state_info));
    d[k].info.store(info_pages_.back().get(), std::memory_order_release);
    constexpr std::size_t row_bytes = page_states * 256 * sizeof(std::uint32_t);
    if (bytes() + row_bytes <= max_bytes_) {
      auto row = std::make_unique<std::atomic<std::uint32_t>[]>(page_states * 256);
      for (std::size_t i = 0; i < page_states * 256; ++i)
        row[i].store(unknown, std::memory_order_relaxed);
      add_bytes(row_bytes);
      d[k].row.store(row.get(), std::memory_order_release);
      row_pages_.push_back(std::move(row));
    }
    dir_.store(d, std::memory_order_release);
  }
  // Cleared in O(1) (a generation stamp), so one wide step (a start state 100,000 rules deep)
  // costs later steps nothing (10^5 bytes through a chain of 10^5 rules: 3 s of memset when
  // a clear cost the table's size).
  visited_set visited_;
  void clear_visited() { visited_.clear(); }
  std::vector<std::uint32_t> scratch_;
  std::vector<frame> work_;  // settle's frames to visit
};

}  // namespace npullm::grammar
