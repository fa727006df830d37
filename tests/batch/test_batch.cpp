// batch_unroll over a batch-1 pipeline and the packed batched scorer.
#include <gtest/gtest.h>

#include "support.hpp"

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "npullm/batch/scorer.hpp"
#include "npullm/batch/unroll.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
namespace fs = std::filesystem;

const fs::path& tiny_dir() {
  return npullm::testing::generated_model("tiny", 5);
}

// Loaded once: every pipeline of this program shares these weights.
const std::shared_ptr<const model::model_weights<float>>& tiny_weights() {
  static const auto w = model::model_weights<float>::load(tiny_dir());
  return w;
}

using lm_t = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;

// A batch-1 pipeline that records what it is given.
struct recording_pipeline {
  struct cfg {
    std::size_t vocab_size = 3, hidden_size = 2;
  } c;
  std::vector<std::span<const std::int32_t>> seen;
  int resets = 0;
  const cfg& config() const { return c; }
  void reset() { ++resets; }
  step_output prefill(std::span<const std::int32_t> ids, const output_selection& sel) {
    seen.push_back(ids);
    step_output o;
    o.logit_rows = sel.logit_rows(ids.size());
    o.logits = tensor<float, 2>(o.logit_rows.size(), 3);
    for (std::size_t i = 0; i < o.logit_rows.size(); ++i)
      o.logits.view()(i, 0) = static_cast<float>(ids.size());
    return o;
  }
};
static_assert(batch1_pipeline<recording_pipeline>);
static_assert(batch1_pipeline<lm_t>);
static_assert(packed_scorer<lm_t>);

TEST(BatchUnroll, RowViewsAreZeroCopyAndSharedInputsBroadcast) {
  const std::vector<std::int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // (3, 4)
  const std::vector<std::int32_t> mask = {0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1};    // left padding
  recording_pipeline p;
  batch_unroll<recording_pipeline> unroll(p);
  const dense_view<const std::int32_t, 2> iv(ids.data(), 3, 4), mv(mask.data(), 3, 4);
  const auto out = unroll.score({iv, mv});
  ASSERT_EQ(p.seen.size(), 3u);
  EXPECT_EQ(p.seen[0].data(), &iv(0, 1));  // pointer identity: no copy of the row
  EXPECT_EQ(p.seen[0].size(), 3u);
  EXPECT_EQ(p.seen[1].data(), &iv(1, 0));
  EXPECT_EQ(p.seen[2].data(), &iv(2, 2));
  EXPECT_EQ(p.seen[2].size(), 2u);
  EXPECT_EQ(out.extent(0), 3u);
  EXPECT_EQ(out.view()(2, 0), 2.0f);  // row 2's output in row 2
  EXPECT_GE(p.resets, 3);             // KV reset between rows
  // A [1, L] mask is shared by every row; right padding works the same.
  const std::vector<std::int32_t> shared = {1, 1, 0, 0};
  p.seen.clear();
  (void)unroll.score({iv, dense_view<const std::int32_t, 2>(shared.data(), 1, 4)});
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(p.seen[r].data(), &iv(r, 0));
  EXPECT_EQ(p.seen[1].size(), 2u);
}

void expect_shape_error(const batch_inputs& in, const std::string& fragment) {
  try {
    (void)resolve_rows(in);
    FAIL() << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(BatchUnroll, ShapeErrorsNameTheShapes) {
  const std::vector<std::int32_t> a(12, 1), b(8, 1);
  expect_shape_error({dense_view<const std::int32_t, 2>(a.data(), 3, 4),
                      dense_view<const std::int32_t, 2>(b.data(), 2, 4)},
                     "ids [3, 4], mask [2, 4]");
  expect_shape_error({dense_view<const std::int32_t, 2>(a.data(), 0, 4)}, "ids [0, 4]");
  expect_shape_error({dense_view<const std::int32_t, 2>(a.data(), 3, 0)}, "ids [3, 0]");
  expect_shape_error({dense_view<const std::int32_t, 2>(a.data(), 3, 4),
                      dense_view<const std::int32_t, 2>(b.data(), 1, 8)},
                     "mask [1, 8]");
  const std::vector<std::int32_t> gap = {1, 0, 1, 1};
  EXPECT_THROW((void)resolve_rows({dense_view<const std::int32_t, 2>(a.data(), 1, 4),
                                   dense_view<const std::int32_t, 2>(gap.data(), 1, 4)}),
               error);
  const std::vector<std::int64_t> pos = {0, 1, 5, 3};
  EXPECT_THROW((void)resolve_rows({dense_view<const std::int32_t, 2>(a.data(), 1, 4),
                                   {},
                                   dense_view<const std::int64_t, 2>(pos.data(), 1, 4)}),
               error);
}

TEST(BatchUnroll, GenerationIsAClearError) {
  recording_pipeline p;
  batch_unroll<recording_pipeline> unroll(p);
  const std::vector<std::int32_t> ids = {1, 2};
  try {
    unroll.generate({dense_view<const std::int32_t, 2>(ids.data(), 1, 2)}, 4);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("needs the batched generator"), std::string::npos);
  }
}

std::vector<std::int32_t> ragged_ids(std::size_t n, std::size_t len,
                                     std::vector<std::int32_t>& mask) {
  std::vector<std::int32_t> ids(n * len);
  mask.assign(n * len, 0);
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t valid = 1 + (r * 7) % len;
    const bool left = r % 2 == 0;
    for (std::size_t c = 0; c < len; ++c) {
      ids[r * len + c] = static_cast<std::int32_t>((r * 31 + c * 17) % 512);
      const bool on = left ? c >= len - valid : c < valid;
      mask[r * len + c] = on ? 1 : 0;
    }
  }
  return ids;
}

