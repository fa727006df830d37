// Tiled flash attention over any KV source ("host flash attention": past KV in tiles, the
// present chunk's own K/V as the final tile), with an online-softmax state per query row.
//
//   q        (q_heads, q_len, D)     f32
//   past     tiles of (kv_heads, len, D) K and V, f32 / f16 / bf16 storage or a quantized KV
//            format (kv::q8_0, kv::q4_0: tiles of (kv_heads, len, D / 32) units, read fused,
//            never dequantized into a copy: scores by integer dot products against the query
//            quantized to int8 (quantized_keys.hpp), P V with V's scales folded into p; a
//            present tile is then read in the past's format too), at consecutive
//            positions p0, p0 + len0, ... (p0 = 0 for a whole cache; later when the keys
//            before p0 are gone: a ring cache, released blocks; the mask must hide them)
//   present  optional final tile (kv_heads, q_len, D) at the position after the past's last
//   out      (q_heads, q_len, D)     f32
//   lse      (q_heads, q_len)        f32, optional: log-sum-exp of each row's scores
// Query head h reads KV head h / (q_heads / kv_heads): K/V are never duplicated for GQA/MQA.
// Everything accumulates in f32 whatever the storage type.
//
// Work is split into items (query tile, KV split), each running every head's rows, so a
// block's K and V are read front to back once. Decode (q_len <= one query tile) splits the
// keys into fixed-length parts (FlashDecoding) whose partial states are merged in order
// afterwards; prefill splits the queries into tiles. Item boundaries do not depend on the
// thread count, so results are identical for any thread count and any run.
//
// Per 16-key sub-tile and KV head: when several rows share the keys (GQA group x queries),
// K is converted to f32 and transposed once (D x 16) and scores for 8 rows at a time are
// broadcast-FMAs over D; a single row instead takes 16 dot products and one reduction tree.
// The online-softmax update runs on 16 lanes, then P V accumulates 8 rows x 32 output columns
// in registers. A sub-tile that the mask hides entirely is skipped before any of that.
//
// Each item starts its walk at the mask's first_visible_key for its first row (rounded down
// to the item's 16-key grid, so the sub-tiles are the ones a walk from the start would form
// and results are bit-for-bit the same): a sliding window reads only the window's tiles, not
// a tile per block of the whole past. Decode splits before the window are not even created.
// attention_io::stats, when given, receives how many keys were read.
//
// The parts: flash_plan.hpp (the tile policy, attention_io, the checks and the item grid: what a
// call computes from its shapes), flash_kernels.hpp (one 16-key sub-tile: scores, the online
// softmax, P V, per KV format), and this header, the driver: the mask's walk over the tiles,
// each item's start and end, the merge of decode splits, and flash_attention itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "npullm/attention/flash_kernels.hpp"
#include "npullm/attention/flash_plan.hpp"
#include "npullm/attention/mask.hpp"
#include "npullm/attention/quantized_keys.hpp"
#include "npullm/attention/state.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/kv/kv_tile.hpp"

