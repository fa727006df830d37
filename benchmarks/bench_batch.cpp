// Batch scoring on the generated qwen2-0.5b model, bf16 weights (names and counters as in
// shared/DESIGN.md): N rows of L tokens, N = 1, 8, 32, L = 128, 512, all threads.
//   batch_unroll/...          rows_per_s through batch_unroll (row by row, batch-1 pipeline)
//   batch_scorer/...          rows_per_s through the packed batched scorer
//   batch_unroll_overhead/... ratio = unroll time / N single-row prefill calls (target <= 1.02)
//   batch_scorer_speedup/...  ratio = unroll time / batched time (target >= 1.5 at N 32, L 128)
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/batch/scorer.hpp"
#include "npullm/batch/unroll.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

namespace nb = npullm::bench;
namespace fs = std::filesystem;
using lm_t = npullm::model::causal_lm<
    npullm::model::pipeline_config<npullm::model::contiguous_kv<npullm::bfloat16>,
                                   npullm::model::dynamic_attention<>, npullm::bfloat16>>;

lm_t& pipeline() {
  static const npullm::thread_pool pool(nb::all_threads());
  static std::unique_ptr<lm_t> lm = [] {
    const fs::path dir = nb::generated_model("qwen2-0.5b", npullm::dtype::bf16);
    return std::make_unique<lm_t>(
        dir, npullm::model::pipeline_options{.max_sequence = 4096, .pool = &pool});
  }();
  return *lm;
}

std::vector<std::int32_t> batch_ids(std::size_t n, std::size_t len) {
  std::vector<std::int32_t> ids(n * len);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 7919 + 11) % 150000);
  return ids;
}

void unroll_benchmark(benchmark::State& state, std::size_t n, std::size_t len) {
  auto& lm = pipeline();
  const auto ids = batch_ids(n, len);
  const npullm::batch::batch_inputs in{
      npullm::dense_view<const std::int32_t, 2>(ids.data(), n, len)};
  npullm::batch::batch_unroll<lm_t> unroll(lm);
  const double s =
      nb::timed_loop(state, [&] { benchmark::DoNotOptimize(unroll.score(in).data()); });
  state.counters["rows_per_s"] = static_cast<double>(n) / s;
}

void scorer_benchmark(benchmark::State& state, std::size_t n, std::size_t len) {
  auto& lm = pipeline();
  const auto ids = batch_ids(n, len);
  const npullm::batch::batch_inputs in{
      npullm::dense_view<const std::int32_t, 2>(ids.data(), n, len)};
  npullm::batch::batched_scorer<lm_t> scorer(lm);
  const double s =
      nb::timed_loop(state, [&] { benchmark::DoNotOptimize(scorer.score(in).data()); });
  state.counters["rows_per_s"] = static_cast<double>(n) / s;
}

// unroll / N single calls (the cost of the unrolling itself).
void overhead_benchmark(benchmark::State& state, std::size_t n, std::size_t len) {
  auto& lm = pipeline();
  const auto ids = batch_ids(n, len);
  const npullm::batch::batch_inputs in{
      npullm::dense_view<const std::int32_t, 2>(ids.data(), n, len)};
  npullm::batch::batch_unroll<lm_t> unroll(lm);
  const double unrolled =
      nb::timed_loop(state, [&] { benchmark::DoNotOptimize(unroll.score(in).data()); });
  const double singles = nb::median_seconds(3, [&] {
    for (std::size_t r = 0; r < n; ++r) {
      lm.reset();
      benchmark::DoNotOptimize(
          lm.prefill(std::span<const std::int32_t>(ids.data() + r * len, len)).logits.data());
    }
    lm.reset();
  });
  state.counters["ratio"] = unrolled / singles;
}

void speedup_benchmark(benchmark::State& state, std::size_t n, std::size_t len) {
  auto& lm = pipeline();
  const auto ids = batch_ids(n, len);
  const npullm::batch::batch_inputs in{
      npullm::dense_view<const std::int32_t, 2>(ids.data(), n, len)};
  npullm::batch::batch_unroll<lm_t> unroll(lm);
  npullm::batch::batched_scorer<lm_t> scorer(lm);
  const double packed =
      nb::timed_loop(state, [&] { benchmark::DoNotOptimize(scorer.score(in).data()); });
  const double unrolled =
      nb::median_seconds(2, [&] { benchmark::DoNotOptimize(unroll.score(in).data()); });
  state.counters["ratio"] = unrolled / packed;
}

void register_all() {
  const std::string t = "/threads:" + std::to_string(nb::all_threads());
  for (std::size_t len : {128u, 512u}) {
    for (std::size_t n : {1u, 8u, 32u}) {
      const std::string shape =
          "/qwen2-0.5b/bf16/n" + std::to_string(n) + "/l" + std::to_string(len) + t;
      benchmark::RegisterBenchmark(("batch_unroll" + shape).c_str(), unroll_benchmark, n, len)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
      benchmark::RegisterBenchmark(("batch_scorer" + shape).c_str(), scorer_benchmark, n, len)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
      benchmark::RegisterBenchmark(("batch_unroll_overhead" + shape).c_str(), overhead_benchmark, n,
                                   len)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
      benchmark::RegisterBenchmark(("batch_scorer_speedup" + shape).c_str(), speedup_benchmark, n,
                                   len)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
