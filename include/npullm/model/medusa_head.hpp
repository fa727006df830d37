// medusa_head: Medusa-style draft heads over a target's final norm and LM head, a draft_head
// for batch::head_draft (batch/speculative.hpp). Model math, so it lives in model/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/rms_norm.hpp"

namespace npullm::model {

// Medusa-style heads over a target's final norm and LM head (views of its weights, which must
// outlive the head): head i maps the pre-norm hidden row h to
//   logits_i = lm_head(rms_norm(h + silu(w_i h)))          w_i (hidden, hidden), own weights
// w_i = 0 gives the target's own next-token logits (Medusa's start before training).
template <storage_type W>
class medusa_head {
 public:
  medusa_head(dense_view<const W, 1> final_norm, dense_view<const W, 2> lm_head, float eps,
              std::vector<tensor<float, 2>> w)
      : norm_(final_norm), lm_head_(lm_head), eps_(eps), w_(std::move(w)) {
    const std::size_t h = lm_head.extent(1);
    if (final_norm.extent(0) != h) {
      raise(error_code::invalid_shape, "medusa_head: final norm of ", final_norm.extent(0),
            " for an LM head of hidden size ", h);
    }
    if (w_.empty()) raise(error_code::invalid_argument, "medusa_head: no heads");
    for (std::size_t i = 0; i < w_.size(); ++i) {
      if (w_[i].extent(0) != h || w_[i].extent(1) != h) {
        raise(error_code::invalid_shape, "medusa_head: head ", i, " is ",
              npullm::detail::format_extents(w_[i].view().extents()), ", not (", h, ", ", h, ")");
      }
    }
  }
  [[nodiscard]] std::size_t heads() const noexcept { return w_.size(); }
  [[nodiscard]] std::size_t vocab() const noexcept { return lm_head_.extent(0); }
  [[nodiscard]] std::size_t hidden_size() const noexcept { return lm_head_.extent(1); }

  [[nodiscard]] std::vector<float> logits(std::span<const float> hidden, std::size_t i) const {
    const std::size_t h = hidden_size();
    if (i >= heads() || hidden.size() != h) {
      raise(error_code::out_of_range, "medusa_head: head ", i, " of ", heads(), ", hidden row of ",
            hidden.size(), " for hidden size ", h);
    }
    tensor<float, 2> x(1, h), y(1, h);  // (1, hidden)
    std::copy(hidden.begin(), hidden.end(), x.data());
    ops::linear<float>(std::as_const(x).view(), w_[i].view(), y.view());
    for (std::size_t j = 0; j < h; ++j) {
      const float v = y.data()[j];
      x.data()[j] += v / (1.0f + std::exp(-v));
    }
    ops::rms_norm<W>(std::as_const(x).view(), norm_, eps_, x.view());
    std::vector<float> out(vocab());
    ops::linear<W>(std::as_const(x).view(), lm_head_, dense_view<float, 2>(out.data(), 1, vocab()));
    return out;
  }

 private:
  dense_view<const W, 1> norm_;
  dense_view<const W, 2> lm_head_;
  float eps_;
  std::vector<tensor<float, 2>> w_;
};

}  // namespace npullm::model

