// flash attention's planning (attention/flash.hpp is the whole; this is what a call computes
// from its shapes alone, before any key is read): the tile policy (flash<QueryTile, KeyTile,
// SplitLength>), attention_io and flash_stats, the rows of a work item, and flash_plan: the
// checks of q / out / lse and of the tiles (consecutive positions, matching shapes), the keys'
// extent, and the item grid (query tiles for prefill, fixed-length key splits for decode,
// splits before the mask's first visible key left out). No kernel, no mask type, no threading
// policy here: the sub-tile kernels are in flash_kernels.hpp, the driver in flash.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/kv/kv_tile.hpp"

namespace npullm::attention {
inline namespace NPULLM_ISA_NAMESPACE {

// The tile policy: QueryTile queries per work item (times the GQA group), KeyTile keys per
// sub-tile (16 for now: one SIMD vector of scores), SplitLength keys per decode split.
template <std::size_t QueryTile = 16, std::size_t KeyTile = 16, std::size_t SplitLength = 512>
struct flash {
  static_assert(QueryTile >= 1, "flash: QueryTile must be at least 1");
  static_assert(KeyTile == simd::lanes, "flash: KeyTile must be 16 (one vector of scores)");
  static_assert(SplitLength % KeyTile == 0, "flash: SplitLength must be a multiple of KeyTile");
  static constexpr std::size_t query_tile = QueryTile;
  static constexpr std::size_t key_tile = KeyTile;
  static constexpr std::size_t split_length = SplitLength;
};

template <class P>
concept flash_policy = requires {
  { P::query_tile } -> std::convertible_to<std::size_t>;
  { P::key_tile } -> std::convertible_to<std::size_t>;
  { P::split_length } -> std::convertible_to<std::size_t>;
};

// What a flash_attention call read, added to (not reset) by each call that is given one, so
// one struct can sum the layers of a step.
struct flash_stats {
  // (key position, KV head) pairs whose K and V were loaded, summed over work items: decode
  // (one query tile) reads each visible key once per KV head; prefill reads the keys once per
  // query tile. Whole 16-key sub-tiles of a tile are loaded, so a window whose first key is
  // not on the tile's 16-key grid reads up to 15 keys before it (masked, not used).
  std::size_t keys_read = 0;
  std::size_t calls = 0;  // flash_attention calls counted
};

struct attention_io {
  dense_view<const float, 3> q;  // (q_heads, q_len, D)
  dense_view<float, 3> out;      // (q_heads, q_len, D)
  dense_view<float, 2> lse{};    // (q_heads, q_len), optional
  float scale = 1.0f;
  flash_stats* stats = nullptr;  // optional: what the call read (no cost when null)
  // > 0: logit soft-capping (Gemma 2): s = softcap tanh(s / softcap) on the scaled scores,
  // before the mask. 0: off. Negative or non-finite values are refused (invalid_argument).
  float softcap = 0.0f;
};

namespace detail {

inline constexpr std::size_t key_block = simd::lanes;  // keys per sub-tile

// The rows of one work item: every query head, for queries [q_begin, q_end). Row
// r = h * queries() + (i - q_begin) is query head h, query i; the rows of KV head hk are
// [hk * per_kv_head(), (hk + 1) * per_kv_head()) (its group's query heads, in order).
struct item_rows {
  std::size_t kv_heads, group;
  std::size_t q_begin, q_end;
  [[nodiscard]] std::size_t queries() const noexcept { return q_end - q_begin; }
  [[nodiscard]] std::size_t per_kv_head() const noexcept { return group * queries(); }
  [[nodiscard]] std::size_t count() const noexcept { return kv_heads * per_kv_head(); }
  [[nodiscard]] std::size_t head(std::size_t r) const noexcept { return r / queries(); }
  [[nodiscard]] std::size_t query(std::size_t r) const noexcept { return q_begin + r % queries(); }
};
// Where a walk over keys from `origin` (a tile's start or a split's, whichever is later) starts
// when nothing before `first` is visible: `first` rounded down to the walk's 16-key grid, so
// the sub-tiles formed are those of a walk from `origin` (bit-for-bit the same results).
inline std::size_t walk_start(std::size_t origin, std::size_t first) noexcept {
  return first <= origin ? origin : origin + (first - origin) / key_block * key_block;
}

template <class K, class V>
void check_tile(const kv::kv_tile<K, V>& t, std::size_t kv_heads, std::size_t dim,
                std::size_t position, const char* what) {
  const auto& k = t.k;
  const auto& v = t.v;
  // A quantized part's last extent counts units of unit_elements elements.
  constexpr std::size_t gk = kv::unit_elements<K>, gv = kv::unit_elements<V>;
  if (k.extent(0) != kv_heads || v.extent(0) != kv_heads || k.extent(2) * gk != dim ||
      v.extent(2) * gv != dim || v.extent(1) != k.extent(1)) {
    raise(error_code::invalid_shape, "flash_attention: ", what, " K ",
          npullm::detail::format_extents(k.extents()), " / V ",
          npullm::detail::format_extents(v.extents()), " do not match ", kv_heads,
          " KV heads and head_dim ", dim, gk == 1 && gv == 1 ? "" : " (in units of 32 elements)");
  }
  if (k.stride(2) != 1 || v.stride(2) != 1 || k.stride(1) != dim / gk || v.stride(1) != dim / gv) {
    raise(error_code::unsupported, "flash_attention: ", what,
          " rows must be dense (stride 1 within a key, head_dim between keys)");
  }
  if (t.position != position) {
    raise(error_code::invalid_argument, "flash_attention: ", what, " starts at position ",
          t.position, ", expected ", position, " (tiles must be consecutive)");
  }
}

// What a call computes, from its shapes alone (no mask, no policy): the keys, and the work
// items (query tile, decode split) with their rows.
struct flash_plan {
  std::size_t q_heads = 0, q_len = 0, dim = 0;
  std::size_t kv_heads = 0, group = 0;
  std::size_t kv_first = 0, kv_len = 0;  // the keys are positions [kv_first, kv_len)
  std::size_t query_tile = 0, split_length = 0;
  std::size_t q_tiles = 0, splits = 1, first_split = 0;
  bool split = false;
  std::size_t rows_per_item = 0;

  [[nodiscard]] std::size_t items() const noexcept { return q_tiles * splits; }
  // Item `item`'s rows and its keys [key_begin, key_end).
  [[nodiscard]] item_rows rows(std::size_t item) const noexcept {
    const std::size_t qt = item / splits;
    return {kv_heads, group, qt * query_tile, std::min(q_len, (qt + 1) * query_tile)};
  }
  [[nodiscard]] std::size_t key_begin(std::size_t item) const noexcept {
    return split ? (first_split + item % splits) * split_length : 0;
  }
  [[nodiscard]] std::size_t key_end(std::size_t item) const noexcept {
    return split ? std::min(kv_len, key_begin(item) + split_length) : kv_len;
  }
};

// Checks io and the tiles (consecutive, shapes matching) and returns the keys' extent; the
// item grid is set by plan_items once the mask is known.
template <kv::kv_element K, kv::kv_element V, storage_type P>
flash_plan plan_keys(const attention_io& io, std::span<const kv::kv_tile<K, V>> past,
                     const kv::kv_tile<P>* present) {
  flash_plan plan;
  plan.q_heads = io.q.extent(0), plan.q_len = io.q.extent(1), plan.dim = io.q.extent(2);
  const std::size_t q_heads = plan.q_heads, q_len = plan.q_len, dim = plan.dim;
  if (dim == 0 || dim % simd::lanes != 0) {
    raise(error_code::unsupported, "flash_attention: head_dim ", dim,
          " is not a positive multiple of ", simd::lanes);
  }
  if (io.out.extents() != io.q.extents()) {
    raise(error_code::invalid_shape, "flash_attention: out ",
          npullm::detail::format_extents(io.out.extents()), " differs from q ",
          npullm::detail::format_extents(io.q.extents()));
  }
  if (io.lse.data_handle() != nullptr &&
      (io.lse.extent(0) != q_heads || io.lse.extent(1) != q_len)) {
    raise(error_code::invalid_shape, "flash_attention: lse ",
          npullm::detail::format_extents(io.lse.extents()), " for q ",
          npullm::detail::format_extents(io.q.extents()));
  }
  std::size_t kv_heads = 0;
  if (!past.empty())
    kv_heads = past.front().k.extent(0);
  else if (present != nullptr)
    kv_heads = present->k.extent(0);
  const std::size_t kv_first =
      !past.empty() ? past.front().position : (present != nullptr ? present->position : 0);
  std::size_t kv_len = kv_first;
  for (const auto& t : past) {
    check_tile(t, kv_heads, dim, kv_len, "past tile");
    kv_len += t.length();
  }
  if (present != nullptr) {
    check_tile(*present, kv_heads, dim, kv_len, "present tile");
    if (present->length() != q_len) {
      raise(error_code::invalid_shape, "flash_attention: present tile has ", present->length(),
            " keys for ", q_len, " queries");
    }
    kv_len += present->length();
  }
  if (kv_heads != 0 && (q_heads % kv_heads != 0)) {
    raise(error_code::invalid_shape, "flash_attention: ", q_heads,
          " query heads are not a multiple of ", kv_heads, " KV heads");
  }
  if (io.softcap != 0.0f && !(io.softcap > 0.0f && std::isfinite(io.softcap))) {
    raise(error_code::invalid_argument, "flash_attention: softcap ", io.softcap,
          " must be 0 (off) or finite and > 0");
  }
  plan.kv_heads = kv_heads;
  plan.kv_first = kv_first;
  plan.kv_len = kv_len;
  return plan;
}

// The item grid of a plan whose keys are known, for a mask whose first visible key (for query
// 0) is first_visible. Decode (one query tile) splits the keys on a grid of absolute positions
// (split_length keys each); the splits wholly before the first visible key hold nothing and are
// not created (merging an empty partial changes nothing, so the results are the same).
inline void plan_items(flash_plan& plan, std::size_t query_tile, std::size_t split_length,
                       std::size_t first_visible) noexcept {
  plan.group = plan.q_heads / plan.kv_heads;
  plan.query_tile = query_tile;
  plan.split_length = split_length;
  plan.q_tiles = (plan.q_len + query_tile - 1) / query_tile;
  plan.split = plan.q_tiles == 1 && plan.kv_len > split_length;
  plan.first_split = plan.split ? std::min(first_visible, plan.kv_len) / split_length : 0;
  plan.splits = plan.split
                    ? std::max<std::size_t>(
                          1, (plan.kv_len + split_length - 1) / split_length - plan.first_split)
                    : 1;
  plan.rows_per_item = plan.q_heads * std::min(plan.q_len, query_tile);
}

}  // namespace detail

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::attention
