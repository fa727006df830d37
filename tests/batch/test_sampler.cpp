// The sampler's chain on hand-made rows (no model): penalties and min-p against hand-computed
// rows, chi-squared tests of the drawn distribution for every control (each also shown to
// differ from the uncontrolled distribution, so the test can fail), logit bias bans, the
// processor hook with its context, the order of temperature and top-p / min-p (llama.cpp's and
// the former one), NaN / +inf / all -inf rows refused on every path that chooses a token,
// log-probabilities against a long-double softmax, stop strings across token boundaries, and bad
// settings refused with the stream unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "npullm/batch/sampler.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/batch/stop_strings.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
using npullm::testing::expect_error;

constexpr float inf = std::numeric_limits<float>::infinity();

// softmax(row / t) in long double, independent of the sampler; -inf entries get 0.
std::vector<double> softmax(const std::vector<float>& row, double t = 1.0) {
  long double sum = 0;
  std::vector<long double> e(row.size());
  for (std::size_t i = 0; i < row.size(); ++i)
    sum += (e[i] = row[i] == -inf ? 0.0L : std::exp(static_cast<long double>(row[i]) / t));
  std::vector<double> p(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) p[i] = static_cast<double>(e[i] / sum);
  return p;
}

// Draw counts of `draws` samples of s on (logits, context).
std::vector<double> counts(sampler& s, const std::vector<float>& logits,
                           const std::vector<std::int32_t>& context, int draws) {
  std::vector<double> c(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) c[static_cast<std::size_t>(s.sample(logits, context))] += 1;
  return c;
}

// Pearson's statistic of counts against probabilities p over the cells with p > 0 (a cell with
// p = 0 and a count makes it infinite), and its degrees of freedom.
double chi2(const std::vector<double>& count, const std::vector<double>& p, std::size_t& df) {
  double n = 0, c = 0;
  for (double v : count) n += v;
  df = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      if (count[i] > 0) return inf;
      continue;
    }
    c += (count[i] - n * p[i]) * (count[i] - n * p[i]) / (n * p[i]);
    ++df;
  }
  --df;
  return c;
}

// The chi-squared distribution's 0.1% critical values for 1..7 degrees of freedom.
double critical(std::size_t df) {
  const double table[] = {10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
  return table[df - 1];
}

// The drawn distribution matches `expected` and not `other` (every expected count >= 5).
void expect_follows(sampler& s, const std::vector<float>& logits,
                    const std::vector<std::int32_t>& context, const std::vector<double>& expected,
                    const std::vector<double>& other) {
  const auto c = counts(s, logits, context, 20000);
  std::size_t df = 0;
  const double stat = chi2(c, expected, df);
  ASSERT_GE(df, 1u);
  EXPECT_LT(stat, critical(df));
  std::size_t df_other = 0;
  EXPECT_GT(chi2(c, other, df_other), 100.0);
}

// ---- penalties ---------------------------------------------------------------------------------

const std::vector<float> row6 = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, 1.0f};
// The last 4 tokens are {1, 0, 3, 0}: token 0 twice, 1 and 3 once; 5 is outside the window.
const std::vector<std::int32_t> context6 = {5, 1, 0, 3, 0};
const sampler_config penalties{.repeat_penalty = 2.0f,
                               .frequency_penalty = 0.5f,
                               .presence_penalty = 0.25f,
                               .penalty_last_n = 4};
// By hand: positive logits divided by 2, negative multiplied, then count * 0.5 + 0.25 off.
//   0:  2 / 2 - (2 * 0.5 + 0.25) = -0.25      1: -1 * 2 - 0.75 = -2.75      3: 3 / 2 - 0.75 = 0.75
const std::vector<float> penalized6 = {-0.25f, -2.75f, 0.5f, 0.75f, 0.0f, 1.0f};

