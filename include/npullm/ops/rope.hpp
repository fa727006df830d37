// Rotary position embedding, rotate-half ("neox") style as Qwen2 and Llama use.
//
// For a head vector x of head_dim d (even), half = d / 2, position p and
// inv_freq[i] = theta^(-2i / d):
//   y[i]        = x[i] cos(p f_i) - x[i + half] sin(p f_i)
//   y[i + half] = x[i + half] cos(p f_i) + x[i] sin(p f_i)      for i < half
// rope_table caches cos/sin for positions [0, max_positions) (computed in double, stored f32);
// apply_rope rotates x (M, heads, head_dim) in place with one position per row.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {

class rope_table {
 public:
  rope_table(std::size_t head_dim, double theta, std::size_t max_positions)
      : head_dim_(head_dim), max_positions_(max_positions) {
    if (head_dim == 0 || head_dim % 2 != 0 || !(theta > 1.0) || max_positions == 0) {
      raise(error_code::invalid_argument, "rope_table: head_dim ", head_dim,
            " must be even and > 0, theta ", theta, " > 1, max_positions ", max_positions, " > 0");
    }
    const std::size_t half = head_dim / 2;
    cos_.resize(max_positions * half);
    sin_.resize(max_positions * half);
    for (std::size_t p = 0; p < max_positions; ++p) {
      for (std::size_t i = 0; i < half; ++i) {
        const double inv_freq =
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const double angle = static_cast<double>(p) * inv_freq;
        cos_[p * half + i] = static_cast<float>(std::cos(angle));
        sin_[p * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  }

  [[nodiscard]] std::size_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::size_t max_positions() const noexcept { return max_positions_; }
  [[nodiscard]] const float* cos(std::size_t p) const noexcept {
    return cos_.data() + p * head_dim_ / 2;
  }
  [[nodiscard]] const float* sin(std::size_t p) const noexcept {
    return sin_.data() + p * head_dim_ / 2;
  }

 private:
  std::size_t head_dim_;
  std::size_t max_positions_;
  std::vector<float> cos_, sin_;  // (max_positions, head_dim / 2)
};

// x: (M, heads, head_dim), rotated in place; positions: [M].
template <class Layout>
void apply_rope(const tensor_view<float, dextents<3>, Layout>& x,
                std::span<const std::int64_t> positions, const rope_table& table) {
  if (x.extent(2) != table.head_dim() || positions.size() != x.extent(0)) {
    raise(error_code::invalid_shape, "apply_rope: x ", npullm::detail::format_extents(x.extents()),
          " with ", positions.size(), " positions and head_dim ", table.head_dim());
  }
  if (x.stride(2) != 1) raise(error_code::unsupported, "apply_rope: head_dim must be dense");
  const std::size_t half = table.head_dim() / 2;
  for (std::size_t m = 0; m < x.extent(0); ++m) {
    const std::int64_t p = positions[m];
    if (p < 0 || static_cast<std::size_t>(p) >= table.max_positions()) {
      raise(error_code::out_of_range, "apply_rope: position ", p, " of row ", m, " outside [0, ",
            table.max_positions(), ")");
    }
    const float* c = table.cos(static_cast<std::size_t>(p));
    const float* s = table.sin(static_cast<std::size_t>(p));
    for (std::size_t h = 0; h < x.extent(1); ++h) {
      float* v = &x(m, h, 0);
      for (std::size_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

inline void apply_rope(dense_view<float, 3> x, std::span<const std::int64_t> positions,
                       const rope_table& table) {
  apply_rope<layout_right>(x, positions, table);
}

}  // namespace npullm::ops
