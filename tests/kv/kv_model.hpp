// A model test of the block KV cache: random operations on block tables over one pool with a
// prefix cache, against a plain reference (each sequence's token ids; a token's K/V values are
// a function of its whole prefix, as in a real model), release_before (a sliding window
// forgetting its oldest blocks) included. After every step `check` verifies:
// every sequence reads back exactly its K/V from its first live position through its tiles;
// reference counts equal the number of tables holding each block; free + used == total; the free
// queue holds exactly the unreferenced blocks, each once; cached blocks still hold the K/V of their
// cached tokens. Failed operations must leave everything as it was (compared by snapshot).
//
// Driven by the randomized gtest (a seeded generator) and by the libFuzzer harness (bytes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "npullm/kv/block_pool.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/prefix_cache.hpp"

namespace npullm::kv::testing {

struct model_failure : std::logic_error {
  using std::logic_error::logic_error;
};

#define KV_MODEL_CHECK(cond, ...)                             \
  do {                                                        \
    if (!(cond)) {                                            \
      std::ostringstream msg_;                                \
      msg_ << "kv model: " #cond " failed: " << __VA_ARGS__;  \
      throw ::npullm::kv::testing::model_failure(msg_.str()); \
    }                                                         \
  } while (0)

// Chooses values: from a seeded generator, or from fuzzer bytes (0 once they run out).
struct rng_source {
  std::mt19937_64 rng;
  explicit rng_source(std::uint64_t seed) : rng(seed) {}
  std::size_t next(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); }
  bool done() const { return false; }
};

struct byte_source {
  std::span<const std::uint8_t> bytes;
  std::size_t pos = 0;
  std::size_t next(std::size_t n) {
    if (n == 0 || pos >= bytes.size()) return 0;
    return bytes[pos++] % n;
  }
  bool done() const { return pos >= bytes.size(); }
};

template <storage_type T>
class kv_model {
 public:
  static constexpr std::size_t layers = 2, kv_heads = 2, head_dim = 2;
  // max_length bounds a sequence's live tokens; max_total its tokens, released ones included.
  static constexpr std::size_t max_sequences = 6, max_length = 48, max_total = 4 * max_length,
                               vocabulary = 3;

  kv_model(std::size_t block_size, std::size_t num_blocks)
      : pool_(kv_shape{layers, kv_heads, head_dim}, block_size, num_blocks), cache_(pool_) {}

  // The K (part 0) or V (part 1) value of a token whose prefix (itself included) hashes to key.
  static float expected(std::uint64_t key, std::size_t layer, std::size_t part, std::size_t h,
                        std::size_t d) {
    // Integers below 256 are exact in f32, f16 and bf16.
    return static_cast<float>((key * 31 + layer * 7 + part * 3 + h * 5 + d) % 251);
  }

  template <class Source>
  void step(Source& src) {
    const std::size_t op = src.next(9);
    ++ops_;
    switch (op) {
      case 0:
      case 1: append(src); break;
      case 2: start_from_prefix(src); break;
      case 3: fork(src); break;
      case 4: truncate(src); break;
      case 5: reset_or_drop(src); break;
      case 6: insert(src); break;
      case 7: release_before(src); break;
      default: failing_calls(src); break;
    }
  }

  void check() const {
    std::vector<std::uint32_t> holders(pool_.total_count(), 0);
    for (const auto& s : seqs_) {
      KV_MODEL_CHECK(s.table.length() == s.tokens.size(),
                     "length " << s.table.length() << " vs " << s.tokens.size());
      KV_MODEL_CHECK(s.table.first_position() == s.first,
                     "first position " << s.table.first_position() << " vs " << s.first);
      const std::size_t bs = pool_.block_size();
      KV_MODEL_CHECK(s.table.blocks().size() == (s.tokens.size() + bs - 1) / bs - s.first / bs,
                     "live blocks " << s.table.blocks().size());
      for (block_id b : s.table.blocks()) ++holders[b];
      check_reads(s);
    }
    for (block_id b = 0; b < pool_.total_count(); ++b) {
      KV_MODEL_CHECK(pool_.ref_count(b) == holders[b],
                     "block " << b << " ref " << pool_.ref_count(b) << " held by " << holders[b]);
      KV_MODEL_CHECK(pool_.is_cached(b) == cache_.contains(b), "cached flag of block " << b);
      if (cache_.contains(b)) check_cached_block(b);
    }
    KV_MODEL_CHECK(pool_.free_count() + pool_.used_count() == pool_.total_count(), "counts");
    const auto free = pool_.free_blocks();
    KV_MODEL_CHECK(free.size() == pool_.free_count(), "free list size " << free.size());
    std::vector<bool> in_free(pool_.total_count(), false);
    for (block_id b : free) {
      KV_MODEL_CHECK(!in_free[b], "block " << b << " twice in the free list");
      KV_MODEL_CHECK(holders[b] == 0, "free block " << b << " is held");
      in_free[b] = true;
    }
    for (block_id b = 0; b < pool_.total_count(); ++b) {
      KV_MODEL_CHECK(in_free[b] || holders[b] > 0, "block " << b << " neither free nor held");
    }
  }

