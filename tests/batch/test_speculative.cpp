// Greedy speculative decoding gives exactly plain greedy decoding's tokens for k = 1..4 with
// every kind of draft (the target's twin: always right; a different 1-layer model: mostly
// wrong; a draft that is always wrong), and leaves the target's KV as plain decoding would.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "npullm/batch/speculative.hpp"
#include "npullm/model/causal_lm.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
namespace fs = std::filesystem;

using lm_t = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;

const fs::path& one_layer_dir() {
  static const fs::path d = [] {
    const fs::path p =
        fs::temp_directory_path() / ("npullm_spec_1layer_" + std::to_string(::getpid()));
    auto spec = model::preset("tiny", npullm::dtype::f32, 99);
    spec.config.num_hidden_layers = 1;
    model::write_model(p, spec);
    return p;
  }();
  return d;
}

// Proposes last + 1, last + 2, ... (mod vocab): almost never what the target says.
struct wrong_draft {
  std::size_t len = 0;
  void start(std::span<const std::int32_t> prompt) { len = prompt.size(); }
  std::vector<std::int32_t> propose(std::int32_t last, std::size_t n) {
    std::vector<std::int32_t> out;
    for (std::size_t i = 1; i <= n; ++i)
      out.push_back(static_cast<std::int32_t>((last + static_cast<std::int32_t>(i) * 37) % 512));
    len += n;
    return out;
  }
  void rollback(std::size_t n) { len = n; }
  void feed(std::span<const std::int32_t> ids) { len += ids.size(); }
  std::size_t length() const { return len; }
};
static_assert(draft_source<wrong_draft>);
static_assert(draft_source<model_draft<lm_t>>);

std::vector<std::int32_t> plain_greedy(lm_t& lm, std::span<const std::int32_t> prompt,
                                       std::size_t n) {
  lm.reset();
  std::vector<std::int32_t> out{greedy_token(lm.prefill(prompt).logits_of(prompt.size() - 1))};
  while (out.size() < n) {
    const std::array<std::int32_t, 1> one{out.back()};
    out.push_back(greedy_token(lm.decode(one).logits_of(0)));
  }
  return out;
}

std::vector<std::int32_t> prompt() {
  std::vector<std::int32_t> p(23);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>((i * 131 + 7) % 512);
  return p;
}

TEST(Speculative, EqualsPlainGreedyWithEveryDraft) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t plain(dir, {.max_sequence = 128});
  const auto p = prompt();
  const auto expected = plain_greedy(plain, p, 20);
  for (std::size_t k = 1; k <= 4; ++k) {
    lm_t target(dir, {.max_sequence = 128, .decode_rows = 8});
    lm_t twin(dir, {.max_sequence = 128, .decode_rows = 8});
    lm_t small(one_layer_dir(), {.max_sequence = 128, .decode_rows = 8});
    model_draft<lm_t> right(twin), other(small);
    wrong_draft wrong;
    speculative_stats s_right, s_other, s_wrong;
    EXPECT_EQ(speculative_generate(target, right, p, 20, k, &s_right), expected) << "k " << k;
    EXPECT_EQ(speculative_generate(target, other, p, 20, k, &s_other), expected) << "k " << k;
    EXPECT_EQ(speculative_generate(target, wrong, p, 20, k, &s_wrong), expected) << "k " << k;
    EXPECT_EQ(s_right.acceptance(), 1.0) << "k " << k;  // always right
    EXPECT_EQ(s_wrong.accepted, 0u) << "k " << k;       // always wrong
    EXPECT_LT(s_right.rounds, s_wrong.rounds);
  }
}

TEST(Speculative, KvAfterRollbackEqualsPlainDecoding) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t plain(dir, {.max_sequence = 128});
  lm_t target(dir, {.max_sequence = 128, .decode_rows = 8});
  lm_t small(one_layer_dir(), {.max_sequence = 128, .decode_rows = 8});
  model_draft<lm_t> draft(small);
  const auto p = prompt();
  plain_greedy(plain, p, 17);
  speculative_generate(target, draft, p, 17, 3);
  ASSERT_EQ(target.length(), plain.length());
  const auto& a = target.kv_cache();
  const auto& b = plain.kv_cache();
  double diff = 0;
  for (std::size_t layer = 0; layer < target.config().num_hidden_layers; ++layer) {
    const auto ta = a.range_tile(layer, 0, a.length()), tb = b.range_tile(layer, 0, b.length());
    for (std::size_t h = 0; h < ta.k.extent(0); ++h) {
      for (std::size_t j = 0; j < ta.k.extent(1); ++j) {
        for (std::size_t d = 0; d < ta.k.extent(2); ++d) {
          diff = std::max<double>(diff, std::fabs(ta.k(h, j, d) - tb.k(h, j, d)));
          diff = std::max<double>(diff, std::fabs(ta.v(h, j, d) - tb.v(h, j, d)));
        }
      }
    }
  }
  EXPECT_LE(diff, 1e-5);  // the same keys and values, up to f32 summation order
}

