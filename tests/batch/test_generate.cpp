// Batched generation: ragged batches give each request's own tokens (greedy and seeded),
// stop and max tokens, requests joining mid-flight, preemption under a small pool, prefix reuse
// (counted), all blocks back at the end, streaming, and request validation.
#include <gtest/gtest.h>

#include "grammar_support.hpp"
#include "support.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "npullm/batch/generate.hpp"
#include "npullm/batch/grammar_processor.hpp"
#include "npullm/grammar/gbnf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/serve/engine.hpp"

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
std::vector<std::int32_t> alone(
    const request& r,
    const std::shared_ptr<const model::model_weights<float>>& weights = tiny_weights()) {
  lm_t lm(weights, {.max_sequence = 512});
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
  // Prompts longer than decode_rows that arrived together were prefilled in shared steps.
  EXPECT_LT(g.stats().prefill_steps, rs.size());
}

TEST(Generator, GreedyBatchEqualsEachAlone) {
  expect_batch_equals_alone(false);
}
TEST(Generator, SeededSamplingBatchEqualsEachAlone) {
  expect_batch_equals_alone(true);
}

// ---- a mixture of experts above the layer ----------------------------------------------------
// tiny-qwen2moe (8 experts of 64, top 2, a shared expert) with every projection, the experts'
// included, quantized to q8_0 at load and so repacked into tiles: decode steps of up to 16 rows
// run the experts the tiled way (moe/mlp.hpp), gathering each expert's rows of the batch;
// prefills run them in turn.
const std::shared_ptr<const model::model_weights<float>>& moe_weights() {
  static const auto w = model::model_weights<float>::load(
      npullm::testing::generated_model("tiny-qwen2moe", 13),
      {.projections = model::quantization{ops::weight_format::q8_0, 0}});
  return w;
}

TEST(GeneratorMoe, GreedyBatchOfAMixtureEqualsEachAlone) {
  ASSERT_EQ(moe_weights()->config().moe.experts, 8u);
  ASSERT_TRUE(moe_weights()->layers[1].moe.down[7].is_quantized());
  lm_t lm(moe_weights(), {.max_sequence = 256, .kv_capacity = 1024});
  generator<lm_t> g(lm, {.max_batch = 4});
  std::vector<request> rs;
  for (const std::size_t n : {5u, 40u, 13u}) {
    request r;
    r.prompt = prompt(n, static_cast<std::uint32_t>(n));
    r.max_new_tokens = 10;
    rs.push_back(r);
  }
  std::vector<std::size_t> ids;
  for (const auto& r : rs) ids.push_back(g.submit(r));
  g.run();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(g.result(ids[i]).tokens.size(), 10u);
    EXPECT_EQ(g.result(ids[i]).tokens, alone(rs[i], moe_weights())) << "request " << i;
  }
  EXPECT_EQ(g.stats().max_running, 3u);  // they really ran together
}

// The same mixture over KV blocks of 8 tokens and over one contiguous cache: a prompt's logits
// and those of the decode steps that follow agree within f32 reassociation of the attention.
TEST(GeneratorMoe, BlockKvLogitsOfAMixtureMatchContiguousKv) {
  lm_t blocks(moe_weights(), {.max_sequence = 128});
  contiguous_lm_t flat(moe_weights(), {.max_sequence = 128});
  const auto ids = prompt(37, 5);
  double worst = 0, scale = 0;
  auto compare = [&](const step_output& a, const step_output& b) {
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (std::size_t i = 0; i < a.logits.size(); ++i) {
      worst = std::max(worst, double(std::fabs(a.logits.data()[i] - b.logits.data()[i])));
      scale = std::max(scale, double(std::fabs(b.logits.data()[i])));
    }
  };
  const auto all = output_selection::all_rows();
  compare(blocks.prefill(ids, all), flat.prefill(ids, all));
  std::int32_t next = ids.back();
  for (int t = 0; t < 6; ++t) {
    const std::array<std::int32_t, 1> one{next};
    const auto a = blocks.decode(one, all);
    compare(a, flat.decode(one, all));
    next = greedy_token(a.logits_of(0));
  }
  EXPECT_GT(scale, 1.0);
  EXPECT_LE(worst, 1e-5 * scale);  // measured: 3.8e-6 of logits up to 15.7
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
  // cache_prompt = false: the whole prompt is computed again, the same tokens come.
  request third = second;
  third.cache_prompt = false;
  const auto id3 = g.submit(third);
  g.run();
  EXPECT_EQ(g.stats().reused_tokens, 40u);
  EXPECT_EQ(g.stats().prefill_tokens, 90u);
  EXPECT_EQ(g.result(id3).tokens, alone(second));
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
  npullm::testing::expect_error(
      [&] { (void)g.result(5); }, error_code::out_of_range,
      "result of request 5, which was never submitted (0 were submitted)");
}

