// block_table: one sequence's KV as a list of blocks from a block_pool.
//
//   append(n)           makes room for n more tokens (allocating blocks as needed) and returns
//                       the positions [begin, end) to write; token_kv(pos, layer, part) is
//                       where a token's K or V goes, (kv_heads, head_dim)
//   fork()              a second table sharing every block (reference counts up)
//   truncate(n)         keeps the first n tokens, releases blocks no longer used (rollback)
//   reset()             releases everything (the KV reset between rows of batch unrolling)
//   tile(layer, i)      block i as a kv_tile, the last one shortened to the valid length
//
// Copy-on-write: blocks shared with another table, or registered in a prefix cache, are never
// written. When append would write into such a block (a partially filled last block after a
// fork or a truncate), it first copies the block's valid tokens into a fresh one. append is all
// or nothing: if the pool cannot supply every block it needs (the copy included), it throws
// capacity_exhausted and the table is unchanged.
//
// A table is move-only and releases its blocks when destroyed. Not thread-safe (see
// block_pool).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/kv/block_pool.hpp"
#include "npullm/kv/kv_tile.hpp"

namespace npullm::kv {

struct token_range {
  std::size_t begin = 0;
  std::size_t end = 0;
};

template <storage_type T, class Allocator = aligned_allocator<T>>
class block_table {
 public:
  using value_type = T;
  using pool_type = block_pool<T, Allocator>;

  explicit block_table(pool_type& pool) noexcept : pool_(&pool) {}
  block_table(const block_table&) = delete;
  block_table& operator=(const block_table&) = delete;
  block_table(block_table&& other) noexcept
      : pool_(other.pool_),
        blocks_(std::move(other.blocks_)),
        length_(std::exchange(other.length_, 0)) {
    other.blocks_.clear();
  }
  block_table& operator=(block_table&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      blocks_ = std::move(other.blocks_);
      other.blocks_.clear();
      length_ = std::exchange(other.length_, 0);
    }
    return *this;
  }
  ~block_table() { reset(); }

  // Room for n more tokens; returns their positions. All or nothing (see above).
  token_range append(std::size_t n) {
    const std::size_t bs = pool_->block_size();
    const std::size_t new_length = length_ + n;
    const std::size_t needed = (new_length + bs - 1) / bs;
    const std::size_t fill = length_ % bs;  // tokens in a partially filled last block
    // The last block receives writes if it is partial (or emptied by a truncate) and n > 0.
    const bool copy_last = n > 0 && blocks_.size() * bs > length_ && !writable(blocks_.back());
    const std::size_t fresh = needed - std::min(needed, blocks_.size()) + (copy_last ? 1 : 0);

    // Grow geometrically (reserve(needed) alone would reallocate on every new block). May
    // throw: nothing has changed yet.
    if (needed > blocks_.capacity()) blocks_.reserve(std::max(needed, 2 * blocks_.capacity()));
    std::vector<block_id> got = pool_->allocate(fresh);  // throws before any change
    std::size_t next = 0;
    if (copy_last) {
      const block_id old = blocks_.back();
      const block_id copy = got[next++];
      pool_->copy_block(old, copy, fill);
      blocks_.back() = copy;
      pool_->release(old);
    }
    while (blocks_.size() < needed) blocks_.push_back(got[next++]);
    const token_range r{length_, new_length};
    length_ = new_length;
    return r;
  }

  // Where token `pos` (< length()) keeps its K or V for a layer: (kv_heads, head_dim).
  [[nodiscard]] strided_view<T, 2> token_kv(std::size_t pos, std::size_t layer, kv_part part) {
    check_position(pos);
    const std::size_t bs = pool_->block_size();
    return subview(pool_->block(blocks_[pos / bs], layer, part), all, pos % bs, all);
  }

  // Another table over the same blocks (each block's reference count goes up by one).
  [[nodiscard]] block_table fork() const {
    block_table copy(*pool_);
    copy.blocks_ = blocks_;
    for (block_id b : blocks_) pool_->retain(b);
    copy.length_ = length_;
    return copy;
  }

  // Keeps the first n tokens (n <= length()); blocks past them go back to the pool.
  void truncate(std::size_t n) {
    if (n > length_) {
      raise(error_code::out_of_range, "block_table: truncate to ", n, " tokens, length is ",
            length_);
    }
    const std::size_t bs = pool_->block_size();
    const std::size_t keep = (n + bs - 1) / bs;
    while (blocks_.size() > keep) {
      pool_->release(blocks_.back());
      blocks_.pop_back();
    }
    length_ = n;
  }

  // Releases every block, last first (so a prefix cache evicts chain tails first).
  void reset() noexcept {
    if (pool_ == nullptr) return;
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_->release(*it);
    blocks_.clear();
    length_ = 0;
  }

  // Takes ownership of blocks already retained for this table, covering `tokens` tokens
  // (a prefix-cache hit). Only on an empty table.
  void adopt_prefix(std::vector<block_id> blocks, std::size_t tokens) {
    const std::size_t bs = pool_->block_size();
    if (length_ != 0 || tokens != blocks.size() * bs) {
      raise(error_code::invalid_argument, "block_table: adopt_prefix of ", blocks.size(),
            " blocks for ", tokens, " tokens into a table of length ", length_);
    }
    blocks_ = std::move(blocks);
    length_ = tokens;
  }

  // ---- KV source ---------------------------------------------------------------------------

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  [[nodiscard]] std::size_t tile_count() const noexcept {
    const std::size_t bs = pool_->block_size();
    return (length_ + bs - 1) / bs;
  }
  // Block i of one layer: (kv_heads, tile_len, head_dim), tile_len = block_size except for a
  // shorter last block.
  [[nodiscard]] kv_tile<T> tile(std::size_t layer, std::size_t i) const noexcept {
    return tile(layer, i, length_);
  }
  // The same over the first `length` tokens only (length <= length()): the past a step
  // attends to, before the tokens it has appended.
  [[nodiscard]] kv_tile<T> tile(std::size_t layer, std::size_t i,
                                std::size_t length) const noexcept {
    const std::size_t bs = pool_->block_size();
    const std::size_t first = i * bs;
    const std::size_t len = std::min(bs, length - first);
    const auto& p = *pool_;
    const auto& s = p.shape();
    return {make_kv_view(p.block(blocks_[i], layer, kv_part::k).data_handle(), s.kv_heads, len,
                         s.head_dim, bs * s.head_dim),
            make_kv_view(p.block(blocks_[i], layer, kv_part::v).data_handle(), s.kv_heads, len,
                         s.head_dim, bs * s.head_dim),
            first};
  }

  [[nodiscard]] const std::vector<block_id>& blocks() const noexcept { return blocks_; }
  [[nodiscard]] pool_type& pool() const noexcept { return *pool_; }

 private:
  bool writable(block_id b) const { return pool_->ref_count(b) == 1 && !pool_->is_cached(b); }

  void check_position(std::size_t pos) const {
    if (pos >= length_) {
      raise(error_code::out_of_range, "block_table: token ", pos, " out of range for length ",
            length_);
    }
  }

  pool_type* pool_;
  std::vector<block_id> blocks_;
  std::size_t length_ = 0;
};

}  // namespace npullm::kv
