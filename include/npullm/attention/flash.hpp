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
// Rows sharing one pass over K / V: as many accumulators as leave room for a K or V vector and
// a broadcast (AVX-512: 8 of 32 vectors; AVX2: 6, each f32x16 two of its 16 ymm registers).
inline constexpr std::size_t row_block =
    simd::f32x16_registers >= 32 ? 8 : std::max<std::size_t>(1, simd::f32x16_registers - 2);
// Keys whose dot products with one row accumulate at once (row_scores): all 16 with 32
// registers; fewer, in groups, where the accumulators and the q / K vectors would not fit.
inline constexpr std::size_t key_group =
    simd::f32x16_registers >= 32 ? key_block : std::max<std::size_t>(1, simd::f32x16_registers / 2);
static_assert(key_block % key_group == 0);

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

// Per-thread working memory of one item (reused across items and calls).
struct item_scratch {
  std::vector<float> q;    // (rows, D) queries times scale
  std::vector<float> kt;   // (D, 16) the sub-tile's K, transposed
  std::vector<float> p;    // (rows, 16) probabilities of the sub-tile
  std::vector<float> acc;  // (rows, D)
  std::vector<float> m;    // (rows)
  // (rows, 16): each row's sum of probabilities kept per lane and added up when the item ends
  // (a horizontal add per row and sub-tile, chained through memory, cost 2-4 % of GQA decode).
  std::vector<float> l;
  std::size_t keys_read = 0;  // (key, KV head) pairs loaded by the current item
  // K / V are read once, front to back (one query tile: decode), so hint them ahead; when
  // query tiles reuse the same keys from cache (prefill), the hints cost more than they save.
  bool stream = false;
  float softcap = 0.0f;  // attention_io::softcap
  // (queries) bit j set: key j of the current sub-tile is visible to the item's query
  // q_begin + i. Filled by the mask's tile walk for a partial sub-tile, so the kernels below
  // take no mask type: they are compiled once per K / V format, not once per mask and format.
  std::vector<std::uint32_t> visible;
  // Quantized keys (quantized_keys.hpp), unit-major so that a row block's values are a
  // constant distance apart: the rows' codes (D / 32, rows, 32), scales and accumulator starts
  // (D / 32, rows); the sub-tile's transposed codes (D / 32, 8, 16) and scales of K and V
  // (D / 32, 16); p times V's scales (D / 32, rows, 16); zero-padded copies of a short
  // sub-tile's K and V rows (16 rows each).
  std::vector<std::int8_t> qq;
  std::vector<float> qd;
  std::vector<std::int32_t> qc;
  std::vector<std::int32_t> kq;
  std::vector<float> kd, vd, ps;
  std::vector<std::byte> tail_k, tail_v;

  // Sized for a K of format K (the query quantized to match) and a V of format V; a part in a
  // storage type needs none of it.
  template <class K, class V>
  void prepare_quantized(std::size_t rows, std::size_t dim) {
    const std::size_t units = dim / 32;
    if constexpr (kv::quantized_kv_element<K>) {
      qq.resize(rows * dim);
      qd.resize(rows * units);
      qc.resize(rows * units);
      kq.resize(units * 8 * key_block);
      kd.resize(units * key_block);
      for (std::size_t r = 0; r < rows; ++r) {
        quantize_query<K>(q.data() + r * dim, dim, rows, qq.data() + r * 32, qd.data() + r,
                          qc.data() + r);
      }
    }
    if constexpr (kv::quantized_kv_element<V>) {
      vd.resize(units * key_block);
      ps.resize(rows * units * key_block);
    }
  }

  [[nodiscard]] float row_sum(std::size_t r) const noexcept {
    return simd::reduce_add(simd::load(l.data() + r * key_block));
  }

  void prepare(std::size_t rows, std::size_t dim) {
    q.resize(rows * dim);
    kt.resize(dim * key_block);
    p.resize(rows * key_block);
    acc.assign(rows * dim, 0.0f);
    m.assign(rows, neg_inf);
    l.assign(rows * key_block, 0.0f);
    keys_read = 0;
  }
};

inline item_scratch& thread_scratch() {
  thread_local item_scratch scratch;
  return scratch;
}

