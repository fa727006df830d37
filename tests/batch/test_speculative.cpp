// Speculative decoding for one sequence: greedy output is exactly plain greedy decoding's for
// k = 1..4 with every kind of draft (a second model: the target's twin and a 1-layer model;
// self-speculation from the target's first layers; a draft head: Medusa heads and oracle heads;
// oracle drafts that are always right and always wrong, with the extreme acceptance counts);
// the target's KV after the rollbacks equals plain decoding's; each pass computes only the rows
// the draft needs; the sampled rule keeps the target's distribution (on explicit distributions
// and end to end on a 16-token vocabulary); bad arguments are refused before anything changes.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "grammar_support.hpp"
#include "npullm/batch/grammar_processor.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/grammar/gbnf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/ops/quant.hpp"
#include "speculative_support.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
using namespace npullm::testing;
namespace fs = std::filesystem;

using lm_t = contiguous_lm;

constexpr std::size_t new_tokens = 20;

// A model of the tiny shapes with its own weights: `layers` layers, `vocab` tokens.
const fs::path& other_dir(std::size_t layers, std::size_t vocab, std::uint64_t seed) {
  static std::map<std::string, fs::path> dirs;
  auto& d = dirs[std::to_string(layers) + "/" + std::to_string(vocab) + "/" + std::to_string(seed)];
  if (d.empty()) {
    d = scratch_root() / ("spec_" + std::to_string(layers) + "l_" + std::to_string(vocab) + "v_" +
                          std::to_string(seed));
    auto spec = model::preset("tiny", npullm::dtype::f32, seed);
    spec.config.num_hidden_layers = layers;
    spec.config.vocab_size = vocab;
    model::write_model(d, spec);
  }
  return d;
}

std::vector<std::int32_t> prompt() {
  std::vector<std::int32_t> p(23);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>((i * 131 + 7) % 512);
  return p;
}

const plain_run& expected() {
  static const plain_run r = [] {
    lm_t plain(target_weights(), {.max_sequence = 128});
    return plain_greedy(plain, prompt(), new_tokens);
  }();
  return r;
}

// Every kind of draft over a target.
struct drafts : npullm::testing::draft_set<lm_t> {
  explicit drafts(lm_t& t)
      : draft_set(t, other_dir(1, 512, 99), {.max_sequence = 128}, {expected()}) {}
};

// A mixture of experts (tiny-qwen2moe, every projection q8_0 and so tiled: verification steps
// of k + 1 rows gather each expert's rows) drafting for itself: plain greedy, token for token.
TEST(SpeculativeMoe, AMixtureWithItsTwinAsDraftGivesPlainGreedy) {
  const auto w = model::model_weights<float>::load(
      generated_model("tiny-qwen2moe", 23),
      {.projections = model::quantization{ops::weight_format::q8_0, 0}});
  ASSERT_EQ(w->config().moe.experts, 8u);
  lm_t plain(w, {.max_sequence = 128});
  const auto p = prompt();
  const auto want = plain_greedy(plain, p, new_tokens).tokens;
  for (const std::size_t k : {1u, 4u}) {
    lm_t target(w, {.max_sequence = 128, .decode_rows = 8});
    lm_t twin(w, {.max_sequence = 128, .decode_rows = 8});
    model_draft<lm_t> draft{twin};
    speculative_stats s;
    EXPECT_EQ(speculative_generate(target, draft, p, new_tokens, k, &s), want) << "k " << k;
    EXPECT_EQ(s.accepted, s.proposed) << "k " << k;  // its own twin: every proposal is right
  }
}

