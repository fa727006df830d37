// tiled_products: several products y_i = x_i W_i^T over repacked tiles (ops::repack), run as ONE
// parallel job split over all their tiles together (not one fork per product), with x quantized
// by the caller once and shared by every product that reads it:
//
//   ops::tile_activations xa;                       // kept between calls: no allocation per call
//   ops::quantize_for_tiles(x, xa);                 // x (M, K) f32 -> int8 codes per 32 values
//   const ops::tiled_product ps[] = {{&gate, &xa, 0, M, g, ff}, {&up, &xa, 0, M, u, ff}};
//   ops::run_tiled_products(ps, policy);            // g, u (M, ff) = x gate^T, x up^T
//
//   tiled_product  w: W (N, K) repacked; rows [m0, m0 + m) of x (x->k == K, m <= 16 is what
//                  the tiles are read at the memory's pace for); y: (m, N) f32, row stride ldy;
//                  bias: N floats added to each row (optional)
//   gather_tile_rows(x, rows, out)   out's row i = x's row rows[i] (the same codes and scales:
//                                    a gathered row's products equal the source row's)
//
// Why: a mixture of experts' decode step multiplies one token by 2 x k small matrices (Qwen2-MoE
// 1B: 4 experts' gate and up of 512 x 1024, and the shared expert's of 2048 x 1024), then by as
// many down matrices. As separate linear calls each quantizes x again and forks and joins the
// pool for 0.5 MB; here a layer's gate and up products are one job and its down products one.
//
// Parts: policy.concurrency() x 8 (linear's decode split), equal shares of all the products'
// tile bytes in list order, each a run of contiguous tiles (one memory stream, running from one
// product's last tile into the next's first). Every output is one tile_rows call's over the same
// activations linear quantizes, so y equals linear(x rows, W's tiles)'s bit for bit whatever
// the split: results do not depend on the thread count. Everything is checked before anything
// is written (invalid_shape naming the product; unsupported for a format without tiles here).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/quant_linear.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {

// x's rows as the tiled kernel reads them (codes, block scales, block sums).
using tile_activations = detail::quantized_activations;

struct tiled_product {
  const repacked_quantized* w = nullptr;
  const tile_activations* x = nullptr;
  std::size_t m0 = 0, m = 0;  // rows [m0, m0 + m) of *x
  float* y = nullptr;         // (m, w->rows()), row stride ldy
  std::size_t ldy = 0;
  const float* bias = nullptr;  // [w->rows()] added to every row of y (nullptr: none)
};

// x (M, K) f32, K a multiple of 32 (invalid_shape otherwise), rows dense. Rows are split over
// the policy's threads only when there are many (as in linear).
template <threading_policy Policy = serial>
void quantize_for_tiles(dense_view<const float, 2> x, tile_activations& out,
                        const Policy& policy = {}) {
  const std::size_t m = x.extent(0), k = x.extent(1);
  if (k % 32 != 0) {
    raise(error_code::invalid_shape, "quantize_for_tiles: x (", m, ", ", k,
          "): K must be a multiple of 32");
  }
  detail::quantize_activations(x.data_handle(), k, m, k, false, false, out, -1, policy);
}

// out's row i = x's row rows[i] (rows in [0, x.m), else invalid_argument naming it).
inline void gather_tile_rows(const tile_activations& x, std::span<const std::int32_t> rows,
                             tile_activations& out) {
  const std::size_t n = rows.size(), k = x.k, b = x.blocks;
  for (std::size_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || static_cast<std::size_t>(rows[i]) >= x.m) {
      raise(error_code::invalid_argument, "gather_tile_rows: row ", rows[i], " (entry ", i, ") of ",
            x.m);
    }
  }
  out.m = n;
  out.k = k;
  out.blocks = b;
  out.bpad = x.bpad;
  out.codes.resize(n * k);
  out.d.resize(n * b);
  out.tot.resize(n * b);
  out.qsum.resize(n * b * 2);
  out.sums.clear();  // (the GEMV's forms: not read by the tiles)
  out.dpad.clear();
  out.corr.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    std::copy_n(x.codes.data() + r * k, k, out.codes.data() + i * k);
    std::copy_n(x.d.data() + r * b, b, out.d.data() + i * b);
    std::copy_n(x.tot.data() + r * b, b, out.tot.data() + i * b);
    std::copy_n(x.qsum.data() + r * b * 2, b * 2, out.qsum.data() + i * b * 2);
  }
}

template <threading_policy Policy = serial>
void run_tiled_products(std::span<const tiled_product> ps, const Policy& policy = {}) {
  using detail::repack_access;
  std::size_t total = 0, tiles = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const tiled_product& p = ps[i];
    if (p.w == nullptr || p.x == nullptr || (p.m != 0 && p.y == nullptr)) {
      raise(error_code::invalid_argument, "run_tiled_products: product ", i,
            " lacks its matrix, activations or output");
    }
    if (p.w->cols() != p.x->k || p.m0 + p.m > p.x->m || (p.m > 1 && p.ldy < p.w->rows())) {
      raise(error_code::invalid_shape, "run_tiled_products: product ", i, ": W [", p.w->rows(),
            ", ", p.w->cols(), "], x rows [", p.m0, ", ", p.m0 + p.m, ") of (", p.x->m, ", ",
            p.x->k, "), ldy ", p.ldy, " (want K = x's K, rows within x, ldy >= N)");
    }
    if (detail::tile_span_for(p.w->format()) == nullptr) {
      raise(error_code::unsupported, "run_tiled_products: product ", i, ": ",
            to_string(p.w->format()), " has no tiles in this build");
    }
    if (p.m == 0) continue;
    total += repack_access::tiles(*p.w) * repack_access::tile_bytes(*p.w);
    tiles += repack_access::tiles(*p.w);
  }
  if (total == 0) return;
  const std::size_t parts = std::min(tiles, policy.concurrency() * 8);
  policy.parallel_for(parts, [&](std::size_t part) {
    // Bytes [lo, hi) of the products' tiles laid end to end: the tiles that start there.
    const std::size_t lo = chunk_begin(total, parts, part),
                      hi = chunk_begin(total, parts, part + 1);
    std::size_t base = 0;
    for (const tiled_product& p : ps) {
      if (p.m == 0) continue;
      const std::size_t tb = repack_access::tile_bytes(*p.w), n = repack_access::tiles(*p.w);
      const auto first_at = [&](std::size_t at) {  // the first tile starting at or after `at`
        return at <= base ? 0 : std::min(n, (at - base + tb - 1) / tb);
      };
      const std::size_t t0 = first_at(lo), t1 = first_at(hi);
      if (t0 < t1) {
        detail::tile_span_for(p.w->format())(*p.w, *p.x, p.m0, p.m, t0, t1, p.bias, p.y, p.ldy);
      }
      base += n * tb;
      if (base >= hi) break;
    }
  });
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
