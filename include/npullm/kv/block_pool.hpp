// block_pool: a fixed number of fixed-size KV blocks with reference counts and a free list.
//
// Storage: for every layer, K and V, `num_blocks` blocks of [kv_heads, block_size, head_dim]
// (layout [layers][K|V][num_blocks][kv_heads, block_size, head_dim]), so a block of one layer
// and one of K/V is a dense, zero-copy view. The element type is a policy (float, float16,
// bfloat16, a quantized format or kv::mixed<K, V>), and so is the allocator (64-byte aligned host
// memory by default; a device allocator can hand out host-visible memory the NPU reads in place).
//
// Lifecycle: allocate(n) takes n free blocks (all or none) with reference count 1; retain and
// release move the count; a block whose count reaches 0 returns to the back of the free queue.
// allocate takes from the front, so the least recently released block is reused first. Blocks
// that a prefix cache registered stay in the free queue while unreferenced (reusable by a
// cache hit through `reclaim`) until allocate takes them, which first tells the cache
// (`set_eviction_listener`) so the entry goes too. Registered ("cached") blocks are
// immutable: tables copy them before writing.
//
// Threading contract: not thread-safe. One pool and the tables over it belong to one thread at
// a time (a scheduler's); share them across threads only behind the caller's own lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/kv/kv_tile.hpp"
#include "npullm/kv/layer_storage.hpp"

namespace npullm::kv {

using block_id = std::uint32_t;
inline constexpr block_id no_block = std::numeric_limits<block_id>::max();

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>>
class block_pool {
 public:
  using value_type = T;  // the format: one element type, or kv::mixed<K, V>
  using allocator_type = Allocator;
  using storage_unit = storage_unit_t<T>;

  block_pool(kv_shape shape, std::size_t block_size, std::size_t num_blocks,
             const Allocator& alloc = Allocator())
      : shape_(checked_shape(shape)),
        block_size_(block_size),
        num_blocks_(checked_count(block_size, num_blocks)),
        storage_(shape_, block_size * num_blocks_, alloc, "block_pool"),
        ref_(num_blocks, 0),
        cached_(num_blocks, 0),
        prev_(num_blocks),
        next_(num_blocks) {
    // Free queue: a doubly linked list through prev_/next_, head_ ... tail_, in id order.
    for (std::size_t b = 0; b < num_blocks; ++b) {
      prev_[b] = b == 0 ? no_block : static_cast<block_id>(b - 1);
      next_[b] = b + 1 == num_blocks ? no_block : static_cast<block_id>(b + 1);
    }
    head_ = 0;
    tail_ = static_cast<block_id>(num_blocks - 1);
    free_count_ = num_blocks;
  }

  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;

  // ---- allocation and reference counts --------------------------------------------------

  // n blocks with reference count 1, least recently released first. On shortage throws
  // capacity_exhausted naming the request and the free count; nothing changes.
  [[nodiscard]] std::vector<block_id> allocate(std::size_t n) {
    if (n > free_count_) {
      raise(error_code::capacity_exhausted, "block_pool: requested ", n, " blocks, ", free_count_,
            " free of ", num_blocks_);
    }
    std::vector<block_id> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const block_id b = head_;
      unlink(b);
      if (cached_[b]) {  // evict: the cache forgets the block before it is reused
        cached_[b] = 0;
        if (on_evict_) on_evict_(b);
      }
      ref_[b] = 1;
      out.push_back(b);
    }
    return out;
  }

  void retain(block_id b) {
    check_held(b, "retain");
    ++ref_[b];
  }

  void release(block_id b) {
    check_held(b, "release");
    if (--ref_[b] == 0) push_back_free(b);
  }

  // Takes an unreferenced cached block back out of the free queue (a prefix-cache hit) with
  // reference count 1. Throws invalid_argument if the block is held or not cached.
  void reclaim(block_id b) {
    check_id(b, "reclaim");
    if (ref_[b] != 0 || !cached_[b]) {
      raise(error_code::invalid_argument, "block_pool: reclaim of block ", b,
            " which is not a free cached block (ref count ", ref_[b], ")");
    }
    unlink(b);
    ref_[b] = 1;
  }