TEST(BatchUnroll, EqualsEachRowAloneBitForBit) {
  lm_t lm(tiny_weights(), {.max_sequence = 64});
  std::vector<std::int32_t> mask;
  const auto ids = ragged_ids(5, 20, mask);
  batch_unroll<lm_t> unroll(lm);
  const dense_view<const std::int32_t, 2> iv(ids.data(), 5, 20), mv(mask.data(), 5, 20);
  const auto out = unroll.run({iv, mv}, {.logits = true, .hidden = pooling::mean});
  lm_t alone(tiny_weights(), {.max_sequence = 64});
  const auto rows = resolve_rows({iv, mv});
  for (std::size_t r = 0; r < 5; ++r) {
    alone.reset();
    std::vector<std::size_t> all(rows[r].tokens.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    const auto o = alone.prefill(rows[r].tokens, output_selection::last().hidden_for(all));
    ASSERT_EQ(std::memcmp(o.logits.data(), &out.logits.view()(r, 0), o.logits.size_bytes()), 0)
        << "row " << r;
    for (std::size_t d = 0; d < alone.config().hidden_size; ++d) {
      float mean = 0;
      for (std::size_t i = 0; i < all.size(); ++i) mean += o.hidden.view()(i, d);
      ASSERT_FLOAT_EQ(out.hidden.view()(r, d), mean / static_cast<float>(all.size()));
    }
  }
  EXPECT_EQ(lm.length(), 0u);  // left reset
}

TEST(BatchUnroll, AnErrorNamesTheRowAndLeavesThePipelineUsable) {
  lm_t lm(tiny_weights(), {.max_sequence = 64, .prefill = model::prefill_mode::static_prompt(16)});
  std::vector<std::int32_t> ids(3 * 20, 7), mask(3 * 20, 1);
  for (std::size_t c = 0; c < 10; ++c) mask[c] = 0;       // row 0: 10 tokens
  for (std::size_t c = 0; c < 10; ++c) mask[40 + c] = 0;  // row 2: 10 tokens; row 1: 20 > 16
  batch_unroll<lm_t> unroll(lm);
  try {
    (void)unroll.score({dense_view<const std::int32_t, 2>(ids.data(), 3, 20),
                        dense_view<const std::int32_t, 2>(mask.data(), 3, 20)});
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::capacity_exhausted);
    EXPECT_NE(std::string(e.what()).find("row 1 of 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("static prompt capacity 16"), std::string::npos)
        << e.what();
    // The row's context is added to the pipeline's message, not to its "npullm <code>:" prefix.
    EXPECT_EQ(std::string(e.what()).rfind("npullm "), 0u) << e.what();
    EXPECT_EQ(e.message().find("npullm"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lm.length(), 0u);
  const std::vector<std::int32_t> ok(10, 7);
  EXPECT_NO_THROW((void)unroll.score({dense_view<const std::int32_t, 2>(ok.data(), 1, 10)}));
}

TEST(BatchedScorer, SameScoresAsUnroll) {
  lm_t lm(tiny_weights(), {.max_sequence = 64});
  std::vector<std::int32_t> mask;
  const auto ids = ragged_ids(9, 30, mask);
  const dense_view<const std::int32_t, 2> iv(ids.data(), 9, 30), mv(mask.data(), 9, 30);
  const std::vector<std::int32_t> first = {3, 4, 5};
  lm.prefill(first);  // the scorer must leave this sequence alone
  batched_scorer<lm_t> scorer(lm);
  const auto packed = scorer.score({iv, mv});  // 9 rows in several packed passes (64 rows each)
  EXPECT_EQ(lm.length(), 3u);
  lm_t other(tiny_weights(), {.max_sequence = 64});
  batch_unroll<lm_t> unroll(other);
  const auto unrolled = unroll.score({iv, mv});
  double diff = 0;
  for (std::size_t i = 0; i < packed.size(); ++i)
    diff = std::max<double>(diff, std::fabs(packed.data()[i] - unrolled.data()[i]));
  EXPECT_LE(diff, 1e-5);
  // The sequence it left alone continues as if nothing happened.
  lm_t fresh(tiny_weights(), {.max_sequence = 64});
  fresh.prefill(first);
  const std::array<std::int32_t, 1> next{9};
  const auto a = lm.decode(next), b = fresh.decode(next);
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size_bytes()), 0);
}

}  // namespace