// A prefetch hint for the same stream 1024 elements (8 to 16 keys) further on, issued with
// every 64 bytes loaded: spread out like this it lifted cold decode ~24% for 14/2 heads; a
// burst of whole sub-tiles ahead, or a longer distance, measured slower (the miss buffers
// fill). Only while streaming (item_scratch::stream): on causal prefill 2048, where the keys
// come from cache, it cost 10% (AVX2). No effect on results.
template <class T>
inline void prefetch_ahead(const T* p) noexcept {
  __builtin_prefetch(p + 1024, 0, 0);
}
// The same for elements [c, c + 16) of a row: once per 64 bytes. (Quantized rows are hinted a
// sub-tile at a time: process_quantized_keys.)
template <storage_type T>
inline void prefetch_row(const T* row, std::size_t c) noexcept {
  if ((c * sizeof(T)) % 64 == 0) prefetch_ahead(row + c);
}

// Scores of R rows against the transposed sub-tile: s[r] lane j = q_r . k_j.
template <std::size_t R>
inline void block_scores(const float* q, const float* kt, std::size_t dim, simd::f32x16* s) {
  simd::f32x16 acc[R];
  NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) acc[r] = simd::zero();
  for (std::size_t d = 0; d < dim; ++d) {
    const simd::f32x16 k = simd::load(kt + d * key_block);
    NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
      acc[r] = simd::fmadd_broadcast(q + r * dim + d, k, acc[r]);
    }
  }
  NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) s[r] = acc[r];
}

// Scores of one row against n keys without transposing K: a dot-product accumulator per key
// (key_group keys at a time), then one reduction tree for all 16 (cheaper than a transpose when
// a single row uses the keys). Key j's row of units starts at k + j * (dim / unit_elements<T>).
template <class T>
inline simd::f32x16 row_scores(const float* q, const T* k, std::size_t n, std::size_t dim) {
  const std::size_t units = dim / kv::unit_elements<T>;
  simd::f32x16 sums[key_block];
  if (n == key_block) {
    for (std::size_t j0 = 0; j0 < key_block; j0 += key_group) {
      simd::f32x16 acc[key_group];
      NPULLM_UNROLL for (std::size_t j = 0; j < key_group; ++j) acc[j] = simd::zero();
      for (std::size_t c = 0; c < dim; c += simd::lanes) {
        const simd::f32x16 qc = simd::load(q + c);
        NPULLM_UNROLL for (std::size_t j = 0; j < key_group; ++j) {
          const T* kj = k + (j0 + j) * units;
          prefetch_row(kj, c);
          acc[j] = simd::fmadd(qc, kv::load16(kj, c), acc[j]);
        }
      }
      NPULLM_UNROLL for (std::size_t j = 0; j < key_group; ++j) sums[j0 + j] = acc[j];
    }
  } else {
    for (std::size_t j = 0; j < key_block; ++j) {
      simd::f32x16 acc = simd::zero();
      for (std::size_t c = 0; j < n && c < dim; c += simd::lanes) {
        acc = simd::fmadd(simd::load(q + c), kv::load16(k + j * units, c), acc);
      }
      sums[j] = acc;
    }
  }
  return simd::reduce_add16(sums);
}

// acc[r] += sum_j p[r][j] v_j for R rows. Output columns go in passes of C vectors, C chosen
// so the R x C accumulators, C value vectors and one broadcast fit in the registers.
template <std::size_t R>
inline constexpr std::size_t pv_columns =
    simd::f32x16_registers >= 32 ? (R <= 2 ? 8 : (R <= 4 ? 4 : 2))
                                 : std::max<std::size_t>(1, (simd::f32x16_registers - 1) / (R + 1));

// Runs body(a, c0, nc) over R rows' accumulators (acc: (R, dim)) a pass of C = pv_columns<R>
// column vectors at a time: a[r][c] holds columns c0 + 16 c of row r (c < nc; the others are
// zero and not stored), loaded before the body and stored after it.
template <std::size_t R, class Body>
[[gnu::always_inline]] inline void pv_passes(float* acc, std::size_t dim, Body&& body) {
  constexpr std::size_t lanes = simd::lanes;
  constexpr std::size_t C = pv_columns<R>;
  for (std::size_t c0 = 0; c0 < dim; c0 += C * lanes) {
    const std::size_t nc = std::min(C, (dim - c0) / lanes);
    simd::f32x16 a[R][C];
    NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
      NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
        a[r][c] = c < nc ? simd::load(acc + r * dim + c0 + c * lanes) : simd::zero();
      }
    }
    body(a, c0, nc);
    NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
      NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
        if (c < nc) simd::store(acc + r * dim + c0 + c * lanes, a[r][c]);
      }
    }
  }
}

