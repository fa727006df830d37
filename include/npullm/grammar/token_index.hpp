// token_index: a vocabulary's tokens as a byte trie, built once per tokenizer, that token masks
// (token_matcher.hpp) walk with a grammar's byte automaton, skipping a whole subtree at the
// first byte the grammar cannot take.
//
// Which bytes a token stands for (text::tokenizer::piece): normal tokens their decoded text
// (GPT-2's byte alphabet undone, SentencePiece's "▁" as a space), byte-fallback tokens their
// byte (<0x0A> -> "\n"), user-defined tokens their text. Control, unknown, unused and empty
// tokens are never allowed by a grammar; the end-of-generation ids (vocabulary::eog) are
// allowed exactly when the grammar can end.
//
// Layout: nodes in depth-first preorder (children by byte), each with its byte, its depth, the
// index just past its subtree (`end`: the skip), and the ids of the tokens whose bytes end
// there (several ids may share bytes: a byte-fallback token and a normal one).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/tokenizer.hpp"

namespace npullm::grammar {

class token_index {
 public:
  struct node {
    std::uint32_t end = 0;                     // preorder index past this node's subtree
    std::uint32_t tok_begin = 0, tok_end = 0;  // its tokens: ids()[tok_begin, tok_end)
    std::uint16_t depth = 0;                   // bytes from the root (1 for a first byte)
    std::uint8_t byte = 0;
  };
  // What a node's subtree holds, apart from the nodes (read only where a walk may skip it).
  struct summary {
    std::array<std::uint64_t, 2> ascii{};  // the subtree's ASCII bytes, this one included
    // Whether every path of the subtree (this byte on) is valid UTF-8, a last character
    // possibly unfinished, when the UTF-8 decoder is in state k (utf8_step) before this
    // byte: bit k.
    std::uint8_t utf8_ok = 0;
    bool non_ascii = false;     // some byte of the subtree is >= 0x80
    std::uint16_t max_len = 0;  // the longest token of the subtree, in bytes (its depth)
  };

  // The UTF-8 decoder of utf8_ok: state 0 between characters, 1..3 continuation bytes
  // expected, 4..7 the first continuation after E0, ED, F0, F4 (narrower ranges); -1 invalid.
  static int utf8_step(int state, std::uint8_t b) noexcept {
    const bool cont = (b & 0xC0) == 0x80;
    switch (state) {
      case 0:
        if (b < 0x80) return 0;
        if (b >= 0xC2 && b <= 0xDF) return 1;
        if (b == 0xE0) return 4;
        if (b == 0xED) return 5;
        if (b >= 0xE1 && b <= 0xEF) return 2;
        if (b == 0xF0) return 6;
        if (b == 0xF4) return 7;
        if (b >= 0xF1 && b <= 0xF3) return 3;
        return -1;
      case 1: return cont ? 0 : -1;
      case 2: return cont ? 1 : -1;
      case 3: return cont ? 2 : -1;
      case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
      case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;
      case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
      case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;
      default: return -1;
    }
  }