TEST(SamplerPenalties, MatchAHandComputedRow) {
  const sampler s(penalties, 0);
  const auto row = s.process(row6, context6);
  ASSERT_EQ(row.size(), row6.size());
  for (std::size_t i = 0; i < row.size(); ++i) EXPECT_FLOAT_EQ(row[i], penalized6[i]) << i;
  // The repeat penalty alone on a zero logit leaves it 0 (neither divided nor multiplied).
  const std::vector<float> zero = {0.0f, 1.0f};
  const std::vector<std::int32_t> ctx0 = {0};
  EXPECT_EQ(sampler({.repeat_penalty = 3.0f}, 0).process(zero, ctx0)[0], 0.0f);
  // A window longer than the context takes all of it; token 5 now counts once.
  auto all = penalties;
  all.penalty_last_n = 100;
  EXPECT_FLOAT_EQ(sampler(all, 0).process(row6, context6)[5], 1.0f / 2.0f - 0.75f);
  // Window 0, or neutral settings: the row as it was.
  all.penalty_last_n = 0;
  EXPECT_EQ(sampler(all, 0).process(row6, context6), row6);
  EXPECT_EQ(sampler({.penalty_last_n = 4}, 0).process(row6, context6), row6);
  // Greedy follows the penalized row: 5 (1.0) instead of 3.
  EXPECT_EQ(sampler({}, 0).sample(row6, context6), 3);
  EXPECT_EQ(sampler(penalties, 0).sample(row6, context6), 5);
  EXPECT_EQ(sampler(penalties, 0).argmax(row6, context6), 5);
}

TEST(SamplerPenalties, DrawsFollowThePenalizedSoftmax) {
  auto cfg = penalties;
  cfg.temperature = 1.0f;
  sampler s(cfg, 11);
  expect_follows(s, row6, context6, softmax(penalized6), softmax(row6));
}

// ---- min-p -------------------------------------------------------------------------------------

// Probabilities 0.4, 0.3, 0.2, 0.06, 0.04 at temperature 1.
std::vector<float> five() {
  const double q[] = {0.4, 0.3, 0.2, 0.06, 0.04};
  std::vector<float> row;
  for (double v : q) row.push_back(static_cast<float>(std::log(v)));
  return row;
}

TEST(SamplerMinP, KeepsTokensWithinAFractionOfTheMostLikely) {
  const auto row = five();
  // min_p 0.25: p >= 0.1 keeps 0.4, 0.3, 0.2, renormalized over 0.9.
  const auto p = sampler({.temperature = 1.0f, .min_p = 0.25f}, 0).distribution(row);
  const double want[] = {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0, 0.0};
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(p[i], want[i], 1e-6) << i;
  // min_p 0.6: p >= 0.24 keeps 0.4 and 0.3.
  const auto p2 = sampler({.temperature = 1.0f, .min_p = 0.6f}, 0).distribution(row);
  EXPECT_NEAR(p2[0], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p2[1], 0.3 / 0.7, 1e-6);
  EXPECT_EQ(p2[2], 0.0);
  // At temperature 2, llama.cpp's order cuts at temperature 1 (ratios 0.15 and 0.1 < 0.35:
  // three tokens), then draws with weights sqrt(q); temperature first, the ratios are square
  // roots, sqrt(0.06 / 0.4) = 0.387 and sqrt(0.04 / 0.4) = 0.316, so four tokens stay.
  const auto p3 = sampler({.temperature = 2.0f, .min_p = 0.35f}, 0).distribution(row);
  const double w[] = {std::sqrt(0.4), std::sqrt(0.3), std::sqrt(0.2), std::sqrt(0.06)};
  const double sw3 = w[0] + w[1] + w[2];
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(p3[i], w[i] / sw3, 1e-6) << i;
  EXPECT_EQ(p3[3], 0.0);
  EXPECT_EQ(p3[4], 0.0);
  const auto p4 =
      sampler({.temperature = 2.0f, .min_p = 0.35f, .order = sampling_order::temperature_first}, 0)
          .distribution(row);
  const double sw4 = sw3 + w[3];
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(p4[i], w[i] / sw4, 1e-6) << i;
  EXPECT_EQ(p4[4], 0.0);
  // min_p 1 keeps only the most likely; min_p 0 keeps everything.
  EXPECT_EQ(sampler({.temperature = 1.0f, .min_p = 1.0f}, 0).distribution(row)[0], 1.0);
  EXPECT_GT(sampler({.temperature = 1.0f, .min_p = 0.0f}, 0).distribution(row)[4], 0.03);
}

