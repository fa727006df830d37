// Pyramid attention: static-shape attention variants of growing KV capacity.
//
// A static-shape device compiles attention for fixed lengths. Running every step at the
// largest capacity wastes most of the work while the context is short, so a pyramid plan
// compiles variants i = 0 .. C/q - 1 with past capacity i * q (q: the query chunk, C: the
// context capacity) and runs the smallest that holds the step's past.
//
//   pyramid_plan      the variants, and select(past_len, present_len)
//   pyramid_step      one step's inputs: the chosen variant and its mask, built once from
//                     the full mask and reused by every layer
//   pyramid_attention runs a variant with its static shapes (padded positions masked) through
//                     the flash kernel, its past KV a zero-copy view of the first i * q
//                     positions of the shared contiguous cache, or of the first i blocks of a
//                     block table with block size q
//
// Masks are additive (0 visible, -inf hidden) over [rows, keys]. The full mask has
// P + S columns: P = C - q past positions (the largest variant's past), then S present slots
// (S = q for a prefill chunk, 1 for decode). Variant i's mask has i * q + S columns: the past
// segment [0, i * q) from the head of the full mask and the present segment from its tail.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "npullm/attention/flash.hpp"
#include "npullm/attention/mask.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"

namespace npullm::attention {

class pyramid_plan {
 public:
  struct variant {
    std::size_t index;          // i
    std::size_t past_capacity;  // i * q
  };

  // q: the query chunk; capacity: the context capacity C, a multiple of q.
  pyramid_plan(std::size_t q, std::size_t capacity) : q_(q), capacity_(capacity) {
    if (q == 0 || capacity == 0 || capacity % q != 0) {
      raise(error_code::invalid_argument, "pyramid_plan: capacity ", capacity,
            " must be a positive multiple of the chunk ", q);
    }
  }

  [[nodiscard]] std::size_t chunk() const noexcept { return q_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t variant_count() const noexcept { return capacity_ / q_; }
  // The largest variant's past capacity: C - q.
  [[nodiscard]] std::size_t max_past() const noexcept { return capacity_ - q_; }
  [[nodiscard]] variant at(std::size_t i) const {
    if (i >= variant_count()) {
      raise(error_code::out_of_range, "pyramid_plan: variant ", i, " of ", variant_count());
    }
    return {i, i * q_};
  }

  // The smallest variant whose past capacity holds past_len (the past rounded up to q) and
  // whose context holds past_len + present_len. Throws capacity_exhausted past C.
  [[nodiscard]] variant select(std::size_t past_len, std::size_t present_len) const {
    if (present_len == 0 || present_len > q_) {
      raise(error_code::invalid_argument, "pyramid_plan: present length ", present_len,
            " must be 1..", q_, " (the chunk)");
    }
    const std::size_t i = (past_len + q_ - 1) / q_;
    if (i >= variant_count()) {
      raise(error_code::capacity_exhausted, "pyramid_plan: past ", past_len, " + present ",
            present_len, " tokens exceed the context capacity ", capacity_, " (largest past ",
            max_past(), ", chunk ", q_, ")");
    }
    return {i, i * q_};
  }

 private:
  std::size_t q_;
  std::size_t capacity_;
};

// One step of a pyramid: the chosen variant and its mask, built once here and reused by
// every layer of the step.
class pyramid_step {
 public:
  // full_mask: (rows, P + S), P = plan.max_past(), S present slots (see the top).
  pyramid_step(const pyramid_plan& plan, dense_view<const float, 2> full_mask, std::size_t past_len,
               std::size_t present_len)
      : pyramid_step(plan, full_mask, past_len, present_len, plan.select(past_len, present_len)) {}

  // A given variant (one that holds the past), e.g. the largest: the full static shape.
  pyramid_step(const pyramid_plan& plan, dense_view<const float, 2> full_mask, std::size_t past_len,
               std::size_t present_len, pyramid_plan::variant v)
      : variant_(v) {
    if (v.past_capacity < past_len || v.index >= plan.variant_count()) {
      raise(error_code::invalid_argument, "pyramid_step: variant ", v.index, " (past ",
            v.past_capacity, ") cannot hold a past of ", past_len);
    }
    const std::size_t past_max = plan.max_past();
    if (full_mask.extent(1) <= past_max || full_mask.extent(1) - past_max > plan.chunk()) {
      raise(error_code::invalid_shape, "pyramid_step: full mask has ", full_mask.extent(1),
            " columns; expected ", past_max, " past + 1..", plan.chunk(), " present");
    }
    present_slots_ = full_mask.extent(1) - past_max;
    if (present_len > present_slots_) {
      raise(error_code::invalid_shape, "pyramid_step: present length ", present_len,
            " exceeds the mask's ", present_slots_, " present slots");
    }
    const std::size_t rows = full_mask.extent(0);
    const std::size_t past = variant_.past_capacity;
    mask_ = tensor<float, 2>(rows, past + present_slots_);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* src = &full_mask(r, 0);
      float* dst = mask_.data() + r * (past + present_slots_);
      std::memcpy(dst, src, past * sizeof(float));  // past segment: the head
      std::memcpy(dst + past, src + past_max, present_slots_ * sizeof(float));  // present: tail
    }
    builds().fetch_add(1, std::memory_order_relaxed);
  }