// cancel(id): a waiting request leaves the queue, a running one the batch with its blocks; the
// others go on as if it had never run beside them; release(id) forgets a finished one.
TEST(Generator, CancelFreesTheBlocksAndLeavesTheOthersAlone) {
  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 2048});
  generator<lm_t> g(lm, {.max_batch = 2, .prefix_cache = false});
  const auto rs = ragged_requests(true);
  const auto a = g.submit(rs[1]);
  const auto b = g.submit(rs[4]);
  const auto c = g.submit(rs[6]);  // waits: max_batch 2
  g.step();
  g.step();
  ASSERT_EQ(g.running(), 2u);
  const std::size_t used = lm.kv_pool().total_count() - lm.kv_pool().free_count();
  const std::size_t b_tokens = g.result(b).tokens.size();
  EXPECT_TRUE(g.cancel(b));   // running: its blocks go back now
  EXPECT_FALSE(g.cancel(b));  // already ended
  EXPECT_LT(lm.kv_pool().total_count() - lm.kv_pool().free_count(), used);
  EXPECT_EQ(g.result(b).finish, finish_reason::cancelled);
  EXPECT_EQ(g.result(b).tokens.size(), b_tokens);  // what it had is kept
  const auto d = g.submit(rs[2]);
  EXPECT_TRUE(g.cancel(d));  // waiting: it never runs
  EXPECT_EQ(g.waiting(), 1u);
  g.run();
  EXPECT_EQ(g.result(a).tokens, alone(rs[1]));
  EXPECT_EQ(g.result(c).tokens, alone(rs[6]));
  EXPECT_TRUE(g.result(d).tokens.empty());
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
  // release: gone, and a second release or a read is out_of_range naming why.
  g.release(a);
  npullm::testing::expect_error([&] { (void)g.result(a); }, error_code::out_of_range,
                                "result of request 0, which was released");
  npullm::testing::expect_error([&] { g.release(a); }, error_code::out_of_range, "was released");
  const auto e = g.submit(rs[3]);
  npullm::testing::expect_error([&] { g.release(e); }, error_code::invalid_argument,
                                "still running");
  g.run();
  g.release(e);
  EXPECT_TRUE(g.done());
}

// A request whose own sampling raises (its processor: say a grammar whose matcher gives up,
// capacity_exhausted) fails alone, at its first token or mid-generation: finish failed with
// the error, its blocks back; the others run as if it had never been there.
TEST(Generator, ARequestWhoseSamplingRaisesFailsAlone) {
  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 4096});
  generator<lm_t> g(lm, {.max_batch = 4, .prefix_cache = false});
  const auto rs = ragged_requests(false);
  const auto raising_after = [](int calls) {
    auto n = std::make_shared<int>(0);
    return [n, calls](std::span<const std::int32_t>, std::span<float>) {
      if ((*n)++ >= calls)
        npullm::raise(error_code::capacity_exhausted, "test: the matcher gave up");
    };
  };
  request first = rs[2], later = rs[6];
  first.sampling.processor = raising_after(0);  // at its first token (admission)
  later.sampling.processor = raising_after(3);  // at its fourth (a decode step)
  const auto a = g.submit(rs[1]);
  const auto f = g.submit(first);
  const auto l = g.submit(later);
  const auto b = g.submit(rs[4]);
  g.run();
  EXPECT_EQ(g.result(a).tokens, alone(rs[1]));
  EXPECT_EQ(g.result(b).tokens, alone(rs[4]));
  EXPECT_EQ(g.result(a).finish, finish_reason::length);
  for (const auto id : {f, l}) {
    EXPECT_EQ(g.result(id).finish, finish_reason::failed);
    ASSERT_TRUE(g.result(id).failure.has_value());
    EXPECT_EQ(g.result(id).failure->code(), error_code::capacity_exhausted);
  }
  EXPECT_TRUE(g.result(f).tokens.empty());
  EXPECT_EQ(g.result(l).tokens.size(), 3u);
  EXPECT_FALSE(g.cancel(l));  // already ended
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
}

