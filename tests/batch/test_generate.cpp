// Batched generation: ragged batches give each request's own tokens (greedy and seeded),
// stop and max tokens, requests joining mid-flight, preemption under a small pool, prefix reuse
// (counted), all blocks back at the end, streaming, and request validation.
#include <gtest/gtest.h>

#include "support.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "npullm/batch/generate.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
namespace fs = std::filesystem;

const fs::path& tiny_dir() {
  return npullm::testing::generated_model("tiny", 11);
}

// Loaded once: every pipeline of this program shares these weights.
const std::shared_ptr<const model::model_weights<float>>& tiny_weights() {
  static const auto w = model::model_weights<float>::load(tiny_dir());
  return w;
}

using lm_t = model::causal_lm<
    model::pipeline_config<model::block_kv<float, 8>, model::dynamic_attention<>, float>>;

// The contracts the executors static_assert (step/pipeline.hpp): a block-KV pipeline is all
// three; a contiguous one is no block_pipeline, so generator<contiguous> fails with a sentence.
using contiguous_lm_t = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;
static_assert(block_pipeline<lm_t> && decoding_pipeline<lm_t> && batch1_pipeline<lm_t>);
static_assert(!block_pipeline<contiguous_lm_t> && decoding_pipeline<contiguous_lm_t>);

std::vector<std::int32_t> prompt(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i)
    ids[i] = static_cast<std::int32_t>((seed * 2654435761u + i * 97u) % 512u);
  return ids;
}

// The tokens one request gets when it runs alone.
std::vector<std::int32_t> alone(const request& r) {
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> g(lm, {.max_batch = 1, .prefix_cache = false});
  const auto id = g.submit(r);
  g.run();
  return g.result(id).tokens;
}

std::vector<request> ragged_requests(bool sampled) {
  std::vector<request> rs;
  const std::size_t lengths[] = {1, 17, 200, 3, 64, 9, 120, 33};
  for (std::size_t i = 0; i < std::size(lengths); ++i) {
    request r;
    r.prompt = prompt(lengths[i], static_cast<std::uint32_t>(i + 1));
    r.max_new_tokens = 6 + i % 5;
    if (sampled) r.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f};
    r.seed = 100 + i;
    rs.push_back(r);
  }
  return rs;
}

void expect_batch_equals_alone(bool sampled) {
  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 4096});
  generator<lm_t> g(lm, {.max_batch = 8});
  const auto rs = ragged_requests(sampled);
  std::vector<std::size_t> ids;
  for (const auto& r : rs) ids.push_back(g.submit(r));
  g.run();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(g.result(ids[i]).tokens, alone(rs[i])) << "request " << i;
    EXPECT_EQ(g.result(ids[i]).finish, finish_reason::length);
  }
  EXPECT_GE(g.stats().max_running, 4u);                              // they really ran together
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());  // every block back
}

TEST(Generator, GreedyBatchEqualsEachAlone) {
  expect_batch_equals_alone(false);
}
TEST(Generator, SeededSamplingBatchEqualsEachAlone) {
  expect_batch_equals_alone(true);
}

TEST(Generator, StopTokensMaxTokensAndStreaming) {
  request r;
  r.prompt = prompt(10, 3);
  r.max_new_tokens = 12;
  const auto free_run = alone(r);
  ASSERT_EQ(free_run.size(), 12u);
  r.stop = {free_run[4]};  // stops where that token first appears
  const auto stopped_at = static_cast<std::size_t>(
      std::find(free_run.begin(), free_run.end(), free_run[4]) - free_run.begin());
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> g(lm);
  const auto id = g.submit(r);
  std::vector<std::int32_t> streamed;
  bool finished_flag = false;
  g.run([&](std::size_t rid, std::int32_t tok, bool finished) {
    EXPECT_EQ(rid, id);
    streamed.push_back(tok);
    finished_flag = finished;
  });
  EXPECT_EQ(g.result(id).finish, finish_reason::stop);
  EXPECT_EQ(g.result(id).tokens,
            std::vector<std::int32_t>(
                free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(stopped_at) + 1));
  EXPECT_EQ(streamed, g.result(id).tokens);
  EXPECT_TRUE(finished_flag);
}

TEST(Generator, ARequestJoiningMidFlight) {
  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 2048});
  generator<lm_t> g(lm);
  const auto rs = ragged_requests(false);
  const auto a = g.submit(rs[1]);
  g.step();
  g.step();
  const auto b = g.submit(rs[4]);  // joins while a runs
  g.step();
  EXPECT_EQ(g.running(), 2u);
  g.run();
  EXPECT_EQ(g.result(a).tokens, alone(rs[1]));
  EXPECT_EQ(g.result(b).tokens, alone(rs[4]));
}

