// Greedy speculative decoding on the generated qwen2-0.5b model (bf16 weights, f32 KV in blocks
// of 16, all threads; names and counters as in shared/DESIGN.md):
//   speculative/qwen2-0.5b/bf16/plain/threads:n              plain greedy decoding
//   speculative/qwen2-0.5b/bf16/k<k>/agree<a>/threads:n      k = 1..4 proposals a round from a
//       draft that agrees with the target on a fraction a of its proposals (a in 0, 50, 80,
//       100 %): it proposes the plain greedy token with probability a and another token
//       otherwise (seeded), so its agreement is set here, not by a model, and it costs nothing:
//       the numbers are the verification side's (a (k+1)-row pass against k+1 one-row steps)
// Counters: tokens_per_s (the decode phase: 64 new tokens after a 64-token prompt, the prefill's
// time measured alone and taken out), acceptance (accepted / proposed draft tokens), x_plain
// (tokens_per_s over plain decoding's in the same process). Every run checks that its tokens
// are plain greedy decoding's. (f32 KV: with bf16 KV a (k+1)-row pass and one-row steps differ
// by ~1e-3 in the logits, which flips a near-tie greedy choice in ~0.1% of tokens and would end
// the comparison; the KV of 128 tokens is 0.3% of the bytes a step reads either way.)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

namespace nb = npullm::bench;
namespace nbt = npullm::batch;
using lm_t = npullm::model::causal_lm<npullm::model::pipeline_config<
    npullm::model::block_kv<float, 16>, npullm::model::dynamic_attention<>, npullm::bfloat16>>;

constexpr std::size_t prompt_tokens = 64, new_tokens = 64;

lm_t& pipeline() {
  static std::unique_ptr<lm_t> lm = std::make_unique<lm_t>(
      nb::generated_model("qwen2-0.5b", npullm::dtype::bf16),
      npullm::model::pipeline_options{
          .max_sequence = 256, .decode_rows = 8, .pool = &nb::pool_for(nb::all_threads())});
  return *lm;
}

const std::vector<std::int32_t>& prompt() {
  static const std::vector<std::int32_t> p = [] {
    std::vector<std::int32_t> ids(prompt_tokens);
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int32_t>((i * 104729 + 7919) % 150000);
    return ids;
  }();
  return p;
}

// Plain greedy decoding: the new tokens.
std::vector<std::int32_t> plain_decode() {
  auto& lm = pipeline();
  lm.reset();
  std::vector<std::int32_t> out{
      nbt::greedy_token(lm.prefill(prompt()).logits_of(prompt_tokens - 1))};
  while (out.size() < new_tokens) {
    const std::array<std::int32_t, 1> one{out.back()};
    out.push_back(nbt::greedy_token(lm.decode(one).logits_of(0)));
  }
  return out;
}

struct baseline {
  std::vector<std::int32_t> tokens;  // plain greedy decoding's new tokens
  double prefill_seconds;            // the prompt's prefill alone (median)
  double decode_seconds;             // plain decoding after the prefill (median)
};
const baseline& plain() {
  static const baseline b = [] {
    baseline r{plain_decode(), 0, 0};
    auto& lm = pipeline();
    r.prefill_seconds = nb::median_seconds(5, [&] {
      lm.reset();
      benchmark::DoNotOptimize(lm.prefill(prompt()).logits.data());
    });
    r.decode_seconds = nb::median_seconds(3, [] { (void)plain_decode(); }) - r.prefill_seconds;
    return r;
  }();
  return b;
}

// Proposes the plain greedy continuation, each token kept with probability `agree` and
// replaced by another otherwise (a splitmix stream seeded per run).
struct agreeing_draft {
  std::vector<std::int32_t> sequence;  // prompt + plain greedy tokens
  double agree;
  std::uint64_t state;
  double uniform() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  }
  nbt::draft_proposal propose(std::span<const std::int32_t> context, std::span<const float>,
                              std::size_t n, nbt::sampler*) {
    nbt::draft_proposal out;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t t = sequence[context.size() + i];  // greedy: context is its prefix
      out.tokens.push_back(uniform() < agree ? t : (t + 1) % 150000);
    }
    return out;
  }
};

void plain_benchmark(benchmark::State& state) {
  const baseline& b = plain();
  std::vector<double> runs;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (plain_decode() != b.tokens) state.SkipWithError("plain decoding is not deterministic");
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double tps = (new_tokens - 1) / (nb::median(runs) - b.prefill_seconds);
  state.counters["tokens_per_s"] = tps;
  state.counters["x_plain"] = tps * b.decode_seconds / (new_tokens - 1);
}

void speculative_benchmark(benchmark::State& state, std::size_t k, double agree) {
  const baseline& b = plain();
  std::vector<std::int32_t> sequence = prompt();
  sequence.insert(sequence.end(), b.tokens.begin(), b.tokens.end());
  std::vector<double> runs;
  nbt::speculative_stats total;
  std::uint64_t seed = 1;
  for (auto _ : state) {
    agreeing_draft draft{sequence, agree, seed++};
    nbt::speculative_stats s;
    const auto start = std::chrono::steady_clock::now();
    const auto out = nbt::speculative_generate(pipeline(), draft, prompt(), new_tokens, k, &s);
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (out != b.tokens) state.SkipWithError("speculative decoding differs from plain decoding");
    total.proposed += s.proposed;
    total.accepted += s.accepted;
  }
  const double tps = (new_tokens - 1) / (nb::median(runs) - b.prefill_seconds);
  state.counters["tokens_per_s"] = tps;
  state.counters["acceptance"] = total.acceptance();
  state.counters["x_plain"] = tps * b.decode_seconds / (new_tokens - 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string base = "speculative/qwen2-0.5b/bf16/";
  const std::string threads = "/threads:" + std::to_string(nb::all_threads());
  benchmark::RegisterBenchmark((base + "plain" + threads).c_str(), plain_benchmark)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3);
  for (std::size_t k = 1; k <= 4; ++k) {
    for (int percent : {0, 50, 80, 100}) {
      const std::string name =
          base + "k" + std::to_string(k) + "/agree" + std::to_string(percent) + threads;
      benchmark::RegisterBenchmark(name.c_str(), speculative_benchmark, k, percent / 100.0)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
  }
  return nb::run_benchmarks(argc, argv);
}