// ---- the server's engine: the generator behind a thread ------------------------------------

// Reads a stream to its end: its tokens, logprobs and text.
struct streamed {
  std::vector<std::int32_t> tokens;
  std::vector<token_logprobs> logprobs;
  std::string text;
  finish_reason finish = finish_reason::running;
  bool failed = false;
};
streamed read_all(serve::output_stream& s) {
  streamed out;
  for (;;) {
    auto p = s.take(std::chrono::milliseconds(50));
    out.tokens.insert(out.tokens.end(), p.tokens.begin(), p.tokens.end());
    out.logprobs.insert(out.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
    out.text += p.text;
    if (p.finished) {
      out.finish = p.finish;
      out.failed = p.failure.has_value();
      return out;
    }
  }
}

// Bit for bit: the same doubles, not only equal ones.
bool same_bits(const std::vector<token_logprobs>& a, const std::vector<token_logprobs>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].chosen.token != b[i].chosen.token ||
        std::memcmp(&a[i].chosen.logprob, &b[i].chosen.logprob, sizeof(double)) != 0 ||
        a[i].top.size() != b[i].top.size())
      return false;
    for (std::size_t k = 0; k < a[i].top.size(); ++k) {
      if (a[i].top[k].token != b[i].top[k].token ||
          std::memcmp(&a[i].top[k].logprob, &b[i].top[k].logprob, sizeof(double)) != 0)
        return false;
    }
  }
  return true;
}

// Output that does not depend on the load: a greedy and a seeded request with logprobs give
// the same tokens and the same logprob bits alone and among 15 others of other lengths (the
// step's products over 16 rows against 1; the attention per sequence), with two threads:
// quantized weights (q8_0, the LM head too), whose tiled kernels compute each row alone, and
// dense f32 weights in a pipeline with batch_invariant (projections and head in panels).
const std::shared_ptr<const model::model_weights<float>>& tiny_q8_weights() {
  static const auto w = model::model_weights<float>::load(
      tiny_dir(), {.projections = model::quantization{ops::weight_format::q8_0, 0},
                   .embedding_and_head = model::quantization{ops::weight_format::q8_0, 0}});
  return w;
}
void expect_output_independent_of_load(
    const std::shared_ptr<const model::model_weights<float>>& weights, bool batch_invariant) {
  thread_pool pool(2);
  lm_t lm(weights, {.max_sequence = 512,
                    .kv_capacity = 8192,
                    .pool = &pool,
                    .batch_invariant = batch_invariant});
  const auto rs = ragged_requests(true);
  std::vector<request> probes;
  for (bool sampled : {false, true}) {
    request r = rs[2];
    r.max_new_tokens = 12;
    r.logprobs = true;
    r.top_logprobs = 3;
    if (!sampled) r.sampling = {};
    probes.push_back(r);
  }
  std::vector<streamed> alone_out;
  {
    serve::engine<lm_t> e(lm, {.parallel = 1, .prefix_cache = false});
    for (const request& r : probes) alone_out.push_back(read_all(*e.submit(r)));
  }
  serve::engine<lm_t> e(lm, {.parallel = 16, .prefix_cache = false});
  std::vector<std::shared_ptr<serve::output_stream>> others, mine;
  for (std::size_t i = 0; i < 15; ++i) {
    request o = rs[i % rs.size()];
    o.seed += i;
    o.max_new_tokens = 20;
    others.push_back(e.submit(o));
  }
  for (const request& r : probes) mine.push_back(e.submit(r));
  for (std::size_t k = 0; k < probes.size(); ++k) {
    const streamed busy = read_all(*mine[k]);
    EXPECT_EQ(busy.tokens, alone_out[k].tokens) << "probe " << k;
    EXPECT_TRUE(same_bits(busy.logprobs, alone_out[k].logprobs)) << "probe " << k;
  }
  for (auto& o : others) EXPECT_EQ(read_all(*o).finish, finish_reason::length);
  EXPECT_GE(e.metrics().generated_tokens, 15u * 20u);
}
TEST(Engine, OutputDoesNotDependOnTheLoad) {
  expect_output_independent_of_load(tiny_q8_weights(), false);
}
TEST(Engine, DenseOutputDoesNotDependOnTheLoadWithBatchInvariant) {
  expect_output_independent_of_load(tiny_weights(), true);
}

