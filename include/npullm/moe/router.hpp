// router: a mixture of experts' choice per token, and the tokens grouped by expert.
//
//   route(logits, k, normalize, out)      logits (rows, experts) f32 -> out.experts / .weights
//                                         (rows, k): p = softmax(logits row), the k largest p in
//                                         descending order (equal p: the lower expert first),
//                                         w = p, or p / (sum of the k p) when normalize
//   group_by_expert(r, experts, out)      the (row, slot) pairs of r ordered by expert: expert
//                                         e's rows are out.rows[out.offsets[e] ..
//                                         out.offsets[e + 1]), ascending, with their weights
//
// The softmax runs in f32 with the row's max subtracted and the sum in double: -inf logits get
// p = 0 (and are chosen only when fewer than k experts are finite, then in index order); a
// row of NaN or all -inf is invalid_argument naming the row (nothing in `out` is meaningful
// then). Why ties go to the lower index: torch.topk and llama.cpp's argsort agree on it for the
// values that occur, and one fixed rule makes a run reproducible across thread counts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::moe {

// The chosen experts of each row: (rows, k), row-major; and how close each row's choice was:
// margin = p of the k-th chosen expert minus the largest p left out (1 when k = experts), the
// change in probabilities that would swap them.
struct routing {
  std::size_t rows = 0, k = 0;
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
  std::vector<float> margins;  // [rows]
};

// Rows grouped by expert (a permutation of the (row, slot) pairs; see the top).
struct expert_groups {
  std::vector<std::size_t> offsets;  // [experts + 1]
  std::vector<std::int32_t> rows;    // [rows * k]
  std::vector<float> weights;        // [rows * k]

  [[nodiscard]] std::size_t count(std::size_t e) const noexcept {
    return offsets[e + 1] - offsets[e];
  }
};

template <class L>
void route(const tensor_view<const float, dextents<2>, L>& logits, std::size_t k, bool normalize,
           routing& out) {
  const std::size_t rows = logits.extent(0), n = logits.extent(1);
  if (k == 0 || k > n) {
    raise(error_code::invalid_argument, "moe::route: k = ", k, " of ", n,
          " experts (want 1 <= k <= experts)");
  }
  out.rows = rows;
  out.k = k;
  out.experts.resize(rows * k);
  out.weights.resize(rows * k);
  out.margins.resize(rows);
  std::vector<float> p(n);
  std::vector<std::int32_t> order(n);
  for (std::size_t r = 0; r < rows; ++r) {
    float mx = -std::numeric_limits<float>::infinity();
    for (std::size_t e = 0; e < n; ++e) {
      const float v = logits(r, e);
      if (std::isnan(v)) {
        raise(error_code::invalid_argument, "moe::route: row ", r, " has a NaN logit (expert ", e,
              ")");
      }
      mx = std::max(mx, v);
    }
    if (mx == -std::numeric_limits<float>::infinity() ||
        mx == std::numeric_limits<float>::infinity()) {
      raise(error_code::invalid_argument, "moe::route: row ", r, " has ",
            mx > 0 ? "an +inf logit" : "every logit -inf");
    }
    double sum = 0;
    for (std::size_t e = 0; e < n; ++e) {
      p[e] = std::exp(logits(r, e) - mx);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::size_t e = 0; e < n; ++e) {
      p[e] *= inv;
      order[e] = static_cast<std::int32_t>(e);
    }
    // The k largest, descending; equal probabilities keep index order.
    std::partial_sort(
        order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
        [&](std::int32_t a, std::int32_t b) {
          return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)] ||
                 (p[static_cast<std::size_t>(a)] == p[static_cast<std::size_t>(b)] && a < b);
        });
    float left_out = 0;  // the best p not chosen
    for (std::size_t j = k; j < n; ++j)
      left_out = std::max(left_out, p[static_cast<std::size_t>(order[j])]);
    out.margins[r] = k == n ? 1.0f : p[static_cast<std::size_t>(order[k - 1])] - left_out;
    double chosen = 0;
    for (std::size_t j = 0; j < k; ++j) chosen += p[static_cast<std::size_t>(order[j])];
    const float scale = normalize ? static_cast<float>(1.0 / chosen) : 1.0f;
    for (std::size_t j = 0; j < k; ++j) {
      out.experts[r * k + j] = order[j];
      out.weights[r * k + j] = p[static_cast<std::size_t>(order[j])] * scale;
    }
  }
}

inline void group_by_expert(const routing& r, std::size_t experts, expert_groups& out) {
  out.offsets.assign(experts + 1, 0);
  for (const std::int32_t e : r.experts) {
    if (e < 0 || static_cast<std::size_t>(e) >= experts) {
      raise(error_code::invalid_argument, "moe::group_by_expert: expert ", e, " of ", experts);
    }
    ++out.offsets[static_cast<std::size_t>(e) + 1];
  }
  for (std::size_t e = 0; e < experts; ++e) out.offsets[e + 1] += out.offsets[e];
  out.rows.resize(r.experts.size());
  out.weights.resize(r.experts.size());
  std::vector<std::size_t> next(out.offsets.begin(), out.offsets.end() - 1);
  for (std::size_t row = 0; row < r.rows; ++row) {  // ascending rows within each expert
    for (std::size_t j = 0; j < r.k; ++j) {
      const auto e = static_cast<std::size_t>(r.experts[row * r.k + j]);
      out.rows[next[e]] = static_cast<std::int32_t>(row);
      out.weights[next[e]] = r.weights[row * r.k + j];
      ++next[e];
    }
  }
}

}  // namespace npullm::moe
