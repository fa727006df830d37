// laddered_cache: whole-decode KV capacity variants for static-shape decode.
//
// A static decode graph is compiled for a fixed KV capacity. Instead of one graph at the
// maximum, an engine compiles a ladder of capacities (for example 1024 * 2^k plus a response
// reserve, up to the maximum), starts on the smallest that holds prompt + reserve, and moves
// to the next when the cache fills. The move copies every valid KV byte into the larger
// buffer (one copy per rung, not per token); at the top rung a full cache is
// capacity_exhausted naming the maximum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/kv/contiguous_cache.hpp"

namespace npullm::kv {

// Capacities base * 2^k + reserve for k = 0.. while <= max, plus max itself if not reached.
inline std::vector<std::size_t> doubling_capacities(std::size_t base, std::size_t reserve,
                                                    std::size_t max) {
  if (base == 0 || base + reserve > max) {
    raise(error_code::invalid_argument, "doubling_capacities: base ", base, " + reserve ", reserve,
          " must be > 0 and <= max ", max);
  }
  std::vector<std::size_t> out;
  for (std::size_t c = base; c + reserve <= max; c *= 2) out.push_back(c + reserve);
  if (out.back() != max) out.push_back(max);
  return out;
}

template <kv_format T, class Allocator = aligned_allocator<storage_unit_t<T>>>
class laddered_cache {
 public:
  using value_type = T;
  using cache_type = contiguous_cache<T, Allocator>;

  // capacities: strictly increasing. Starts on the smallest rung that holds `need` tokens.
  laddered_cache(kv_shape shape, std::vector<std::size_t> capacities, std::size_t need)
      : shape_(shape), capacities_(std::move(capacities)) {
    if (capacities_.empty() || !std::is_sorted(capacities_.begin(), capacities_.end()) ||
        std::adjacent_find(capacities_.begin(), capacities_.end()) != capacities_.end()) {
      raise(error_code::invalid_argument,
            "laddered_cache: capacities must be non-empty and strictly increasing");
    }
    rung_ = rung_for(need);
    cache_.emplace_back(shape_, capacities_[rung_]);
  }

  // Reserves n more positions, moving up the ladder as needed; returns the first position.
  // At the top: capacity_exhausted naming the maximum, nothing changed.
  std::size_t append(std::size_t n) {
    const std::size_t need = length() + n;
    if (need > capacity()) grow_to(rung_for(need));
    return cache_.back().append(n);
  }

  [[nodiscard]] std::size_t rung() const noexcept { return rung_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacities_[rung_]; }
  [[nodiscard]] std::size_t max_capacity() const noexcept { return capacities_.back(); }
  [[nodiscard]] std::size_t length() const noexcept { return cache_.back().length(); }
  [[nodiscard]] cache_type& cache() noexcept { return cache_.back(); }
  [[nodiscard]] const cache_type& cache() const noexcept { return cache_.back(); }

 private:
  std::size_t rung_for(std::size_t need) const {
    const auto it = std::lower_bound(capacities_.begin(), capacities_.end(), need);
    if (it == capacities_.end()) {
      raise(error_code::capacity_exhausted, "laddered_cache: KV cache is full: ", need,
            " tokens exceed the largest capacity ", capacities_.back());
    }
    return static_cast<std::size_t>(it - capacities_.begin());
  }

  void grow_to(std::size_t rung) {
    cache_type bigger(shape_, capacities_[rung]);  // may throw: nothing changed yet
    const cache_type& old = cache_.back();
    const std::size_t len = old.length();
    bigger.append(len);
    for (std::size_t layer = 0; layer < shape_.layers; ++layer) {
      const auto src = old.range_tile(layer, 0, len);  // (heads, len, D | units)
      copy_rows(src.k, bigger.buffer(layer, k_part), len);
      copy_rows(src.v, bigger.buffer(layer, v_part), len);
    }
    cache_.clear();
    cache_.push_back(std::move(bigger));
    rung_ = rung;
  }

  // The first len tokens of every head: (heads, len, units) into (heads, capacity, units).
  template <class Src, class Dst>
  void copy_rows(const Src& src, const Dst& dst, std::size_t len) const noexcept {
    if (len == 0) return;
    for (std::size_t h = 0; h < shape_.kv_heads; ++h) {
      std::memcpy(&dst(h, 0, 0), &src(h, 0, 0),
                  len * src.extent(2) * sizeof(typename Src::element_type));
    }
  }

  kv_shape shape_;
  std::vector<std::size_t> capacities_;
  std::size_t rung_ = 0;
  std::vector<cache_type> cache_;  // exactly one: the current rung
};

}  // namespace npullm::kv