// Requests from several threads, each read on its own thread, get what each gets alone; a
// cancelled one ends with its blocks back; a full queue refuses with capacity_exhausted; a
// request the generator refuses fails alone; drain finishes what runs.
TEST(Engine, ConcurrentStreamsCancelQueueAndDrain) {
  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 2048});
  serve::engine<lm_t> e(lm, {.parallel = 2, .max_queue = 3});
  const auto rs = ragged_requests(true);
  std::vector<std::shared_ptr<serve::output_stream>> s;
  for (std::size_t i = 0; i < 4; ++i) s.push_back(e.submit(rs[i]));
  request long_one = rs[5];
  long_one.max_new_tokens = 400;
  s.push_back(e.submit(long_one));  // 5 = parallel 2 + queue 3
  npullm::testing::expect_error([&] { (void)e.submit(rs[6]); }, error_code::capacity_exhausted,
                                "requests in flight");
  // The long one runs once a slot frees; cancel it at its first tokens: it ends cancelled.
  std::size_t first = 0;
  while ((first = s[4]->take(std::chrono::milliseconds(10)).tokens.size()) == 0) {
  }
  e.cancel(*s[4]);
  const streamed cut = read_all(*s[4]);
  EXPECT_EQ(cut.finish, finish_reason::cancelled);
  EXPECT_LT(first + cut.tokens.size(), 400u);
  std::vector<streamed> got(4);
  {
    std::vector<std::thread> readers;
    for (std::size_t i = 0; i < 4; ++i) readers.emplace_back([&, i] { got[i] = read_all(*s[i]); });
    for (auto& t : readers) t.join();
  }
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i].tokens, alone(rs[i])) << "request " << i;
  // A request the generator refuses (a token outside the vocabulary) fails alone.
  request bad = rs[0];
  bad.prompt.push_back(100000);
  EXPECT_TRUE(read_all(*e.submit(bad)).failed);
  const auto after = read_all(*e.submit(rs[7]));
  EXPECT_EQ(after.tokens, alone(rs[7]));
  const auto m = e.metrics();
  EXPECT_EQ(m.cancelled, 1u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.finished, 5u);
  EXPECT_EQ(e.in_flight(), 0u);
  // Drain: the one running finishes; afterwards submit refuses.
  auto last = e.submit(rs[1]);
  EXPECT_TRUE(e.drain(std::chrono::seconds(30)));
  EXPECT_EQ(read_all(*last).tokens, alone(rs[1]));
  npullm::testing::expect_error([&] { (void)e.submit(rs[1]); }, error_code::capacity_exhausted,
                                "stopping");
}

// ---- sampling controls per request -----------------------------------------------------------

constexpr float inf = std::numeric_limits<float>::infinity();

// The tests' detokenizer: two letters a token, so a stop string can span tokens.
std::string letters(std::int32_t t) {
  return {static_cast<char>('a' + t % 26), static_cast<char>('a' + (t / 26) % 26)};
}

