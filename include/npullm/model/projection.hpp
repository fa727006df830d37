// projection: a weight matrix (N, K) as the pipeline runs it (dense in W, or a checked view of
// its quantized blocks, plus the packed copy or tiles a pipeline made of it) and its products:
// project (y = x W^T + bias, dispatched at run time to W's linear or the format's quantized
// kernel), project_together (several matrices over the same x as one parallel job over their
// tiles), row_range (rows of a fused matrix, zero-copy), gather_rows (the embedding gather).
// model_weights (weights.hpp) holds them; the MoE MLP (moe/mlp.hpp) runs its experts' through
// them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"
#include "npullm/ops/tiled_products.hpp"

namespace npullm::model {

// A weight matrix (N, K): dense in W as stored, or quantized (a checked view of its blocks,
// zero-copy into a GGUF / quantized safetensors mapping, or owned by the weights when quantized
// or row-permuted at load), plus the packed copy that linear reads instead when there is one
// (owned by the pipeline that packs: ops::packed_weights for a dense W, ops::packed_quantized's
// int8 panels for a quantized one, read by steps of more than 16 rows). The per-tensor unit:
// project() dispatches on it at run time to W's dense linear or one of the quantized kernels.
template <storage_type W>
struct projection {
  dense_view<const W, 2> w;  // (N, K); empty when quantized
  const ops::packed_weights<W>* packed = nullptr;
  std::optional<ops::quantized_view> quantized;
  const ops::packed_quantized* packed_quantized = nullptr;  // of *quantized
  const ops::repacked_quantized* repacked = nullptr;        // of *quantized: its tiles

  [[nodiscard]] bool is_quantized() const noexcept { return quantized.has_value(); }
  [[nodiscard]] std::size_t rows() const noexcept {
    return quantized ? quantized->rows : w.extent(0);
  }
  [[nodiscard]] std::size_t cols() const noexcept {
    return quantized ? quantized->cols : w.extent(1);
  }
  // The first stored byte: identifies the tensor (a tied LM head has its embedding's).
  [[nodiscard]] const void* identity() const noexcept {
    return quantized ? static_cast<const void*>(quantized->data.data())
                     : static_cast<const void*>(w.data_handle());
  }
  // Bytes a product with it reads (data and scales).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return quantized ? quantized->data.size() + quantized->scales.size() : w.size() * sizeof(W);
  }
};

// Rows [r0, r1) of a matrix, zero-copy (Phi-3's fused projections).
template <storage_type W>
projection<W> row_range(const projection<W>& p, std::size_t r0, std::size_t r1) {
  projection<W> out;
  if (!p.quantized) {
    out.w = rows(p.w, r0, r1);
    return out;
  }
  const ops::quantized_view& q = *p.quantized;
  const std::size_t rb = q.row_bytes();
  const auto data = q.data.subspan(r0 * rb, (r1 - r0) * rb);
  if (ops::is_block_format(q.format)) {
    out.quantized.emplace(q.format, r1 - r0, q.cols, data);
  } else {
    const std::size_t sb = q.groups() * size_of(q.scale_type);
    out.quantized.emplace(q.format, r1 - r0, q.cols, data,
                          q.scales.subspan(r0 * sb, (r1 - r0) * sb), q.group, q.scale_type);
  }
  return out;
}

// y = x W^T (+ bias): the quantized kernel of the matrix's format (over its tiles when repacked,
// except steps of more than 16 rows where there are panels too; over its panels when packed),
// else W's linear through the packed copy when there is one.
template <storage_type W, threading_policy Policy>
void project(dense_view<const float, 2> x, const projection<W>& p, dense_view<float, 2> y,
             std::span<const float> bias, const Policy& policy) {
  if (p.repacked != nullptr && (p.packed_quantized == nullptr || x.extent(0) <= 16)) {
    ops::linear(x, *p.repacked, y, bias, policy);
  } else if (p.packed_quantized != nullptr) {
    ops::linear(x, *p.packed_quantized, y, bias, policy);
  } else if (p.quantized) {
    ops::linear(x, *p.quantized, y, bias, policy);
  } else if (p.packed != nullptr) {
    ops::linear<W>(x, *p.packed, y, bias, policy);
  } else {
    ops::linear<W>(x, p.w, y, bias, policy);
  }
}

// One of several projections of the same x (project_together).
template <storage_type W>
struct projection_into {
  const projection<W>* p;
  dense_view<float, 2> y;
  std::span<const float> bias;
};

// y_i = x W_i^T (+ bias_i) for projections that all read x (Q, K and V; gate and up). Where
// every one has tiles and x has at most 16 rows (a decode step, a small batch or a speculative
// verification), x is quantized once and all run as ONE parallel job over their tiles
// (ops/tiled_products.hpp): one fork and join instead of one per matrix, the threads' parts
// split over all their bytes. Each y equals project()'s bit for bit either way (the same
// tile kernel over the same quantized x), so nothing depends on which path ran.
template <storage_type W, threading_policy Policy>
void project_together(dense_view<const float, 2> x, std::span<const projection_into<W>> outs,
                      const Policy& policy) {
  const std::size_t m = x.extent(0);
  for (std::size_t i = 0; i < outs.size(); ++i) {  // all checked before any is written
    const projection_into<W>& o = outs[i];
    if (o.p == nullptr || o.p->cols() != x.extent(1) || o.y.extent(0) != m ||
        o.y.extent(1) != o.p->rows() || (!o.bias.empty() && o.bias.size() != o.p->rows())) {
      raise(error_code::invalid_shape, "project_together: projection ", i, ": x (", m, ", ",
            x.extent(1), "), W [", o.p ? o.p->rows() : 0, ", ", o.p ? o.p->cols() : 0, "], y (",
            o.y.extent(0), ", ", o.y.extent(1), "), bias [", o.bias.size(),
            "] (want y (M, N), bias empty or [N])");
    }
  }
  constexpr std::size_t most = 4;
  bool together = m >= 1 && m <= 16 && outs.size() >= 2 && outs.size() <= most &&
                  x.stride(1) == 1 && static_cast<std::size_t>(x.stride(0)) == x.extent(1) &&
                  x.extent(1) % 32 == 0;
  for (const projection_into<W>& o : outs) {
    together = together && o.p->repacked != nullptr && o.y.stride(1) == 1;
  }
  if (!together) {
    for (const projection_into<W>& o : outs) project(x, *o.p, o.y, o.bias, policy);
    return;
  }
  thread_local ops::tile_activations xa;  // (kept: no allocation per step)
  ops::quantize_for_tiles(x, xa);
  std::array<ops::tiled_product, most> ps{};
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const projection_into<W>& o = outs[i];
    ps[i] = {.w = o.p->repacked,
             .x = &xa,
             .m0 = 0,
             .m = m,
             .y = o.y.data_handle(),
             .ldy = static_cast<std::size_t>(o.y.stride(0)),
             .bias = o.bias.empty() ? nullptr : o.bias.data()};
  }
  ops::run_tiled_products(std::span<const ops::tiled_product>(ps.data(), outs.size()), policy);
}

// Rows ids of a (vocab, hidden) matrix as f32 (the embedding gather): quantized rows are
// dequantized as their format defines them.
template <storage_type W>
void gather_rows(std::span<const std::int32_t> ids, const projection<W>& table,
                 dense_view<float, 2> out) {
  if (table.quantized) {
    ops::gather(ids, *table.quantized, out);
  } else {
    ops::gather<W>(ids, table.w, out);
  }
}

}  // namespace npullm::model
