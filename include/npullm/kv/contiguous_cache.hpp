// contiguous_cache: the static-capacity KV cache a static-shape (NPU) graph uses.
//
// Storage [layers][K|V][kv_heads, capacity, head_dim]: each layer's K (or V) is one buffer a
// device graph binds as is. append(n) reserves positions [length, length + n); a full cache is
// capacity_exhausted ("KV cache is full") naming the capacity. split_into_blocks(block_size)
// gives zero-copy block views over the valid tokens (full blocks plus a shorter tail), so the
// attention code that runs over block tables runs over this cache too; the cache itself is a
// KV source with one tile per layer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/kv/kv_tile.hpp"
#include "npullm/kv/layer_storage.hpp"

namespace npullm::kv {

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>>
class contiguous_cache {
 public:
  using value_type = T;  // the format: one element type, or kv::mixed<K, V>
  using storage_unit = storage_unit_t<T>;

  contiguous_cache(kv_shape shape, std::size_t capacity, const Allocator& alloc = Allocator())
      : shape_(checked(shape, capacity)),
        capacity_(capacity),
        storage_(shape_, capacity, alloc, "contiguous_cache") {}

  // Reserves n more positions; returns the first. Throws capacity_exhausted when they do not
  // fit (the length is unchanged).
  std::size_t append(std::size_t n) {
    if (n > capacity_ - length_) {
      raise(error_code::capacity_exhausted, "contiguous_cache: KV cache is full: capacity ",
            capacity_, " tokens, length ", length_, ", appending ", n);
    }
    const std::size_t first = length_;
    length_ += n;
    return first;
  }

  void truncate(std::size_t n) {
    if (n > length_) {
      raise(error_code::out_of_range, "contiguous_cache: truncate to ", n, " tokens, length is ",
            length_);
    }
    length_ = n;
  }
  void reset() noexcept { length_ = 0; }

  // The whole buffer of one layer, K or V: (kv_heads, capacity, head_dim | units). The part as
  // a tag (kv::k_part, kv::v_part) gives a view of that part's format; as a kv_part value, for
  // a cache of one format.
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<T, P>, 3> buffer(std::size_t layer,
                                                            part_tag<P>) noexcept {
    return storage_.template buffer<P>(layer);
  }
  [[nodiscard]] strided_view<T, 3> buffer(std::size_t layer,
                                          kv_part part) noexcept requires kv_element<T> {
    return part == kv_part::k ? buffer(layer, k_part) : buffer(layer, v_part);
  }
  // Where token `pos` (< length()) keeps its K or V for a layer: (kv_heads, head_dim | units).
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<T, P>, 2> token_kv(std::size_t pos, std::size_t layer,
                                                              part_tag<P> part) {
    if (pos >= length_) {
      raise(error_code::out_of_range, "contiguous_cache: token ", pos, " out of range for length ",
            length_);
    }
    return subview(buffer(layer, part), all, pos, all);
  }
  [[nodiscard]] strided_view<T, 2> token_kv(std::size_t pos, std::size_t layer,
                                            kv_part part) requires kv_element<T> {
    return part == kv_part::k ? token_kv(pos, layer, k_part) : token_kv(pos, layer, v_part);
  }

  // ---- KV source: one tile per layer, the valid tokens ---------------------------------------

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] const kv_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t tile_count() const noexcept { return length_ == 0 ? 0 : 1; }
  [[nodiscard]] format_tile<T> tile(std::size_t layer, std::size_t /*i*/) const noexcept {
    return range_tile(layer, 0, length_);
  }

  // Tokens [first, first + len) of one layer as a tile: zero-copy.
  [[nodiscard]] format_tile<T> range_tile(std::size_t layer, std::size_t first,
                                          std::size_t len) const noexcept {
    return storage_.tile(layer, first, len, first);
  }

  class block_split;
  // Zero-copy blocks of block_size tokens over the valid length (the last may be shorter).
  // The split sees the tokens valid now; append more and split again to see them.
  [[nodiscard]] block_split split_into_blocks(std::size_t block_size) const {
    if (block_size == 0) {
      raise(error_code::invalid_argument, "contiguous_cache: split_into_blocks(0)");
    }
    return block_split(*this, block_size);
  }

  // The storage as one buffer (what a device binds): (layers * 2, kv_heads, capacity * units)
  // for one format; for a mixed one, bytes laid out [layers][K|V][kv_heads, capacity, units].
  [[nodiscard]] const storage_unit* data() const noexcept { return storage_.data(); }
  [[nodiscard]] std::size_t storage_bytes() const noexcept { return storage_.size_bytes(); }

 private:
  static kv_shape checked(kv_shape shape, std::size_t capacity) {
    shape.validate("contiguous_cache");
    if (capacity == 0) raise(error_code::invalid_argument, "contiguous_cache: capacity 0");
    return shape;
  }
  kv_shape shape_;
  std::size_t capacity_;
  std::size_t length_ = 0;
  layer_storage<T, Allocator> storage_;
};

template <kv_format T, class Allocator>
class contiguous_cache<T, Allocator>::block_split {
 public:
  using value_type = T;

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t tile_count() const noexcept {
    return (length_ + block_size_ - 1) / block_size_;
  }
  [[nodiscard]] format_tile<T> tile(std::size_t layer, std::size_t i) const noexcept {
    const std::size_t first = i * block_size_;
    return cache_->range_tile(layer, first, std::min(block_size_, length_ - first));
  }

 private:
  friend class contiguous_cache;
  block_split(const contiguous_cache& cache, std::size_t block_size) noexcept
      : cache_(&cache), block_size_(block_size), length_(cache.length()) {}

  const contiguous_cache* cache_;
  std::size_t block_size_;
  std::size_t length_;
};

}  // namespace npullm::kv