namespace npullm::attention {
inline namespace NPULLM_ISA_NAMESPACE {

namespace detail {

// Which of the n keys at positions [j0, j0 + n) each of the item's queries sees, as bits
// (s.visible): a partial sub-tile's mask, asked once per query and key (the GQA group's heads
// share their query's bits).
template <mask_policy Mask>
void visible_keys(const item_rows& rows, std::size_t j0, std::size_t n, const Mask& mask,
                  item_scratch& s) {
  s.visible.resize(rows.queries());
  for (std::size_t i = rows.q_begin; i < rows.q_end; ++i) {
    std::uint32_t bits = 0;
    for (std::size_t j = 0; j < n; ++j) {
      bits |= std::uint32_t{static_cast<bool>(mask.visible(i, j0 + j))} << j;
    }
    s.visible[i - rows.q_begin] = bits;
  }
}

// Runs keys [key_begin, key_end) of one tile (at `position`) through every KV head's rows,
// 16 keys at a time. When a tile keeps each head's keys far apart (a contiguous cache:
// heads `capacity` keys apart), heads go outermost, so one head's K and V are read as two
// sequential streams; when heads sit side by side (a block), the heads of each 16-key step go
// together so the block is read front to back.
template <class K, class V, mask_policy Mask>
void process_tile(const item_rows& rows, const kv::kv_tile<K, V>& tile, std::size_t key_begin,
                  std::size_t key_end, std::size_t dim, const Mask& mask, item_scratch& s) {
  auto step = [&](std::size_t hk, std::size_t j) {
    const std::size_t n = std::min(key_block, key_end - j);
    const std::size_t pos = tile.position + j;
    const tile_visibility vis = mask.classify(rows.q_begin, rows.q_end, pos, pos + n);
    if (vis == tile_visibility::hidden) return;
    if (vis == tile_visibility::partial) visible_keys(rows, pos, n, mask, s);
    s.keys_read += n;
    const K* k = tile.k.data_handle() + hk * tile.k.stride(0) + j * (dim / kv::unit_elements<K>);
    const V* v = tile.v.data_handle() + hk * tile.v.stride(0) + j * (dim / kv::unit_elements<V>);
    process_keys(rows, hk, k, v, n, dim, vis, s);
  };
  constexpr std::size_t far_apart = 64 * 1024;  // bytes between heads
  if (static_cast<std::size_t>(tile.k.stride(0)) * sizeof(K) >= far_apart) {
    for (std::size_t hk = 0; hk < rows.kv_heads; ++hk) {
      for (std::size_t j = key_begin; j < key_end; j += key_block) step(hk, j);
    }
  } else {
    for (std::size_t j = key_begin; j < key_end; j += key_block) {
      for (std::size_t hk = 0; hk < rows.kv_heads; ++hk) step(hk, j);
    }
  }
}

// A threading policy behind one function pointer: the driver below is compiled once per KV
// format, present type and mask, not once more per policy (the items are coarse: one indirect
// call each costs nothing).
struct erased_policy {
  const void* policy;
  void (*run)(const void* policy, std::size_t n, void (*fn)(void*, std::size_t), void* fn_state);

  template <threading_policy Policy>
  static erased_policy of(const Policy& p) noexcept {
    return {&p, [](const void* pp, std::size_t n, void (*fn)(void*, std::size_t), void* state) {
              static_cast<const Policy*>(pp)->parallel_for(n, [&](std::size_t i) { fn(state, i); });
            }};
  }
  template <class Fn>
  void parallel_for(std::size_t n, Fn& fn) const {
    run(
        policy, n, [](void* f, std::size_t i) { (*static_cast<Fn*>(f))(i); }, &fn);
  }
};
// Every row of a call without keys (kv_heads 0): zeros, lse -inf.
inline void write_empty_rows(const attention_io& io) {
  for (std::size_t h = 0; h < io.q.extent(0); ++h) {
    for (std::size_t i = 0; i < io.q.extent(1); ++i) {
      for (std::size_t d = 0; d < io.q.extent(2); ++d) io.out(h, i, d) = 0.0f;
      if (io.lse.data_handle() != nullptr) io.lse(h, i) = neg_inf;
    }
  }
}

// An item's start: the thread's scratch sized for its rows, its queries times the scale (and
// quantized to K's format for integer scores).
template <class K, class V>
item_scratch& begin_item(const attention_io& io, const flash_plan& plan, const item_rows& rows) {
  item_scratch& s = thread_scratch();
  s.prepare(rows.count(), plan.dim);
  s.stream = plan.q_tiles == 1;
  s.softcap = io.softcap;
  for (std::size_t r = 0; r < rows.count(); ++r) {
    const std::size_t h = rows.head(r), i = rows.query(r);
    for (std::size_t d = 0; d < plan.dim; ++d) s.q[r * plan.dim + d] = io.q(h, i, d) * io.scale;
  }
  s.prepare_quantized<K, V>(rows.count(), plan.dim);
  return s;
}

// An item's end: each row normalized into out (and lse), or, for a decode split, its partial
// state (acc, m, l) into partials (splits, rows, D + 2) for merge_splits.
inline void end_item(const attention_io& io, const flash_plan& plan, std::size_t item,
                     const item_rows& rows, item_scratch& s, std::vector<float>& partials) {
  const std::size_t dim = plan.dim;
  for (std::size_t r = 0; r < rows.count(); ++r) {
    if (plan.split) {
      float* out = partials.data() + (item * plan.rows_per_item + r) * (dim + 2);
      std::copy_n(s.acc.data() + r * dim, dim, out);
      out[dim] = s.m[r];
      out[dim + 1] = s.row_sum(r);
    } else {
      softmax_state state(s.m[r], s.row_sum(r), std::span<float>(s.acc.data() + r * dim, dim));
      state.normalize();
      const std::size_t h = rows.head(r), i = rows.query(r);
      for (std::size_t d = 0; d < dim; ++d) io.out(h, i, d) = s.acc[r * dim + d];
      if (io.lse.data_handle() != nullptr) io.lse(h, i) = state.lse();
    }
  }
}

// Merges each row's partial states in split order (deterministic), then normalizes.
inline void merge_splits(const attention_io& io, const flash_plan& plan,
                         std::vector<float>& partials) {
  const std::size_t dim = plan.dim;
  std::vector<float> acc(dim);
  const item_rows rows{plan.kv_heads, plan.group, 0, plan.q_len};
  // (Splits before first_split would be empty states: merging them changes nothing.)
  for (std::size_t r = 0; r < rows.count(); ++r) {
    softmax_state total{std::span<float>(acc)};
    for (std::size_t part = 0; part < plan.splits; ++part) {
      float* p = partials.data() + (part * plan.rows_per_item + r) * (dim + 2);
      total.merge(softmax_state(p[dim], p[dim + 1], std::span<float>(p, dim)));
    }
    total.normalize();
    const std::size_t h = rows.head(r), i = rows.query(r);
    for (std::size_t d = 0; d < dim; ++d) io.out(h, i, d) = acc[d];
    if (io.lse.data_handle() != nullptr) io.lse(h, i) = total.lse();
  }
}

// A quantized past's present tile in the past's formats (quantized here, once), so a chunk's
// keys score the same as the present as when they come back from the cache: the past's tiles
// and that one, into tiles (the quantized rows in qk, qv).
template <kv::kv_element K, kv::kv_element V, storage_type P>
void quantized_present(std::span<const kv::kv_tile<K, V>> past, const kv::kv_tile<P>& present,
                       std::size_t dim, std::vector<K>& qk, std::vector<V>& qv,
                       std::vector<kv::kv_tile<K, V>>& tiles) {
  const std::size_t kv_heads = present.k.extent(0), n = present.length();
  const std::size_t ku = dim / kv::unit_elements<K>, vu = dim / kv::unit_elements<V>;
  qk.resize(kv_heads * n * ku);
  qv.resize(kv_heads * n * vu);
  std::vector<float> row(dim);
  for (std::size_t h = 0; h < kv_heads; ++h) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t d = 0; d < dim; ++d) row[d] = to_float(present.k(h, i, d));
      kv::quantize_row<K>(row.data(), dim, qk.data() + (h * n + i) * ku);
      for (std::size_t d = 0; d < dim; ++d) row[d] = to_float(present.v(h, i, d));
      kv::quantize_row<V>(row.data(), dim, qv.data() + (h * n + i) * vu);
    }
  }
  tiles.assign(past.begin(), past.end());
  tiles.push_back({kv::make_kv_view<const K>(qk.data(), kv_heads, n, ku, n * ku),
                   kv::make_kv_view<const V>(qv.data(), kv_heads, n, vu, n * vu),
                   present.position});
}

