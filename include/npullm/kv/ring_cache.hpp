// ring_cache: the static KV cache of a sliding-window layer, holding only the positions its
// window can still see.
//
// Storage [layers][K|V][kv_heads, capacity, head_dim], like contiguous_cache (one buffer per
// layer and K/V that a device graph binds as is); position p lives in slot p % capacity, so
// writes wrap and memory does not grow with the sequence. Positions stay absolute:
// length() counts every token appended, first_position() is the first one still held, and
// tiles carry absolute positions, so masks (sliding_window{window, q_offset}) keep working.
//
// Capacity. A step of up to max_step rows at positions [L, L + n) needs keys from
// L - window + 1 on: its row 0 sees (L - window, L]. That holds whether the step attends to
// its own K/V as a separate present tile (the past is then [.., L)) or writes them first and
// reads everything from the ring. So
//   capacity = round_up(window + max_step, 16) + 16
// The 16s keep the tiles on the 16-key grid of flash's sub-tiles (capacity and first_position
// are multiples of 16), so attention over a ring gives bit-for-bit what it gives over a
// contiguous cache of the whole sequence with the same sliding_window mask.
//
//   append(n)                  n <= max_step more positions; returns the first
//   token_kv(pos, layer, part) where token pos (first_position() <= pos < length()) keeps its
//                              K or V: (kv_heads, head_dim)
//   truncate(n)                first_position() <= n <= length() (speculative rollback);
//                              below first_position() the tokens are overwritten: an error
//   reset()                    empty, positions from 0 again
//   tile(layer, i)             the held positions [first_position(), length()) as at most two
//                              tiles (split where the slots wrap): a KV source
//   range_tiles(layer, b, e)   positions [b, e) (held) as at most two tiles: the past a step
//                              attends to, before the tokens it has appended
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/kv/kv_tile.hpp"
#include "npullm/kv/layer_storage.hpp"

namespace npullm::kv {

// At most two tiles of a ring: positions [b, wrap) then [wrap, e).
template <class T>
struct ring_tiles {
  std::array<format_tile<T>, 2> tiles{};
  std::size_t count = 0;

  [[nodiscard]] std::span<const format_tile<T>> span() const noexcept {
    return {tiles.data(), count};
  }
};

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>>
class ring_cache {
 public:
  using value_type = T;  // the format: one element type, or kv::mixed<K, V>
  using storage_unit = storage_unit_t<T>;
  // Tiles start on multiples of this many positions (flash's sub-tile: see the top).
  static constexpr std::size_t alignment = 16;

  // The capacity a window and a largest step need (see the top of this file).
  static constexpr std::size_t capacity_for(std::size_t window, std::size_t max_step) noexcept {
    return (window + max_step + alignment - 1) / alignment * alignment + alignment;
  }

  ring_cache(kv_shape shape, std::size_t window, std::size_t max_step,
             const Allocator& alloc = Allocator())
      : shape_(checked(shape, window, max_step)),
        window_(window),
        max_step_(max_step),
        capacity_(capacity_for(window, max_step)),
        storage_(shape_, capacity_, alloc, "ring_cache") {}

  // Reserves n more positions (n <= max_step); returns the first. The oldest positions are
  // overwritten as the slots wrap. Throws capacity_exhausted for a step larger than max_step
  // (nothing changes).
  std::size_t append(std::size_t n) {
    if (n > max_step_) {
      raise(error_code::capacity_exhausted, "ring_cache: a step of ", n,
            " tokens, the ring holds steps of at most ", max_step_, " (window ", window_,
            ", capacity ", capacity_, ")");
    }
    const std::size_t first = length_;
    length_ += n;
    if (length_ > capacity_) {
      first_ = std::max(first_, round_up(length_ - capacity_));
    }
    return first;
  }

  // Keeps positions [0, n): first_position() <= n <= length().
  void truncate(std::size_t n) {
    if (n > length_) {
      raise(error_code::out_of_range, "ring_cache: truncate to ", n, " tokens, length is ",
            length_);
    }
    if (n < first_) {
      raise(error_code::out_of_range, "ring_cache: truncate to ", n,
            " tokens, but the ring holds only positions from ", first_, " (window ", window_,
            ", capacity ", capacity_, "): the tokens before were overwritten");
    }
    length_ = n;
  }
  void reset() noexcept { length_ = first_ = 0; }