TEST(SamplerMinP, DrawsFollowTheTruncatedSoftmax) {
  const auto row = five();
  sampler s({.temperature = 1.0f, .min_p = 0.25f}, 12);
  expect_follows(s, row, {}, {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0, 0.0}, softmax(row));
}

// ---- the order of temperature and the cuts (llama.cpp's: temperature last) -------------------

// At T = 0.5 the weights are q^2: 0.16, 0.09, 0.04, 0.0036, 0.0016 (sum 0.2952), so the
// sharpened probabilities are 0.542, 0.305, 0.136, ... With top_p 0.8, llama.cpp's order cuts
// softmax(row) (0.4 + 0.3 < 0.8 <= 0.4 + 0.3 + 0.2: three tokens) and then draws those three
// with weights q^2; temperature first cuts the sharpened one (0.542 + 0.305 >= 0.8: two).
TEST(SamplerOrder, TopPCutsBeforeTheTemperatureAsLlamaCpp) {
  const auto row = five();
  const sampler_config last{.temperature = 0.5f, .top_p = 0.8f};
  auto first = last;
  first.order = sampling_order::temperature_first;
  const auto pl = sampler(last, 0).distribution(row);
  const auto pf = sampler(first, 0).distribution(row);
  const double q2[] = {0.16, 0.09, 0.04};
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(pl[i], q2[i] / 0.29, 1e-6) << i;
  EXPECT_EQ(pl[3], 0.0);
  EXPECT_NEAR(pf[0], 0.16 / 0.25, 1e-6);
  EXPECT_NEAR(pf[1], 0.09 / 0.25, 1e-6);
  EXPECT_EQ(pf[2], 0.0);  // the token the two orders disagree on
  // The draws follow each order's distribution, not the other's.
  sampler sl(last, 16), sf(first, 17);
  expect_follows(sl, row, {}, pl, pf);
  expect_follows(sf, row, {}, pf, pl);
  // At T = 1 the orders are the same chain.
  auto one_last = last, one_first = first;
  one_last.temperature = one_first.temperature = 1.0f;
  EXPECT_EQ(sampler(one_last, 0).distribution(row), sampler(one_first, 0).distribution(row));
}

// Top-k keeps the k largest logits at any temperature: both orders keep the same tokens.
TEST(SamplerOrder, TopKIsTheSameInBothOrders) {
  const auto row = five();
  for (const float t : {0.3f, 1.0f, 3.0f}) {
    const sampler_config last{.temperature = t, .top_k = 2};
    auto first = last;
    first.order = sampling_order::temperature_first;
    const auto pl = sampler(last, 0).distribution(row);
    const auto pf = sampler(first, 0).distribution(row);
    for (std::size_t i = 0; i < row.size(); ++i) EXPECT_NEAR(pl[i], pf[i], 1e-12) << i;
    EXPECT_EQ(pl[2], 0.0);
  }
}

// ---- logit bias --------------------------------------------------------------------------------

TEST(SamplerBias, AddsAndBans) {
  const std::vector<float> row = {1.0f, 2.0f, 0.0f, 1.5f};
  const sampler_config cfg{.temperature = 1.0f,
                           .logit_bias = {{1, -inf}, {2, 1.0f}, {2, 0.5f}, {3, -0.5f}}};
  const std::vector<float> biased = {1.0f, -inf, 1.5f, 1.0f};  // entries for token 2 add up
  EXPECT_EQ(sampler(cfg, 0).process(row), biased);
  // Greedy never picks a banned token, even the largest logit.
  EXPECT_EQ(sampler({.logit_bias = {{1, -inf}}}, 0).sample(row), 3);
  sampler s(cfg, 13);
  expect_follows(s, row, {}, softmax(biased), softmax(row));
}

// ---- processor ---------------------------------------------------------------------------------