// flash_attention over explicit tiles (below), its policy erased. What depends on the mask is
// only this: the checks it adds, where each item's walk starts and which sub-tiles it visits
// (process_tile); plan, items' start and end, the kernels and the merge are shared by all masks.
template <flash_policy Tiles, kv::kv_element K, kv::kv_element V, storage_type P, mask_policy Mask>
void flash_tiles(const attention_io& io, std::span<const kv::kv_tile<K, V>> past,
                 const kv::kv_tile<P>* present, const Mask& mask, erased_policy policy) {
  flash_plan plan = plan_keys(io, past, present);
  const std::size_t q_len = plan.q_len;
  if (plan.kv_len < mask.required_kv_length(q_len)) {
    raise(error_code::invalid_shape, "flash_attention: KV has ", plan.kv_len,
          " keys, the mask needs ", mask.required_kv_length(q_len), " for ", q_len, " queries");
  }
  const std::size_t first_visible = first_visible_key(mask, 0);
  if (q_len != 0 && first_visible < plan.kv_first) {
    raise(error_code::invalid_argument, "flash_attention: the KV starts at position ",
          plan.kv_first, " (the keys before it are gone) but the mask lets query 0 see keys from ",
          first_visible);
  }
  if (q_len == 0 || plan.q_heads == 0) return;
  if constexpr (kv::quantized_kv_element<K> || kv::quantized_kv_element<V>) {
    if (present != nullptr) {
      std::vector<K> qk;
      std::vector<V> qv;
      std::vector<kv::kv_tile<K, V>> tiles;
      quantized_present(past, *present, plan.dim, qk, qv, tiles);
      flash_tiles<Tiles>(io, std::span<const kv::kv_tile<K, V>>(tiles),
                         static_cast<const kv::kv_tile<float>*>(nullptr), mask, policy);
      return;
    }
  }
  if (plan.kv_heads == 0) {  // no keys at all: every row is empty
    write_empty_rows(io);
    return;
  }
  plan_items(plan, Tiles::query_tile, Tiles::split_length, first_visible);
  std::vector<std::size_t> item_reads(io.stats != nullptr ? plan.items() : 0);
  std::vector<float> partials(plan.split ? plan.items() * plan.rows_per_item * (plan.dim + 2) : 0);

  auto run_item = [&](std::size_t item) {
    const item_rows rows = plan.rows(item);
    const std::size_t key_begin = plan.key_begin(item), key_end = plan.key_end(item);
    // Nothing before this is visible to the item's rows.
    const std::size_t item_first = std::max(key_begin, first_visible_key(mask, rows.q_begin));
    item_scratch& s = begin_item<K, V>(io, plan, rows);
    // Tiles overlapping [item_first, key_end), clipped to [key_begin, key_end) and started
    // on their grid at item_first.
    auto run = [&](const auto& tile) {
      const std::size_t t0 = tile.position, t1 = tile.position + tile.length();
      if (t1 <= item_first || t0 >= key_end) return;
      const std::size_t begin = walk_start(std::max(t0, key_begin), item_first);
      const std::size_t end = std::min(t1, key_end);
      if (mask.classify(rows.q_begin, rows.q_end, begin, end) == tile_visibility::hidden) return;
      process_tile(rows, tile, begin - t0, end - t0, plan.dim, mask, s);
    };
    // Past tiles in order, from the first one that reaches item_first (binary search).
    auto first = std::partition_point(past.begin(), past.end(), [&](const auto& t) {
      return t.position + t.length() <= item_first;
    });
    for (auto it = first; it != past.end() && it->position < key_end; ++it) run(*it);
    if (present != nullptr) run(*present);
    if (io.stats != nullptr) item_reads[item] = s.keys_read;
    end_item(io, plan, item, rows, s, partials);
  };
  policy.parallel_for(plan.items(), run_item);

  if (io.stats != nullptr) {
    for (std::size_t n : item_reads) io.stats->keys_read += n;
    ++io.stats->calls;
  }
  if (plan.split) merge_splits(io, plan, partials);
}

}  // namespace detail

