// layer_storage: the buffer of a cache laid out [layers][K|V][kv_heads, rows, units], which
// contiguous_cache (rows = capacity) and ring_cache (rows = slots) keep their K and V in.
//
// A format of one element type is stored as (layers * 2, kv_heads, rows * units) of it; a
// mixed format (kv::mixed<K, V>) as bytes in the same order, each part in its own units, so
// a layer's K (or V) is still one dense block a device graph binds as is.
#pragma once

#include <array>
#include <cstddef>

#include "npullm/core/tensor.hpp"
#include "npullm/kv/kv_tile.hpp"

namespace npullm::kv {

template <kv_format F, class Allocator = aligned_allocator<storage_unit_t<F>>>
class layer_storage {
 public:
  using storage_unit = storage_unit_t<F>;

  // `who` names the cache in the error for a head_dim the format cannot group.
  layer_storage(const kv_shape& shape, std::size_t rows, const Allocator& alloc, const char* who)
      : shape_(shape), rows_(rows), storage_(extents(shape, rows, who), alloc) {}

  // Part P of one layer: (kv_heads, rows, units of P's format), heads rows * units apart.
  template <kv_part P>
  [[nodiscard]] part_format_t<F, P>* data(std::size_t layer) noexcept {
    return reinterpret_cast<part_format_t<F, P>*>(reinterpret_cast<std::byte*>(storage_.data()) +
                                                  layer_part_bytes<F>(shape_, rows_, layer, P));
  }
  template <kv_part P>
  [[nodiscard]] const part_format_t<F, P>* data(std::size_t layer) const noexcept {
    return const_cast<layer_storage*>(this)->data<P>(layer);
  }
  template <kv_part P>
  [[nodiscard]] strided_view<part_format_t<F, P>, 3> buffer(std::size_t layer) noexcept {
    const std::size_t u = shape_.units<part_format_t<F, P>>();
    return make_kv_view(data<P>(layer), shape_.kv_heads, rows_, u, rows_ * u);
  }
  // Rows [row, row + len) of one layer as a tile whose first token is at `position`.
  [[nodiscard]] format_tile<F> tile(std::size_t layer, std::size_t row, std::size_t len,
                                    std::size_t position) const noexcept {
    using K = key_format_t<F>;
    using V = value_format_t<F>;
    const std::size_t ku = shape_.units<K>(), vu = shape_.units<V>();
    return {make_kv_view<const K>(data<kv_part::k>(layer) + row * ku, shape_.kv_heads, len, ku,
                                  rows_ * ku),
            make_kv_view<const V>(data<kv_part::v>(layer) + row * vu, shape_.kv_heads, len, vu,
                                  rows_ * vu),
            position};
  }

  [[nodiscard]] const storage_unit* data() const noexcept { return storage_.data(); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return storage_.size_bytes(); }

 private:
  static std::array<std::size_t, 3> extents(const kv_shape& s, std::size_t rows, const char* who) {
    check_head_dim<F>(s.head_dim, who);
    if constexpr (kv_element<F>) {
      return {s.layers * 2, s.kv_heads, rows * s.units<F>()};
    } else {
      return {1, 1, cache_bytes<F>(s, rows)};
    }
  }

  kv_shape shape_;
  std::size_t rows_;
  tensor<storage_unit, 3, Allocator> storage_;
};

}  // namespace npullm::kv
