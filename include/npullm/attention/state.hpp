// The online-softmax state of one query row: what flash attention carries across KV tiles,
// split-KV partials, pyramid levels and block lists.
//
//   m    the largest score seen so far (-inf before any unmasked key)
//   l    sum over seen keys of exp(s - m)
//   acc  sum over seen keys of exp(s - m) * v          (D floats, caller-owned storage)
//
// Updating with a tile of scores s[j] (masked keys are -inf) and its value rows v[j]:
//   m' = max(m, max_j s[j]);  alpha = exp(m - m');  p[j] = exp(s[j] - m')
//   l' = alpha * l + sum_j p[j];  acc' = alpha * acc + sum_j p[j] v[j]
// -inf cases: while m' is -inf (every key so far masked) nothing changes: computing
// exp(-inf - (-inf)) would give NaN, so it is never computed. Merging is the same rule with
// (m_b, l_b, acc_b) as one "key": two empty states merge to an empty state.
// normalize() divides acc by l; an empty row (l == 0) gives zeros and lse() == -inf.
//
// These rules live in step_max() and merge_weight() below, and only there: softmax_state and
// flash attention's vectorized row update (which keeps m, l, acc of many rows in its own
// arrays) both go through them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::attention {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// One step of the running max: m_old seen so far, then scores whose largest is `candidate`.
struct max_step {
  float m;      // max(m_old, candidate): the new running max
  float alpha;  // exp(m_old - m): the factor for l and acc (0 when m_old was -inf, 1 if m_old == m)
  // false while every key so far is masked (m == -inf): then nothing may be computed or changed.
  [[nodiscard]] bool visible() const noexcept { return m != neg_inf; }
};

[[nodiscard]] inline max_step step_max(float m_old, float candidate) noexcept {
  const float m = std::max(m_old, candidate);
  if (m == m_old) return {m, 1.0f};  // also both -inf: no exp(-inf - (-inf))
  return {m, m_old == neg_inf ? 0.0f : std::exp(m_old - m)};
}

// The weight exp(m_part - m) of a partial state with max m_part folded into a total whose max
// m >= m_part is visible: 0 for an empty partial (m_part == -inf).
[[nodiscard]] inline float merge_weight(float m_part, float m) noexcept {
  return m_part == neg_inf ? 0.0f : std::exp(m_part - m);
}

class softmax_state {
 public:
  // acc: D floats of the caller's; set to zero.
  explicit softmax_state(std::span<float> acc) noexcept : acc_(acc) {
    for (float& a : acc_) a = 0.0f;
  }
  // Resumes from a saved (m, l) with acc already holding its sum.
  softmax_state(float m, float l, std::span<float> acc) noexcept : m_(m), l_(l), acc_(acc) {}

  // scores: [n] (masked keys -inf); v: (n, D) value rows of any storage type.
  template <class V>
  void update(std::span<const float> scores, const V& v) {
    if (v.extent(0) != scores.size() || static_cast<std::size_t>(v.extent(1)) != acc_.size()) {
      raise(error_code::invalid_shape, "softmax_state::update: ", scores.size(),
            " scores with value rows [", v.extent(0), ", ", v.extent(1), "] for D = ", acc_.size());
    }
    float tile_max = neg_inf;
    for (float s : scores) tile_max = std::max(tile_max, s);
    const max_step step = step_max(m_, tile_max);
    if (!step.visible()) return;  // nothing visible yet
    rescale(step);
    for (std::size_t j = 0; j < scores.size(); ++j) {
      if (scores[j] == neg_inf) continue;
      const float p = std::exp(scores[j] - m_);
      l_ += p;
      for (std::size_t d = 0; d < acc_.size(); ++d) acc_[d] += p * to_float(v(j, d));
    }
  }

  // Folds another state over the same row (other keys) into this one.
  void merge(const softmax_state& other) {
    if (other.acc_.size() != acc_.size()) {
      raise(error_code::invalid_shape, "softmax_state::merge: D ", acc_.size(), " and ",
            other.acc_.size());
    }
    const max_step step = step_max(m_, other.m_);
    if (!step.visible()) return;  // both empty
    rescale(step);
    const float beta = merge_weight(other.m_, m_);
    l_ += beta * other.l_;
    for (std::size_t d = 0; d < acc_.size(); ++d) acc_[d] += beta * other.acc_[d];
  }

  // acc /= l: the attention output of the row (zeros when no key was visible).
  void normalize() noexcept {
    const float inv = l_ > 0.0f ? 1.0f / l_ : 0.0f;
    for (float& a : acc_) a *= inv;
  }

  // log sum_j exp(s_j): -inf when no key was visible.
  [[nodiscard]] float lse() const noexcept { return l_ > 0.0f ? m_ + std::log(l_) : neg_inf; }
  [[nodiscard]] float max() const noexcept { return m_; }
  [[nodiscard]] float sum() const noexcept { return l_; }
  [[nodiscard]] std::span<float> acc() const noexcept { return acc_; }
  [[nodiscard]] bool empty() const noexcept { return m_ == neg_inf; }

 private:
  void rescale(const max_step& step) noexcept {
    if (step.m == m_) return;
    l_ *= step.alpha;
    for (float& a : acc_) a *= step.alpha;
    m_ = step.m;
  }

  float m_ = neg_inf;
  float l_ = 0.0f;
  std::span<float> acc_;
};

}  // namespace npullm::attention
