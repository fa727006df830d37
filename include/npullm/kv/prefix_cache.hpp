// prefix_cache: reuse of KV blocks across sequences that share a prompt prefix.
//
// Each *full* block of a sequence is keyed by a chained hash: hash(parent block's hash, the
// block's token ids), so a key stands for the whole prefix up to the block's end. `insert`
// registers a table's full blocks for the tokens the caller vouches for (verified tokens only:
// never pass unverified speculative tokens; blocks the table released are chained through
// when still cached, else the chain stops there); `attach` finds the longest cached prefix of a
// prompt and gives its blocks to an empty table. A match never covers the prompt's last token:
// that token must be computed to produce logits.
//
// Hash collisions are checked: an entry matches only if its tokens and its parent block are
// the ones looked for, so two prefixes with equal hashes never share KV.
//
// Registered blocks are immutable (tables copy before writing into them). When no table holds
// one it stays in the pool's free queue, reusable by a hit, until the pool reuses it for an
// allocation (least recently released first); the pool then tells the cache to drop it.
// Not thread-safe (see block_pool).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/kv/block_pool.hpp"
#include "npullm/kv/block_table.hpp"

namespace npullm::kv {

using token_id = std::int32_t;

// Chains the parent's hash with a block's token ids: one multiply-xorshift round per token,
// then a final avalanche (the splitmix64 finalizer). Not cryptographic: entries are verified
// by their tokens, so a collision costs a comparison, never wrong KV.
struct chained_block_hash {
  std::uint64_t operator()(std::uint64_t parent, std::span<const token_id> tokens) const noexcept {
    std::uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (token_id t : tokens) {
      h = (h ^ static_cast<std::uint32_t>(t)) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
  }
};

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>,
          class Hash = chained_block_hash>
class prefix_cache {
 public:
  using pool_type = block_pool<T, Allocator>;
  using table_type = block_table<T, Allocator>;
  static constexpr std::uint64_t root_hash = 0;

  explicit prefix_cache(pool_type& pool, Hash hash = Hash())
      : pool_(&pool), hash_(hash), entries_(pool.total_count()) {
    pool_->set_eviction_listener([this](block_id b) { forget(b); });
  }
  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;
  ~prefix_cache() {
    pool_->set_eviction_listener({});
    for (block_id b = 0; b < entries_.size(); ++b) {
      if (entries_[b].cached) pool_->set_cached(b, false);
    }
  }

  // Registers the full blocks of `table` that hold tokens[0, n): `tokens` are the table's
  // verified tokens (n = tokens.size() <= table.length()). Blocks already registered, or whose
  // prefix another block already holds, are skipped. Returns how many blocks were added.
  std::size_t insert(const table_type& table, std::span<const token_id> tokens) {
    check_table(table);
    if (tokens.size() > table.length()) {
      raise(error_code::invalid_argument, "prefix_cache: insert of ", tokens.size(),
            " tokens into a table of length ", table.length());
    }
    const std::size_t bs = pool_->block_size();
    const std::size_t full = tokens.size() / bs;
    std::uint64_t parent_hash = root_hash;
    block_id parent = no_block;
    std::size_t added = 0;
    for (std::size_t i = 0; i < full; ++i) {
      const auto block_tokens = tokens.subspan(i * bs, bs);
      const std::uint64_t h = hash_(parent_hash, block_tokens);
      const block_id existing = find(h, parent, block_tokens);
      // The table's block i, or no_block where release_before gave it back.
      const std::size_t released = table.released_blocks();
      block_id b = i < released ? no_block : table.blocks()[i - released];
      if (existing != no_block) {
        b = existing;  // this prefix is cached already (maybe in another block): chain on it
      } else if (b == no_block) {
        break;  // released and not cached: the chain cannot go on past it
      } else if (!entries_[b].cached) {
        entry& e = entries_[b];
        e.cached = true;
        e.hash = h;
        e.parent = parent;
        e.tokens.assign(block_tokens.begin(), block_tokens.end());
        if (parent != no_block) entries_[parent].children.push_back(b);
        index_.emplace(h, b);
        pool_->set_cached(b, true);
        ++added;
      } else {
        break;  // the table's block is cached for a different prefix: stop the chain here
      }
      parent_hash = h;
      parent = b;
    }
    return added;
  }

