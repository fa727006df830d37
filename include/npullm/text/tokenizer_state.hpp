// The tables a tokenizer (text/tokenizer.hpp) builds once from a vocabulary and shares between
// its copies: token text -> id (text_table, open addressing), the special tokens' prefix tree
// and their longest-first order (special_trie), each token's decoded piece, the byte tokens
// (<0xXX> for SentencePiece, GPT-2's byte alphabet for BPE), and BPE's merges as
// (left id, right id) -> (rank, merged id) (merge_table), a merge side or result that is no
// token taking a virtual id past the vocabulary. build_tokenizer_state makes them; encode and
// decode, which only read them, are in tokenizer.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/text/pretokenizer.hpp"
#include "npullm/text/unicode.hpp"
#include "npullm/text/vocabulary.hpp"

namespace npullm::text {
namespace detail {

// (left id, right id) -> (rank, merged id): open addressing, linear probing.
class merge_table {
 public:
  struct entry {
    std::uint64_t key = empty;
    std::int32_t rank = 0;
    std::int32_t result = 0;
  };
  static constexpr std::uint64_t empty = ~std::uint64_t{0};

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, entry{});
    mask_ = cap - 1;
  }
  // Keeps the first (lowest-rank) entry of a pair.
  void insert(std::int32_t left, std::int32_t right, std::int32_t rank, std::int32_t result) {
    const std::uint64_t k = key(left, right);
    for (std::size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == empty) {
        slots_[i] = {k, rank, result};
        return;
      }
      if (slots_[i].key == k) return;
    }
  }
  [[nodiscard]] const entry* find(std::int32_t left, std::int32_t right) const noexcept {
    if (slots_.empty()) return nullptr;
    const std::uint64_t k = key(left, right);
    for (std::size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i];
      if (slots_[i].key == empty) return nullptr;
    }
  }

 private:
  static std::uint64_t key(std::int32_t l, std::int32_t r) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) |
           static_cast<std::uint32_t>(r);
  }
  [[nodiscard]] std::size_t hash(std::uint64_t k) const noexcept {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<entry> slots_;
  std::size_t mask_ = 0;
};

// A prefix tree over the texts of the special tokens, for finding them all in one pass.
class special_trie {
 public:
  void add(std::string_view text, std::int32_t id) {
    std::int32_t node = 0;
    for (const char c : text) {
      const auto b = static_cast<unsigned char>(c);
      std::int32_t child = child_of(node, b);
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_.emplace_back();
        nodes_[static_cast<std::size_t>(node)].edges.emplace_back(b, child);
        if (node == 0) root_[b] = child;
      }
      node = child;
    }
    auto& n = nodes_[static_cast<std::size_t>(node)];
    if (n.token < 0 || id < n.token) n.token = id;  // duplicate texts: the lowest id
  }
  // Calls f(id, length) for every token whose text starts at text[pos].
  template <class F>
  void matches(std::string_view text, std::size_t pos, F&& f) const {
    std::int32_t node = root_[static_cast<unsigned char>(text[pos])];
    for (std::size_t i = pos + 1; node >= 0; ++i) {
      const auto& n = nodes_[static_cast<std::size_t>(node)];
      if (n.token >= 0) f(n.token, i - pos);
      if (i >= text.size()) break;
      node = child_of(node, static_cast<unsigned char>(text[i]));
    }
  }
  [[nodiscard]] bool empty() const noexcept { return nodes_.size() == 1; }

 private:
  struct node {
    std::vector<std::pair<unsigned char, std::int32_t>> edges;
    std::int32_t token = -1;
  };
  [[nodiscard]] std::int32_t child_of(std::int32_t node, unsigned char b) const noexcept {
    if (node == 0) return root_[b];
    for (const auto& [c, child] : nodes_[static_cast<std::size_t>(node)].edges) {
      if (c == b) return child;
    }
    return -1;
  }
  std::vector<node> nodes_ = std::vector<node>(1);
  std::array<std::int32_t, 256> root_ = [] {
    std::array<std::int32_t, 256> r{};
    r.fill(-1);
    return r;
  }();
};

// Token text -> id: open addressing over (hash, id) slots, the text compared in the vocabulary
// (a node-based map costs a cache miss per hop; loading a 150k-token vocabulary does 600k
// lookups). Duplicate texts: the last id wins, as in llama.cpp.
class text_table {
 public:
  void build(const std::vector<token_info>& tokens) {
    tokens_ = &tokens;
    std::size_t cap = 16;
    while (cap < 2 * tokens.size()) cap *= 2;
    slots_.assign(cap, slot{});
    mask_ = cap - 1;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view t = tokens[i].text;
      const std::uint32_t h = hash(t);
      for (std::size_t j = h & mask_;; j = (j + 1) & mask_) {
        if (slots_[j].id < 0) {
          slots_[j] = {h, static_cast<std::int32_t>(i)};
          break;
        }
        if (slots_[j].hash == h && (*tokens_)[static_cast<std::size_t>(slots_[j].id)].text == t) {
          slots_[j].id = static_cast<std::int32_t>(i);
          break;
        }
      }
    }
  }
  [[nodiscard]] std::int32_t find(std::string_view t) const noexcept {
    const std::uint32_t h = hash(t);
    for (std::size_t j = h & mask_;; j = (j + 1) & mask_) {
      const slot& s = slots_[j];
      if (s.id < 0) return -1;
      if (s.hash == h && (*tokens_)[static_cast<std::size_t>(s.id)].text == t) return s.id;
    }
  }

 private:
  struct slot {
    std::uint32_t hash = 0;
    std::int32_t id = -1;
  };
  // FNV-1a, 64-bit, folded: short keys, good enough spread for power-of-two tables.
  static std::uint32_t hash(std::string_view t) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : t) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return static_cast<std::uint32_t>(h ^ (h >> 32));
  }
  const std::vector<token_info>* tokens_ = nullptr;
  std::vector<slot> slots_;
  std::size_t mask_ = 0;
};