  [[nodiscard]] std::size_t ops() const { return ops_; }
  [[nodiscard]] std::size_t failed_calls() const { return failed_; }
  [[nodiscard]] std::size_t prefix_hits() const { return prefix_hits_; }
  [[nodiscard]] std::size_t copies_on_write() const { return cow_; }
  [[nodiscard]] std::size_t blocks_released() const { return released_; }

 private:
  struct sequence {
    block_table<T> table;
    std::vector<token_id> tokens;
    std::size_t first = 0;  // first live position (tokens before it were released)
  };

  struct snapshot {
    std::vector<std::uint32_t> refs;
    std::vector<block_id> free;
    std::vector<std::vector<block_id>> tables;
    std::vector<std::size_t> lengths;
    std::vector<std::size_t> firsts;
    std::vector<bool> cached;
    std::size_t cache_size;
    bool operator==(const snapshot&) const = default;
  };

  snapshot take_snapshot() const {
    snapshot s{{}, pool_.free_blocks(), {}, {}, {}, {}, cache_.size()};
    for (block_id b = 0; b < pool_.total_count(); ++b) {
      s.refs.push_back(pool_.ref_count(b));
      s.cached.push_back(pool_.is_cached(b));
    }
    for (const auto& q : seqs_) {
      s.tables.push_back(q.table.blocks());
      s.lengths.push_back(q.table.length());
      s.firsts.push_back(q.table.first_position());
    }
    return s;
  }

  // Running prefix keys: key[p] stands for tokens[0..p].
  static std::vector<std::uint64_t> keys_of(std::span<const token_id> tokens) {
    std::vector<std::uint64_t> keys(tokens.size());
    std::uint64_t k = 0x9e3779b97f4a7c15ull;
    for (std::size_t p = 0; p < tokens.size(); ++p) {
      k = (k ^ static_cast<std::uint64_t>(tokens[p] + 1)) * 0x100000001b3ull;
      keys[p] = k >> 8;
    }
    return keys;
  }

  void write_tokens(sequence& s, std::size_t first) {
    const auto keys = keys_of(s.tokens);
    for (std::size_t p = first; p < s.tokens.size(); ++p) {
      for (std::size_t layer = 0; layer < layers; ++layer) {
        for (std::size_t part = 0; part < 2; ++part) {
          auto kv = s.table.token_kv(p, layer, static_cast<kv_part>(part));  // (heads, dim)
          for (std::size_t h = 0; h < kv_heads; ++h) {
            for (std::size_t d = 0; d < head_dim; ++d) {
              kv(h, d) = from_float<T>(expected(keys[p], layer, part, h, d));
            }
          }
        }
      }
    }
  }

  void check_reads(const sequence& s) const {
    const auto keys = keys_of(s.tokens);
    for (std::size_t layer = 0; layer < layers; ++layer) {
      std::size_t pos = s.first;
      for (std::size_t i = 0; i < s.table.tile_count(); ++i) {
        const kv_tile<T> t = s.table.tile(layer, i);
        KV_MODEL_CHECK(t.position == pos, "tile " << i << " starts at " << t.position);
        for (std::size_t j = 0; j < t.length(); ++j, ++pos) {
          for (std::size_t h = 0; h < kv_heads; ++h) {
            for (std::size_t d = 0; d < head_dim; ++d) {
              const float want_k = expected(keys[pos], layer, 0, h, d);
              const float want_v = expected(keys[pos], layer, 1, h, d);
              KV_MODEL_CHECK(to_float(t.k(h, j, d)) == want_k && to_float(t.v(h, j, d)) == want_v,
                             "token " << pos << " layer " << layer << " reads "
                                      << to_float(t.k(h, j, d)) << " want " << want_k);
            }
          }
        }
      }
      KV_MODEL_CHECK(pos == s.tokens.size(), "tiles cover " << pos << " of " << s.tokens.size());
    }
  }

