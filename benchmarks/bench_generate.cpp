// Batched generation on the generated qwen2-0.5b model, bf16 weights, bf16 KV in blocks of 16
// (names and counters as in shared/DESIGN.md): `batch` requests of 128-token prompts, 128 new
// tokens each, greedy, all threads. tokens_per_s counts generated tokens over the whole run
// (prefill included); x_batch1 is the speedup over batch 1 measured in the same process.
// NPULLM_BATCH_INVARIANT=1 in the environment: the pipeline with batch_invariant (projections
// and LM head in packed panels, as npullm_server runs dense weights), to measure its cost.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/batch/generate.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

namespace nb = npullm::bench;
namespace fs = std::filesystem;
using lm_t = npullm::model::causal_lm<
    npullm::model::pipeline_config<npullm::model::block_kv<npullm::bfloat16, 16>,
                                   npullm::model::dynamic_attention<>, npullm::bfloat16>>;

lm_t& pipeline() {
  static const npullm::thread_pool pool(nb::all_threads());
  static std::unique_ptr<lm_t> lm = [] {
    const fs::path dir = nb::generated_model("qwen2-0.5b", npullm::dtype::bf16);
    const char* invariant = std::getenv("NPULLM_BATCH_INVARIANT");
    return std::make_unique<lm_t>(
        dir, npullm::model::pipeline_options{
                 .max_sequence = 1024,
                 .kv_capacity = 64 * 272,
                 .pool = &pool,
                 .batch_invariant = invariant != nullptr && std::string(invariant) == "1"});
  }();
  return *lm;
}

double run_batch(std::size_t batch) {
  auto& lm = pipeline();
  npullm::batch::generator<lm_t> g(lm, {.max_batch = batch, .prefix_cache = false});
  for (std::size_t b = 0; b < batch; ++b) {
    npullm::batch::request r;
    r.prompt.resize(128);
    for (std::size_t i = 0; i < 128; ++i)
      r.prompt[i] = static_cast<std::int32_t>((b * 7919 + i * 104729 + 1) % 150000);
    r.max_new_tokens = 128;
    g.submit(std::move(r));
  }
  const auto start = std::chrono::steady_clock::now();
  g.run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double batch1_tokens_per_s() {
  static const double v = 128.0 / run_batch(1);
  return v;
}

void generate_benchmark(benchmark::State& state, std::size_t batch) {
  std::vector<double> runs;
  for (auto _ : state) runs.push_back(run_batch(batch));
  const double tps = static_cast<double>(batch) * 128.0 / nb::median(runs);
  state.counters["tokens_per_s"] = tps;
  state.counters["x_batch1"] = tps / batch1_tokens_per_s();
}

}  // namespace

int main(int argc, char** argv) {
  for (std::size_t batch : {1u, 4u, 16u, 64u}) {
    const std::string name = "generate/qwen2-0.5b/bf16/batch" + std::to_string(batch) +
                             "/threads:" + std::to_string(nb::all_threads());
    benchmark::RegisterBenchmark(name.c_str(), generate_benchmark, batch)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  return npullm::bench::run_benchmarks(argc, argv);
}