TEST(Speculative, GreedyEqualsPlainForEveryDraftKind) {
  lm_t target(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  drafts all(target);
  // The twin draft runs over the target's weights, not a copy of them.
  EXPECT_EQ(all.twin.weights().get(), target.weights().get());
  EXPECT_EQ(target.weights().get(), target_weights().get());
  const auto p = prompt();
  for (std::size_t k = 1; k <= 4; ++k) {
    all.each([&](const char* name, auto& draft, acceptance a) {
      speculative_stats s;
      EXPECT_EQ(speculative_generate(target, draft, p, new_tokens, k, &s), expected().tokens)
          << name << ", k " << k;
      EXPECT_EQ(target.length(), p.size() + new_tokens - 1) << name;
      // A round emits its accepted proposals and one target token; never more than asked for.
      EXPECT_EQ(s.rounds + s.accepted, new_tokens - 1) << name << ", k " << k;
      EXPECT_GT(s.proposed, 0u) << name;
      if (a == acceptance::all) {
        EXPECT_EQ(s.accepted, s.proposed) << name << ", k " << k;
        EXPECT_EQ(s.rounds, (new_tokens - 1 + k) / (k + 1)) << name << ", k " << k;
      }
      if (a == acceptance::none) {
        EXPECT_EQ(s.accepted, 0u) << name << ", k " << k;
        EXPECT_EQ(s.rounds, new_tokens - 1) << name << ", k " << k;
      }
    });
  }
  // The heads were handed the target's own rows: each found a plain-run row at float rounding.
  EXPECT_LT(all.right_head.worst, 1e-4);
  EXPECT_LT(all.wrong_head.worst, 1e-4);
}

TEST(Speculative, KvAfterRollbackEqualsPlainForEveryDraftKind) {
  lm_t plain(target_weights(), {.max_sequence = 128});
  const auto p = prompt();
  plain_greedy(plain, p, new_tokens);
  lm_t target(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  drafts all(target);
  for (std::size_t k : {2u, 4u}) {
    all.each([&](const char* name, auto& draft, acceptance) {
      speculative_generate(target, draft, p, new_tokens, k);
      ASSERT_EQ(target.length(), plain.length()) << name;
      // The same keys and values, up to f32 summation order.
      EXPECT_LE(kv_difference(target.kv_cache(), plain.kv_cache(), 2, plain.length()), 1e-5)
          << name << ", k " << k;
    });
  }
}

// Records the rows each pass of a target computes (and through how many layers).
struct recording_target {
  struct pass {
    bool prefill;
    std::size_t tokens;
    std::vector<std::size_t> logits, hidden;
    std::size_t layers;
  };
  lm_t* lm;
  std::vector<pass> passes;

  void reset() { lm->reset(); }
  step_output prefill(std::span<const std::int32_t> ids, const output_selection& sel) {
    auto out = lm->prefill(ids, sel);
    passes.push_back({true, ids.size(), out.logit_rows, out.hidden_rows, lm_t::all_layers});
    return out;
  }
  step_output decode(std::span<const std::int32_t> ids, const output_selection& sel,
                     std::size_t layers = lm_t::all_layers) {
    auto out = lm->decode(ids, sel, layers);
    passes.push_back({false, ids.size(), out.logit_rows, out.hidden_rows, layers});
    return out;
  }
  void truncate(std::size_t n) { lm->truncate(n); }
  [[nodiscard]] std::size_t length() const { return lm->length(); }
  [[nodiscard]] std::size_t capacity() const { return lm->capacity(); }
  [[nodiscard]] std::size_t decode_rows() const { return lm->decode_rows(); }
  [[nodiscard]] const model::model_config& config() const { return lm->config(); }
};

std::vector<std::size_t> first_rows(std::size_t n) {
  std::vector<std::size_t> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

TEST(Speculative, EachPassComputesOnlyTheRowsTheDraftNeeds) {
  lm_t lm(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  const auto p = prompt();
  const std::size_t last = p.size() - 1;
  {  // A second model: the prompt's last logits row; verify passes: logits for every row.
    recording_target t{&lm, {}};
    lm_t small(other_dir(1, 512, 99), {.max_sequence = 128});
    model_draft<lm_t> d(small);
    EXPECT_EQ(speculative_generate(t, d, p, new_tokens, 3), expected().tokens);
    ASSERT_TRUE(t.passes.front().prefill);
    EXPECT_EQ(t.passes.front().logits, std::vector<std::size_t>{last});
    EXPECT_TRUE(t.passes.front().hidden.empty());
    for (std::size_t i = 1; i < t.passes.size(); ++i) {
      EXPECT_EQ(t.passes[i].logits, first_rows(t.passes[i].tokens));
      EXPECT_TRUE(t.passes[i].hidden.empty());
      EXPECT_LE(t.passes[i].tokens, 4u);  // k + 1 rows at most
    }
    EXPECT_EQ(t.passes[1].tokens, 4u);
  }
  {  // A head: the prompt's last row also as a hidden row; verify passes: hidden rows too.
    recording_target t{&lm, {}};
    medusa_fixture m(target_dir(), 4, 0.05f, 5);
    head_draft<model::medusa_head<float>> d(m.head);
    EXPECT_EQ(speculative_generate(t, d, p, new_tokens, 3), expected().tokens);
    EXPECT_EQ(t.passes.front().logits, std::vector<std::size_t>{last});
    EXPECT_EQ(t.passes.front().hidden, std::vector<std::size_t>{last});
    for (std::size_t i = 1; i < t.passes.size(); ++i) {
      EXPECT_EQ(t.passes[i].logits, first_rows(t.passes[i].tokens));
      EXPECT_EQ(t.passes[i].hidden, first_rows(t.passes[i].tokens));
    }
  }
  {  // Self-speculation: one-row draft steps through layer 1, verify passes through all.
    recording_target t{&lm, {}};
    self_draft<recording_target> d(t, 1);
    EXPECT_EQ(speculative_generate(t, d, p, new_tokens, 3), expected().tokens);
    std::size_t draft_steps = 0;
    for (std::size_t i = 1; i < t.passes.size(); ++i) {
      const auto& s = t.passes[i];
      if (s.layers == 1) {
        ++draft_steps;
        EXPECT_EQ(s.tokens, 1u);
        EXPECT_EQ(s.logits, std::vector<std::size_t>{0});
      } else {
        EXPECT_EQ(s.layers, lm_t::all_layers);
        EXPECT_EQ(s.logits, first_rows(s.tokens));
      }
      EXPECT_TRUE(s.hidden.empty());
    }
    EXPECT_GT(draft_steps, 0u);
  }
}

// decode(..., layers) exits early: its logits are the final norm and LM head over the hidden row
// after those layers (a Medusa head with w = 0 is exactly that map), and the K/V it writes for
// the layers it ran equal the full pass's (what self-speculation relies on).
TEST(Speculative, EarlyExitThroughTheFirstLayers) {
  lm_t full(target_weights(), {.max_sequence = 64}), early(target_weights(), {.max_sequence = 64});
  medusa_fixture m(target_dir(), 1, 0.0f, 1);  // w = 0
  const auto p = prompt();
  full.prefill(p);
  early.prefill(p);
  const std::array<std::int32_t, 2> ids{5, 77};
  const auto sel = output_selection::all_rows().hidden_for({0, 1});
  const step_output a = full.decode(ids, sel), b = early.decode(ids, sel, 1);
  double head_diff = 0, hidden_diff = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    const auto via_head_a = m.head.logits(a.hidden_of(r), 0);
    const auto via_head_b = m.head.logits(b.hidden_of(r), 0);
    for (std::size_t t = 0; t < 512; ++t) {
      head_diff = std::max<double>(head_diff, std::fabs(via_head_a[t] - a.logits_of(r)[t]));
      head_diff = std::max<double>(head_diff, std::fabs(via_head_b[t] - b.logits_of(r)[t]));
    }
    for (std::size_t j = 0; j < 128; ++j)
      hidden_diff = std::max<double>(hidden_diff, std::fabs(a.hidden_of(r)[j] - b.hidden_of(r)[j]));
  }
  EXPECT_LE(head_diff, 1e-4);
  EXPECT_GT(hidden_diff, 1e-2);  // layer 2 does change the row
  EXPECT_LE(kv_difference(full.kv_cache(), early.kv_cache(), 1, full.length()), 1e-6);
  EXPECT_GT(kv_difference(full.kv_cache(), early.kv_cache(), 2, full.length()), 1e-3);
  expect_error([&] { (void)early.decode(ids, sel, 3); }, error_code::invalid_argument,
               "a step through 3 layers; the model has 2");
}

// With a 16-bit KV cache a step's rows attend to their own K/V at the cache's precision, so a
// verify pass of several rows gives the logits one-row steps give (those read the K/V back from
// the cache): to f32 summation order and the rare bf16 rounding it flips, ~2e-4 here; with the
// unrounded K/V they are ~1.3e-2 apart.
TEST(Speculative, MultiRowStepsSeeTheKvAtTheCachePrecision) {
  using bf16_kv_lm = model::causal_lm<
      model::pipeline_config<model::contiguous_kv<bfloat16>, model::dynamic_attention<>, float>>;
  bf16_kv_lm lm(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  const auto p = prompt();
  // One-row steps: the greedy tokens and each step's logits.
  std::vector<std::int32_t> tokens{greedy_token(lm.prefill(p).logits_of(p.size() - 1))};
  std::vector<std::vector<float>> one_row;
  while (tokens.size() <= 40) {
    const std::array<std::int32_t, 1> one{tokens.back()};
    const step_output o = lm.decode(one);
    one_row.emplace_back(o.logits_of(0).begin(), o.logits_of(0).end());
    tokens.push_back(greedy_token(o.logits_of(0)));
  }
  // The same tokens four to a step.
  lm.reset();
  lm.prefill(p);
  double diff = 0;
  for (std::size_t i = 0; i < 40; i += 4) {
    const std::vector<std::int32_t> ids(tokens.begin() + static_cast<std::ptrdiff_t>(i),
                                        tokens.begin() + static_cast<std::ptrdiff_t>(i + 4));
    const step_output o = lm.decode(ids, output_selection::all_rows());
    for (std::size_t r = 0; r < 4; ++r) {
      for (std::size_t t = 0; t < 512; ++t)
        diff = std::max<double>(diff, std::fabs(o.logits_of(r)[t] - one_row[i + r][t]));
    }
  }
  EXPECT_LE(diff, 1e-3);
  // Greedy speculative decoding over this cache: plain greedy decoding's tokens.
  std::vector<std::int32_t> sequence = p;
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  oracle_draft right{{sequence}, false};
  speculative_stats s;
  EXPECT_EQ(speculative_generate(lm, right, p, 40, 4, &s),
            std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 40));
  EXPECT_EQ(s.accepted, s.proposed);
}

TEST(Speculative, BadArgumentsLeaveTheTargetAsItWas) {
  lm_t target(target_weights(), {.max_sequence = 64, .decode_rows = 4});
  const auto p = prompt();
  target.prefill(std::vector<std::int32_t>{1, 2, 3});
  oracle_draft d{{expected().sequence()}, false};
  auto unchanged = [&] { EXPECT_EQ(target.length(), 3u); };
  auto bad = [&](auto&& fn, error_code code, const std::string& fragment) {
    expect_error(fn, code, fragment);
    unchanged();
  };
  bad([&] { speculative_generate(target, d, p, 5, 0); }, error_code::invalid_argument,
      "speculative_generate: k 0 and max_new_tokens 5 must be > 0");
  bad([&] { speculative_generate(target, d, p, 0, 2); }, error_code::invalid_argument,
      "k 2 and max_new_tokens 0 must be > 0");
  bad([&] { speculative_generate(target, d, std::vector<std::int32_t>{}, 5, 2); },
      error_code::invalid_argument, "empty prompt");
  bad(
      [&] {
        speculative_generate(target, d, std::vector<std::int32_t>{1, 600}, 5, 2);
      },
      error_code::invalid_argument, "prompt token 600 at 1 outside the vocabulary of 512");
  bad([&] { speculative_generate(target, d, p, 5, 4); }, error_code::invalid_argument,
      "k 4 needs a decode shape of 5 rows; the target's has 4");
  bad([&] { speculative_generate(target, d, p, 43, 2); }, error_code::capacity_exhausted,
      "prompt of 23 + 43 new tokens exceeds the target's capacity of 64");
  bad([&] { speculative_generate_sampled(target, d, p, 5, 0, {.temperature = 1.0f}, 1); },
      error_code::invalid_argument, "speculative_generate_sampled: k 0");
  // Drafts that cannot serve the target are refused up front.
  lm_t other_vocab(other_dir(1, 300, 7), {.max_sequence = 64});
  model_draft<lm_t> mismatched(other_vocab);
  bad([&] { speculative_generate(target, mismatched, p, 5, 2); }, error_code::invalid_argument,
      "model_draft: the draft's vocabulary of 300 differs from the target's 512");
  lm_t short_lm(other_dir(1, 512, 99), {.max_sequence = 24});
  model_draft<lm_t> too_short(short_lm);
  bad([&] { speculative_generate(target, too_short, p, 5, 2); }, error_code::capacity_exhausted,
      "model_draft: the draft holds 24 tokens; the generation needs 27");
  expect_error([&] { self_draft<lm_t>(target, 3); }, error_code::invalid_argument,
               "self_draft: 3 layers; the target has 2");
  // Bad proposals are named (found mid-run: the target then holds the verified tokens only).
  struct greedy_liar {
    std::int32_t token;
    std::size_t extra;
    draft_proposal propose(std::span<const std::int32_t>, std::span<const float>, std::size_t n,
                           sampler*) const {
      return {std::vector<std::int32_t>(n + extra, token), {}};
    }
  };
  greedy_liar out_of_vocab{512, 0}, too_many{1, 1};
  expect_error([&] { speculative_generate(target, out_of_vocab, p, 5, 2); },
               error_code::invalid_argument, "draft token 512 at 0 outside the vocabulary of 512");
  EXPECT_EQ(target.length(), p.size());
  expect_error([&] { speculative_generate(target, too_many, p, 5, 2); },
               error_code::invalid_argument, "the draft proposed 3 tokens; 2 were asked for");
  // Medusa heads of the wrong shapes.
  npullm::io::safetensors_model f = npullm::io::safetensors_model::open(target_dir());
  std::vector<tensor<float, 2>> w;
  w.emplace_back(128, 64);
  expect_error(
      [&] {
        model::medusa_head<float>(f.view<float, 1>("model.norm.weight"),
                                  f.view<float, 2>("model.embed_tokens.weight"), 1e-6f,
                                  std::move(w));
      },
      error_code::invalid_shape, "medusa_head: head 0 is [128, 64], not (128, 128)");
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

TEST(SpeculativeSampler, DistributionMatchesSampling) {
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

TEST(Speculative, SampledWithEveryDraftKind) {
  lm_t target(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  drafts all(target);
  const auto p = prompt();
  const sampler_config cfg{.temperature = 0.8f, .top_k = 50};
  all.each([&](const char* name, auto& draft, acceptance a) {
    speculative_stats s;
    const auto out = speculative_generate_sampled(target, draft, p, 24, 3, cfg, 7, &s);
    EXPECT_EQ(out.size(), 24u) << name;
    EXPECT_EQ(target.length(), p.size() + out.size() - 1) << name;  // all but the last token
    for (auto t : out) EXPECT_TRUE(t >= 0 && t < 512) << name;
    EXPECT_EQ(speculative_generate_sampled(target, draft, p, 24, 3, cfg, 7), out) << name;
    // Proposals drawn from (almost exactly) the target's own distribution: nearly all accepted.
    if (std::string(name) == "twin model" || std::string(name) == "self, all layers") {
      EXPECT_GE(s.acceptance(), 0.9) << name;
    }
    (void)a;
    // The sampled path with a greedy sampler is greedy decoding.
    EXPECT_EQ(speculative_generate_sampled(target, draft, p, new_tokens, 3, {}, 7),
              expected().tokens)
        << name;
  });
}

// A grammar processor in speculative decoding (the draft's proposals and the target's rows go
// through it): greedy output equals plain greedy decoding under the same grammar, and sampled
// output stays inside the grammar. The grammar cannot end within the run (at least 100 bytes,
// the tokens have at most 4): speculative_generate has no stop token.
TEST(Speculative, GrammarProcessorThroughTheRounds) {
  const auto g = std::make_shared<grammar::token_grammar>(
      grammar::parse_gbnf(R"(root ::= ("{" [abx]* "}"){50,})"), toy_token_index());
  const auto p = prompt();
  std::vector<std::int32_t> plain_tokens;
  {
    lm_t plain(target_weights(), {.max_sequence = 128});
    sampler greedy({.processor = grammar_processor(g, p.size())}, 0);
    std::vector<std::int32_t> context = p;
    auto out = plain.prefill(p);
    std::int32_t t = greedy.sample(out.logits_of(p.size() - 1), context);
    for (std::size_t i = 0; i < new_tokens; ++i) {
      plain_tokens.push_back(t);
      context.push_back(t);
      if (i + 1 == new_tokens) break;
      t = greedy.sample(plain.decode(std::array{t}).logits_of(0), context);
    }
  }
  lm_t target(target_weights(), {.max_sequence = 128, .decode_rows = 8});
  self_draft<lm_t> draft(target, 1);
  for (const std::size_t k : {1, 3}) {
    const grammar_processor gp(g, p.size());
    EXPECT_EQ(speculative_generate_sampled(target, draft, p, new_tokens, k,
                                           {.processor = gp, .prefetch = gp.prefetcher()}, 7),
              plain_tokens)
        << "k " << k;
    const grammar_processor hot(g, p.size());
    const auto sampled = speculative_generate_sampled(target, draft, p, new_tokens, k,
                                                      {.temperature = 1.0f, .processor = hot}, 9);
    grammar::token_matcher m(g);
    for (const std::int32_t t : sampled) EXPECT_TRUE(m.try_accept(t)) << t << " k " << k;
  }
}

// End to end on a 16-token vocabulary at temperature 4 (the generated model's logits are sharp:
// at 1 one token takes ~85%): the second new token's empirical distribution over many seeds (it
// goes through the rejection rule: one proposal from the first-layer self draft) matches the
// target's exact marginal sum_t1 p(t1) p(t2 | t1), by chi-squared at 0.1% significance (cells with
// fewer than 5 expected draws merged); and, to show the test can fail, it does not match the
// draft's marginal sum_t1 p(t1) q(t2 | t1).
TEST(Speculative, SampledDecodingKeepsTheTargetDistributionEndToEnd) {
  const fs::path& dir = other_dir(2, 16, 3);
  lm_t target(dir, {.max_sequence = 16, .decode_rows = 4});
  self_draft<lm_t> draft(target, 1);
  const sampler_config cfg{.temperature = 4.0f};
  const std::vector<std::int32_t> p = {3, 1, 4, 1, 5};
  // Exact marginals of the second token under the target and under the draft's proposals.
  const sampler dist(cfg, 0);
  std::vector<double> target_marginal(16, 0.0), draft_marginal(16, 0.0);
  target.reset();
  const auto p1 = dist.distribution(target.prefill(p).logits_of(p.size() - 1));
  for (std::int32_t t1 = 0; t1 < 16; ++t1) {
    const std::array<std::int32_t, 1> one{t1};
    const auto pt = dist.distribution(target.decode(one).logits_of(0));
    target.truncate(p.size());
    const auto qt = dist.distribution(target.decode(one, output_selection::last(), 1).logits_of(0));
    target.truncate(p.size());
    for (std::size_t t2 = 0; t2 < 16; ++t2) {
      target_marginal[t2] += p1[static_cast<std::size_t>(t1)] * pt[t2];
      draft_marginal[t2] += p1[static_cast<std::size_t>(t1)] * qt[t2];
    }
  }
  const int runs = 6000;
  std::vector<double> count(16, 0.0);
  speculative_stats total;
  for (int seed = 0; seed < runs; ++seed) {
    speculative_stats s;
    const auto out = speculative_generate_sampled(target, draft, p, 3, 2, cfg,
                                                  static_cast<std::uint64_t>(seed), &s);
    count[static_cast<std::size_t>(out[1])] += 1;
    total.proposed += s.proposed;
    total.accepted += s.accepted;
  }
  // Both branches of the rule ran many times.
  EXPECT_GT(total.acceptance(), 0.1);
  EXPECT_LT(total.acceptance(), 0.95);
  auto chi2 = [&](const std::vector<double>& prob, std::size_t& df) {
    double c = 0, merged_count = 0, merged_expected = 0;
    std::size_t cells = 0;
    for (std::size_t i = 0; i < 16; ++i) {
      const double e = runs * prob[i];
      if (e < 5) {
        merged_count += count[i];
        merged_expected += e;
        continue;
      }
      c += (count[i] - e) * (count[i] - e) / e;
      ++cells;
    }
    if (merged_expected > 0) {
      c += (merged_count - merged_expected) * (merged_count - merged_expected) / merged_expected;
      ++cells;
    }
    df = cells - 1;
    return c;
  };
  // The 0.1% critical value of chi-squared with df degrees of freedom (Wilson-Hilferty; within
  // 1% of the tables for df >= 3): df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3, z = 3.0902.
  auto critical = [](std::size_t df) {
    const double d = static_cast<double>(df), a = 2.0 / (9.0 * d);
    return d * std::pow(1.0 - a + 3.0902 * std::sqrt(a), 3.0);
  };
  std::size_t df = 0;
  const double against_target = chi2(target_marginal, df);
  ASSERT_GE(df, 3u);
  EXPECT_LT(against_target, critical(df)) << "df " << df;
  const double against_draft = chi2(draft_marginal, df);
  EXPECT_GT(against_draft, critical(df)) << "df " << df;
}

}  // namespace
