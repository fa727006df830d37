// The one argmax of the library (greedy decoding, verification, samplers): the first index of
// the largest value. NaN is never chosen unless every value is NaN, then 0; -inf is chosen
// only when every other value is -inf or NaN.
//
//   argmax(std::span<const float> logits)      one row; empty is invalid_shape
//   argmax(x (M, N), out (M))                  every row; N = 0 is invalid_shape
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // a loop compiled per ISA: see core/isa.hpp

inline std::int32_t argmax(std::span<const float> x) {
  if (x.empty()) raise(error_code::invalid_shape, "argmax: no values");
  std::size_t best = 0;
  float best_v = x[0];
  for (std::size_t i = 1; i < x.size(); ++i) {
    const float v = x[i];
    if (v > best_v || (std::isnan(best_v) && !std::isnan(v))) {
      best = i;
      best_v = v;
    }
  }
  return static_cast<std::int32_t>(best);
}

inline void argmax(dense_view<const float, 2> x, std::span<std::int32_t> out) {
  if (out.size() != x.extent(0) || x.extent(1) == 0) {
    raise(error_code::invalid_shape, "argmax: x ", npullm::detail::format_extents(x.extents()),
          " into ", out.size(), " indices");
  }
  for (std::size_t m = 0; m < x.extent(0); ++m) out[m] = argmax({&x(m, 0), x.extent(1)});
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