template <std::size_t R, class T>
inline void block_pv(const float* p, const T* v, std::size_t n, std::size_t dim, float* acc,
                     bool stream) {
  constexpr std::size_t lanes = simd::lanes;
  constexpr std::size_t C = pv_columns<R>;
  const std::size_t units = dim / kv::unit_elements<T>;
  pv_passes<R>(acc, dim, [&](simd::f32x16(&a)[R][C], std::size_t c0, std::size_t nc) {
    for (std::size_t j = 0; j < n; ++j) {
      simd::f32x16 vj[C];
      NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
        if (stream && c < nc) prefetch_row(v + j * units, c0 + c * lanes);
        vj[c] = c < nc ? kv::load16(v + j * units, c0 + c * lanes) : simd::zero();
      }
      NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
        const simd::f32x16 pr = simd::set1(p[r * key_block + j]);
        NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) a[r][c] = simd::fmadd(pr, vj[c], a[r][c]);
      }
    }
  });
}

// Calls fn.template operator()<R>(r0) over rows [begin, end) in blocks of up to row_block.
template <std::size_t R = row_block - 1, class Fn>
inline void row_remainder(std::size_t rest, std::size_t r0, Fn& fn) {
  if constexpr (R > 0) {
    if (rest == R) return fn.template operator()<R>(r0);
    row_remainder<R - 1>(rest, r0, fn);
  }
}

template <class Fn>
inline void for_row_blocks(std::size_t begin, std::size_t end, Fn&& fn) {
  std::size_t r0 = begin;
  for (; r0 + row_block <= end; r0 += row_block) fn.template operator()<row_block>(r0);
  row_remainder(end - r0, r0, fn);
}

// c tanh(s / c) per lane, with tanh(z) = 1 - 2 / (exp(2z) + 1) (exp overflowing to inf gives
// 1, underflowing to 0 gives -1). Off the hot path: only soft-capped models (Gemma 2) call it.
[[gnu::noinline]] inline simd::f32x16 softcapped(simd::f32x16 sc, float cap) noexcept {
  alignas(64) float e[simd::lanes];
  simd::store(e, simd::exp(simd::mul(sc, simd::set1(2.0f / cap))));
  for (float& v : e) v = cap * (1.0f - 2.0f / (v + 1.0f));
  return simd::load(e);
}

// The online-softmax update of one row with a vector of scores (lanes >= n are masked; in a
// partial sub-tile, the lanes whose bit in s.visible is clear too).
// (Inlined into the row loop: as a call, its scores went through memory and one row's chain of
// max, exp and sum could not overlap the next row's.)
[[gnu::always_inline]] inline void update_row(const item_rows& rows, std::size_t row,
                                              simd::f32x16 sc, std::size_t n, std::size_t dim,
                                              tile_visibility visibility, item_scratch& s) {
  if (s.softcap > 0.0f) sc = softcapped(sc, s.softcap);
  if (n < key_block) sc = simd::mask_tail(sc, n);
  if (visibility == tile_visibility::partial) {
    alignas(64) float tmp[simd::lanes];
    simd::store(tmp, sc);
    const std::uint32_t bits = s.visible[rows.query(row) - rows.q_begin];
    for (std::size_t j = 0; j < n; ++j) {
      if (((bits >> j) & 1u) == 0) tmp[j] = neg_inf;
    }
    sc = simd::load(tmp);
  }
  float* p = s.p.data() + row * key_block;
  // The -inf rules are softmax_state's (attention/state.hpp), over this row's m, l and acc.
  const max_step step = step_max(s.m[row], simd::reduce_max(sc));
  if (!step.visible()) {  // nothing visible to this row yet: p = 0, state unchanged
    simd::store(p, simd::zero());
    return;
  }
  const simd::f32x16 prob = simd::exp(simd::sub(sc, simd::set1(step.m)));
  simd::store(p, prob);
  if (step.m != s.m[row]) {
    float* acc = s.acc.data() + row * dim;
    const simd::f32x16 va = simd::set1(step.alpha);
    for (std::size_t d = 0; d < dim; d += simd::lanes) {
      simd::store(acc + d, simd::mul(simd::load(acc + d), va));
    }
    float* lr = s.l.data() + row * key_block;
    simd::store(lr, simd::mul(simd::load(lr), va));
    s.m[row] = step.m;
  }
  float* lr = s.l.data() + row * key_block;
  simd::store(lr, simd::add(simd::load(lr), prob));
}

