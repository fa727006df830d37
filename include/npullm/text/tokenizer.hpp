// tokenizer: text -> token ids -> text with a GGUF vocabulary (vocabulary.hpp), giving the ids
// llama.cpp gives for the same file (its test vectors pass, tests/text/test_tokenizer.cpp).
//
// encode(text, {add_special, parse_special}):
//   1. special tokens: every user-defined token found in the text, and with parse_special
//      every control / unknown token too, becomes that token; longer tokens are taken first
//      (llama.cpp's order), each at its leftmost non-overlapping occurrences. What is between
//      them is raw text.
//   2. raw text, SentencePiece ("llama"): " " before it when the vocabulary adds a space
//      prefix and it starts the text or follows a special token; spaces written "▁"; one
//      symbol per UTF-8 character; the adjacent pair whose concatenation is the token of
//      highest score merges first (ties: leftmost), through a priority queue of candidate
//      pairs, until no pair is a token; a symbol that is no token is written as its bytes'
//      <0xXX> tokens (byte fallback).
//   3. raw text, byte-level BPE ("gpt2"): the pre-tokenizer splits it into words; a word is
//      one symbol per byte (GPT-2's byte alphabet) merged by merge rank (lowest first, ties
//      leftmost) through a priority queue, with merges looked up by (left id, right id) in one
//      hash table; llama3 vocabularies take a word that is itself a token as is.
//   4. add_special: BOS first if the vocabulary adds one, EOS last if it adds one.
//   Bytes that are not valid UTF-8 are kept: byte fallback (SentencePiece) or their byte
//   tokens (BPE) encode them, so decode gives them back.
//
// decode(ids, {render_special}): the concatenated pieces: "▁" as " " and <0xXX> as the byte
// (SentencePiece), GPT-2's alphabet back to bytes (BPE), control and unknown tokens as their
// text only with render_special, user-defined tokens as their text. With a space prefix
// (SentencePiece) the space the encoder added at the start and after each special token is
// removed again, so decode(encode(s)) == s for SentencePiece text without "▁" and for
// byte-level BPE text whose every byte has a normal token (falcon has none for some control
// bytes; deepseek's vocabularies give the bytes C0, C1, F5..FF, never in valid UTF-8,
// user-defined tokens whose text is the byte's character), with parse_special too when the
// specials are rendered, Phi-3's whitespace-stripping tokens aside. Unlike llama.cpp no spaces are
// "cleaned up".
//
// The tables encode and decode read (token text -> id, special tokens, pieces, byte tokens, BPE
// merges) are built once per vocabulary in tokenizer_state.hpp; this header is the algorithms.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/text/pretokenizer.hpp"
#include "npullm/text/tokenizer_state.hpp"
#include "npullm/text/unicode.hpp"
#include "npullm/text/vocabulary.hpp"

namespace npullm::text {

struct encode_options {
  bool add_special = true;     // BOS / EOS as the vocabulary asks
  bool parse_special = false;  // control tokens written in the text become those tokens
};

struct decode_options {
  bool render_special = false;     // control and unknown tokens as their text
  bool strip_space_prefix = true;  // remove the space the encoder added (SentencePiece)
};

class tokenizer {
 public:
  explicit tokenizer(vocabulary v) : s_(detail::build_tokenizer_state(std::move(v))) {}

  static tokenizer from_gguf(const io::gguf_file& f) { return tokenizer(vocabulary::from_gguf(f)); }
  static tokenizer from_gguf(const std::filesystem::path& path) {
    return tokenizer(vocabulary::from_gguf(path));
  }

