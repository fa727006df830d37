// Speculative decoding inside the batched generator: greedy output equals plain batched greedy
// decoding for k = 1..4 with every kind of draft (each sequence with its own accepted count and
// rollback), the extreme acceptance counts for always-right and always-wrong drafts, only
// verified KV in the prefix cache (compared with plain decoding's buffers) and reused by a
// follow-up prompt, preemption under a small pool, sampled requests, and refused options.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "npullm/batch/generate.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/model/causal_lm.hpp"
#include "speculative_support.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
using namespace npullm::testing;
namespace fs = std::filesystem;

const fs::path& one_layer_dir() {
  static const fs::path d = [] {
    const fs::path p = scratch_root() / "spec_batch_1layer";
    auto spec = model::preset("tiny", npullm::dtype::f32, 98);
    spec.config.num_hidden_layers = 1;
    model::write_model(p, spec);
    return p;
  }();
  return d;
}

std::vector<std::int32_t> prompt(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i)
    ids[i] = static_cast<std::int32_t>((seed * 2654435761u + i * 97u) % 512u);
  return ids;
}

std::vector<request> ragged_requests() {
  std::vector<request> rs;
  const std::size_t lengths[] = {1, 17, 40, 3, 23, 9};
  for (std::size_t i = 0; i < std::size(lengths); ++i) {
    request r;
    r.prompt = prompt(lengths[i], static_cast<std::uint32_t>(i + 1));
    r.max_new_tokens = 7 + 2 * i;
    rs.push_back(r);
  }
  return rs;
}

std::vector<std::vector<std::int32_t>> run(auto& g, const std::vector<request>& rs) {
  std::vector<std::size_t> ids;
  for (const auto& r : rs) ids.push_back(g.submit(r));
  g.run();
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t id : ids) out.push_back(g.result(id).tokens);
  return out;
}

// Plain batched greedy decoding's tokens, and each request's plain run alone (with the hidden
// rows the oracle head looks up).
struct reference {
  std::vector<request> requests = ragged_requests();
  std::vector<std::vector<std::int32_t>> batched;
  std::vector<plain_run> alone;
  std::vector<std::vector<std::int32_t>> sequences;
  reference() {
    block_lm lm(target_weights(), {.max_sequence = 256, .kv_capacity = 2048});
    generator<block_lm> g(lm, {.max_batch = 6});
    batched = run(g, requests);
    contiguous_lm flat(target_weights(), {.max_sequence = 256});
    for (const auto& r : requests) {
      alone.push_back(plain_greedy(flat, r.prompt, r.max_new_tokens));
      sequences.push_back(alone.back().sequence());
    }
  }
};
const reference& ref() {
  static const reference r;
  return r;
}

TEST(SpeculativeGenerator, GreedyEqualsPlainBatchForEveryDraftKind) {
  ASSERT_EQ(ref().batched, [] {  // the oracles' sequences are the batched ones
    std::vector<std::vector<std::int32_t>> t;
    for (const auto& a : ref().alone) t.push_back(a.tokens);
    return t;
  }());
  const model::pipeline_options options{.max_sequence = 256, .kv_capacity = 2048};
  block_lm lm(target_weights(), options);
  draft_set<block_lm> all(lm, one_layer_dir(), options, ref().alone);
  for (std::size_t k = 1; k <= 4; ++k) {
    all.each([&](const char* name, auto& draft, acceptance a) {
      generator<block_lm, std::remove_reference_t<decltype(draft)>> g(
          lm, draft, {.max_batch = 6, .draft_tokens = k});
      EXPECT_EQ(run(g, ref().requests), ref().batched) << name << ", k " << k;
      const auto& s = g.stats();
      EXPECT_GT(s.proposed, 0u) << name;
      EXPECT_GE(s.max_running, 4u) << name;  // they really ran together
      if (a == acceptance::all) {
        EXPECT_EQ(s.accepted, s.proposed) << name << ", k " << k;
      }
      if (a == acceptance::none) {
        EXPECT_EQ(s.accepted, 0u) << name << ", k " << k;
      }
      // A step emits each running sequence's accepted proposals and one token (the first
      // token comes from the prefill): the longest request sets the number of steps.
      std::size_t longest = 0;
      for (const auto& r : ref().requests) longest = std::max(longest, r.max_new_tokens - 1);
      if (a == acceptance::none) {
        EXPECT_EQ(s.steps, longest) << name;
      }
      if (a == acceptance::all) {
        EXPECT_EQ(s.steps, (longest + k) / (k + 1)) << name;
      }
      EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count()) << name;
    });
  }
  EXPECT_LT(all.right_head.worst, 1e-4);  // the heads got the rows of the last accepted tokens
  EXPECT_LT(all.wrong_head.worst, 1e-4);
}