TEST(GeneratorSampling, EachRequestKeepsItsOwnSettingsInABatch) {
  request base;
  base.prompt = prompt(12, 5);
  base.max_new_tokens = 10;
  const auto free_run = alone(base);
  std::vector<request> rs(6, base);
  rs[0].sampling.logit_bias = {{free_run[0], -inf}};  // greedy, its first token banned
  rs[1].prompt = prompt(30, 6);  // greedy, a presence penalty that forbids any repeat
  rs[1].sampling = {.presence_penalty = 1e4f, .penalty_last_n = 1000};
  rs[2].sampling = {.temperature = 1.5f, .min_p = 0.5f};
  rs[2].seed = 3;
  bool contexts_ok = true;  // the processor sees the prompt and the tokens so far
  rs[3].prompt = prompt(20, 7);
  rs[3].sampling = {
      .temperature = 1.0f,
      .processor = [&, p = rs[3].prompt](std::span<const std::int32_t> ctx, std::span<float> row) {
        contexts_ok =
            contexts_ok && ctx.size() >= p.size() && std::equal(p.begin(), p.end(), ctx.begin());
        for (std::size_t t = 100; t < row.size(); ++t) row[t] = -inf;
      }};
  rs[3].seed = 4;
  rs[4].sampling = {.temperature = 0.9f, .repeat_penalty = 1.3f, .frequency_penalty = 0.2f};
  rs[4].seed = 5;
  rs[4].logprobs = true;
  rs[4].top_logprobs = 3;
  rs[5].prompt = prompt(9, 8);
  rs[5].sampling = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.05f};
  rs[5].seed = 6;

  lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 2048});
  generator<lm_t> g(lm, {.max_batch = 6});
  std::vector<std::size_t> ids;
  for (const auto& r : rs) ids.push_back(g.submit(r));
  g.run();
  EXPECT_EQ(g.stats().max_running, 6u);
  for (std::size_t i = 0; i < rs.size(); ++i)
    EXPECT_EQ(g.result(ids[i]).tokens, alone(rs[i])) << "request " << i;
  const auto& banned = g.result(ids[0]).tokens;
  EXPECT_EQ(std::count(banned.begin(), banned.end(), free_run[0]), 0);
  EXPECT_NE(banned, free_run);
  std::vector<std::int32_t> seen = rs[1].prompt;  // no token twice, prompt included
  for (std::int32_t t : g.result(ids[1]).tokens) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), t), 0) << t;
    seen.push_back(t);
  }
  for (std::int32_t t : g.result(ids[3]).tokens) EXPECT_LT(t, 100);
  EXPECT_TRUE(contexts_ok);
  const generation& lp = g.result(ids[4]);
  ASSERT_EQ(lp.logprobs.size(), lp.tokens.size());
  for (std::size_t i = 0; i < lp.tokens.size(); ++i) {
    EXPECT_EQ(lp.logprobs[i].chosen.token, lp.tokens[i]);
    ASSERT_EQ(lp.logprobs[i].top.size(), 3u);
    EXPECT_LE(lp.logprobs[i].chosen.logprob, 0.0);
    EXPECT_LE(lp.logprobs[i].chosen.logprob, lp.logprobs[i].top[0].logprob);
    double mass = 0;
    for (const auto& e : lp.logprobs[i].top) mass += std::exp(e.logprob);
    EXPECT_LE(mass, 1.0 + 1e-9);
  }
  EXPECT_TRUE(g.result(ids[0]).logprobs.empty());  // only when asked for
}

// Constrained generation in a batch: each request's grammar processor (one compiled grammar
// shared by all, masks prefetched while the model runs) keeps its tokens inside the grammar,
// and the prefetch changes no token.
TEST(GeneratorSampling, GrammarProcessorsWithPrefetchInABatch) {
  const auto g = std::make_shared<grammar::token_grammar>(
      grammar::parse_gbnf(R"(root ::= "{" ("a" | "b" | "ab")* "}")"),
      npullm::testing::toy_token_index());
  const auto run = [&](bool prefetch) {
    lm_t lm(tiny_weights(), {.max_sequence = 512, .kv_capacity = 2048});
    generator<lm_t> gen(lm, {.max_batch = 4});
    std::vector<std::size_t> ids;
    for (std::uint32_t i = 0; i < 4; ++i) {
      request r;
      r.prompt = prompt(10 + 7 * i, 20 + i);
      r.max_new_tokens = 12;
      r.stop = {0};
      r.seed = 40 + i;
      const grammar_processor p(g, r.prompt.size());
      r.sampling = {.temperature = 1.0f, .processor = p};
      if (prefetch) r.sampling.prefetch = p.prefetcher();
      ids.push_back(gen.submit(r));
    }
    gen.run();
    std::vector<std::vector<std::int32_t>> out;
    for (const std::size_t id : ids) out.push_back(gen.result(id).tokens);
    return out;
  };
  const auto with = run(true);
  EXPECT_EQ(with, run(false));
  for (const auto& tokens : with) {
    ASSERT_FALSE(tokens.empty());
    grammar::token_matcher m(g);
    for (const std::int32_t t : tokens) EXPECT_TRUE(m.try_accept(t)) << t;
  }
}