// Flash attention over explicit tiles. See the top of this file for shapes.
template <flash_policy Tiles = flash<>, kv::kv_element K, kv::kv_element V, storage_type P = float,
          mask_policy Mask = no_mask, threading_policy Policy = serial>
void flash_attention(const attention_io& io, std::span<const kv::kv_tile<K, V>> past,
                     const kv::kv_tile<P>* present, const Mask& mask, const Policy& policy = {}) {
  detail::flash_tiles<Tiles>(io, past, present, mask, detail::erased_policy::of(policy));
}

// Flash attention over a KV source (contiguous cache, block table, split-into-blocks view,
// ring cache) for one layer, with an optional present tile. Only the tiles from the one that
// holds the mask's first visible key on are handed over (found by binary search: a source's
// tiles are consecutive), so a window over a long block table costs the window's tiles.
template <flash_policy Tiles = flash<>, kv::kv_source Source, storage_type P = float,
          mask_policy Mask = no_mask, threading_policy Policy = serial>
void flash_attention(const attention_io& io, const Source& source, std::size_t layer,
                     const kv::kv_tile<P>* present, const Mask& mask, const Policy& policy = {}) {
  using tile_type = kv::format_tile<typename Source::value_type>;
  const std::size_t count = source.tile_count();
  const std::size_t first_visible = first_visible_key(mask, 0);
  std::size_t lo = 0, hi = count;  // first tile ending after first_visible (the last at most)
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    const tile_type t = source.tile(layer, mid);
    if (t.position + t.length() <= first_visible)
      lo = mid + 1;
    else
      hi = mid;
  }
  std::vector<tile_type> tiles;
  tiles.reserve(count - std::min(lo, count));
  for (std::size_t i = std::min(lo, count == 0 ? 0 : count - 1); i < count; ++i)
    tiles.push_back(source.tile(layer, i));
  flash_attention<Tiles>(io, std::span<const tile_type>(tiles), present, mask, policy);
}