// After a speculative run, the prefix cache holds the full blocks of each request's verified
// tokens (prompt + output but the last) and their K/V are plain decoding's; a follow-up prompt
// that extends a finished conversation reuses them and decodes as it would alone.
TEST(SpeculativeGenerator, OnlyVerifiedKvReachesThePrefixCache) {
  block_lm lm(target_weights(), {.max_sequence = 256, .kv_capacity = 2048});
  self_draft<block_lm> self(lm, 1);
  oracle_draft wrong{ref().sequences, true};
  contiguous_lm flat(target_weights(), {.max_sequence = 256});
  auto check = [&](auto& draft, const char* name) {
    generator<block_lm, std::remove_reference_t<decltype(draft)>> g(
        lm, draft, {.max_batch = 6, .draft_tokens = 3});
    const auto out = run(g, ref().requests);
    ASSERT_EQ(out, ref().batched) << name;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto& r = ref().requests[i];
      std::vector<std::int32_t> all = r.prompt;
      all.insert(all.end(), out[i].begin(), out[i].end());
      const auto blocks = g.cached_prefixes()->match(all);
      EXPECT_EQ(blocks.size(), (all.size() - 1) / 8) << name << ", request " << i;
      plain_greedy(flat, r.prompt, r.max_new_tokens);  // KV of prompt + output but the last
      double diff = 0;
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        for (std::size_t layer = 0; layer < 2; ++layer) {
          const auto ref_tile = flat.kv_cache().range_tile(layer, b * 8, b * 8 + 8);
          const auto k = lm.kv_pool().block(blocks[b], layer, kv::kv_part::k);
          const auto v = lm.kv_pool().block(blocks[b], layer, kv::kv_part::v);
          for (std::size_t h = 0; h < k.extent(0); ++h) {
            for (std::size_t t = 0; t < 8; ++t) {
              for (std::size_t d = 0; d < k.extent(2); ++d) {
                diff = std::max<double>(diff, std::fabs(k(h, t, d) - ref_tile.k(h, t, d)));
                diff = std::max<double>(diff, std::fabs(v(h, t, d) - ref_tile.v(h, t, d)));
              }
            }
          }
        }
      }
      EXPECT_LE(diff, 1e-5) << name << ", request " << i;
    }
    // A follow-up turn: the 40-token prompt, its 11 new tokens and 5 more.
    request next;
    next.prompt = ref().requests[2].prompt;
    next.prompt.insert(next.prompt.end(), out[2].begin(), out[2].end());
    next.prompt.insert(next.prompt.end(), {1, 2, 3, 4, 5});
    next.max_new_tokens = 6;
    const std::size_t reused = g.stats().reused_tokens;
    const auto id = g.submit(next);
    g.run();
    EXPECT_EQ(g.stats().reused_tokens - reused, 48u) << name;  // 6 of the 51 verified: blocks
    block_lm alone_lm(target_weights(), {.max_sequence = 256});
    generator<block_lm> alone(alone_lm, {.max_batch = 1, .prefix_cache = false});
    EXPECT_EQ(g.result(id).tokens, run(alone, {next})[0]) << name;
  };
  check(self, "self, first layer");
  check(wrong, "wrong oracle");
}

