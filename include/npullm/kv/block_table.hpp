// block_table: one sequence's KV as a list of blocks from a block_pool.
//
//   append(n)           makes room for n more tokens (allocating blocks as needed) and returns
//                       the positions [begin, end) to write; token_kv(pos, layer, part) is
//                       where a token's K or V goes, (kv_heads, head_dim)
//   fork()              a second table sharing every block (reference counts up)
//   truncate(n)         keeps the first n tokens, releases blocks no longer used (rollback)
//   reset()             releases everything (the KV reset between rows of batch unrolling)
//   release_before(p)   releases every whole block that ends at or before position p (tokens
//                       that fell out of every layer's sliding window); positions stay
//                       absolute: length() is unchanged, first_position() moves up
//   tile(layer, i)      live block i (0 = the first not released) as a kv_tile at its absolute
//                       position, the last one shortened to the valid length
//
// Released blocks: the table keeps the count of leading blocks it gave back (released_blocks()),
// and blocks() holds the live ones only, so block i of the sequence is blocks()[i -
// released_blocks()]. A released block shared with a fork or registered in a prefix cache
// stays with them (only this table's reference goes). Tokens before first_position() can no
// longer be read or written; truncate below it is an error.
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

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>>
class block_table {
 public:
  using value_type = T;  // the format: one element type, or kv::mixed<K, V>
  using pool_type = block_pool<T, Allocator>;

