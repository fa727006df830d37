// What every KV source hands to attention: its K and V as a sequence of tiles.
//
//   kv_shape        layers, kv_heads, head_dim of a model's KV
//   kv_tile<K, V>   one tile of one layer: k, v as [kv_heads, tile_len, head_dim] views (V's
//                   format defaults to K's), plus the position of its first token
//   kv_source       a type with tile_count() and tile(layer, i): contiguous caches, their
//                   split-into-blocks views and block tables all are, so one attention kernel
//                   runs over all of them.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/kv/kv_format.hpp"

namespace npullm::kv {

struct kv_shape {
  std::size_t layers = 0;
  std::size_t kv_heads = 0;
  std::size_t head_dim = 0;

  // Elements of one token's K (or V) in one layer.
  [[nodiscard]] constexpr std::size_t token_elements() const noexcept {
    return kv_heads * head_dim;
  }
  // Storage units of one head's row in format T: head_dim elements, or head_dim / 32 blocks of
  // a quantized format (kv_units checks the division when a cache is made).
  template <kv_element T>
  [[nodiscard]] constexpr std::size_t units() const noexcept {
    return head_dim / unit_elements<T>;
  }

  void validate(const char* who) const {
    if (layers == 0 || kv_heads == 0 || head_dim == 0) {
      raise(error_code::invalid_shape, who,
            ": KV shape needs layers, kv_heads and head_dim > 0, got ", layers, ", ", kv_heads,
            ", ", head_dim);
    }
  }
  friend constexpr bool operator==(const kv_shape&, const kv_shape&) = default;
};

enum class kv_part { k = 0, v = 1 };

// A part as a type, for the accessors of a cache whose K and V formats may differ
// (token_kv(pos, layer, kv::k_part) is a view of K's format, kv::v_part of V's).
template <kv_part P>
struct part_tag {
  static constexpr kv_part part = P;
};
inline constexpr part_tag<kv_part::k> k_part{};
inline constexpr part_tag<kv_part::v> v_part{};

// The element format of part P of format F.
template <kv_format F, kv_part P>
using part_format_t = std::conditional_t<P == kv_part::k, key_format_t<F>, value_format_t<F>>;

// What a cache of format F allocates: F itself, or bytes for a mixed format (its K and V
// units differ in size). Caches lay a layer's K out, then its V, in bytes of that storage.
template <kv_format F>
using storage_unit_t = std::conditional_t<kv_element<F>, F, std::byte>;

// Bytes of one head row (head_dim elements) of part P in format F.
template <kv_format F, kv_part P>
constexpr std::size_t row_bytes(const kv_shape& s) noexcept {
  using T = part_format_t<F, P>;
  return s.units<T>() * sizeof(T);
}
// Where (layer, part)'s [kv_heads, rows, units] block starts, in bytes, in a cache laid out
// [layers][K|V][kv_heads, rows, units] (contiguous_cache, ring_cache; a block pool has
// rows = num_blocks * block_size).
template <kv_format F>
constexpr std::size_t layer_part_bytes(const kv_shape& s, std::size_t rows, std::size_t layer,
                                       kv_part part) noexcept {
  const std::size_t k = s.kv_heads * rows * row_bytes<F, kv_part::k>(s);
  const std::size_t v = s.kv_heads * rows * row_bytes<F, kv_part::v>(s);
  return layer * (k + v) + (part == kv_part::v ? k : 0);
}
// Bytes of a whole cache of format F with `rows` rows per head.
template <kv_format F>
constexpr std::size_t cache_bytes(const kv_shape& s, std::size_t rows) noexcept {
  return layer_part_bytes<F>(s, rows, s.layers, kv_part::k);
}

// A quantized format's tile holds units: (kv_heads, length, head_dim / unit_elements<T>).
// K and V may be of different formats (kv::mixed).
template <class K, class V = K>
struct kv_tile {
  strided_view<const K, 3> k;  // (kv_heads, length, head_dim | units)
  strided_view<const V, 3> v;  // (kv_heads, length, head_dim | units)
  std::size_t position = 0;    // sequence position of the tile's first token

  [[nodiscard]] std::size_t length() const noexcept { return k.extent(1); }
};

// The tile type of a source of format F.
template <kv_format F>
using format_tile = kv_tile<key_format_t<F>, value_format_t<F>>;

template <class S>
concept kv_source = requires(const S& s, std::size_t i) {
  typename S::value_type;
  { s.length() } -> std::convertible_to<std::size_t>;
  { s.tile_count() } -> std::convertible_to<std::size_t>;
  { s.tile(i, i) } -> std::same_as<format_tile<typename S::value_type>>;
};

// [kv_heads, length, head_dim] view with the given head stride (elements between heads); for a
// quantized format, units in place of elements.
template <class T>
strided_view<T, 3> make_kv_view(T* data, std::size_t kv_heads, std::size_t length,
                                std::size_t head_dim, std::size_t head_stride) {
  using view = strided_view<T, 3>;
  return view(data, typename view::mapping_type(dextents<3>(kv_heads, length, head_dim),
                                                {head_stride, head_dim, 1}));
}

}  // namespace npullm::kv
