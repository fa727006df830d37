// gather (embedding lookup): out[m, :] = table[ids[m], :] as f32.
//   ids [M]; table (V, D) f32, f16 or bf16, or quantized (ops/quant_format.hpp: each selected row
//   dequantized exactly as its format defines it); out (M, D) f32. An id outside [0, V) is
//   out_of_range naming the row, the id and V (out untouched).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/core/tokens.hpp"
#include "npullm/ops/dequantize.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // a loop compiled per ISA: see core/isa.hpp

template <storage_type T>
void gather(std::span<const std::int32_t> ids, dense_view<const T, 2> table,
            dense_view<float, 2> out) {
  if (out.extent(0) != ids.size() || out.extent(1) != table.extent(1)) {
    raise(error_code::invalid_shape, "gather: ", ids.size(), " ids into out ",
          npullm::detail::format_extents(out.extents()), " from table ",
          npullm::detail::format_extents(table.extents()));
  }
  check_token_ids(ids, table.extent(0), "gather:");
  const std::size_t d = table.extent(1);
  for (std::size_t m = 0; m < ids.size(); ++m) {
    const T* src = &table(static_cast<std::size_t>(ids[m]), 0);
    float* dst = &out(m, 0);
    for (std::size_t i = 0; i < d; ++i) dst[i] = to_float(src[i]);
  }
}

inline void gather(std::span<const std::int32_t> ids, const quantized_view& table,
                   dense_view<float, 2> out) {
  if (out.extent(0) != ids.size() || out.extent(1) != table.cols) {
    raise(error_code::invalid_shape, "gather: ", ids.size(), " ids into out ",
          npullm::detail::format_extents(out.extents()), " from ", to_string(table.format),
          " table [", table.rows, ", ", table.cols, "]");
  }
  check_token_ids(ids, table.rows, "gather:");
  for (std::size_t m = 0; m < ids.size(); ++m) {
    dequantize_row(table, static_cast<std::size_t>(ids[m]),
                   std::span<float>(&out(m, 0), table.cols));
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