// The drivers a model pipeline runs (default tiles, f32 present, a sliding window with or
// without padding: dynamic_attention's masks) for every KV format, instantiated once for a whole
// program with the sub-tile kernels (flash_kernels.hpp), as ops/quant_linear.hpp does for the
// quantized linear: one translation unit defines NPULLM_FLASH_KERNELS_INSTANTIATE before
// including this header, the others NPULLM_FLASH_KERNELS_EXTERN, all built with the same -march
// (npullm_kernels in CMakeLists.txt; core/isa.hpp). Other masks' drivers compile in the caller
// as usual, over the same kernels.
#if defined(NPULLM_FLASH_KERNELS_INSTANTIATE) || defined(NPULLM_FLASH_KERNELS_EXTERN)
#if defined(NPULLM_FLASH_KERNELS_INSTANTIATE)
#define NPULLM_FK_EXTERN_
#else
#define NPULLM_FK_EXTERN_ extern
#endif
#define NPULLM_FK_MASK_(K, V, M)                                                          \
  NPULLM_FK_EXTERN_ template void detail::flash_tiles<flash<>, K, V, float, M>(           \
      const attention_io&, std::span<const kv::kv_tile<K, V>>, const kv::kv_tile<float>*, \
      const M&, detail::erased_policy);
#define NPULLM_FK_(K, V) \
  NPULLM_FK_MASK_(K, V, sliding_window) NPULLM_FK_MASK_(K, V, NPULLM_FK_WINDOW_PADDING_)
#define NPULLM_FK_WINDOW_PADDING_ all_of<sliding_window, padding>
NPULLM_FK_(float, float)
NPULLM_FK_(float16, float16)
NPULLM_FK_(bfloat16, bfloat16)
NPULLM_FK_(kv::q8_0, kv::q8_0)
NPULLM_FK_(kv::q4_0, kv::q4_0)
NPULLM_FK_(kv::q8_0, kv::q4_0)
#undef NPULLM_FK_WINDOW_PADDING_
#undef NPULLM_FK_
#undef NPULLM_FK_MASK_
#undef NPULLM_FK_EXTERN_
#endif

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::attention
