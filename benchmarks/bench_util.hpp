// Helpers shared by npullm's benchmarks: per-iteration timing with medians, and the counters
// of shared/DESIGN.md (GBps, pct_bw, GFLOPs, pct_peak, x_naive) against the machine's limits
// measured in the same process.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "machine_limits.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/model/generator.hpp"

#include <filesystem>

#include <map>
#include <memory>

namespace npullm::bench {

inline std::size_t all_threads() {
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

// The thread counts every benchmark runs at: 1 and all (once when they are equal).
inline std::vector<std::size_t> thread_counts() {
  return all_threads() == 1 ? std::vector<std::size_t>{1}
                            : std::vector<std::size_t>{1, all_threads()};
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Runs fn once per benchmark iteration and returns the median seconds of one run.
template <class Fn>
double timed_loop(benchmark::State& state, Fn&& fn) {
  std::vector<double> seconds;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    benchmark::ClobberMemory();
  }
  return median(std::move(seconds));
}

// Median seconds of `repetitions` runs of fn (for baselines measured beside the benchmark).
template <class Fn>
double median_seconds(int repetitions, Fn&& fn) {
  std::vector<double> seconds;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    benchmark::ClobberMemory();
  }
  return median(std::move(seconds));
}

// GBps and pct_bw for `bytes` moved in `seconds` at `threads`.
inline void set_bandwidth_counters(benchmark::State& state, double bytes, double seconds,
                                   std::size_t threads) {
  const double gbps = bytes / seconds / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["pct_bw"] = 100.0 * gbps / limits_for(threads).read_gbps;
}

// GFLOPs and pct_peak (of the fp32 FMA peak, or the bf16 dot peak when bf16 is true).
inline void set_flops_counters(benchmark::State& state, double flops, double seconds,
                               std::size_t threads, bool bf16 = false) {
  const double gflops = flops / seconds / 1e9;
  const auto& m = limits_for(threads);
  state.counters["GFLOPs"] = gflops;
  const double peak = bf16 && m.bf16_gflops > 0 ? m.bf16_gflops : m.fma_gflops;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
  state.counters["peak_GFLOPs"] = peak;
}

// One pool per thread count, alive for the whole benchmark process.
inline const thread_pool& pool_for(std::size_t threads) {
  static std::map<std::size_t, std::unique_ptr<thread_pool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<thread_pool>(threads);
  return *p;
}

// A generated model under models/ (written once per generator version, then reused).
inline std::filesystem::path generated_model(const std::string& preset, npullm::dtype weights) {
  const std::filesystem::path dir = "models/" + preset + "-" + std::string(to_string(weights));
  model::ensure_model(dir, model::preset(preset, weights));
  return dir;
}

// What this binary was built for, as its JSON context records it: `npullm_isa` is the SIMD path
// (npullm::isa_name(): avx512-bf16, avx512, avx2, portable) and `npullm_build_isa` the CMake
// option and flag that chose it (NPULLM_ISA, benchmarks/CMakeLists.txt), for instance
// "NPULLM_ISA=avx2, -march=x86-64-v3".
inline std::string build_isa() {
#if defined(NPULLM_BENCH_BUILD_ISA) && defined(NPULLM_BENCH_MARCH)
  return std::string("NPULLM_ISA=") + NPULLM_BENCH_BUILD_ISA + ", " + NPULLM_BENCH_MARCH;
#else
  return "";
#endif
}

// The standard Google Benchmark main, after the benchmarks are registered.
inline int run_benchmarks(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("npullm_isa", std::string(npullm::isa_name()));
  if (const std::string b = build_isa(); !b.empty()) {
    benchmark::AddCustomContext("npullm_build_isa", b);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace npullm::bench