  // ---- prefix-cache bookkeeping ------------------------------------------------------------

  void set_cached(block_id b, bool cached) {
    check_id(b, "set_cached");
    cached_[b] = cached ? 1 : 0;
  }
  [[nodiscard]] bool is_cached(block_id b) const {
    check_id(b, "is_cached");
    return cached_[b] != 0;
  }
  // Called with a cached block's id just before allocate reuses it.
  void set_eviction_listener(std::function<void(block_id)> listener) {
    on_evict_ = std::move(listener);
  }

  // ---- storage ---------------------------------------------------------------------------

  // (kv_heads, block_size, head_dim | units) of block b, one layer, K or V: zero-copy. The part
  // as a tag (kv::k_part, kv::v_part) gives a view of that part's format; as a kv_part value,
  // for a pool of one format.
  template <kv_part P>
  [[nodiscard]] dense_view<part_format_t<T, P>, 3> block(block_id b, std::size_t layer,
                                                         part_tag<P>) noexcept {
    return dense_view<part_format_t<T, P>, 3>(block_data<P>(b, layer), shape_.kv_heads, block_size_,
                                              shape_.units<part_format_t<T, P>>());
  }
  template <kv_part P>
  [[nodiscard]] dense_view<const part_format_t<T, P>, 3> block(block_id b, std::size_t layer,
                                                               part_tag<P>) const noexcept {
    return dense_view<const part_format_t<T, P>, 3>(
        block_data<P>(b, layer), shape_.kv_heads, block_size_, shape_.units<part_format_t<T, P>>());
  }
  [[nodiscard]] dense_view<T, 3> block(block_id b, std::size_t layer,
                                       kv_part part) noexcept requires kv_element<T> {
    return part == kv_part::k ? block(b, layer, k_part) : block(b, layer, v_part);
  }
  [[nodiscard]] dense_view<const T, 3> block(block_id b, std::size_t layer,
                                             kv_part part) const noexcept requires kv_element<T> {
    return part == kv_part::k ? block(b, layer, k_part) : block(b, layer, v_part);
  }

  // The first `len` tokens of block b, one layer, as a tile whose first token is at
  // `position`: zero-copy.
  [[nodiscard]] format_tile<T> block_tile(block_id b, std::size_t layer, std::size_t len,
                                          std::size_t position) const noexcept {
    using K = key_format_t<T>;
    using V = value_format_t<T>;
    const std::size_t ku = shape_.units<K>(), vu = shape_.units<V>();
    return {make_kv_view<const K>(block_data<kv_part::k>(b, layer), shape_.kv_heads, len, ku,
                                  block_size_ * ku),
            make_kv_view<const V>(block_data<kv_part::v>(b, layer), shape_.kv_heads, len, vu,
                                  block_size_ * vu),
            position};
  }

  // Copies the first `tokens` tokens of every layer's K and V from src to dst.
  void copy_block(block_id src, block_id dst, std::size_t tokens) noexcept {
    for (std::size_t layer = 0; layer < shape_.layers; ++layer) {
      copy_part<kv_part::k>(src, dst, layer, tokens);
      copy_part<kv_part::v>(src, dst, layer, tokens);
    }
  }

  // ---- observers -------------------------------------------------------------------------