TEST(Generator, PreemptionUnderASmallPoolChangesNothing) {
  // 40 blocks of 8 tokens: not enough for 6 requests of ~60 tokens plus their growth at once.
  lm_t lm(tiny_weights(), {.max_sequence = 256, .kv_capacity = 320});
  generator<lm_t> g(lm, {.max_batch = 6, .prefix_cache = false});
  std::vector<request> rs;
  for (std::size_t i = 0; i < 6; ++i) {
    request r;
    r.prompt = prompt(50 + i, static_cast<std::uint32_t>(40 + i));
    r.max_new_tokens = 14;
    r.sampling = {.temperature = 0.7f};
    r.seed = i;
    rs.push_back(r);
  }
  std::vector<std::size_t> ids;
  for (const auto& r : rs) ids.push_back(g.submit(r));
  g.run();
  EXPECT_GT(g.stats().preemptions, 0u);
  for (std::size_t i = 0; i < rs.size(); ++i)
    EXPECT_EQ(g.result(ids[i]).tokens, alone(rs[i])) << "request " << i;
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
}

TEST(Generator, PrefixReuseComputesOnlyTheNewTokens) {
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> g(lm);
  request first;
  first.prompt = prompt(40, 7);  // 5 full blocks of 8
  first.max_new_tokens = 3;
  g.submit(first);
  g.run();
  EXPECT_EQ(g.stats().prefill_tokens, 40u);
  request second = first;
  second.prompt.insert(second.prompt.end(), {5, 6, 7, 8, 9});  // same 40-token prefix + 5 new
  const auto id = g.submit(second);
  g.run();
  EXPECT_EQ(g.stats().reused_tokens, 40u);
  EXPECT_EQ(g.stats().prefill_tokens, 45u);  // only the 5 new tokens were computed
  EXPECT_EQ(g.result(id).tokens, alone(second));
}

TEST(Generator, BadRequestsAreRejected) {
  lm_t lm(tiny_weights(), {.max_sequence = 64});
  generator<lm_t> g(lm);
  auto expect_reject = [&](request r, const std::string& fragment,
                           error_code code = error_code::invalid_argument) {
    try {
      g.submit(std::move(r));
      FAIL() << fragment;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_reject({}, "request 0: empty prompt");
  expect_reject({.prompt = {1}, .max_new_tokens = 0}, "max_new_tokens is 0");
  expect_reject({.prompt = {1, 600}}, "prompt token 600 at 1 outside the vocabulary of 512");
  expect_reject({.prompt = {1}, .stop = {3, -1}},
                "request 0: stop token -1 at 1 outside the vocabulary of 512");
  expect_reject({.prompt = std::vector<std::int32_t>(60, 1), .max_new_tokens = 10},
                "exceeds max_sequence 64", error_code::capacity_exhausted);
  EXPECT_TRUE(g.done());
  // Only npullm::error escapes, here out_of_range for a request that was never submitted.
  npullm::testing::expect_error([&] { (void)g.result(5); }, error_code::out_of_range,
                                "result of request 5; 0 were submitted");
}

}  // namespace

namespace {

TEST(Sampler, GreedyTopKAndTopP) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f, 3.0f};
  EXPECT_EQ(sampler({}, 1).sample(logits), 1);  // greedy: the first largest
  EXPECT_EQ(sampler({.temperature = 1.0f, .top_k = 1}, 7).sample(logits), 1);
  // top_p small: only the most probable token (ties by id) survives.
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(sampler({.temperature = 1.0f, .top_p = 0.01f}, seed).sample(logits), 1);
  }
  // top_k = 3 never picks outside {1, 4, 2}.
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const auto t = sampler({.temperature = 2.0f, .top_k = 3}, seed).sample(logits);
    EXPECT_TRUE(t == 1 || t == 4 || t == 2) << t;
  }
  EXPECT_THROW(sampler({.temperature = -1.0f}, 0), error);
  EXPECT_THROW(sampler({.temperature = 1.0f, .top_p = 0.0f}, 0), error);
}

TEST(Sampler, FollowsTheSoftmaxDistribution) {
  // Chi-squared over 4 outcomes, 20,000 draws: the 0.1% critical value for 3 degrees of
  // freedom is 16.27.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f};
  const float t = 1.5f;
  std::vector<double> p(4);
  double sum = 0;
  for (std::size_t i = 0; i < 4; ++i) sum += (p[i] = std::exp(logits[i] / t));
  sampler s({.temperature = t}, 2026);
  std::vector<double> count(4, 0.0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) count[static_cast<std::size_t>(s.sample(logits))] += 1;
  double chi2 = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const double expected = draws * p[i] / sum;
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 16.27);
  // The same seed gives the same sequence.
  sampler a({.temperature = t}, 5), b({.temperature = t}, 5);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

}  // namespace