// acc[r] += sum_j p'[u][r][j] vq_j for R rows over quantized V: V's scales are folded into the
// probabilities (ps: (D / 32, rows, 16), p times key j's scale of unit u; ps points at the
// block's first row of unit 0), so a value vector is its codes converted once (q4_0: minus 8)
// and shared by the rows. Columns in passes as block_pv.
template <std::size_t R, kv::quantized_kv_element T>
inline void block_pv_quantized(const float* ps, std::size_t rows, const T* v, std::size_t n,
                               std::size_t dim, float* acc) {
  constexpr std::size_t lanes = simd::lanes;
  constexpr std::size_t C = pv_columns<R>;
  const std::size_t units = dim / 32;
  pv_passes<R>(acc, dim, [&](simd::f32x16(&a)[R][C], std::size_t c0, std::size_t nc) {
    const float* pu[C];  // each column vector's unit's probabilities
    NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
      pu[c] = ps + (c < nc ? (c0 + c * lanes) / 32 : 0) * rows * key_block;
    }
    for (std::size_t j = 0; j < n; ++j) {
      simd::f32x16 vj[C];
      NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
        const std::size_t col = c0 + c * lanes;
        if (c < nc) {
          const T& b = v[j * units + col / 32];
          if constexpr (std::same_as<T, kv::q8_0>)
            vj[c] = simd::load_s8(b.qs + col % 32);
          else
            vj[c] = simd::load_q4(b.qs, col % 32 != 0);
        } else {
          vj[c] = simd::zero();
        }
      }
      NPULLM_UNROLL for (std::size_t r = 0; r < R; ++r) {
        NPULLM_UNROLL for (std::size_t c = 0; c < C; ++c) {
          if (c < nc) a[r][c] = simd::fmadd(simd::set1(pu[c][r * key_block + j]), vj[c], a[r][c]);
        }
      }
    }
  });
}

// A short sub-tile's (n < 16 keys) rows of a quantized part copied into 16 rows, zero-padded,
// so the kernels always read 16 whole rows (the padding's scores are masked like any lane >= n,
// its probabilities are 0).
template <kv::quantized_kv_element T>
const T* padded_rows(const T* rows, std::size_t n, std::size_t units,
                     std::vector<std::byte>& tail) {
  tail.assign(key_block * units * sizeof(T), std::byte{0});
  std::memcpy(tail.data(), rows, n * units * sizeof(T));
  return reinterpret_cast<const T*>(tail.data());
}

// Scores of rows [begin, end) against a sub-tile of quantized K by integer dot products
// (quantized_keys.hpp), K transposed once for all rows, into the online softmax.
template <kv::quantized_kv_element K>
void quantized_key_scores(const item_rows& rows, std::size_t begin, std::size_t end, const K* k,
                          std::size_t n, std::size_t dim, tile_visibility visibility,
                          item_scratch& s) {
  const std::size_t units = dim / 32;
  transpose_keys(k, units, s.kq.data(), s.kd.data());
  for_row_blocks(begin, end, [&]<std::size_t R>(std::size_t r0) {
    simd::f32x16 scores[R];
    quantized_scores<R, K>(s.qq.data() + r0 * 32, s.qd.data() + r0, s.qc.data() + r0, rows.count(),
                           s.kq.data(), s.kd.data(), units, scores);
    for (std::size_t r = 0; r < R; ++r) {
      update_row(rows, r0 + r, scores[r], n, dim, visibility, s);
    }
  });
}