TEST(SamplerProcessor, MasksWithItsContextAndDrawsFollow) {
  const std::vector<float> row = {0.5f, 1.0f, 0.2f, 0.8f, 1.2f, 0.1f};
  const std::vector<std::int32_t> context = {4, 2, 9};
  std::vector<std::int32_t> seen;
  // Constrained decoding in miniature: only tokens of the parity of the context's last token.
  const sampler_config cfg{.temperature = 1.0f,
                           .processor = [&](std::span<const std::int32_t> ctx, std::span<float> r) {
                             seen.assign(ctx.begin(), ctx.end());
                             for (std::size_t t = 0; t < r.size(); ++t)
                               if (static_cast<std::int32_t>(t % 2) != ctx.back() % 2) r[t] = -inf;
                           }};
  sampler s(cfg, 14);
  EXPECT_EQ(s.sample(row, context) % 2, 1);
  EXPECT_EQ(seen, context);
  std::vector<float> masked = row;
  for (std::size_t t = 0; t < masked.size(); t += 2) masked[t] = -inf;
  expect_follows(s, row, context, softmax(masked), softmax(row));
  // Greedy: the largest logit (token 4) is masked; 1 is the largest odd one.
  auto greedy = cfg;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sampler(greedy, 0).sample(row, context), 1);
  // The processor runs after bias and penalties: it sees their row.
  std::vector<float> got;
  const sampler_config after{.presence_penalty = 1.0f,
                             .penalty_last_n = 8,
                             .logit_bias = {{0, 2.0f}},
                             .processor = [&](std::span<const std::int32_t>, std::span<float> r) {
                               got.assign(r.begin(), r.end());
                             }};
  (void)sampler(after, 0).sample(row, std::vector<std::int32_t>{1});
  ASSERT_EQ(got.size(), row.size());
  EXPECT_FLOAT_EQ(got[0], 2.5f);
  EXPECT_FLOAT_EQ(got[1], 0.0f);
  EXPECT_FLOAT_EQ(got[2], 0.2f);
}

// ---- existing controls with the chain (top-k + top-p + temperature unchanged) ----------------

TEST(SamplerChain, TopKTopPAndTemperatureComposeWithBias) {
  const std::vector<float> row = {0.0f, 1.0f, 2.0f, 0.5f, 1.5f};
  // Bias first, then top-k 3 of the biased row: {2 -> banned}, so {4, 1, 3} compete at T = 0.7.
  sampler s({.temperature = 0.7f, .top_k = 3, .logit_bias = {{2, -inf}}}, 15);
  std::vector<float> kept = {-inf, 1.0f, -inf, 0.5f, 1.5f};
  expect_follows(s, row, {}, softmax(kept, 0.7), softmax(row, 0.7));
}

// ---- rows no sampler can draw from -------------------------------------------------------------

constexpr float nan = std::numeric_limits<float>::quiet_NaN();

// Every way npullm chooses a token from a logits row: the sampler (greedy and sampled, with and
// without the processing steps, which read the row in place or copy it), its argmax and
// distribution, and speculative decoding's greedy and sampled helpers. Each must refuse `row`
// with invalid_argument and a message containing `fragment`, and draw nothing.
void expect_every_path_refuses(const std::vector<float>& row, const std::string& fragment) {
  const sampler_config plain_greedy{};
  const sampler_config plain_sampled{.temperature = 0.8f, .top_p = 0.9f};
  const sampler_config biased_greedy{.logit_bias = {{0, 0.5f}}};
  const sampler_config penalized_sampled{.temperature = 1.3f, .presence_penalty = 0.5f};
  for (const sampler_config& cfg :
       {plain_greedy, plain_sampled, biased_greedy, penalized_sampled}) {
    SCOPED_TRACE(::testing::Message()
                 << "temperature " << cfg.temperature << ", processes " << cfg.processes());
    const std::vector<std::int32_t> context = {1, 0};
    sampler s(cfg, 31);
    expect_error([&] { (void)s.sample(row, context); }, error_code::invalid_argument, fragment);
    expect_error([&] { (void)s.argmax(row, context); }, error_code::invalid_argument, fragment);
    expect_error([&] { (void)s.distribution(row, context); }, error_code::invalid_argument,
                 fragment);
    expect_error([&] { (void)s.process(row, context); }, error_code::invalid_argument, fragment);
    draft_proposal d;
    expect_error([&] { (void)draw_into(d, row, &s, context); }, error_code::invalid_argument,
                 fragment);
    EXPECT_TRUE(d.tokens.empty() && d.q.empty());
    // The target rejects a proposal on the bad row: greedy through the chain, or sampled.
    const draft_proposal one{.tokens = {0}, .q = {}};
    expect_error([&] { (void)verify_round([&](std::size_t) { return std::span(row); }, one, &s); },
                 error_code::invalid_argument, fragment);
    sampler fresh(cfg, 31);  // nothing was drawn
    EXPECT_EQ(s.uniform(), fresh.uniform());
  }
  // No sampler: greedy decoding's own argmax, for the draft and the target.
  expect_error([&] { (void)greedy_token(row); }, error_code::invalid_argument, fragment);
  draft_proposal d;
  expect_error([&] { (void)draw_into(d, row, nullptr); }, error_code::invalid_argument, fragment);
  const draft_proposal one{.tokens = {0}, .q = {}};
  expect_error(
      [&] { (void)verify_round([&](std::size_t) { return std::span(row); }, one, nullptr); },
      error_code::invalid_argument, fragment);
}