  [[nodiscard]] const kv_shape& shape() const noexcept { return shape_; }
  // Storage units per head row: head_dim elements, or head_dim / 32 quantized units (for a pool
  // of one format; kv_shape::units<part_format_t<T, P>>() for each part of a mixed one).
  [[nodiscard]] std::size_t units() const noexcept requires kv_element<T> {
    return shape_.units<T>();
  }
  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t total_count() const noexcept { return num_blocks_; }
  [[nodiscard]] std::size_t free_count() const noexcept { return free_count_; }
  [[nodiscard]] std::size_t used_count() const noexcept { return num_blocks_ - free_count_; }
  [[nodiscard]] std::uint32_t ref_count(block_id b) const {
    check_id(b, "ref_count");
    return ref_[b];
  }
  // The free queue front (next allocated) to back.
  [[nodiscard]] std::vector<block_id> free_blocks() const {
    std::vector<block_id> out;
    out.reserve(free_count_);
    for (block_id b = head_; b != no_block; b = next_[b]) out.push_back(b);
    return out;
  }
  // Bytes of bookkeeping per block (reference count, cached flag, free-queue links).
  static constexpr std::size_t metadata_bytes_per_block() noexcept {
    return sizeof(std::uint32_t) + sizeof(std::uint8_t) + 2 * sizeof(block_id);
  }
  // The storage: [layers][K|V][num_blocks][kv_heads, block_size, units] (bytes in that order
  // for a mixed format).
  [[nodiscard]] const storage_unit* data() const noexcept { return storage_.data(); }
  [[nodiscard]] std::size_t storage_bytes() const noexcept { return storage_.size_bytes(); }

 private:
  static kv_shape checked_shape(kv_shape shape) {
    shape.validate("block_pool");
    return shape;
  }
  static std::size_t checked_count(std::size_t block_size, std::size_t num_blocks) {
    if (block_size == 0 || num_blocks == 0 || num_blocks >= no_block) {
      raise(error_code::invalid_argument, "block_pool: block_size ", block_size,
            " and block count ", num_blocks, " must be > 0 (and the count < ", no_block, ")");
    }
    return num_blocks;
  }

  template <kv_part P>
  part_format_t<T, P>* block_data(block_id b, std::size_t layer) noexcept {
    return storage_.template data<P>(layer) +
           b * shape_.kv_heads * block_size_ * shape_.units<part_format_t<T, P>>();
  }
  template <kv_part P>
  const part_format_t<T, P>* block_data(block_id b, std::size_t layer) const noexcept {
    return const_cast<block_pool*>(this)->block_data<P>(b, layer);
  }
  template <kv_part P>
  void copy_part(block_id src, block_id dst, std::size_t layer, std::size_t tokens) noexcept {
    using U = part_format_t<T, P>;
    const std::size_t units = shape_.units<U>();
    const U* s = block_data<P>(src, layer);
    U* d = block_data<P>(dst, layer);
    for (std::size_t h = 0; h < shape_.kv_heads; ++h) {
      const std::size_t offset = h * block_size_ * units;
      std::memcpy(d + offset, s + offset, tokens * units * sizeof(U));
    }
  }

  void check_id(block_id b, const char* what) const {
    if (b >= num_blocks_) {
      raise(error_code::out_of_range, "block_pool: ", what, " of block ", b, ", pool has ",
            num_blocks_, " blocks");
    }
  }
  void check_held(block_id b, const char* what) const {
    check_id(b, what);
    if (ref_[b] == 0) {
      raise(error_code::invalid_argument, "block_pool: ", what, " of block ", b,
            " which is not held (ref count 0)");
    }
  }

  void unlink(block_id b) noexcept {
    if (prev_[b] != no_block)
      next_[prev_[b]] = next_[b];
    else
      head_ = next_[b];
    if (next_[b] != no_block)
      prev_[next_[b]] = prev_[b];
    else
      tail_ = prev_[b];
    prev_[b] = next_[b] = no_block;
    --free_count_;
  }
  void push_back_free(block_id b) noexcept {
    prev_[b] = tail_;
    next_[b] = no_block;
    if (tail_ != no_block)
      next_[tail_] = b;
    else
      head_ = b;
    tail_ = b;
    ++free_count_;
  }

  kv_shape shape_;
  std::size_t block_size_;
  std::size_t num_blocks_;
  layer_storage<T, Allocator> storage_;  // rows: num_blocks * block_size (see data())
  std::vector<std::uint32_t> ref_;
  std::vector<std::uint8_t> cached_;
  std::vector<block_id> prev_, next_;
  block_id head_ = no_block, tail_ = no_block;
  std::size_t free_count_ = 0;
  std::function<void(block_id)> on_evict_;
};

}  // namespace npullm::kv