  // The whole buffer of one layer, K or V: (kv_heads, capacity, head_dim | units), slot
  // p % capacity. The part as a tag (kv::k_part, kv::v_part) gives a view of that part's
  // format; as a kv_part value, for a cache of one format.
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<T, P>, 3> buffer(std::size_t layer,
                                                            part_tag<P>) noexcept {
    return storage_.template buffer<P>(layer);
  }
  [[nodiscard]] strided_view<T, 3> buffer(std::size_t layer, kv_part part) noexcept
    requires kv_element<T>
  {
    return part == kv_part::k ? buffer(layer, k_part) : buffer(layer, v_part);
  }
  // Where token `pos` (first_position() <= pos < length()) keeps its K or V: (kv_heads, head_dim).
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<T, P>, 2> token_kv(std::size_t pos, std::size_t layer,
                                                              part_tag<P> part) {
    if (pos >= length_ || pos < first_) {
      raise(error_code::out_of_range, "ring_cache: token ", pos, " out of range: the ring holds [",
            first_, ", ", length_, ")");
    }
    return subview(buffer(layer, part), all, pos % capacity_, all);
  }
  [[nodiscard]] strided_view<T, 2> token_kv(std::size_t pos, std::size_t layer, kv_part part)
    requires kv_element<T>
  {
    return part == kv_part::k ? token_kv(pos, layer, k_part) : token_kv(pos, layer, v_part);
  }

  // Positions [begin, end) of one layer (first_position() <= begin <= end <= length()) as at
  // most two zero-copy tiles, split where the slots wrap.
  [[nodiscard]] ring_tiles<T> range_tiles(std::size_t layer, std::size_t begin,
                                          std::size_t end) const {
    if (begin < first_ || begin > end || end > length_) {
      raise(error_code::out_of_range, "ring_cache: positions [", begin, ", ", end,
            ") out of range: the ring holds [", first_, ", ", length_, ")");
    }
    ring_tiles<T> out;
    std::size_t p = begin;
    while (p < end) {
      const std::size_t slot = p % capacity_;
      const std::size_t len = std::min(end - p, capacity_ - slot);
      out.tiles[out.count++] = slot_tile(layer, slot, len, p);
      p += len;
    }
    return out;
  }

  // ---- KV source: the held positions, at most two tiles per layer ---------------------------

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  [[nodiscard]] std::size_t first_position() const noexcept { return first_; }
  [[nodiscard]] std::size_t window() const noexcept { return window_; }
  [[nodiscard]] std::size_t max_step() const noexcept { return max_step_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] const kv_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t tile_count() const noexcept {
    if (length_ == first_) return 0;
    return first_ / capacity_ == (length_ - 1) / capacity_ ? 1 : 2;
  }
  [[nodiscard]] format_tile<T> tile(std::size_t layer, std::size_t i) const noexcept {
    const std::size_t wrap = (first_ / capacity_ + 1) * capacity_;  // first position in slot 0
    const std::size_t begin = i == 0 ? first_ : wrap;
    const std::size_t end = i == 0 ? std::min(length_, wrap) : length_;
    return slot_tile(layer, begin % capacity_, end - begin, begin);
  }

  // The storage as one buffer: (layers * 2, kv_heads, capacity * units), bytes in that order
  // for a mixed format (layer_storage.hpp).
  [[nodiscard]] const storage_unit* data() const noexcept { return storage_.data(); }
  [[nodiscard]] std::size_t storage_bytes() const noexcept { return storage_.size_bytes(); }

 private:
  static kv_shape checked(kv_shape shape, std::size_t window, std::size_t max_step) {
    shape.validate("ring_cache");
    if (window == 0 || max_step == 0) {
      raise(error_code::invalid_argument, "ring_cache: window ", window, " and max_step ", max_step,
            " must be > 0");
    }
    return shape;
  }
  static constexpr std::size_t round_up(std::size_t n) noexcept {
    return (n + alignment - 1) / alignment * alignment;
  }
  format_tile<T> slot_tile(std::size_t layer, std::size_t slot, std::size_t len,
                           std::size_t position) const noexcept {
    return storage_.tile(layer, slot, len, position);
  }

  kv_shape shape_;
  std::size_t window_;
  std::size_t max_step_;
  std::size_t capacity_;
  std::size_t length_ = 0;
  std::size_t first_ = 0;            // first position held (a multiple of alignment)
  layer_storage<T, Allocator> storage_;
};

static_assert(kv_source<ring_cache<float>>);

}  // namespace npullm::kv