  [[nodiscard]] const pyramid_plan::variant& variant() const noexcept { return variant_; }
  // (rows, past_capacity + present slots)
  [[nodiscard]] dense_view<const float, 2> mask() const noexcept { return mask_.view(); }
  [[nodiscard]] std::size_t present_slots() const noexcept { return present_slots_; }
  [[nodiscard]] std::size_t context() const noexcept {
    return variant_.past_capacity + present_slots_;
  }

  // How many variant masks were built in this process (tests: once per step, not per layer).
  static std::atomic<std::size_t>& builds() noexcept {
    static std::atomic<std::size_t> count{0};
    return count;
  }

 private:
  pyramid_plan::variant variant_;
  std::size_t present_slots_ = 0;
  tensor<float, 2> mask_;
};

// The variant's past KV over a contiguous cache: positions [0, past_capacity) of the shared
// buffer, valid or not (padding is masked). Zero-copy.
template <kv::kv_format T, class A>
kv::format_tile<T> pyramid_past(const kv::contiguous_cache<T, A>& cache, std::size_t layer,
                                const pyramid_step& step) {
  const std::size_t past = step.variant().past_capacity;
  if (past > cache.capacity()) {
    raise(error_code::invalid_shape, "pyramid_past: variant past ", past,
          " exceeds the cache capacity ", cache.capacity());
  }
  return cache.range_tile(layer, 0, past);
}

// The variant's past KV over a block table with block size q: its first i blocks, whole
// (padded slots of a partial last block are masked). Zero-copy.
template <kv::kv_format T, class A>
std::vector<kv::format_tile<T>> pyramid_past(const kv::block_table<T, A>& table, std::size_t layer,
                                             const pyramid_step& step) {
  const auto& pool = table.pool();
  const std::size_t bs = pool.block_size();
  const std::size_t blocks = step.variant().index;
  if (table.released_blocks() != 0) {  // block i must hold positions [i bs, (i + 1) bs)
    raise(error_code::unsupported, "pyramid_past: the table released its first ",
          table.released_blocks(), " blocks (release_before); a pyramid variant reads from 0");
  }
  if (step.variant().past_capacity != blocks * bs || table.blocks().size() < blocks) {
    raise(error_code::invalid_shape, "pyramid_past: variant ", blocks, " needs ", blocks,
          " blocks of ", step.variant().past_capacity / std::max<std::size_t>(blocks, 1),
          " tokens; the table has ", table.blocks().size(), " blocks of ", bs);
  }
  std::vector<kv::format_tile<T>> tiles;
  tiles.reserve(blocks);
  for (std::size_t i = 0; i < blocks; ++i) {
    tiles.push_back(pool.block_tile(table.blocks()[i], layer, bs, i * bs));
  }
  return tiles;
}

// Runs the step's variant for one layer: q (q_heads, rows, D) against the past tiles and the
// present tile (kv_heads, rows, D) under the step's mask, as the device would.
template <flash_policy Tiles = flash<>, kv::kv_element K, kv::kv_element V, storage_type P = float,
          threading_policy Policy = serial>
void pyramid_attention(const attention_io& io, std::span<const kv::kv_tile<K, V>> past,
                       const kv::kv_tile<P>& present, const pyramid_step& step,
                       const Policy& policy = {}) {
  if (present.length() != step.present_slots() || io.q.extent(1) != step.mask().extent(0)) {
    raise(error_code::invalid_shape, "pyramid_attention: ", io.q.extent(1), " query rows and ",
          present.length(), " present keys for a step mask of ",
          npullm::detail::format_extents(step.mask().extents()), " (", step.present_slots(),
          " present slots)");
  }
  kv::kv_tile<P> shifted = present;  // the present segment follows the variant's past
  shifted.position = step.variant().past_capacity;
  flash_attention<Tiles>(io, past, &shifted, explicit_mask{step.mask()}, policy);
}

}  // namespace npullm::attention