  // A cached block holds the K/V of its cached tokens (walk the parents for the prefix).
  void check_cached_block(block_id b) const {
    std::vector<block_id> chain;
    for (block_id x = b; x != no_block; x = cache_.parent_of(x)) {
      KV_MODEL_CHECK(cache_.contains(x), "cached block " << b << " has an uncached ancestor " << x);
      chain.push_back(x);
    }
    std::vector<token_id> prefix;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const auto t = cache_.tokens_of(*it);
      prefix.insert(prefix.end(), t.begin(), t.end());
    }
    const auto keys = keys_of(prefix);
    const std::size_t bs = pool_.block_size();
    const std::size_t first = prefix.size() - bs;
    for (std::size_t layer = 0; layer < layers; ++layer) {
      const auto k = pool_.block(b, layer, kv_part::k);
      for (std::size_t j = 0; j < bs; ++j) {
        KV_MODEL_CHECK(to_float(k(0, j, 0)) == expected(keys[first + j], layer, 0, 0, 0),
                       "cached block " << b << " token " << j << " was overwritten");
      }
    }
  }

  std::size_t pick(auto& src) { return src.next(seqs_.size()); }

  template <class Source>
  void append(Source& src) {
    if (seqs_.empty() || (seqs_.size() < max_sequences && src.next(4) == 0)) {
      seqs_.push_back({block_table<T>(pool_), {}});
    }
    sequence& s = seqs_[pick(src)];
    const std::size_t n = 1 + src.next(2 * pool_.block_size());
    if (s.tokens.size() - s.first + n > max_length || s.tokens.size() + n > max_total) return;
    const snapshot before = take_snapshot();
    const auto blocks_before = s.table.blocks();
    try {
      s.table.append(n);
    } catch (const error& e) {
      KV_MODEL_CHECK(e.code() == error_code::capacity_exhausted, e.what());
      KV_MODEL_CHECK(take_snapshot() == before, "failed append changed state");
      ++failed_;
      return;
    }
    const std::size_t common = std::min(blocks_before.size(), s.table.blocks().size());
    KV_MODEL_CHECK(s.table.first_position() == s.first, "append moved the first position");
    if (common > 0 && blocks_before[common - 1] != s.table.blocks()[common - 1]) ++cow_;
    const std::size_t first = s.tokens.size();
    for (std::size_t i = 0; i < n; ++i)
      s.tokens.push_back(static_cast<token_id>(src.next(vocabulary)));
    write_tokens(s, first);
  }

  template <class Source>
  void start_from_prefix(Source& src) {
    if (seqs_.size() >= max_sequences) return;
    std::vector<token_id> prompt;
    if (!seqs_.empty()) {
      const auto& donor = seqs_[pick(src)].tokens;
      prompt.assign(donor.begin(),
                    donor.begin() + static_cast<std::ptrdiff_t>(src.next(donor.size() + 1)));
    }
    for (std::size_t extra = 1 + src.next(4); extra > 0; --extra) {
      prompt.push_back(static_cast<token_id>(src.next(vocabulary)));
    }
    if (prompt.size() > max_length) prompt.resize(max_length);  // (the donor's may be longer)
    seqs_.push_back({block_table<T>(pool_), {}});
    sequence& s = seqs_.back();
    const std::size_t covered = cache_.attach(s.table, prompt);
    KV_MODEL_CHECK(covered < prompt.size(), "a match covered the last prompt token");
    KV_MODEL_CHECK(covered % pool_.block_size() == 0, "partial block matched");
    if (covered > 0) ++prefix_hits_;
    s.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(covered));
    check_reads(s);  // the attached blocks hold exactly this prefix's K/V
    try {
      s.table.append(prompt.size() - covered);
    } catch (const error& e) {
      KV_MODEL_CHECK(e.code() == error_code::capacity_exhausted, e.what());
      ++failed_;
      return;  // keeps the attached prefix only
    }
    s.tokens = prompt;
    write_tokens(s, covered);
  }

  template <class Source>
  void fork(Source& src) {
    if (seqs_.empty() || seqs_.size() >= max_sequences) return;
    const sequence& s = seqs_[pick(src)];
    sequence copy{s.table.fork(), s.tokens, s.first};
    seqs_.push_back(std::move(copy));
  }

  template <class Source>
  void truncate(Source& src) {
    if (seqs_.empty()) return;
    sequence& s = seqs_[pick(src)];
    const std::size_t n = s.first + src.next(s.tokens.size() - s.first + 1);
    s.table.truncate(n);
    s.tokens.resize(n);
  }

  // Forgets the blocks that end before a position, as a sliding window does; a position past
  // the length is refused with nothing changed.
  template <class Source>
  void release_before(Source& src) {
    if (seqs_.empty()) return;
    sequence& s = seqs_[pick(src)];
    const std::size_t p = s.first + src.next(s.tokens.size() - s.first + 1);
    const std::size_t bs = pool_.block_size();
    const std::size_t live_before = s.table.blocks().size();
    const std::size_t released = s.table.release_before(p);
    KV_MODEL_CHECK(released == std::max(s.first, p / bs * bs) / bs - s.first / bs,
                   "released " << released << " blocks before " << p);
    KV_MODEL_CHECK(s.table.blocks().size() + released == live_before, "live blocks");
    s.first = std::max(s.first, p / bs * bs);
    released_ += released;
  }

  template <class Source>
  void reset_or_drop(Source& src) {
    if (seqs_.empty()) return;
    const std::size_t i = pick(src);
    if (src.next(2) == 0) {
      seqs_[i].table.reset();
      seqs_[i].tokens.clear();
      seqs_[i].first = 0;
    } else {
      seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  template <class Source>
  void insert(Source& src) {
    if (seqs_.empty()) return;
    const sequence& s = seqs_[pick(src)];
    // Only a verified prefix: the tail stands for unverified speculative tokens.
    const std::size_t verified = src.next(s.tokens.size() + 1);
    cache_.insert(s.table, std::span<const token_id>(s.tokens).first(verified));
  }

  template <class Source>
  void failing_calls(Source& src) {
    const snapshot before = take_snapshot();
    const std::size_t which = src.next(7);
    try {
      if (which == 0) {
        (void)pool_.allocate(pool_.free_count() + 1 + src.next(3));
      } else if (which == 1) {
        if (pool_.free_count() == 0) return;
        pool_.release(pool_.free_blocks().front());
      } else if (which == 2) {
        if (seqs_.empty()) return;
        sequence& s = seqs_[pick(src)];
        s.table.truncate(s.tokens.size() + 1 + src.next(3));
      } else if (which == 3) {
        if (seqs_.empty()) return;
        sequence& s = seqs_[pick(src)];
        (void)s.table.token_kv(s.tokens.size() + src.next(3), 0, kv_part::k);
      } else {
        // Below a released prefix, or past the length: truncate, token_kv, release_before.
        if (seqs_.empty()) return;
        sequence& s = seqs_[pick(src)];
        if (which == 6) {
          s.table.release_before(s.tokens.size() + 1 + src.next(3));
        } else {
          if (s.first == 0) return;
          const std::size_t below = src.next(s.first);
          if (which == 4)
            s.table.truncate(below);
          else
            (void)s.table.token_kv(below, 0, kv_part::v);
        }
      }
    } catch (const error&) {
      ++failed_;
      KV_MODEL_CHECK(take_snapshot() == before, "a failed call (" << which << ") changed state");
      return;
    }
    KV_MODEL_CHECK(false, "call " << which << " should have failed");
  }

  block_pool<T> pool_;
  prefix_cache<T> cache_;
  std::vector<sequence> seqs_;
  std::size_t ops_ = 0, failed_ = 0, prefix_hits_ = 0, cow_ = 0, released_ = 0;
};

// Runs a byte string as a model test (the fuzzer's input format): the first byte picks the
// block size, the second the pool size, the rest the operations.
inline void run_bytes(std::span<const std::uint8_t> data) {
  byte_source src{data};
  constexpr std::size_t block_sizes[] = {1, 2, 3, 4, 8, 16};
  const std::size_t bs = block_sizes[src.next(std::size(block_sizes))];
  const std::size_t blocks = 4 + src.next(40);
  kv_model<float> model(bs, blocks);
  while (!src.done()) {
    model.step(src);
    model.check();
  }
}

}  // namespace npullm::kv::testing
