#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "npullm/attention/mask.hpp"
#include "npullm/attention/state.hpp"
#include "npullm/core/slice.hpp"

namespace {

using namespace npullm::attention;

TEST(SoftmaxState, UpdateMatchesDirectSoftmax) {
  std::vector<float> acc(2);
  softmax_state st(acc);
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};  // (3 keys, D = 2)
  npullm::dense_view<const float, 2> vv(v.data(), 3, 2);
  const std::vector<float> scores = {0.5f, neg_inf, 2.0f};
  st.update(scores, vv);
  st.normalize();
  const double e0 = std::exp(0.5), e2 = std::exp(2.0);
  EXPECT_NEAR(acc[0], (e0 * 1 + e2 * 5) / (e0 + e2), 1e-6);
  EXPECT_NEAR(acc[1], (e0 * 2 + e2 * 6) / (e0 + e2), 1e-6);
  EXPECT_NEAR(st.lse(), std::log(e0 + e2), 1e-6);
}

TEST(SoftmaxState, MergeEqualsOnePass) {
  const std::vector<float> v = {1, -1, 2, 0, 3, 5, -2, 4};  // (4 keys, D = 2)
  npullm::dense_view<const float, 2> vv(v.data(), 4, 2);
  const std::vector<float> scores = {3.0f, -1.0f, 10.0f, 0.25f};
  std::vector<float> one(2), a(2), b(2);
  softmax_state whole(one), left(a), right(b);
  whole.update(scores, vv);
  left.update(std::span(scores).first(2), npullm::rows(vv, 0, 2));
  right.update(std::span(scores).last(2), npullm::rows(vv, 2, 4));
  left.merge(right);
  whole.normalize();
  left.normalize();
  EXPECT_NEAR(left.acc()[0], one[0], 1e-6);
  EXPECT_NEAR(left.acc()[1], one[1], 1e-6);
  EXPECT_NEAR(left.lse(), whole.lse(), 1e-6);
}

TEST(SoftmaxState, EmptyStatesAreSafe) {
  std::vector<float> a(3, 7.0f), b(3, 7.0f);
  softmax_state x(a), y(b);
  x.merge(y);  // two empty states: still empty, no NaN
  EXPECT_TRUE(x.empty());
  const std::vector<float> masked = {neg_inf, neg_inf};
  const std::vector<float> v(6, 1.0f);
  x.update(masked, npullm::dense_view<const float, 2>(v.data(), 2, 3));
  x.normalize();
  for (float f : a) EXPECT_EQ(f, 0.0f);
  EXPECT_EQ(x.lse(), neg_inf);
  // Merging an empty state into a full one changes nothing.
  std::vector<float> c(3);
  softmax_state full(c);
  const std::vector<float> s = {1.0f};
  full.update(s, npullm::dense_view<const float, 2>(v.data(), 1, 3));
  const float lse = full.lse();
  full.merge(x);
  EXPECT_EQ(full.lse(), lse);
}

// The -inf rules every online-softmax update goes through (softmax_state and flash's row
// update): no exp(-inf - (-inf)), nothing accumulated before the first visible key.
TEST(SoftmaxState, StepMaxRules) {
  const max_step none = step_max(neg_inf, neg_inf);  // every key so far masked
  EXPECT_FALSE(none.visible());
  EXPECT_FALSE(std::isnan(none.alpha));
  const max_step first = step_max(neg_inf, 2.0f);  // first visible key: old sums are empty
  EXPECT_TRUE(first.visible());
  EXPECT_EQ(first.m, 2.0f);
  EXPECT_EQ(first.alpha, 0.0f);
  const max_step same = step_max(2.0f, 1.0f);  // max unchanged: nothing rescaled
  EXPECT_EQ(same.m, 2.0f);
  EXPECT_EQ(same.alpha, 1.0f);
  const max_step up = step_max(1.0f, 3.0f);
  EXPECT_EQ(up.m, 3.0f);
  EXPECT_FLOAT_EQ(up.alpha, std::exp(-2.0f));
  EXPECT_EQ(merge_weight(neg_inf, 1.0f), 0.0f);  // an empty partial adds nothing
  EXPECT_FLOAT_EQ(merge_weight(0.5f, 1.0f), std::exp(-0.5f));
}

TEST(SoftmaxState, LargeScoresDoNotOverflow) {
  std::vector<float> acc(1);
  softmax_state st(acc);
  const std::vector<float> v = {1.0f, 3.0f};
  const std::vector<float> s = {1e4f, 1e4f};
  st.update(s, npullm::dense_view<const float, 2>(v.data(), 2, 1));
  st.normalize();
  EXPECT_FLOAT_EQ(acc[0], 2.0f);
  EXPECT_FLOAT_EQ(st.lse(), 1e4f + std::log(2.0f));
}

TEST(SoftmaxState, ShapeMismatchThrows) {
  std::vector<float> acc(2), v(3);
  softmax_state st(acc);
  const std::vector<float> s = {1.0f};
  EXPECT_THROW(st.update(s, npullm::dense_view<const float, 2>(v.data(), 1, 3)), npullm::error);
}

// classify() must agree with visible() on every element: hidden -> none visible,
// visible -> all visible.
template <class Mask>
void expect_classify_consistent(const Mask& m, std::size_t q_len, std::size_t kv_len) {
  for (std::size_t i0 = 0; i0 < q_len; i0 += 3) {
    for (std::size_t i1 = i0 + 1; i1 <= q_len; i1 += 4) {
      for (std::size_t j0 = 0; j0 < kv_len; j0 += 5) {
        for (std::size_t j1 = j0 + 1; j1 <= kv_len; j1 += 7) {
          const tile_visibility t = m.classify(i0, i1, j0, j1);
          bool any = false, every = true;
          for (std::size_t i = i0; i < i1; ++i) {
            for (std::size_t j = j0; j < j1; ++j) {
              any = any || m.visible(i, j);
              every = every && m.visible(i, j);
            }
          }
          if (t == tile_visibility::hidden) {
            ASSERT_FALSE(any) << i0 << " " << i1 << " " << j0 << " " << j1;
          }
          if (t == tile_visibility::visible) {
            ASSERT_TRUE(every) << i0 << " " << i1 << " " << j0 << " " << j1;
          }
        }
      }
    }
  }
}

TEST(Mask, ClassifyAgreesWithVisible) {
  expect_classify_consistent(no_mask{}, 9, 20);
  expect_classify_consistent(causal{5}, 9, 20);
  expect_classify_consistent(sliding_window{4, 7}, 9, 20);
  expect_classify_consistent(padding::left(3, 20), 9, 20);
  expect_classify_consistent(padding::right(11), 9, 20);
  expect_classify_consistent(all_of<causal, padding>{causal{11}, padding::left(4, 20)}, 9, 20);
  expect_classify_consistent(
      all_of<sliding_window, padding>{sliding_window{3, 11}, padding::right(15)}, 9, 20);
}

TEST(Mask, Rules) {
  EXPECT_TRUE(causal{2}.visible(0, 2));
  EXPECT_FALSE(causal{2}.visible(0, 3));
  EXPECT_EQ(causal{2}.required_kv_length(3), 5u);
  EXPECT_TRUE((sliding_window{3, 0}.visible(5, 3)));
  EXPECT_FALSE((sliding_window{3, 0}.visible(5, 2)));
  EXPECT_FALSE(padding::left(2, 8).visible(0, 1));
  EXPECT_TRUE(padding::left(2, 8).visible(0, 2));
  EXPECT_EQ((all_of<causal, padding>{causal{4}, padding::right(9)}.required_kv_length(2)), 9u);
}

}  // namespace
