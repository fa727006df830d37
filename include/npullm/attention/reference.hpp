// Plain scaled-dot-product attention in double precision: the oracle for every attention test.
//
//   q    (q_heads, q_len, D)     any element type readable as float
//   k, v (kv_heads, kv_len, D)   any element type readable as float (f16/bf16 through a
//                                converting view, or the exact floats the storage holds)
//   out  (q_heads, q_len, D)     double
//   lse  (q_heads, q_len)        double, optional (an empty view skips it)
// Query head h reads KV head h / (q_heads / kv_heads) (GQA/MQA). Scores are scale * q . k over
// the keys the mask leaves visible; a row with none gives zeros and lse = -inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "npullm/attention/mask.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::attention {

template <class Q, class K, class V, mask_policy Mask>
void reference_attention(const Q& q, const K& k, const V& v, const Mask& mask, double scale,
                         dense_view<double, 3> out, dense_view<double, 2> lse = {}) {
  const std::size_t q_heads = q.extent(0), q_len = q.extent(1), dim = q.extent(2);
  const std::size_t kv_heads = k.extent(0), kv_len = k.extent(1);
  if (kv_heads == 0 || q_heads % kv_heads != 0 || k.extent(2) != dim || v.extent(0) != kv_heads ||
      v.extent(1) != kv_len || v.extent(2) != dim || out.extent(0) != q_heads ||
      out.extent(1) != q_len || out.extent(2) != dim) {
    raise(error_code::invalid_shape, "reference_attention: q ",
          npullm::detail::format_extents(q.extents()), ", k ",
          npullm::detail::format_extents(k.extents()), ", v ",
          npullm::detail::format_extents(v.extents()), ", out ",
          npullm::detail::format_extents(out.extents()));
  }
  const std::size_t group = q_heads / kv_heads;
  // One query row and its output row in double, read and written through the views once.
  std::vector<double> scores(kv_len), qi(dim), o(dim);
  for (std::size_t h = 0; h < q_heads; ++h) {
    const std::size_t hk = h / group;
    for (std::size_t i = 0; i < q_len; ++i) {
      for (std::size_t d = 0; d < dim; ++d) qi[d] = static_cast<double>(q(h, i, d));
      double m = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < kv_len; ++j) {
        if (!mask.visible(i, j)) {
          scores[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double s = 0;
        for (std::size_t d = 0; d < dim; ++d) s += qi[d] * static_cast<double>(k(hk, j, d));
        scores[j] = s * scale;
        m = std::max(m, scores[j]);
      }
      std::fill(o.begin(), o.end(), 0.0);
      double l = 0;
      if (m != -std::numeric_limits<double>::infinity()) {
        for (std::size_t j = 0; j < kv_len; ++j) {
          if (scores[j] == -std::numeric_limits<double>::infinity()) continue;
          const double p = std::exp(scores[j] - m);
          l += p;
          for (std::size_t d = 0; d < dim; ++d) o[d] += p * static_cast<double>(v(hk, j, d));
        }
        for (std::size_t d = 0; d < dim; ++d) o[d] /= l;
      }
      for (std::size_t d = 0; d < dim; ++d) out(h, i, d) = o[d];
      if (lse.data_handle() != nullptr) lse(h, i) = m + (l > 0 ? std::log(l) : 0.0);
    }
  }
}

}  // namespace npullm::attention