// Scores of rows [begin, end) against a sub-tile of K in a storage type, in f32: one row reads
// K as it is (row_scores), several transpose it once (K (n, D) -> kt (D, 16), keys past n zero).
template <storage_type K>
void float_key_scores(const item_rows& rows, std::size_t begin, std::size_t end, const K* k,
                      std::size_t n, std::size_t dim, tile_visibility visibility, item_scratch& s) {
  if (end - begin == 1) {
    update_row(rows, begin, row_scores(s.q.data() + begin * dim, k, n, dim), n, dim, visibility, s);
    return;
  }
  for (std::size_t d0 = 0; d0 < dim; d0 += simd::lanes) {
    simd::f32x16 block[simd::lanes];
    for (std::size_t j = 0; j < simd::lanes; ++j) {
      if (s.stream && j < n) prefetch_row(k + j * dim, d0);
      block[j] = j < n ? simd::load(k + j * dim + d0) : simd::zero();
    }
    simd::transpose16(block);
    for (std::size_t d = 0; d < simd::lanes; ++d) {
      simd::store(s.kt.data() + (d0 + d) * key_block, block[d]);
    }
  }
  for_row_blocks(begin, end, [&]<std::size_t R>(std::size_t r0) {
    simd::f32x16 scores[R];
    block_scores<R>(s.q.data() + r0 * dim, s.kt.data(), dim, scores);
    for (std::size_t r = 0; r < R; ++r) {
      update_row(rows, r0 + r, scores[r], n, dim, visibility, s);
    }
  });
}

// acc += P V for rows [begin, end) over a sub-tile of quantized V, V's scales folded into p.
template <kv::quantized_kv_element V>
void quantized_pv(const item_rows& rows, std::size_t begin, std::size_t end, const V* v,
                  std::size_t n, std::size_t dim, item_scratch& s) {
  const std::size_t units = dim / 32;
  unit_scales(v, units, s.vd.data());
  for (std::size_t r = begin; r < end; ++r) {
    const simd::f32x16 p = simd::load(s.p.data() + r * key_block);
    for (std::size_t u = 0; u < units; ++u) {
      simd::store(s.ps.data() + (u * rows.count() + r) * key_block,
                  simd::mul(p, simd::load(s.vd.data() + u * key_block)));
    }
  }
  for_row_blocks(begin, end, [&]<std::size_t R>(std::size_t r0) {
    block_pv_quantized<R>(s.ps.data() + r0 * key_block, rows.count(), v, n, dim,
                          s.acc.data() + r0 * dim);
  });
}

// Scores of rows [begin, end) against a sub-tile of n <= 16 keys of K (k: its first key, rows
// D / unit_elements<K> units apart) into the online softmax: integer dot products for a
// quantized K, f32 for a storage type; a partial sub-tile's visible keys are in s.visible.
// No mask type, no V, no threading policy: one instantiation per K format serves every mask,
// value format, source and policy (npullm_kernels compiles each once for a whole program).
template <kv::kv_element K>
void key_scores(const item_rows& rows, std::size_t begin, std::size_t end, const K* k,
                std::size_t n, std::size_t dim, tile_visibility visibility, item_scratch& s) {
  if constexpr (kv::quantized_kv_element<K>) {
    if (n < key_block) k = padded_rows(k, n, dim / 32, s.tail_k);
    quantized_key_scores(rows, begin, end, k, n, dim, visibility, s);
  } else {
    float_key_scores(rows, begin, end, k, n, dim, visibility, s);
  }
}

// acc += P V for rows [begin, end) over the same sub-tile of V (v: its first key): V's scales
// folded into p for a quantized V, f32 for a storage type. One instantiation per V format.
template <kv::kv_element V>
void value_products(const item_rows& rows, std::size_t begin, std::size_t end, const V* v,
                    std::size_t n, std::size_t dim, item_scratch& s) {
  if constexpr (kv::quantized_kv_element<V>) {
    if (n < key_block) v = padded_rows(v, n, dim / 32, s.tail_v);
    quantized_pv(rows, begin, end, v, n, dim, s);
  } else {
    for_row_blocks(begin, end, [&]<std::size_t R>(std::size_t r0) {
      block_pv<R>(s.p.data() + r0 * key_block, v, n, dim, s.acc.data() + r0 * dim, s.stream);
    });
  }
}