  explicit block_table(pool_type& pool) noexcept : pool_(&pool) {}
  block_table(const block_table&) = delete;
  block_table& operator=(const block_table&) = delete;
  block_table(block_table&& other) noexcept
      : pool_(other.pool_),
        blocks_(std::move(other.blocks_)),
        length_(std::exchange(other.length_, 0)),
        released_(std::exchange(other.released_, 0)) {
    other.blocks_.clear();
  }
  block_table& operator=(block_table&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      blocks_ = std::move(other.blocks_);
      other.blocks_.clear();
      length_ = std::exchange(other.length_, 0);
      released_ = std::exchange(other.released_, 0);
    }
    return *this;
  }
  ~block_table() { reset(); }

  // Room for n more tokens; returns their positions. All or nothing (see above).
  token_range append(std::size_t n) {
    const std::size_t bs = pool_->block_size();
    const std::size_t new_length = length_ + n;
    const std::size_t needed = (new_length + bs - 1) / bs - released_;  // live blocks
    const std::size_t fill = length_ % bs;  // tokens in a partially filled last block
    // The last block receives writes if it is partial (or emptied by a truncate) and n > 0.
    const bool copy_last = n > 0 && !blocks_.empty() &&
                           (released_ + blocks_.size()) * bs > length_ && !writable(blocks_.back());
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

  // Where token `pos` (< length()) keeps its K or V for a layer: (kv_heads, head_dim | units).
  // The part as a tag (kv::k_part, kv::v_part) gives a view of that part's format; as a kv_part
  // value, for a table of one format.
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<T, P>, 2> token_kv(std::size_t pos, std::size_t layer,
                                                              part_tag<P> part) {
    check_position(pos);
    const std::size_t bs = pool_->block_size();
    return subview(pool_->block(blocks_[pos / bs - released_], layer, part), all, pos % bs, all);
  }
  [[nodiscard]] strided_view<T, 2> token_kv(std::size_t pos, std::size_t layer,
                                            kv_part part) requires kv_element<T> {
    return part == kv_part::k ? token_kv(pos, layer, k_part) : token_kv(pos, layer, v_part);
  }

  // Another table over the same blocks (each block's reference count goes up by one).
  [[nodiscard]] block_table fork() const {
    block_table copy(*pool_);
    copy.blocks_ = blocks_;
    for (block_id b : blocks_) pool_->retain(b);
    copy.length_ = length_;
    copy.released_ = released_;
    return copy;
  }

  // Keeps the first n tokens (first_position() <= n <= length()); blocks past them go back to
  // the pool.
  void truncate(std::size_t n) {
    if (n > length_) {
      raise(error_code::out_of_range, "block_table: truncate to ", n, " tokens, length is ",
            length_);
    }
    if (n < first_position()) {
      raise(error_code::out_of_range, "block_table: truncate to ", n,
            " tokens, but the tokens before ", first_position(), " were released");
    }
    const std::size_t bs = pool_->block_size();
    const std::size_t keep = (n + bs - 1) / bs - released_;
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
    released_ = 0;
  }

  // Gives back every whole block that ends at or before `position` (position <= length()):
  // blocks [released_blocks(), position / block_size). Returns how many were released now
  // (0 when they already were). Last first, as reset, so a prefix cache evicts chain tails
  // first. After a step, the next query (position length()) sees keys from length() - window
  // + 1 on, so a pipeline whose layers are all windowed calls release_before(length() + 1 -
  // max window) (when positive); with a global layer it must not call it. Speculative steps:
  // call it with the length kept after verification, never before a rollback (truncate
  // cannot go below first_position()).
  std::size_t release_before(std::size_t position) {
    if (position > length_) {
      raise(error_code::out_of_range, "block_table: release_before(", position,
            ") past the length ", length_);
    }
    const std::size_t whole = position / pool_->block_size();
    if (whole <= released_) return 0;
    const std::size_t count = whole - released_;
    for (std::size_t i = count; i-- > 0;) pool_->release(blocks_[i]);
    blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(count));
    released_ = whole;
    return count;
  }

  // Takes ownership of blocks already retained for this table, covering `tokens` tokens
  // (a prefix-cache hit). Only on an empty table.
  void adopt_prefix(std::vector<block_id> blocks, std::size_t tokens) {
    const std::size_t bs = pool_->block_size();
    if (length_ != 0 || released_ != 0 || tokens != blocks.size() * bs) {
      raise(error_code::invalid_argument, "block_table: adopt_prefix of ", blocks.size(),
            " blocks for ", tokens, " tokens into a table of length ", length_);
    }
    blocks_ = std::move(blocks);
    length_ = tokens;
  }

  // ---- KV source ---------------------------------------------------------------------------

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  // Live blocks (those not released) holding tokens.
  [[nodiscard]] std::size_t tile_count() const noexcept { return tile_count(length_); }
  // Live blocks holding tokens before `length` (first_position() <= length <= length()).
  [[nodiscard]] std::size_t tile_count(std::size_t length) const noexcept {
    const std::size_t bs = pool_->block_size();
    return (length + bs - 1) / bs - released_;
  }
  // The live tile holding `position` (first_position() <= position): the tile a walk that
  // needs nothing before `position` starts at.
  [[nodiscard]] std::size_t tile_index(std::size_t position) const noexcept {
    return position / pool_->block_size() - released_;
  }
  // The first token still held (released_blocks() * block_size).
  [[nodiscard]] std::size_t first_position() const noexcept {
    return released_ * pool_->block_size();
  }
  [[nodiscard]] std::size_t released_blocks() const noexcept { return released_; }
  // Live block i of one layer: (kv_heads, tile_len, head_dim) at position
  // (released_blocks() + i) * block_size; tile_len = block_size except for a shorter last block.
  [[nodiscard]] format_tile<T> tile(std::size_t layer, std::size_t i) const noexcept {
    return tile(layer, i, length_);
  }
  // The same over the tokens before `length` only (length <= length()): the past a step
  // attends to, before the tokens it has appended (i < tile_count(length)).
  [[nodiscard]] format_tile<T> tile(std::size_t layer, std::size_t i,
                                    std::size_t length) const noexcept {
    const std::size_t bs = pool_->block_size();
    const std::size_t first = (released_ + i) * bs;
    return pool_->block_tile(blocks_[i], layer, std::min(bs, length - first), first);
  }

  // The live blocks: blocks()[i] holds tokens from (released_blocks() + i) * block_size.
  [[nodiscard]] const std::vector<block_id>& blocks() const noexcept { return blocks_; }
  [[nodiscard]] pool_type& pool() const noexcept { return *pool_; }

 private:
  bool writable(block_id b) const { return pool_->ref_count(b) == 1 && !pool_->is_cached(b); }

  void check_position(std::size_t pos) const {
    if (pos >= length_) {
      raise(error_code::out_of_range, "block_table: token ", pos, " out of range for length ",
            length_);
    }
    if (pos < first_position()) {
      raise(error_code::out_of_range, "block_table: token ", pos, " was released (tokens before ",
            first_position(), " are gone)");
    }
  }

  pool_type* pool_;
  std::vector<block_id> blocks_;  // the live blocks, from block released_ of the sequence
  std::size_t length_ = 0;
  std::size_t released_ = 0;  // leading blocks given back by release_before
};

}  // namespace npullm::kv
