// Attention masks, chosen at compile time. A mask answers for query row i (0-based within the
// call's q_len) and key position j (0-based over past + present keys):
//   visible(i, j)                   may row i attend to key j?
//   classify(i0, i1, j0, j1)        for rows [i0, i1) and keys [j0, j1): hidden (skip the
//                                   tile, compute nothing), visible (no per-element checks)
//                                   or partial
//   required_kv_length(q_len)       the fewest keys the mask implies exist (checked by the
//                                   kernels: fewer is an error naming both)
//   first_visible_key(i0)           optional: a key position below which no row i >= i0
//                                   sees anything (non-decreasing in i0). Flash starts its
//                                   walk over the keys there, so a sliding window reads only
//                                   the window, and KV before it may be gone (a ring, released
//                                   blocks). Without the member, the free function
//                                   first_visible_key(mask, i0) answers 0.
//
//   no_mask                everything visible
//   causal{q_offset}       j <= q_offset + i  (q_offset: the first query's position, so
//                          chunked prefill and decode use the same rule)
//   sliding_window{w, q_offset}  causal, and q_offset + i - j < w
//   padding{begin, end}    keys [begin, end) are real; padding::right(valid) and
//                          padding::left(pad, total) build the usual two
//   explicit_mask{view}    an additive [q_len, kv_len] view: 0 visible, -inf hidden
//   all_of<M...>{m...}     visible where every part is (e.g. causal + padding)
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <tuple>

#include "npullm/core/tensor_view.hpp"

namespace npullm::attention {

enum class tile_visibility { hidden, partial, visible };

template <class M>
concept mask_policy = requires(const M& m, std::size_t i) {
  { m.visible(i, i) } -> std::convertible_to<bool>;
  { m.classify(i, i, i, i) } -> std::same_as<tile_visibility>;
  { m.required_kv_length(i) } -> std::convertible_to<std::size_t>;
};

struct no_mask {
  static constexpr bool visible(std::size_t, std::size_t) noexcept { return true; }
  static constexpr tile_visibility classify(std::size_t, std::size_t, std::size_t,
                                            std::size_t) noexcept {
    return tile_visibility::visible;
  }
  static constexpr std::size_t required_kv_length(std::size_t) noexcept { return 0; }
  static constexpr std::size_t first_visible_key(std::size_t) noexcept { return 0; }
};

// A lower bound of the keys rows [i0, q_len) may see: the mask's own first_visible_key(i0),
// or 0 for a mask without one (every key may be visible).
template <mask_policy M>
constexpr std::size_t first_visible_key(const M& mask, std::size_t i0) noexcept {
  if constexpr (requires {
                  { mask.first_visible_key(i0) } -> std::convertible_to<std::size_t>;
                }) {
    return mask.first_visible_key(i0);
  } else {
    return 0;
  }
}

struct causal {
  std::size_t q_offset = 0;

  constexpr bool visible(std::size_t i, std::size_t j) const noexcept { return j <= q_offset + i; }
  constexpr tile_visibility classify(std::size_t i0, std::size_t i1, std::size_t j0,
                                     std::size_t j1) const noexcept {
    if (j0 > q_offset + i1 - 1) return tile_visibility::hidden;  // after the last row's position
    if (j1 - 1 <= q_offset + i0) return tile_visibility::visible;
    return tile_visibility::partial;
  }
  // Every query's own position is a key.
  constexpr std::size_t required_kv_length(std::size_t q_len) const noexcept {
    return q_offset + q_len;
  }
  static constexpr std::size_t first_visible_key(std::size_t) noexcept { return 0; }
};

struct sliding_window {
  std::size_t window = 1;  // keys (q_pos - window, q_pos] are visible
  std::size_t q_offset = 0;

