// argmax of each row of x (M, N): the first index of the largest value (NaN is never chosen
// unless the row is all NaN, then 0). N = 0 is invalid_shape.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {

inline void argmax(dense_view<const float, 2> x, std::span<std::int32_t> out) {
  if (out.size() != x.extent(0) || x.extent(1) == 0) {
    raise(error_code::invalid_shape, "argmax: x ", npullm::detail::format_extents(x.extents()),
          " into ", out.size(), " indices");
  }
  for (std::size_t m = 0; m < x.extent(0); ++m) {
    std::size_t best = 0;
    float best_v = x(m, 0);
    for (std::size_t i = 1; i < x.extent(1); ++i) {
      const float v = x(m, i);
      if (v > best_v || (std::isnan(best_v) && !std::isnan(v))) {
        best = i;
        best_v = v;
      }
    }
    out[m] = static_cast<std::int32_t>(best);
  }
}

}  // namespace npullm::ops
