// linear benchmarks (names and counters as in shared/DESIGN.md): K = 896 with N = 4864 (an MLP
// projection of Qwen2-0.5B) and N = 151936 (its LM head), M = 1, 8, 32, 512, f32 / bf16 / f16
// weights, 1 and all threads.
//   M <= 8: GBps of weight bytes and pct_bw (% of the read bandwidth measured in this
//           process); "cold" rotates over enough weight copies to pass the last-level cache 4x.
//   M >= 16: GFLOPs (2 M N K) and pct_peak (% of the fp32 FMA peak, or of the bf16 dot-product
//           peak where bf16 weights take the dot-product path).
//   /packed: the weights packed once (ops::packed_weights) before timing.
//   x_naive: speedup over a naive baseline in the same binary: the weights converted to f32
//           then Eigen's GEMM (for f32 weights: a plain triple loop, at M <= 8 only).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/linear.hpp"

namespace {

namespace nb = npullm::bench;

using npullm::bench::pool_for;

template <class W>
const char* dtype_name() {
  return std::is_same_v<W, float> ? "f32" : std::is_same_v<W, npullm::bfloat16> ? "bf16" : "f16";
}

template <class W>
void linear_benchmark(benchmark::State& state, std::size_t m, std::size_t k, std::size_t n,
                      bool cold, bool packed, std::size_t threads) {
  const double weight_bytes = static_cast<double>(n * k * sizeof(W));
  const std::size_t copies =
      cold
          ? std::max<std::size_t>(1, static_cast<std::size_t>(128.0 * (1 << 20) / weight_bytes) + 1)
          : 1;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<npullm::tensor<W, 2>> w;
  for (std::size_t c = 0; c < copies; ++c) {
    w.emplace_back(n, k);
    for (std::size_t i = 0; i < w.back().size(); ++i)
      w.back().data()[i] = npullm::from_float<W>(u(rng));
  }
  npullm::tensor<float, 2> x(m, k), y(m, n);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  const auto& pool = pool_for(threads);
  std::vector<npullm::ops::packed_weights<W>> pw;
  if (packed) {
    for (const auto& wc : w) pw.emplace_back(wc.view(), pool);
  }
  std::size_t next = 0;
  const double seconds = nb::timed_loop(state, [&] {
    const std::size_t c = next++ % copies;
    if (packed) {
      npullm::ops::linear<W>(x.view(), pw[c], y.view(), {}, pool);
    } else {
      npullm::ops::linear<W>(x.view(), w[c].view(), y.view(), {}, pool);
    }
    benchmark::DoNotOptimize(y.data());
  });
  if (m <= 8) {
    nb::set_bandwidth_counters(state, weight_bytes, seconds, threads);
  } else {
    nb::set_flops_counters(state, 2.0 * static_cast<double>(m * n * k), seconds, threads,
                           std::is_same_v<W, npullm::bfloat16> && !packed &&
                               npullm::ops::rounds_activations<W>());
  }
  if (!cold && n <= 4864) {
    // Naive: f32 copy of W, Eigen GEMM (single-threaded, as Eigen runs without OpenMP).
    Eigen::MatrixXf wf(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(n));
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t t = 0; t < k; ++t)
        wf(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(j)) =
            npullm::to_float(w[0].data()[j * k + t]);
    }
    const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
        xm(x.data(), static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(k));
    Eigen::MatrixXf ym(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
    state.counters["x_naive"] = nb::median_seconds(5, [&] { ym.noalias() = xm * wf; }) / seconds;
  }
}

template <class W>
void register_type() {
  for (std::size_t n : {4864u, 151936u}) {
    for (bool packed : {false, true}) {
      for (std::size_t m : {1u, 8u, 16u, 32u, 512u}) {
        if (n > 4864 && m > 32) continue;  // the LM head runs on selected rows only
        for (bool cold : {false, true}) {
          if (cold && m != 1 && m != 16) continue;
          for (std::size_t threads : nb::thread_counts()) {
            const std::string name = "linear/m" + std::to_string(m) + "/k896/n" +
                                     std::to_string(n) + "/" + dtype_name<W>() +
                                     (packed ? "/packed" : "") + (cold ? "/cold" : "") +
                                     "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), linear_benchmark<W>, m, std::size_t{896},
                                         n, cold, packed, threads)
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_type<float>();
  register_type<npullm::bfloat16>();
  register_type<npullm::float16>();
  return npullm::bench::run_benchmarks(argc, argv);
}