  constexpr bool visible(std::size_t i, std::size_t j) const noexcept {
    const std::size_t q = q_offset + i;
    return j <= q && q - j < window;
  }
  constexpr tile_visibility classify(std::size_t i0, std::size_t i1, std::size_t j0,
                                     std::size_t j1) const noexcept {
    const std::size_t q_first = q_offset + i0, q_last = q_offset + i1 - 1;
    if (j0 > q_last || j1 - 1 + window <= q_first) return tile_visibility::hidden;
    if (j1 - 1 <= q_first && q_last - j0 < window) return tile_visibility::visible;
    return tile_visibility::partial;
  }
  constexpr std::size_t required_kv_length(std::size_t q_len) const noexcept {
    return q_offset + q_len;
  }
  // Row i0 sees (q_offset + i0 - window, q_offset + i0]; later rows start later.
  constexpr std::size_t first_visible_key(std::size_t i0) const noexcept {
    const std::size_t q = q_offset + i0;
    return q + 1 > window ? q + 1 - window : 0;
  }
};

struct padding {
  std::size_t begin = 0;  // first real key
  std::size_t end = 0;    // one past the last real key

  // Right padding: keys [0, valid) are real.
  static constexpr padding right(std::size_t valid) noexcept { return {0, valid}; }
  // Left padding: `pad` padding keys, then real ones up to `total`.
  static constexpr padding left(std::size_t pad, std::size_t total) noexcept {
    return {pad, total};
  }

  constexpr bool visible(std::size_t, std::size_t j) const noexcept {
    return j >= begin && j < end;
  }
  constexpr tile_visibility classify(std::size_t, std::size_t, std::size_t j0,
                                     std::size_t j1) const noexcept {
    if (j1 <= begin || j0 >= end) return tile_visibility::hidden;
    if (j0 >= begin && j1 <= end) return tile_visibility::visible;
    return tile_visibility::partial;
  }
  constexpr std::size_t required_kv_length(std::size_t) const noexcept { return end; }
  constexpr std::size_t first_visible_key(std::size_t) const noexcept { return begin; }
};

// An additive mask [q_len, kv_len]: 0 where visible, -inf where hidden.
struct explicit_mask {
  dense_view<const float, 2> bias;  // (q_len, kv_len)

  bool visible(std::size_t i, std::size_t j) const noexcept {
    return bias(i, j) != -std::numeric_limits<float>::infinity();
  }
  // Scanning the tile costs about what the per-element checks save: always partial.
  static constexpr tile_visibility classify(std::size_t, std::size_t, std::size_t,
                                            std::size_t) noexcept {
    return tile_visibility::partial;
  }
  std::size_t required_kv_length(std::size_t) const noexcept { return bias.extent(1); }
  // Not scanned: any key may be visible.
  static constexpr std::size_t first_visible_key(std::size_t) noexcept { return 0; }
};

template <class... Masks>
struct all_of {
  std::tuple<Masks...> parts;

  constexpr all_of(Masks... m) : parts(m...) {}  // NOLINT: all_of{causal{}, padding{...}}

  constexpr bool visible(std::size_t i, std::size_t j) const noexcept {
    return std::apply([&](const auto&... m) { return (m.visible(i, j) && ...); }, parts);
  }
  constexpr tile_visibility classify(std::size_t i0, std::size_t i1, std::size_t j0,
                                     std::size_t j1) const noexcept {
    bool all_visible = true;
    bool any_hidden = false;
    std::apply(
        [&](const auto&... m) {
          (([&] {
             const tile_visibility t = m.classify(i0, i1, j0, j1);
             any_hidden = any_hidden || t == tile_visibility::hidden;
             all_visible = all_visible && t == tile_visibility::visible;
           }()),
           ...);
        },
        parts);
    if (any_hidden) return tile_visibility::hidden;
    return all_visible ? tile_visibility::visible : tile_visibility::partial;
  }
  constexpr std::size_t required_kv_length(std::size_t q_len) const noexcept {
    return std::apply([&](const auto&... m) { return std::max({m.required_kv_length(q_len)...}); },
                      parts);
  }
  // A key is visible only where every part lets it be: the latest of the parts' bounds.
  constexpr std::size_t first_visible_key(std::size_t i0) const noexcept {
    return std::apply(
        [&](const auto&... m) {
          return std::max({std::size_t{0}, attention::first_visible_key(m, i0)...});
        },
        parts);
  }
};

static_assert(mask_policy<no_mask> && mask_policy<causal> && mask_policy<sliding_window> &&
              mask_policy<padding> && mask_policy<explicit_mask> &&
              mask_policy<all_of<causal, padding>>);

}  // namespace npullm::attention
