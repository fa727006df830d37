// Core benchmarks: the machine's limits themselves, and bulk dtype conversion against them.
// Names: <primitive>/<settings>/threads:<n>; counters as in shared/DESIGN.md.
#include <benchmark/benchmark.h>

#include <span>
#include <string>

#include "bench_util.hpp"
#include "npullm/core/dtype.hpp"
#include "npullm/core/tensor.hpp"

namespace {

namespace nb = npullm::bench;

void machine_limits_benchmark(benchmark::State& state, std::size_t threads) {
  npullm::bench::machine_limits m;
  for (auto _ : state) m = nb::measure_machine_limits(threads, 3);
  state.counters["read_GBps"] = m.read_gbps;
  state.counters["triad_GBps"] = m.triad_gbps;
  state.counters["fma_GFLOPs"] = m.fma_gflops;
  state.counters["bf16_GFLOPs"] = m.bf16_gflops;
}

// Converts n floats (64 MiB of f32: past the last-level cache) to a 16-bit type. Bytes moved
// (f32 read + 16-bit written) as GBps and % of the read bandwidth limit; reads and writes
// together can move more than a read-only stream, so pct_bw may pass 100 here. x_naive is
// against a scalar loop of the portable conversion in the same process (for bf16 the compiler
// vectorizes that loop too, and both run at memory speed).
template <class To>
void convert_benchmark(benchmark::State& state, std::size_t n) {
  npullm::tensor<float, 1> in(n);
  npullm::tensor<To, 1> out(n);
  for (std::size_t i = 0; i < n; ++i) in.data()[i] = 0.001f * static_cast<float>(i % 4099);
  const auto fast = [&] {
    npullm::convert(std::span<const float>(in.data(), n), std::span<To>(out.data(), n));
    benchmark::DoNotOptimize(out.data());
  };
  const auto naive = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<To, npullm::float16>) {
        out.data()[i] =
            npullm::float16::from_bits(npullm::detail::f32_to_f16_bits_portable(in.data()[i]));
      } else {
        out.data()[i] =
            npullm::bfloat16::from_bits(npullm::detail::f32_to_bf16_bits_portable(in.data()[i]));
      }
    }
    benchmark::DoNotOptimize(out.data());
  };
  const double seconds = nb::timed_loop(state, fast);
  nb::set_bandwidth_counters(state, static_cast<double>(n) * (sizeof(float) + sizeof(To)), seconds,
                             1);
  state.counters["x_naive"] = nb::median_seconds(5, naive) / seconds;
}

void register_all() {
  for (std::size_t threads : nb::thread_counts()) {
    benchmark::RegisterBenchmark(("machine_limits/threads:" + std::to_string(threads)).c_str(),
                                 machine_limits_benchmark, threads)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  constexpr std::size_t n = 16 << 20;
  benchmark::RegisterBenchmark("convert/f32_to_f16/n16777216/threads:1",
                               convert_benchmark<npullm::float16>, n)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("convert/f32_to_bf16/n16777216/threads:1",
                               convert_benchmark<npullm::bfloat16>, n)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
