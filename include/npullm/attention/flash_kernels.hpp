// flash attention's sub-tile kernels (attention/flash.hpp is the whole): one 16-key sub-tile
// of one KV head against the rows of a work item (detail::process_keys): scores (detail::
// key_scores: f32 broadcast-FMAs over a transposed K for several rows, dot products and one
// reduction tree for a single row, integer dot products for q8_0 / q4_0 keys), the
// online-softmax update on 16 lanes (update_row, soft-capping included), and P V
// (detail::value_products: rows x 32 output columns in registers, V's scales folded into p for
// a quantized V); the per-thread scratch they share (item_scratch). No mask type and no
// threading policy: a partial sub-tile's visible keys come in as bits (item_scratch::visible),
// so each kernel is compiled once per KV format. The per-format kernels are precompiled per
// ISA like the drivers (NPULLM_FLASH_KERNELS_INSTANTIATE / _EXTERN, at the end of this file).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "npullm/attention/flash_plan.hpp"
#include "npullm/attention/mask.hpp"
#include "npullm/attention/quantized_keys.hpp"
#include "npullm/attention/state.hpp"
#include "npullm/core/dtype.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/kv/kv_tile.hpp"

namespace npullm::attention {
inline namespace NPULLM_ISA_NAMESPACE {

namespace detail {

// Rows sharing one pass over K / V: as many accumulators as leave room for a K or V vector and
// a broadcast (AVX-512: 8 of 32 vectors; AVX2: 6, each f32x16 two of its 16 ymm registers).
inline constexpr std::size_t row_block =
    simd::f32x16_registers >= 32 ? 8 : std::max<std::size_t>(1, simd::f32x16_registers - 2);
// Keys whose dot products with one row accumulate at once (row_scores): all 16 with 32
// registers; fewer, in groups, where the accumulators and the q / K vectors would not fit.
inline constexpr std::size_t key_group =
    simd::f32x16_registers >= 32 ? key_block : std::max<std::size_t>(1, simd::f32x16_registers / 2);
static_assert(key_block % key_group == 0);

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

}  // namespace detail

// The sub-tile kernels of every KV format (detail::key_scores, detail::value_products: no
// mask, no policy, so they serve any pair of formats and any mask), instantiated once for a
// whole program with flash.hpp's drivers: one translation unit defines
// NPULLM_FLASH_KERNELS_INSTANTIATE before including flash.hpp, the others
// NPULLM_FLASH_KERNELS_EXTERN (npullm_kernels in CMakeLists.txt; core/isa.hpp).
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
NPULLM_FK_FORMAT_(float)
NPULLM_FK_FORMAT_(float16)
NPULLM_FK_FORMAT_(bfloat16)
NPULLM_FK_FORMAT_(kv::q8_0)
NPULLM_FK_FORMAT_(kv::q4_0)
#undef NPULLM_FK_FORMAT_
#undef NPULLM_FK_EXTERN_
#endif

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::attention