// One sub-tile of n <= 16 keys for the rows of KV head hk: k, v point at that head's first key
// of the sub-tile. Scores by K's kernel, then P V by V's.
template <class K, class V>
inline void process_keys(const item_rows& rows, std::size_t hk, const K* k, const V* v,
                         std::size_t n, std::size_t dim, tile_visibility visibility,
                         item_scratch& s) {
  const std::size_t begin = hk * rows.per_kv_head(), end = begin + rows.per_kv_head();
  if (s.stream) {  // quantized K / V 2 KiB ahead (about one sub-tile), a hint per 64 bytes
    auto hint = [](const auto* part, std::size_t bytes) {
      for (std::size_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(part) + 2048 + b, 0, 0);
      }
    };
    if constexpr (kv::quantized_kv_element<K>) hint(k, key_block * (dim / 32) * sizeof(K));
    if constexpr (kv::quantized_kv_element<V>) hint(v, key_block * (dim / 32) * sizeof(V));
  }
  key_scores(rows, begin, end, k, n, dim, visibility, s);
  value_products(rows, begin, end, v, n, dim, s);
}

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

// The sub-tile kernels of every KV format (detail::key_scores, detail::value_products: no
// mask, no policy, so they serve any pair of formats and any mask), and the drivers a model
// pipeline runs (default tiles, f32 present, a sliding window with or without padding:
// dynamic_attention's masks), instantiated once for a whole program, as ops/quant_linear.hpp
// does for the quantized linear: one translation unit defines NPULLM_FLASH_KERNELS_INSTANTIATE
// before including this header, the others NPULLM_FLASH_KERNELS_EXTERN, all built with the
// same -march (npullm_kernels in CMakeLists.txt; core/isa.hpp). Other masks' drivers compile
// in the caller as usual, over the same kernels.
#if defined(NPULLM_FLASH_KERNELS_INSTANTIATE) || defined(NPULLM_FLASH_KERNELS_EXTERN)
#if defined(NPULLM_FLASH_KERNELS_INSTANTIATE)
#define NPULLM_FK_EXTERN_
#else
#define NPULLM_FK_EXTERN_ extern
#endif
#define NPULLM_FK_FORMAT_(T)                                                                       \
  NPULLM_FK_EXTERN_ template void detail::key_scores<T>(                                           \
      const detail::item_rows&, std::size_t, std::size_t, const T*, std::size_t, std::size_t,      \
      tile_visibility, detail::item_scratch&);                                                     \
  NPULLM_FK_EXTERN_ template void detail::value_products<T>(const detail::item_rows&, std::size_t, \
                                                            std::size_t, const T*, std::size_t,    \
                                                            std::size_t, detail::item_scratch&);
#define NPULLM_FK_MASK_(K, V, M)                                                          \
  NPULLM_FK_EXTERN_ template void detail::flash_tiles<flash<>, K, V, float, M>(           \
      const attention_io&, std::span<const kv::kv_tile<K, V>>, const kv::kv_tile<float>*, \
      const M&, detail::erased_policy);
#define NPULLM_FK_(K, V) \
  NPULLM_FK_MASK_(K, V, sliding_window) NPULLM_FK_MASK_(K, V, NPULLM_FK_WINDOW_PADDING_)
#define NPULLM_FK_WINDOW_PADDING_ all_of<sliding_window, padding>
NPULLM_FK_FORMAT_(float)
NPULLM_FK_FORMAT_(float16)
NPULLM_FK_FORMAT_(bfloat16)
NPULLM_FK_FORMAT_(kv::q8_0)
NPULLM_FK_FORMAT_(kv::q4_0)
NPULLM_FK_(float, float)
NPULLM_FK_(float16, float16)
NPULLM_FK_(bfloat16, bfloat16)
NPULLM_FK_(kv::q8_0, kv::q8_0)
NPULLM_FK_(kv::q4_0, kv::q4_0)
NPULLM_FK_(kv::q8_0, kv::q4_0)
#undef NPULLM_FK_WINDOW_PADDING_
#undef NPULLM_FK_
#undef NPULLM_FK_MASK_
#undef NPULLM_FK_FORMAT_
#undef NPULLM_FK_EXTERN_
#endif

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::attention