// A greedy request's log-probabilities are the log-softmax of the logits the pipeline gives
// for its context (checked token by token against a batch-1 run of the same pipeline).
TEST(GeneratorSampling, LogprobsAreTheRawLogitsLogSoftmax) {
  request r;
  r.prompt = prompt(15, 9);
  r.max_new_tokens = 5;
  r.logprobs = true;
  r.top_logprobs = 2;
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> g(lm);
  const auto id = g.submit(r);
  g.run();
  const generation& out = g.result(id);
  ASSERT_EQ(out.logprobs.size(), 5u);
  contiguous_lm_t flat(tiny_weights(), {.max_sequence = 512});
  std::vector<std::int32_t> context = r.prompt;
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    flat.reset();
    const step_output step = flat.prefill(context);
    const auto row = step.logits_of(context.size() - 1);
    double top = -inf, sum = 0;
    for (float v : row) top = std::max(top, static_cast<double>(v));
    for (float v : row) sum += std::exp(static_cast<double>(v) - top);
    const double want = row[static_cast<std::size_t>(out.tokens[i])] - top - std::log(sum);
    EXPECT_NEAR(out.logprobs[i].chosen.logprob, want, 1e-4) << i;
    EXPECT_EQ(out.logprobs[i].top[0].token, out.tokens[i]);  // greedy: the most likely
    context.push_back(out.tokens[i]);
  }
}

TEST(GeneratorSampling, StopStringsAcrossTokensLeaveTheStopStringOut) {
  request r;
  r.prompt = prompt(10, 3);
  r.max_new_tokens = 12;
  r.detokenize = letters;
  r.logprobs = true;
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> free_gen(lm);
  const auto free_id = free_gen.submit(r);
  free_gen.run();
  const generation free_run = free_gen.result(free_id);
  ASSERT_EQ(free_run.tokens.size(), 12u);
  std::string all;
  for (std::int32_t t : free_run.tokens) all += letters(t);
  EXPECT_EQ(free_run.text, all);
  // Starts in the second letter of token 2, ends in the first of token 4.
  const std::string stop = all.substr(5, 4);
  const std::size_t at = all.find(stop);
  const std::size_t completing = (at + stop.size() - 1) / 2;
  ASSERT_LT(at / 2, completing);  // it spans tokens
  r.stop_strings = {"this never occurs", stop};
  std::string streamed;
  std::size_t text_calls = 0, finished_calls = 0;
  r.on_text = [&](std::string_view piece, bool finished) {
    EXPECT_EQ(finished_calls, 0u);  // nothing after the end
    streamed += piece;
    ++text_calls;
    finished_calls += finished ? 1 : 0;
  };
  generator<lm_t> g(lm);
  const auto id = g.submit(r);
  std::vector<std::int32_t> sampled;
  bool last_finished = false;
  g.run([&](std::size_t, std::int32_t t, bool finished) {
    sampled.push_back(t);
    last_finished = finished;
  });
  const generation& out = g.result(id);
  EXPECT_EQ(out.finish, finish_reason::stop);
  EXPECT_EQ(out.stop_string, 1u);
  EXPECT_EQ(out.tokens, std::vector<std::int32_t>(
                            free_run.tokens.begin(),
                            free_run.tokens.begin() + static_cast<std::ptrdiff_t>(completing)));
  EXPECT_EQ(out.logprobs.size(), out.tokens.size());
  EXPECT_EQ(out.text, all.substr(0, at));
  // Streamed: the same text, in more than one piece, finished once; the token callback saw the
  // completing token too.
  EXPECT_EQ(streamed, out.text);
  EXPECT_GT(text_calls, 1u);
  EXPECT_EQ(finished_calls, 1u);
  EXPECT_EQ(sampled.size(), completing + 1);
  EXPECT_EQ(sampled.back(), free_run.tokens[completing]);
  EXPECT_TRUE(last_finished);
  // A request that ends by length streams all of its text.
  request plain = r;
  plain.stop_strings = {"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"};
  streamed.clear();
  finished_calls = 0;
  const auto id2 = g.submit(plain);
  g.run();
  EXPECT_EQ(g.result(id2).finish, finish_reason::length);
  EXPECT_EQ(streamed, all);
  EXPECT_EQ(finished_calls, 1u);
}