TEST(SpeculativeGenerator, PreemptionUnderASmallPoolChangesNothing) {
  std::vector<request> rs;
  for (std::size_t i = 0; i < 6; ++i) {
    request r;
    r.prompt = prompt(50 + i, static_cast<std::uint32_t>(40 + i));
    r.max_new_tokens = 20;
    rs.push_back(r);
  }
  block_lm big(target_weights(), {.max_sequence = 256, .kv_capacity = 4096});
  generator<block_lm> plain(big, {.max_batch = 6});
  const auto expected = run(plain, rs);
  // 36 blocks of 8: 5 of the 50-token prompts fill 35 of them before any growth.
  block_lm lm(target_weights(), {.max_sequence = 256, .kv_capacity = 288});
  block_lm small(one_layer_dir(), {.max_sequence = 256, .kv_capacity = 288});
  self_draft<block_lm> self(lm, 1);
  model_draft<block_lm> other(small);
  generator<block_lm, self_draft<block_lm>> a(lm, self, {.max_batch = 6, .draft_tokens = 3});
  EXPECT_EQ(run(a, rs), expected);
  EXPECT_GT(a.stats().preemptions, 0u);
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
  // The draft model's pool is as small: some rounds it proposes less, never wrongly.
  generator<block_lm, model_draft<block_lm>> b(lm, other, {.max_batch = 6, .draft_tokens = 3});
  EXPECT_EQ(run(b, rs), expected);
  EXPECT_GT(b.stats().preemptions, 0u);
  EXPECT_GT(b.stats().proposed, 0u);
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
}

TEST(SpeculativeGenerator, SampledRequestsBesideGreedyOnes) {
  block_lm lm(target_weights(), {.max_sequence = 256, .kv_capacity = 2048});
  self_draft<block_lm> self(lm, 2);  // proposes from the target's own distribution
  auto rs = ref().requests;
  for (std::size_t i = 1; i < rs.size(); i += 2) {
    rs[i].sampling = {.temperature = 0.9f, .top_k = 40};
    rs[i].seed = 100 + i;
  }
  generator<block_lm, self_draft<block_lm>> a(lm, self, {.max_batch = 6, .draft_tokens = 3});
  const auto first = run(a, rs);
  generator<block_lm, self_draft<block_lm>> b(lm, self, {.max_batch = 6, .draft_tokens = 3});
  EXPECT_EQ(run(b, rs), first);  // seeded: the same tokens again
  for (std::size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(first[i].size(), rs[i].max_new_tokens);
    if (i % 2 == 0) {
      EXPECT_EQ(first[i], ref().batched[i]) << "greedy request " << i;
    }
    for (auto t : first[i]) EXPECT_TRUE(t >= 0 && t < 512);
  }
  EXPECT_GE(static_cast<double>(a.stats().accepted), 0.9 * static_cast<double>(a.stats().proposed));
}

// The sampler's chain inside speculative rounds: greedy requests with a ban, penalties (whose
// window must include the round's earlier proposals), a processor, stop strings and logprobs
// give exactly the plain generator's results; sampled ones keep the processor's mask.
TEST(SpeculativeGenerator, SamplingControlsAsInPlainDecoding) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  auto rs = ref().requests;
  auto letters = [](std::int32_t t) {
    return std::string{static_cast<char>('a' + t % 26), static_cast<char>('a' + (t / 26) % 26)};
  };
  const logits_processor below_200 = [](std::span<const std::int32_t>, std::span<float> row) {
    for (std::size_t t = 200; t < row.size(); ++t) row[t] = -inf;
  };
  for (std::size_t i = 0; i < rs.size(); ++i) {
    rs[i].sampling.repeat_penalty = 1.5f;
    rs[i].sampling.frequency_penalty = 0.3f;
    rs[i].sampling.penalty_last_n = 16;
    rs[i].logprobs = true;
    rs[i].top_logprobs = 2;
  }
  rs[0].sampling.logit_bias = {{ref().batched[0][0], -inf}};
  rs[1].sampling.processor = below_200;
  rs[2].detokenize = letters;
  rs[3].sampling = {.temperature = 0.9f, .presence_penalty = 0.5f, .processor = below_200};
  rs[3].seed = 9;
  block_lm lm(target_weights(), {.max_sequence = 256, .kv_capacity = 2048});
  generator<block_lm> plain(lm, {.max_batch = 6});
  std::vector<std::size_t> plain_ids;
  for (const auto& r : rs) plain_ids.push_back(plain.submit(r));
  plain.run();
  // A stop string across tokens 3 and 4 of request 2's plain output.
  const std::string text = plain.result(plain_ids[2]).text;
  ASSERT_GE(text.size(), 10u);
  rs[2].stop_strings = {text.substr(7, 2)};
  const std::size_t stop_plain = plain.submit(rs[2]);
  plain.run();
  ASSERT_EQ(plain.result(stop_plain).finish, finish_reason::stop);
  for (std::size_t layers : {1, 2}) {
    self_draft<block_lm> self(lm, layers);
    generator<block_lm, self_draft<block_lm>> g(lm, self, {.max_batch = 6, .draft_tokens = 3});
    std::vector<std::size_t> ids;
    for (const auto& r : rs) ids.push_back(g.submit(r));
    g.run();
    EXPECT_GT(g.stats().accepted, 0u) << layers;
    EXPECT_LT(g.stats().accepted, g.stats().proposed) << layers;  // rejections too
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const generation& got = g.result(ids[i]);
      const generation& want = plain.result(i == 2 ? stop_plain : plain_ids[i]);
      ASSERT_EQ(got.logprobs.size(), got.tokens.size());
      for (std::size_t t = 0; t < got.tokens.size(); ++t)
        EXPECT_EQ(got.logprobs[t].chosen.token, got.tokens[t]);
      if (i == 3) {  // sampled: only the mask can be checked
        for (std::int32_t t : got.tokens) EXPECT_LT(t, 200);
        continue;
      }
      EXPECT_EQ(got.tokens, want.tokens) << "request " << i << ", layers " << layers;
      EXPECT_EQ(got.text, want.text) << "request " << i;
      EXPECT_EQ(got.finish, want.finish) << "request " << i;
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
      for (std::size_t t = 0; t < got.logprobs.size(); ++t) {
        EXPECT_NEAR(got.logprobs[t].chosen.logprob, want.logprobs[t].chosen.logprob, 1e-4);
        EXPECT_EQ(got.logprobs[t].top[0].token, want.logprobs[t].top[0].token);
      }
    }
    EXPECT_NE(g.result(ids[0]).tokens[0], ref().batched[0][0]);  // the ban held
    for (std::int32_t t : g.result(ids[1]).tokens) EXPECT_LT(t, 200);
    EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
  }
}