TEST(Speculative, BadArguments) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t target(dir, {.max_sequence = 64});
  wrong_draft d;
  const auto p = prompt();
  EXPECT_THROW(speculative_generate(target, d, p, 5, 0), error);
  EXPECT_THROW(speculative_generate(target, d, p, 0, 2), error);
}

}  // namespace

namespace {

// The rejection rule keeps the target's distribution: the first emitted token over 40,000
// rounds against p[0], for a draft q that differs from p (chi-squared, 5 outcomes, 4 degrees
// of freedom, 0.1% critical value 18.47), and the second token, given the first was accepted,
// against p[1].
TEST(Speculative, RejectionSamplingKeepsTheTargetDistribution) {
  using dist = std::vector<double>;
  const std::vector<dist> p = {
      {0.1, 0.4, 0.2, 0.25, 0.05}, {0.3, 0.1, 0.1, 0.2, 0.3}, {0.2, 0.2, 0.2, 0.2, 0.2}};
  const std::vector<dist> q = {{0.5, 0.1, 0.1, 0.1, 0.2}, {0.05, 0.05, 0.6, 0.2, 0.1}};
  sampler draw({.temperature = 1.0f}, 1), rng({.temperature = 1.0f}, 2);
  std::vector<double> first(5, 0.0), second(5, 0.0);
  double second_total = 0;
  const int rounds = 40000;
  for (int r = 0; r < rounds; ++r) {
    const std::int32_t d0 = draw.sample_from(q[0]), d1 = draw.sample_from(q[1]);
    const std::vector<std::int32_t> draft = {d0, d1};
    const auto out = verify_sampled(p, q, draft, rng);
    first[static_cast<std::size_t>(out[0])] += 1;
    if (out.size() >= 2) {
      second[static_cast<std::size_t>(out[1])] += 1;
      second_total += 1;
    }
  }
  auto chi2 = [](const std::vector<double>& count, const dist& prob, double n) {
    double c = 0;
    for (std::size_t i = 0; i < count.size(); ++i)
      c += (count[i] - n * prob[i]) * (count[i] - n * prob[i]) / (n * prob[i]);
    return c;
  };
  EXPECT_LT(chi2(first, p[0], rounds), 18.47);
  EXPECT_LT(chi2(second, p[1], second_total), 18.47);
  // Same draft and target: everything is accepted.
  std::size_t accepted = 0;
  const std::vector<std::int32_t> draft = {1, 3};
  (void)verify_sampled(p, std::vector<dist>{p[0], p[1]}, draft, rng, &accepted);
  EXPECT_EQ(accepted, 2u);
}

TEST(Sampler, DistributionMatchesSampling) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f};
  sampler s({.temperature = 0.8f, .top_k = 3}, 4);
  const auto p = s.distribution(logits);
  EXPECT_EQ(p[3], 0.0);  // outside the top 3
  double sum = 0;
  for (double v : p) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_NEAR(p[1] / p[2], std::exp(1.0 / static_cast<double>(0.8f)), 1e-9);  // T is the float 0.8f
  EXPECT_EQ(sampler({}, 0).distribution(logits)[1], 1.0);                     // greedy
}

}  // namespace

namespace {

TEST(Speculative, SampledOverTwoPipelines) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  const auto p = prompt();
  const sampler_config cfg{.temperature = 0.8f, .top_k = 50};
  lm_t target(dir, {.max_sequence = 128, .decode_rows = 8});
  lm_t twin(dir, {.max_sequence = 128, .decode_rows = 8});
  lm_t small(one_layer_dir(), {.max_sequence = 128, .decode_rows = 8});
  speculative_stats with_twin, with_small;
  const auto a = speculative_generate_sampled(target, twin, p, 24, 3, cfg, 7, &with_twin);
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(target.length(), p.size() + a.size() - 1);  // KV of everything but the last token
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 512);
  // The twin proposes from (almost exactly) the target's distribution: nearly all accepted.
  EXPECT_GE(with_twin.acceptance(), 0.9);
  const auto b = speculative_generate_sampled(target, small, p, 24, 3, cfg, 7, &with_small);
  EXPECT_EQ(b.size(), 24u);
  EXPECT_LT(with_small.acceptance(), with_twin.acceptance());
  // Deterministic for a seed.
  EXPECT_EQ(speculative_generate_sampled(target, twin, p, 24, 3, cfg, 7), a);
}

}  // namespace