// Streamed text never stops inside a UTF-8 character that a later token completes.
TEST(GeneratorSampling, StreamedTextKeepsUtf8CharactersWhole) {
  request r;
  r.prompt = prompt(10, 4);
  r.max_new_tokens = 24;
  r.sampling = {.temperature = 1.0f};
  r.seed = 2;
  // A 3-byte character in two tokens ("\xE2\x82" + "\xAC" is the euro sign), and ASCII.
  r.detokenize = [](std::int32_t t) -> std::string {
    return t % 3 == 0 ? "\xE2\x82" : t % 3 == 1 ? "\xAC" : "a";
  };
  std::string streamed;
  std::size_t held = 0;  // calls that held bytes back
  r.on_text = [&](std::string_view piece, bool finished) {
    streamed += piece;
    if (!finished) {
      EXPECT_EQ(incomplete_utf8_tail(streamed), 0u) << streamed.size();
    }
  };
  lm_t lm(tiny_weights(), {.max_sequence = 512});
  generator<lm_t> g(lm);
  const auto id = g.submit(r);
  std::string all;
  g.run([&](std::size_t, std::int32_t t, bool) {
    held += streamed.size() < all.size() ? 1 : 0;  // after the previous token
    all += r.detokenize(t);
  });
  EXPECT_EQ(g.result(id).text, all);
  EXPECT_EQ(streamed, all);
  EXPECT_GT(held, 0u);  // some token did end inside a character
}

TEST(GeneratorSampling, BadSettingsAreRejectedAndChangeNothing) {
  lm_t lm(tiny_weights(), {.max_sequence = 64});
  generator<lm_t> g(lm);
  auto expect_reject = [&](request r, const std::string& fragment) {
    npullm::testing::expect_error([&] { g.submit(std::move(r)); }, error_code::invalid_argument,
                                  fragment);
  };
  const request ok{.prompt = {1, 2}, .max_new_tokens = 2};
  auto with = [&](auto change) {
    request r = ok;
    change(r);
    return r;
  };
  expect_reject(with([](request& r) { r.sampling.penalty_last_n = -1; }),
                "request 0: sampler: penalty_last_n -1 must be >= 0");
  expect_reject(with([](request& r) { r.sampling.min_p = 2.0f; }), "min_p 2 outside [0, 1]");
  expect_reject(with([](request& r) {
                  r.sampling.logit_bias = {{3, std::numeric_limits<float>::quiet_NaN()}};
                }),
                "logit_bias 0 (token 3, bias nan)");
  expect_reject(with([](request& r) {
                  r.sampling.logit_bias = {{600, -inf}};
                }),
                "request 0: logit_bias token 600 outside the vocabulary of 512");
  expect_reject(with([](request& r) {
                  r.detokenize = letters;
                  r.stop_strings = {"ab", ""};
                }),
                "request 0: stop string 1 is empty");
  expect_reject(with([](request& r) { r.stop_strings = {"ab"}; }), "need a detokenize callback");
  expect_reject(with([](request& r) { r.on_text = [](std::string_view, bool) {}; }),
                "need a detokenize callback");
  expect_reject(with([](request& r) { r.top_logprobs = 3; }), "top_logprobs 3 without logprobs");
  EXPECT_TRUE(g.done());
  EXPECT_EQ(g.submit(ok), 0u);  // nothing was queued
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