TEST(SpeculativeGenerator, BadOptionsAndDraftsAreRefused) {
  block_lm lm(target_weights(), {.max_sequence = 64});
  self_draft<block_lm> self(lm, 1);
  using spec_t = generator<block_lm, self_draft<block_lm>>;
  expect_error([&] { spec_t(lm, self, {.draft_tokens = 0}); }, error_code::invalid_argument,
               "generator: a draft needs draft_tokens >= 1");
  expect_error([&] { generator<block_lm>(lm, {.draft_tokens = 2}); }, error_code::invalid_argument,
               "generator: draft_tokens 2 without a draft");
  expect_error([&] { spec_t(lm, self, {.max_batch = 16, .draft_tokens = 4}); },
               error_code::invalid_argument,
               "max_batch 16 x (draft_tokens 4 + 1) = 80 rows exceed the pipeline's step of 64");
  // A draft model of another vocabulary: the request is refused, the queue stays as it was.
  const fs::path d = scratch_root() / "spec_batch_v300";
  auto spec = model::preset("tiny", npullm::dtype::f32, 4);
  spec.config.num_hidden_layers = 1;
  spec.config.vocab_size = 300;
  model::write_model(d, spec);
  block_lm other(d, {.max_sequence = 64});
  model_draft<block_lm> mismatched(other);
  generator<block_lm, model_draft<block_lm>> g(lm, mismatched, {.max_batch = 4, .draft_tokens = 2});
  expect_error(
      [&] {
        g.submit({.prompt = {1, 2, 3}});
      },
      error_code::invalid_argument,
      "model_draft: the draft's vocabulary of 300 differs from the target's 512");
  EXPECT_EQ(g.waiting(), 0u);
  EXPECT_TRUE(g.done());
  // A draft proposing outside the vocabulary is named; no sequence keeps a draft token.
  struct liar {
    draft_proposal propose(std::span<const std::int32_t>, std::span<const float>, std::size_t n,
                           sampler*) const {
      return {std::vector<std::int32_t>(n, 700), {}};
    }
  } bad;
  generator<block_lm, liar> h(lm, bad, {.max_batch = 4, .draft_tokens = 2});
  h.submit({.prompt = {1, 2, 3}, .max_new_tokens = 5});
  expect_error([&] { h.step(); }, error_code::invalid_argument,
               "draft token 700 at 0 outside the vocabulary of 512");
  EXPECT_EQ(h.running(), 1u);
  EXPECT_EQ(h.result(0).tokens.size(), 1u);  // the prefill's token only
}

}  // namespace