  // Gives the longest cached prefix of `prompt` (whole blocks, never the last token) to the
  // empty `table`; returns the number of tokens it covers (0 when nothing matched).
  std::size_t attach(table_type& table, std::span<const token_id> prompt) {
    check_table(table);
    if (table.length() != 0) {
      raise(error_code::invalid_argument, "prefix_cache: attach to a table of length ",
            table.length(), " (must be empty)");
    }
    const std::vector<block_id> matched = match(prompt);
    if (matched.empty()) return 0;
    std::vector<block_id> held;
    held.reserve(matched.size());
    for (block_id b : matched) {  // retain or reclaim: cannot fail for a matched block
      if (pool_->ref_count(b) == 0)
        pool_->reclaim(b);
      else
        pool_->retain(b);
      held.push_back(b);
    }
    const std::size_t tokens = held.size() * pool_->block_size();
    table.adopt_prefix(std::move(held), tokens);
    return tokens;
  }

  // The blocks of the longest cached prefix of `prompt` (whole blocks, never the last token),
  // without taking them.
  [[nodiscard]] std::vector<block_id> match(std::span<const token_id> prompt) const {
    const std::size_t bs = pool_->block_size();
    const std::size_t max_blocks = prompt.empty() ? 0 : (prompt.size() - 1) / bs;
    std::vector<block_id> out;
    std::uint64_t parent_hash = root_hash;
    block_id parent = no_block;
    for (std::size_t i = 0; i < max_blocks; ++i) {
      const auto block_tokens = prompt.subspan(i * bs, bs);
      const std::uint64_t h = hash_(parent_hash, block_tokens);
      const block_id b = find(h, parent, block_tokens);
      if (b == no_block) break;
      out.push_back(b);
      parent_hash = h;
      parent = b;
    }
    return out;
  }

  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }
  [[nodiscard]] bool contains(block_id b) const {
    return b < entries_.size() && entries_[b].cached;
  }
  // The token ids a cached block holds (empty if not cached).
  [[nodiscard]] std::span<const token_id> tokens_of(block_id b) const { return entries_[b].tokens; }
  [[nodiscard]] block_id parent_of(block_id b) const { return entries_[b].parent; }

 private:
  struct entry {
    bool cached = false;
    std::uint64_t hash = 0;
    block_id parent = no_block;
    std::vector<token_id> tokens;
    std::vector<block_id> children;  // cached blocks whose parent this is
  };

  // The cached block with this hash whose parent and tokens are exactly these (collisions
  // compare contents), or no_block.
  block_id find(std::uint64_t h, block_id parent, std::span<const token_id> tokens) const {
    auto [first, last] = index_.equal_range(h);
    for (auto it = first; it != last; ++it) {
      const entry& e = entries_[it->second];
      if (e.parent == parent &&
          std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
        return it->second;
      }
    }
    return no_block;
  }

  // The pool reuses block b: drop its entry, and its descendants' (their keys name b as the
  // parent; once b holds other tokens they must never match again).
  void forget(block_id b) {
    if (const block_id p = entries_[b].parent; p != no_block && entries_[p].cached) {
      auto& siblings = entries_[p].children;
      siblings.erase(std::find(siblings.begin(), siblings.end(), b));
    }
    std::vector<block_id> pending{b};
    while (!pending.empty()) {
      const block_id x = pending.back();
      pending.pop_back();
      entry& e = entries_[x];
      auto [first, last] = index_.equal_range(e.hash);
      for (auto it = first; it != last; ++it) {
        if (it->second == x) {
          index_.erase(it);
          break;
        }
      }
      pending.insert(pending.end(), e.children.begin(), e.children.end());
      if (x != b) pool_->set_cached(x, false);  // the pool already cleared b's flag
      e = entry{};
    }
  }

  void check_table(const table_type& table) const {
    if (&table.pool() != pool_) {
      raise(error_code::invalid_argument, "prefix_cache: the table belongs to another pool");
    }
  }

  pool_type* pool_;
  Hash hash_;
  std::vector<entry> entries_;                              // by block id
  std::unordered_multimap<std::uint64_t, block_id> index_;  // hash -> block
};

}  // namespace npullm::kv