struct tokenizer_state {
  vocabulary vocab;
  text_table text_to_id;
  std::vector<std::string> pieces;  // decoded text per id
  special_trie specials;
  std::vector<std::int32_t> special_priority;  // by id: rank in llama.cpp's longest-first order
  std::array<std::int32_t, 256>
      byte_token{};  // <0xXX> (SentencePiece) or the byte's token (BPE); -1
  merge_table merges;
  std::vector<std::string> virtual_texts;  // merge results that are no token: id size() + i
  std::optional<pretokenizer> pre;

  [[nodiscard]] std::int32_t find(std::string_view s) const { return text_to_id.find(s); }
};

inline std::string byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const std::size_t n = decode_utf8(text.substr(i), cp);
    const int b = cp == invalid_code_point ? -1 : code_point_to_byte(cp);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text.substr(i, n));  // not in the alphabet: as written
    }
    i += n;
  }
  return out;
}

inline std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(out, byte_to_code_point()[static_cast<unsigned char>(c)]);
  return out;
}

// The tables of a tokenizer over vocabulary v (special tokens and their order, pieces, byte
// tokens; for BPE the pre-tokenizer and the merges as id pairs).
inline std::shared_ptr<const tokenizer_state> build_tokenizer_state(vocabulary v) {
  auto s = std::make_shared<tokenizer_state>();
  s->vocab = std::move(v);
  auto& vocab = s->vocab;
  const std::size_t n = vocab.size();
  s->text_to_id.build(vocab.tokens);

  // Special tokens and their order: longer first, then lower id.
  std::vector<std::int32_t> order;
  for (std::size_t i = 0; i < n; ++i) {
    if (vocab.tokens[i].special()) {
      order.push_back(static_cast<std::int32_t>(i));
      s->specials.add(vocab.tokens[i].text, static_cast<std::int32_t>(i));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return vocab.tokens[static_cast<std::size_t>(a)].text.size() >
           vocab.tokens[static_cast<std::size_t>(b)].text.size();
  });
  s->special_priority.assign(n, -1);
  for (std::size_t r = 0; r < order.size(); ++r)
    s->special_priority[static_cast<std::size_t>(order[r])] = static_cast<std::int32_t>(r);

  s->byte_token.fill(-1);
  s->pieces.resize(n);
  if (vocab.model == tokenizer_model::spm) {
    static constexpr char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      std::int32_t id = s->find(name);
      if (id < 0) id = s->find(std::string(1, static_cast<char>(b)));  // the byte itself
      s->byte_token[static_cast<std::size_t>(b)] = id;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto& t = vocab.tokens[i];
      std::string& p = s->pieces[i];
      switch (t.type) {
        case token_type::normal: {
          for (std::size_t j = 0; j < t.text.size();) {
            if (t.text.compare(j, 3, "\xe2\x96\x81") == 0) {
              p += ' ';
              j += 3;
            } else {
              p += t.text[j++];
            }
          }
          break;
        }
        case token_type::byte: {
          unsigned v = 0;
          if (t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0 && t.text[5] == '>') {
            for (std::size_t j = 3; j < 5; ++j) {
              const char c = t.text[j];
              v = v * 16 + static_cast<unsigned>(c >= 'a'   ? c - 'a' + 10
                                                 : c >= 'A' ? c - 'A' + 10
                                                            : c - '0');
            }
            p = std::string(1, static_cast<char>(v & 0xFF));
          } else {
            p = t.text;
          }
          break;
        }
        case token_type::control:
        case token_type::unknown:
        case token_type::user_defined: p = t.text; break;
        default: break;  // unused, undefined: nothing
      }
    }
  } else {
    s->pre.emplace(vocab.pre_info.kind);
    for (int b = 0; b < 256; ++b) {
      std::string c;
      append_utf8(c, byte_to_code_point()[static_cast<std::size_t>(b)]);
      s->byte_token[static_cast<std::size_t>(b)] = s->find(c);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto& t = vocab.tokens[i];
      switch (t.type) {
        case token_type::normal:
        case token_type::byte: s->pieces[i] = byte_level_decode(t.text); break;
        case token_type::control:
        case token_type::unknown:
        case token_type::user_defined: s->pieces[i] = t.text; break;
        default: break;
      }
    }
    // Merges as id pairs; a side or result that is no token gets a virtual id past the
    // vocabulary.
    std::unordered_map<std::string, std::int32_t> virtual_ids;
    const auto id_of = [&](std::string_view text) -> std::int32_t {
      if (const std::int32_t id = s->find(text); id >= 0) return id;
      const auto [it, inserted] = virtual_ids.emplace(
          std::string(text), static_cast<std::int32_t>(n + s->virtual_texts.size()));
      if (inserted) s->virtual_texts.emplace_back(text);
      return it->second;
    };
    s->merges.reserve(vocab.merges.size());
    std::string joined;
    for (std::size_t r = 0; r < vocab.merges.size(); ++r) {
      const auto& [l, rt] = vocab.merges[r];
      const std::int32_t li = id_of(l);
      const std::int32_t ri = id_of(rt);
      joined.assign(l).append(rt);
      const std::int32_t res = id_of(joined);
      s->merges.insert(li, ri, static_cast<std::int32_t>(r), res);
    }
  }
  return s;
}

}  // namespace detail
}  // namespace npullm::text