  [[nodiscard]] const vocabulary& vocab() const noexcept { return s_->vocab; }
  [[nodiscard]] std::size_t size() const noexcept { return s_->vocab.size(); }
  // The id of the token with exactly this text, if any.
  [[nodiscard]] std::optional<std::int32_t> find(std::string_view text) const {
    const std::int32_t id = s_->find(text);
    return id < 0 ? std::nullopt : std::optional<std::int32_t>(id);
  }

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 encode_options opt = {}) const {
    std::vector<std::int32_t> out;
    encode(text, out, opt);
    return out;
  }
  // Appends the ids of `text` to out.
  void encode(std::string_view text, std::vector<std::int32_t>& out,
              encode_options opt = {}) const {
    const auto& v = s_->vocab;
    if (opt.add_special && v.add_bos) out.push_back(v.bos);
    const auto fragments = partition(text, opt.parse_special);
    bool after_special = true;  // the start counts as following a special token
    scratch sc;
    for (const auto& f : fragments) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      const std::string_view raw = text.substr(f.begin, f.end - f.begin);
      if (v.model == tokenizer_model::spm) {
        encode_spm(raw, v.add_space_prefix && after_special, out, sc);
      } else {
        encode_bpe(raw, out, sc);
      }
      after_special = false;
    }
    if (opt.add_special && v.add_eos) out.push_back(v.eos);
  }

  // The text of one token, as decode writes it (without the space-prefix removal).
  [[nodiscard]] std::string_view piece(std::int32_t id, bool render_special = false) const {
    check(id);
    const auto& t = s_->vocab.tokens[static_cast<std::size_t>(id)];
    if (!render_special && (t.type == token_type::control || t.type == token_type::unknown))
      return {};
    return s_->pieces[static_cast<std::size_t>(id)];
  }

  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   decode_options opt = {}) const {
    for (const std::int32_t id : ids) check(id);
    std::string out;
    bool strip = strips(opt);
    for (const std::int32_t id : ids) append_piece(out, id, opt, strip);
    return out;
  }

  // Appends the text of `id` to out; `strip` carries the space-prefix state between calls (the
  // streaming detokenizer's use): start with strips(opt).
  void append_piece(std::string& out, std::int32_t id, const decode_options& opt,
                    bool& strip) const {
    check(id);
    const auto& t = s_->vocab.tokens[static_cast<std::size_t>(id)];
    if (t.special()) {
      out += piece(id, opt.render_special);
      strip = strips(opt);
      return;
    }
    std::string_view p = s_->pieces[static_cast<std::size_t>(id)];
    if (p.empty()) return;
    if (strip && p.front() == ' ') p.remove_prefix(1);
    strip = false;
    out += p;
  }
  [[nodiscard]] bool strips(const decode_options& opt) const noexcept {
    return opt.strip_space_prefix && s_->vocab.add_space_prefix;
  }

  // Throws out_of_range unless 0 <= id < size().
  void check(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= s_->vocab.size()) {
      raise(error_code::out_of_range, "token id ", id, " outside the vocabulary of ",
            s_->vocab.size());
    }
  }

 private:
  struct fragment {
    std::size_t begin = 0, end = 0;  // raw text [begin, end) when token < 0
    std::int32_t token = -1;
  };
  // Per-call buffers (encode is const and may run on many threads at once).
  struct scratch {
    std::string text;
    struct symbol {
      std::int32_t prev, next;
      std::size_t begin, len;  // bytes of the (escaped) text
      std::int32_t id;         // BPE: token id (or virtual id); -1 none
    };
    std::vector<symbol> symbols;
    std::vector<std::pair<std::size_t, std::size_t>> words;
    detail::code_points cps;
  };

  // Step 1: special tokens and raw text between them.
  [[nodiscard]] std::vector<fragment> partition(std::string_view text, bool parse_special) const {
    std::vector<fragment> out;
    if (text.empty()) return out;
    const auto& s = *s_;
    // Every occurrence of every eligible special token: (priority, position, id, length).
    struct occurrence {
      std::int32_t priority;
      std::size_t pos;
      std::int32_t id;
      std::size_t len;
    };
    std::vector<occurrence> occ;
    if (!s.specials.empty()) {
      for (std::size_t p = 0; p < text.size(); ++p) {
        s.specials.matches(text, p, [&](std::int32_t id, std::size_t len) {
          const auto& t = s.vocab.tokens[static_cast<std::size_t>(id)];
          if (!parse_special && t.type != token_type::user_defined) return;
          occ.push_back({s.special_priority[static_cast<std::size_t>(id)], p, id, len});
        });
      }
    }
    if (occ.empty()) {
      out.push_back({0, text.size(), -1});
      return out;
    }
    std::sort(occ.begin(), occ.end(), [](const occurrence& a, const occurrence& b) {
      return a.priority != b.priority ? a.priority < b.priority : a.pos < b.pos;
    });
    // Taken spans: start -> (end, id), id -1 for whitespace a strip flag removed.
    std::map<std::size_t, std::pair<std::size_t, std::int32_t>> taken;
    const auto free_span = [&](std::size_t b, std::size_t e) {
      auto it = taken.lower_bound(e);  // first span starting at or after e
      if (it == taken.begin()) return true;
      --it;  // the last span starting before e
      return it->second.first <= b;
    };
    const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    for (const auto& o : occ) {
      const std::size_t e = o.pos + o.len;
      if (!free_span(o.pos, e)) continue;
      taken[o.pos] = {e, o.id};
      const auto& t = s.vocab.tokens[static_cast<std::size_t>(o.id)];
      if (t.lstrip) {
        std::size_t b = o.pos;
        while (b > 0 && is_space(text[b - 1]) && free_span(b - 1, b)) --b;
        if (b < o.pos) taken[b] = {o.pos, -1};
      }
      if (t.rstrip) {
        std::size_t r = e;
        while (r < text.size() && is_space(text[r]) && free_span(r, r + 1)) ++r;
        if (r > e) taken[e] = {r, -1};
      }
    }
    std::size_t at = 0;
    for (const auto& [b, span] : taken) {
      if (b > at) out.push_back({at, b, -1});
      if (span.second >= 0) out.push_back({b, span.first, span.second});
      at = span.first;
    }
    if (at < text.size()) out.push_back({at, text.size(), -1});
    return out;
  }

  // Step 2: SentencePiece over one raw fragment.
  void encode_spm(std::string_view raw, bool space_prefix, std::vector<std::int32_t>& out,
                  scratch& sc) const {
    const auto& s = *s_;
    std::string& text = sc.text;
    text.clear();
    if (space_prefix) text += "\xe2\x96\x81";
    for (const char c : raw) {
      if (c == ' ') {
        text += "\xe2\x96\x81";
      } else {
        text += c;
      }
    }
    if (text.empty()) return;
    auto& sym = sc.symbols;
    sym.clear();
    for (std::size_t i = 0; i < text.size();) {
      std::uint32_t cp = 0;
      const std::size_t len = decode_utf8(std::string_view(text).substr(i), cp);
      const auto idx = static_cast<std::int32_t>(sym.size());
      sym.push_back({idx - 1, i + len == text.size() ? -1 : idx + 1, i, len, -1});
      i += len;
    }
    struct bigram {
      float score;
      std::int32_t left, right;
      std::size_t size;
    };
    // Highest score first; ties: leftmost first.
    const auto worse = [](const bigram& a, const bigram& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<bigram, std::vector<bigram>, decltype(worse)> queue(worse);
    const std::string_view tv(text);
    const auto try_pair = [&](std::int32_t l, std::int32_t r) {
      if (l < 0 || r < 0) return;
      const auto& a = sym[static_cast<std::size_t>(l)];
      const auto& b = sym[static_cast<std::size_t>(r)];
      const std::int32_t id = s.find(tv.substr(a.begin, a.len + b.len));
      if (id < 0) return;
      queue.push({s.vocab.tokens[static_cast<std::size_t>(id)].score, l, r, a.len + b.len});
    };
    for (std::size_t i = 1; i < sym.size(); ++i)
      try_pair(static_cast<std::int32_t>(i - 1), static_cast<std::int32_t>(i));
    while (!queue.empty()) {
      const bigram top = queue.top();
      queue.pop();
      auto& l = sym[static_cast<std::size_t>(top.left)];
      auto& r = sym[static_cast<std::size_t>(top.right)];
      if (l.len == 0 || r.len == 0 || l.len + r.len != top.size) continue;  // stale
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = top.left;
      try_pair(l.prev, top.left);
      try_pair(top.left, l.next);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
      const auto& x = sym[static_cast<std::size_t>(i)];
      const std::int32_t id = s.find(tv.substr(x.begin, x.len));
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (std::size_t j = 0; j < x.len; ++j) {  // byte fallback
        const std::int32_t b = s.byte_token[static_cast<unsigned char>(text[x.begin + j])];
        if (b >= 0) {
          out.push_back(b);
        } else if (s.vocab.unk >= 0) {
          out.push_back(s.vocab.unk);
        }
      }
    }
  }

  // Step 3: byte-level BPE over one raw fragment.
  void encode_bpe(std::string_view raw, std::vector<std::int32_t>& out, scratch& sc) const {
    const auto& s = *s_;
    s.pre->split(raw, sc.words, sc.cps);
    for (const auto& [wb, we] : sc.words) encode_word(raw.substr(wb, we - wb), out, sc);
  }

  void encode_word(std::string_view word, std::vector<std::int32_t>& out, scratch& sc) const {
    const auto& s = *s_;
    const auto n_vocab = static_cast<std::int32_t>(s.vocab.size());
    if (s.vocab.pre_info.ignore_merges) {
      const std::string mapped = detail::byte_level_encode(word);
      if (const std::int32_t id = s.find(mapped); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    if (word.size() == 1) {  // the common one-byte word: no queue
      push_bpe_symbol(s.byte_token[static_cast<unsigned char>(word[0])], word, out);
      return;
    }
    auto& sym = sc.symbols;
    sym.clear();
    for (std::size_t i = 0; i < word.size(); ++i) {
      const auto idx = static_cast<std::int32_t>(i);
      sym.push_back({idx - 1, i + 1 == word.size() ? -1 : idx + 1, i, 1,
                     s.byte_token[static_cast<unsigned char>(word[i])]});
    }
    struct bigram {
      std::int32_t rank, left, right, left_id, right_id, result;
    };
    // Lowest rank first; ties: leftmost first.
    const auto worse = [](const bigram& a, const bigram& b) {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    };
    std::priority_queue<bigram, std::vector<bigram>, decltype(worse)> queue(worse);
    const auto try_pair = [&](std::int32_t l, std::int32_t r) {
      if (l < 0 || r < 0) return;
      const std::int32_t li = sym[static_cast<std::size_t>(l)].id;
      const std::int32_t ri = sym[static_cast<std::size_t>(r)].id;
      if (li < 0 || ri < 0) return;
      if (const auto* m = s.merges.find(li, ri)) queue.push({m->rank, l, r, li, ri, m->result});
    };
    for (std::size_t i = 1; i < sym.size(); ++i)
      try_pair(static_cast<std::int32_t>(i - 1), static_cast<std::int32_t>(i));
    while (!queue.empty()) {
      const bigram top = queue.top();
      queue.pop();
      auto& l = sym[static_cast<std::size_t>(top.left)];
      auto& r = sym[static_cast<std::size_t>(top.right)];
      // Stale when either side has changed since the pair was queued.
      if (l.len == 0 || r.len == 0 || l.id != top.left_id || r.id != top.right_id ||
          l.next != top.right)
        continue;
      l.id = top.result;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = top.left;
      try_pair(l.prev, top.left);
      try_pair(top.left, l.next);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
      const auto& x = sym[static_cast<std::size_t>(i)];
      push_bpe_symbol(x.id < n_vocab ? x.id : -1 - (x.id - n_vocab), word.substr(x.begin, x.len),
                      out);
    }
  }

  // A final BPE symbol: its token, or (no token: -1 - virtual index, or -1 for a byte without
  // a token) what llama.cpp writes then: the single-byte tokens of its byte-level text.
  void push_bpe_symbol(std::int32_t id, std::string_view bytes,
                       std::vector<std::int32_t>& out) const {
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    const std::string mapped = detail::byte_level_encode(bytes);
    for (const char c : mapped) {
      if (const std::int32_t b = s_->find(std::string_view(&c, 1)); b >= 0) out.push_back(b);
    }
  }

  std::shared_ptr<const detail::tokenizer_state> s_;
};

}  // namespace npullm::text