TEST(SamplerLogits, NanIsRefusedOnEveryPath) {
  // Before, greedy skipped the NaN (token 1 here) and a draw sorted it (undefined behaviour).
  expect_every_path_refuses({0.5f, 2.0f, nan, 1.0f}, "logit of token 2 is NaN in a row of 4");
  expect_every_path_refuses({nan, nan, nan}, "logit of token 0 is NaN in a row of 3");
}

TEST(SamplerLogits, PlusInfinityIsRefusedOnEveryPath) {
  expect_every_path_refuses({0.5f, inf, 1.0f}, "logit of token 1 is +inf in a row of 3");
}

TEST(SamplerLogits, ARowOfMinusInfinityIsRefusedOnEveryPath) {
  expect_every_path_refuses({-inf, -inf, -inf, -inf},
                            "every logit of a row of 4 is -inf: no token to choose");
}

TEST(SamplerLogits, MinusInfinityMasksATokenAndIsNeverChosen) {
  const std::vector<float> row = {-inf, 0.3f, -inf, 0.1f, 0.2f, -inf};
  EXPECT_EQ(sampler({}, 0).sample(row), 1);
  EXPECT_EQ(greedy_token(row), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{-inf, -inf, 7.0f}), 2);
  sampler s({.temperature = 2.0f}, 32);
  std::vector<float> unmasked = {0.0f, 0.3f, 0.0f, 0.1f, 0.2f, 0.0f};
  expect_follows(s, row, {}, softmax(row, 2.0), softmax(unmasked, 2.0));
}

TEST(SamplerLogits, AProcessorThatWritesNanIsRefused) {
  const sampler_config cfg{
      .temperature = 1.0f,
      .processor = [](std::span<const std::int32_t>, std::span<float> r) { r[3] = nan; }};
  sampler s(cfg, 33);
  expect_error(
      [&] {
        (void)s.sample(std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f});
      },
      error_code::invalid_argument, "logit of token 3 is NaN after bias, penalties and processor");
  sampler fresh(cfg, 33);
  EXPECT_EQ(s.uniform(), fresh.uniform());
}

TEST(SamplerLogits, ExplicitProbabilitiesMustBeNumbersAtLeastZero) {
  sampler s({.temperature = 1.0f}, 34);
  for (const double bad : {static_cast<double>(nan), -0.25, static_cast<double>(inf)}) {
    const std::vector<double> p = {0.5, bad, 0.5};
    expect_error([&] { (void)s.sample_from(p); }, error_code::invalid_argument,
                 "probability of token 1 is ");
  }
  expect_error([&] { (void)s.sample_from(std::vector<double>{}); }, error_code::invalid_argument,
               "no probabilities");
  sampler fresh({.temperature = 1.0f}, 34);
  EXPECT_EQ(s.uniform(), fresh.uniform());
  EXPECT_EQ(s.sample_from(std::vector<double>{0.0, 0.0, 2.0}), 2);
}

// ---- log-probabilities -------------------------------------------------------------------------

