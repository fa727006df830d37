// softmax over each row of x (M, N), in place. -inf entries get probability 0; a row of only
// -inf becomes all zeros (no NaN).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {  // a loop compiled per ISA: see core/isa.hpp

inline void softmax(dense_view<float, 2> x) {
  for (std::size_t m = 0; m < x.extent(0); ++m) {
    float* row = &x(m, 0);
    const std::size_t n = x.extent(1);
    float mx = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < n; ++i) mx = std::max(mx, row[i]);
    if (mx == -std::numeric_limits<float>::infinity()) {
      for (std::size_t i = 0; i < n; ++i) row[i] = 0.0f;
      continue;
    }
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      row[i] = std::exp(row[i] - mx);
      sum += row[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::size_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