  // bytes[id]: the token's bytes, or nullopt for a token no grammar allows; eog: the ids
  // allowed when the grammar can end.
  token_index(std::vector<std::optional<std::string>> bytes, std::vector<std::int32_t> eog)
      : size_(bytes.size()), eog_(std::move(eog)) {
    for (const std::int32_t e : eog_) {
      if (e < 0 || static_cast<std::size_t>(e) >= size_)
        raise(error_code::out_of_range, "token_index: end-of-generation id ", e,
              " outside the vocabulary of ", size_);
    }
    std::vector<std::int32_t> order;
    for (std::size_t i = 0; i < size_; ++i) {
      if (bytes[i] && !bytes[i]->empty()) order.push_back(static_cast<std::int32_t>(i));
    }
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return *bytes[static_cast<std::size_t>(a)] < *bytes[static_cast<std::size_t>(b)];
    });
    // Sorted strings give the trie in preorder: a string shares its longest common prefix
    // with the previous one; the nodes past it close, new ones open.
    std::vector<std::uint32_t> open;  // node index per depth - 1
    std::string prev;
    for (const std::int32_t id : order) {
      const std::string& s = *bytes[static_cast<std::size_t>(id)];
      if (s.size() > 0xFFFF)
        raise(error_code::invalid_argument, "token_index: token ", id, " has ", s.size(),
              " bytes (at most 65535)");
      std::size_t lcp = 0;
      while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
      while (open.size() > lcp) {
        nodes_[open.back()].end = static_cast<std::uint32_t>(nodes_.size());
        open.pop_back();
      }
      for (std::size_t d = lcp; d < s.size(); ++d) {
        node n;
        n.byte = static_cast<std::uint8_t>(s[d]);
        n.depth = static_cast<std::uint16_t>(d + 1);
        n.tok_begin = n.tok_end = static_cast<std::uint32_t>(ids_.size());
        open.push_back(static_cast<std::uint32_t>(nodes_.size()));
        nodes_.push_back(n);
      }
      // Tokens arrive grouped by node (sorted), so a node's ids are contiguous.
      node& last = nodes_[open.back()];
      if (last.tok_end == last.tok_begin) last.tok_begin = static_cast<std::uint32_t>(ids_.size());
      ids_.push_back(id);
      last.tok_end = static_cast<std::uint32_t>(ids_.size());
      max_depth_ = std::max(max_depth_, s.size());
      prev = s;
    }
    while (!open.empty()) {
      nodes_[open.back()].end = static_cast<std::uint32_t>(nodes_.size());
      open.pop_back();
    }
    // Subtree summaries, children before parents (reverse preorder).
    summaries_.resize(nodes_.size());
    for (std::size_t i = nodes_.size(); i-- > 0;) {
      const node& nd = nodes_[i];
      summary& n = summaries_[i];
      if (nd.byte < 0x80) {
        n.ascii[nd.byte >> 6] |= std::uint64_t{1} << (nd.byte & 63);
      } else {
        n.non_ascii = true;
      }
      if (nd.tok_end != nd.tok_begin) n.max_len = nd.depth;
      std::uint8_t ok = 0;
      for (int k = 0; k < 8; ++k) {
        const int next = utf8_step(k, nd.byte);
        if (next >= 0) ok |= static_cast<std::uint8_t>(1u << k);
      }
      for (std::size_t c = i + 1; c < nd.end; c = nodes_[c].end) {
        const summary& ch = summaries_[c];
        n.ascii[0] |= ch.ascii[0];
        n.ascii[1] |= ch.ascii[1];
        n.non_ascii = n.non_ascii || ch.non_ascii;
        n.max_len = std::max(n.max_len, ch.max_len);
        for (int k = 0; k < 8; ++k) {
          const int next = utf8_step(k, nd.byte);
          if (next < 0 || !((ch.utf8_ok >> next) & 1)) ok &= static_cast<std::uint8_t>(~(1u << k));
        }
      }
      n.utf8_ok = ok;
    }
    bytes_.resize(size_);
    for (std::size_t i = 0; i < size_; ++i) {
      if (bytes[i] && !bytes[i]->empty()) bytes_[i] = std::move(*bytes[i]);
    }
    allowed_.assign(size_, 0);
    for (const std::int32_t id : order) allowed_[static_cast<std::size_t>(id)] = 1;
    loops_->lengths.resize(max_depth_ + 1);  // never resized again: length_mask's references
  }

  // The tokens of a tokenizer (see the top).
  static token_index of(const text::tokenizer& tok) {
    const auto& v = tok.vocab();
    std::vector<std::optional<std::string>> bytes(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto t = v.tokens[i].type;
      if (t == text::token_type::normal || t == text::token_type::byte ||
          t == text::token_type::user_defined) {
        bytes[i] = std::string(tok.piece(static_cast<std::int32_t>(i)));
      }
    }
    return token_index(std::move(bytes), v.eog);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }  // the vocabulary's
  [[nodiscard]] std::span<const node> nodes() const noexcept { return nodes_; }
  [[nodiscard]] std::span<const summary> summaries() const noexcept { return summaries_; }

  // The tokens made only of the given ASCII bytes and, with non_ascii, of non-ASCII
  // characters (valid UTF-8, a last one possibly unfinished): the tokens a state whose self
  // loops are exactly those allows whatever else it does. Computed once per byte set (a walk
  // of the trie) and kept, at most max_loop_masks of them (the least recently used leaving:
  // grammars come and go over a process's life, their byte sets with them; a caller keeps
  // the one it reads alive); thread-safe. The trie walk runs outside the lock.
  static constexpr std::size_t max_loop_masks = 256;  // 4 MiB at Llama 3's 128k tokens
  using shared_mask = std::shared_ptr<const std::vector<std::uint64_t>>;
  [[nodiscard]] shared_mask loop_mask(std::array<std::uint64_t, 2> ascii, bool non_ascii) const {
    const auto key = std::make_tuple(ascii[0], ascii[1], non_ascii);
    {
      const std::lock_guard<std::mutex> lock(loops_->mutex);
      if (const auto it = loops_->masks.find(key); it != loops_->masks.end()) {
        loops_->order.splice(loops_->order.begin(), loops_->order, it->second.used);
        return it->second.mask;
      }
    }
    auto m = std::make_shared<std::vector<std::uint64_t>>((size_ + 63) / 64, 0);
    std::vector<int> dec(max_depth_ + 1, 0);
    for (std::size_t i = 0; i < nodes_.size();) {
      const node& nd = nodes_[i];
      const int prev = dec[nd.depth - 1u];
      int next = -1;
      if (nd.byte < 0x80) {
        if (prev == 0 && ((ascii[nd.byte >> 6] >> (nd.byte & 63)) & 1)) next = 0;
      } else if (non_ascii) {
        next = utf8_step(prev, nd.byte);
      }
      if (next < 0) {
        i = nd.end;
        continue;
      }
      dec[nd.depth] = next;
      for (std::uint32_t k = nd.tok_begin; k < nd.tok_end; ++k) {
        const auto id = static_cast<std::uint32_t>(ids_[k]);
        (*m)[id >> 6] |= std::uint64_t{1} << (id & 63);
      }
      ++i;
    }
    const std::lock_guard<std::mutex> lock(loops_->mutex);
    if (const auto it = loops_->masks.find(key); it != loops_->masks.end())
      return it->second.mask;  // another thread made it meanwhile (the same mask)
    while (loops_->masks.size() >= max_loop_masks) {
      loops_->masks.erase(loops_->order.back());
      loops_->order.pop_back();
    }
    loops_->order.push_front(key);
    loops_->masks.emplace(key, loop_entry{m, loops_->order.begin()});
    return m;
  }
  // Loop masks kept now (at most max_loop_masks).
  [[nodiscard]] std::size_t loop_masks() const {
    const std::lock_guard<std::mutex> lock(loops_->mutex);
    return loops_->masks.size();
  }
  // The tokens of at most n bytes (every token for n >= max_depth()): with loop_mask, the
  // tokens a bounded repetition allows whole (n copies left). Computed once per n; thread-safe.
  [[nodiscard]] const std::vector<std::uint64_t>& length_mask(std::size_t n) const {
    n = std::min(n, max_depth_);
    const std::lock_guard<std::mutex> lock(loops_->mutex);
    std::vector<std::uint64_t>& m = loops_->lengths[n];
    if (m.empty()) {
      m.assign((size_ + 63) / 64, 0);
      for (std::size_t i = 0; i < size_; ++i) {
        if (allowed_[i] && bytes_[i].size() <= n) m[i >> 6] |= std::uint64_t{1} << (i & 63);
      }
    }
    return m;
  }
  [[nodiscard]] std::span<const std::int32_t> ids() const noexcept { return ids_; }
  [[nodiscard]] std::span<const std::int32_t> eog() const noexcept { return eog_; }
  [[nodiscard]] std::size_t max_depth() const noexcept { return max_depth_; }
  // The token's bytes ("" for one no grammar allows).
  [[nodiscard]] std::string_view bytes(std::int32_t id) const {
    check(id);
    return bytes_[static_cast<std::size_t>(id)];
  }
  [[nodiscard]] bool is_eog(std::int32_t id) const noexcept {
    return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
  }
  // Whether the token has bytes a grammar may allow (not control, unknown, unused, empty).
  [[nodiscard]] bool has_bytes(std::int32_t id) const {
    check(id);
    return allowed_[static_cast<std::size_t>(id)] != 0;
  }
  void check(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= size_)
      raise(error_code::out_of_range, "token id ", id, " outside the vocabulary of ", size_);
  }

 private:
  std::size_t size_ = 0;
  std::vector<node> nodes_;
  std::vector<summary> summaries_;  // by node
  using loop_key = std::tuple<std::uint64_t, std::uint64_t, bool>;
  struct loop_entry {
    shared_mask mask;
    std::list<loop_key>::iterator used;  // its place in order
  };
  struct loop_cache {
    std::mutex mutex;
    std::map<loop_key, loop_entry> masks;
    std::list<loop_key> order;                        // most recently used first
    std::vector<std::vector<std::uint64_t>> lengths;  // length_mask(n) at n, once computed
  };
  std::unique_ptr<loop_cache> loops_ = std::make_unique<loop_cache>();  // movable index
  std::vector<std::int32_t> ids_;
  std::vector<std::int32_t> eog_;
  std::vector<std::string> bytes_;
  std::vector<char> allowed_;
  std::size_t max_depth_ = 0;
};

}  // namespace npullm::grammar