TEST(SamplerLogprobs, MatchALongDoubleSoftmax) {
  std::vector<float> row(37);
  for (std::size_t i = 0; i < row.size(); ++i)
    row[i] = static_cast<float>(std::sin(static_cast<double>(i) * 1.7) * 6.0);
  row[20] = row[7];  // a tie: the lower id first
  row[30] = -inf;
  row[31] = std::numeric_limits<float>::quiet_NaN();  // counts as -inf
  long double sum = 0;
  for (float v : row)
    if (std::isfinite(v)) sum += std::exp(static_cast<long double>(v));
  auto ref = [&](std::size_t i) {
    return static_cast<double>(static_cast<long double>(row[i]) - std::log(sum));
  };
  const auto lp = logprobs_of(row, 5, 6);
  EXPECT_EQ(lp.chosen.token, 5);
  EXPECT_NEAR(lp.chosen.logprob, ref(5), 1e-12);
  ASSERT_EQ(lp.top.size(), 6u);
  for (std::size_t i = 0; i < lp.top.size(); ++i) {
    EXPECT_NEAR(lp.top[i].logprob, ref(static_cast<std::size_t>(lp.top[i].token)), 1e-12);
    if (i > 0) {
      EXPECT_TRUE(
          lp.top[i - 1].logprob > lp.top[i].logprob ||
          (lp.top[i - 1].logprob == lp.top[i].logprob && lp.top[i - 1].token < lp.top[i].token));
    }
  }
  // The top entries are the 6 largest logits.
  std::vector<float> sorted(row.begin(), row.end());
  std::erase_if(sorted, [](float v) { return std::isnan(v); });
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t i = 0; i < 6; ++i)
    EXPECT_EQ(row[static_cast<std::size_t>(lp.top[i].token)], sorted[i]);
  EXPECT_EQ(logprobs_of(row, 30).chosen.logprob, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(logprobs_of(row, 31).chosen.logprob, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(logprobs_of(row, 0, 100).top.size(), row.size());  // n capped at the row
  // Large logits do not overflow: log-softmax is shift invariant.
  std::vector<float> big(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) big[i] = row[i] + 1000.0f;
  EXPECT_NEAR(logprobs_of(big, 5).chosen.logprob, lp.chosen.logprob, 1e-4);
  expect_error([&] { (void)logprobs_of(row, 37); }, error_code::out_of_range,
               "token 37 outside a row of 37");
}

// ---- stop strings ------------------------------------------------------------------------------

TEST(StopStrings, FoundAcrossTokenBoundariesAndHeldBack) {
  const std::vector<std::string> stops = {"STOP", "END!"};
  const std::vector<std::string> pieces = {"Hel", "lo S", "T", "O", "P and more"};
  std::string text;
  std::vector<std::size_t> held;
  stop_string_match m;
  std::size_t at = 0;
  for (; at < pieces.size(); ++at) {
    const std::size_t searched = text.size();
    text += pieces[at];
    m = find_stop_string(text, searched, stops);
    if (m.found()) break;
    held.push_back(stop_string_holdback(text, stops));
  }
  ASSERT_TRUE(m.found());
  EXPECT_EQ(at, 4u);  // completed by "P and more", begun three tokens before
  EXPECT_EQ(m.position, 6u);
  EXPECT_EQ(m.index, 0u);
  EXPECT_EQ(text.substr(0, m.position), "Hello ");
  // "Hel": nothing; "Hello S": "S"; "Hello ST": "ST"; "Hello STO": "STO".
  EXPECT_EQ(held, (std::vector<std::size_t>{0, 1, 2, 3}));
  // The earliest occurrence wins, whichever stop string it is; bytes already searched are not
  // searched again (an occurrence must end in the new bytes).
  EXPECT_EQ(find_stop_string("xEND!STOP", 0, stops).index, 1u);
  EXPECT_EQ(find_stop_string("xEND!STOP", 0, stops).position, 1u);
  EXPECT_EQ(find_stop_string("xEND!STOP", 6, stops).position, 5u);
  EXPECT_FALSE(find_stop_string("STOP", 4, stops).found());
  // A stop string inside one piece, and a prefix of one that is also the held back end.
  EXPECT_EQ(stop_string_holdback("abcEN", stops), 2u);
  EXPECT_EQ(stop_string_holdback("STOP", stops), 0u);  // whole: found, not held
  // A stream never ends inside a UTF-8 character: "é" is C3 A9, "€" E2 82 AC, "😀" F0 9F 98 80.
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3\xA9"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\x80\x80\x80\x80"), 0u);  // invalid: nothing to wait for
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
  expect_error(
      [&] {
        check_stop_strings(std::vector<std::string>{"a", ""}, "test");
      },
      error_code::invalid_argument, "test: stop string 1 is empty");
}

// ---- bad settings
// --------------------------------------------------------------------------------

TEST(SamplerErrors, BadSettingsAreRefused) {
  auto refuse = [](sampler_config c, const std::string& fragment) {
    expect_error([&] { (void)sampler(std::move(c), 0); }, error_code::invalid_argument, fragment);
  };
  refuse({.penalty_last_n = -1}, "penalty_last_n -1 must be >= 0");
  refuse({.min_p = 1.5f}, "min_p 1.5 outside [0, 1]");
  refuse({.min_p = -0.1f}, "min_p -0.1 outside [0, 1]");
  refuse({.min_p = std::numeric_limits<float>::quiet_NaN()}, "min_p nan outside");
  refuse({.repeat_penalty = 0.0f}, "repeat_penalty 0 must be finite and > 0");
  refuse({.repeat_penalty = -1.0f}, "repeat_penalty -1");
  refuse({.frequency_penalty = std::numeric_limits<float>::quiet_NaN()}, "must be finite");
  refuse({.presence_penalty = inf}, "presence_penalty inf must be finite");
  refuse({.temperature = inf}, "temperature inf must be finite");
  refuse({.logit_bias = {{2, std::numeric_limits<float>::quiet_NaN()}}},
         "logit_bias 0 (token 2, bias nan)");
  refuse({.logit_bias = {{1, 0.5f}, {2, inf}}}, "logit_bias 1 (token 2, bias inf)");
  refuse({.logit_bias = {{-3, 1.0f}}}, "logit_bias 0 (token -3");
}

// A call that throws draws nothing: the sampler's next draws are those of a fresh one.
TEST(SamplerErrors, AFailedDrawLeavesTheStreamUnchanged) {
  const std::vector<float> row = {0.1f, 0.7f, 0.3f, 0.2f};
  const std::vector<std::int32_t> ctx = {1, 2};
  auto same_stream = [&](sampler& used, const sampler_config& cfg) {
    sampler fresh(cfg, 21);
    for (int i = 0; i < 30; ++i) EXPECT_EQ(used.uniform(), fresh.uniform());
  };
  {  // a bias token outside the row
    const sampler_config cfg{.temperature = 1.0f, .logit_bias = {{4, 1.0f}}};
    sampler s(cfg, 21);
    expect_error([&] { (void)s.sample(row); }, error_code::invalid_argument,
                 "logit_bias token 4 outside a row of 4");
    same_stream(s, cfg);
  }
  {  // a context token outside the row, inside the penalty window
    const sampler_config cfg{.temperature = 1.0f, .presence_penalty = 1.0f};
    sampler s(cfg, 21);
    const std::vector<std::int32_t> bad = {1, 9};
    expect_error([&] { (void)s.sample(row, bad); }, error_code::invalid_argument,
                 "context token 9 outside a row of 4");
    same_stream(s, cfg);
  }
  {  // a processor that masks everything, one that gives +inf, one that throws
    const sampler_config none{.temperature = 1.0f,
                              .processor = [](std::span<const std::int32_t>, std::span<float> r) {
                                for (float& v : r) v = -inf;
                              }};
    sampler s(none, 21);
    expect_error([&] { (void)s.sample(row, ctx); }, error_code::invalid_argument, "left no token");
    same_stream(s, none);
    const sampler_config plus{
        .processor = [](std::span<const std::int32_t>, std::span<float> r) { r[2] = inf; }};
    expect_error([&] { (void)sampler(plus, 0).sample(row, ctx); }, error_code::invalid_argument,
                 "logit of token 2 is +inf");
    const sampler_config throws{.temperature = 1.0f,
                                .processor = [](std::span<const std::int32_t>, std::span<float>) {
                                  raise(error_code::invalid_argument, "grammar: no continuation");
                                }};
    sampler t(throws, 21);
    expect_error([&] { (void)t.sample(row, ctx); }, error_code::invalid_argument,
                 "grammar: no continuation");
    same_stream(t, throws);
  }
}

}  // namespace
