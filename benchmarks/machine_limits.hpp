// Measures what this machine can do, in this process, so that benchmarks report their figures
// as a percentage of it:
//   read_gbps    streaming read bandwidth over a buffer far larger than the last-level cache
//   triad_gbps   STREAM triad a[i] = b[i] + s * c[i] (3 x 4 bytes per element counted)
//   fma_gflops   fp32 fused multiply-add peak (2 flops per lane per FMA) at the widest width
//                the compiler targets: AVX-512 (__AVX512F__), AVX2 + FMA (__FMA__), or, in a
//                baseline x86-64 build, SSE multiply + add (still 2 flops per lane)
//   bf16_gflops  bf16 dot-product peak (`vdpbf16ps`: 2 flops per bf16 pair), 0 without it
//   int8_gops    int8 dot-product peak (2 ops per u8 x s8 multiply-add) with the instructions
//                the quantized kernels (ops/quant_linear.hpp) use: AVX512-VNNI `vpdpbusd` zmm,
//                else AVX-VNNI `vpdpbusd` ymm, else AVX2 `vpmaddubsw` + `vpmaddwd` + `vpaddd`;
//                0 in a portable build (its scalar kernels are compared with the FMA peak)
// per thread count: every thread runs the same loop at the same time (a spin barrier starts
// them together) and the slowest thread's time counts. Each figure is the best of several
// repetitions: the limit the machine reached, which a kernel can be compared against.
// `make bench` measures them once per run and hands them to every binary (NPULLM_BENCH_LIMITS).
// The limits are measured with code of the build's ISA (npullm::isa_name()), so that a kernel
// is compared with what its own instruction set can do: an AVX2 build against the AVX2 FMA peak
// even on an AVX-512 machine. A limits file measured under another ISA is not used (measured
// again in this process instead; see recorded_limits()).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor.hpp"

#include <nlohmann/json.hpp>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace npullm::bench {

// The SIMD path this translation unit's kernels take is npullm::isa_name() (core/isa.hpp:
// "avx512-bf16", "avx512", "avx2", "portable", chosen by the macros the compiler's -march
// defines); the limits here are measured with code of that same ISA. Every benchmark binary
// records it in its Google Benchmark context as `npullm_isa` (bench_util.hpp), limits.json too.

struct machine_limits {
  std::size_t threads = 1;
  double read_gbps = 0;
  double triad_gbps = 0;
  double fma_gflops = 0;
  double bf16_gflops = 0;  // 0 when the CPU (or the build) has no bf16 dot product
  double int8_gops = 0;    // 0 in a portable build
};

namespace detail {

// The sum of a vector's lanes, through memory (outside the timed loops): GCC 12's
// _mm512_reduce_add_* pass an undefined operand to their extracts, which it then reports under
// -Wall (-Wuninitialized, GCC bug 105593).
template <class T, class V>
T lane_sum(const V& v) {
  T lanes[sizeof(V) / sizeof(T)];
  std::memcpy(lanes, &v, sizeof v);
  T sum{};
  for (T x : lanes) sum += x;
  return sum;
}

using clock = std::chrono::steady_clock;

// Runs body(t) on `threads` threads at once; returns the slowest thread's seconds.
template <class Body>
double timed_on_all_threads(const thread_pool& pool, std::size_t threads, Body&& body) {
  std::atomic<std::size_t> arrived{0};
  std::vector<double> seconds(threads, 0.0);
  pool.parallel_for(threads, [&](std::size_t t) {
    arrived.fetch_add(1);
    while (arrived.load() < threads) {
    }
    const auto start = clock::now();
    body(t);
    seconds[t] = std::chrono::duration<double>(clock::now() - start).count();
  });
  return *std::max_element(seconds.begin(), seconds.end());
}

// Sums n words (n a multiple of 64, 64-byte aligned) read as `streams` concurrent sequential
// streams (the n words split into that many contiguous parts, read side by side). One stream
// is the plain streaming read; several streams keep more DRAM pages and prefetchers busy and
// read more from one core (on this project's machines 8 streams read ~25% more than 1), and
// kernels that stream K and V, or weights and activations, do the same. The limit is the best.
template <int streams>
std::uint64_t read_sum(const std::uint64_t* p, std::size_t n) {
  const std::size_t per = n / streams;  // words per stream, a multiple of 8
#if defined(__AVX512F__)
  __m512i acc[streams];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (std::size_t i = 0; i < per; i += 8) {
    for (int k = 0; k < streams; ++k) {
      acc[k] = _mm512_add_epi64(acc[k], _mm512_load_si512(p + k * per + i));
    }
  }
  for (int k = 1; k < streams; ++k) acc[0] = _mm512_add_epi64(acc[0], acc[k]);
  return static_cast<std::uint64_t>(lane_sum<std::int64_t>(acc[0]));
#elif defined(__AVX2__)
  __m256i acc[streams];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (std::size_t i = 0; i < per; i += 4) {
    for (int k = 0; k < streams; ++k) {
      acc[k] = _mm256_add_epi64(
          acc[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + k * per + i)));
    }
  }
  for (int k = 1; k < streams; ++k) acc[0] = _mm256_add_epi64(acc[0], acc[k]);
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
  std::uint64_t acc[streams] = {};
  for (std::size_t i = 0; i < per; ++i) {
    for (int k = 0; k < streams; ++k) acc[k] += p[k * per + i];
  }
  std::uint64_t total = 0;
  for (auto a : acc) total += a;
  return total;
#endif
}

// `iterations` rounds of 12 independent FMA chains; returns flops done.
inline double fma_loop(std::size_t iterations, float* sink) {
#if defined(__AVX512F__)
  constexpr int lanes = 16;
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(1.0f + 0.001f * static_cast<float>(k));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  __m512 total = acc[0];
  for (int k = 1; k < 12; ++k) total = _mm512_add_ps(total, acc[k]);
  *sink += lane_sum<float>(total);
  return 2.0 * lanes * 12 * static_cast<double>(iterations);
#elif defined(__FMA__)
  constexpr int lanes = 8;
  __m256 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_ps(1.0f + 0.001f * static_cast<float>(k));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  alignas(32) float out[8];
  __m256 total = acc[0];
  for (int k = 1; k < 12; ++k) total = _mm256_add_ps(total, acc[k]);
  _mm256_store_ps(out, total);
  for (float x : out) *sink += x;
  return 2.0 * lanes * 12 * static_cast<double>(iterations);
#elif defined(__SSE2__)
  // Baseline x86-64 (SSE2, no FMA): multiply + add, still 2 flops per lane, 4 lanes. A chain's
  // multiply and add take 6 to 8 cycles and cores issue 1 to 2 of each per cycle, so 14 chains
  // (the 16 XMM registers less the two constants) keep both busy without spilling.
  constexpr int lanes = 4, chains = 14;
  __m128 acc[chains];
  for (int k = 0; k < chains; ++k) acc[k] = _mm_set1_ps(1.0f + 0.001f * static_cast<float>(k));
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < chains; ++k) acc[k] = _mm_add_ps(_mm_mul_ps(acc[k], a), b);
  }
  __m128 total = acc[0];
  for (int k = 1; k < chains; ++k) total = _mm_add_ps(total, acc[k]);
  alignas(16) float out[lanes];
  _mm_store_ps(out, total);
  for (float x : out) *sink += x;
  return 2.0 * lanes * chains * static_cast<double>(iterations);
#else
  // No x86 SIMD targeted: multiply + add, still 2 flops, in a width the compiler vectorizes.
  float acc[12][8];
  for (int k = 0; k < 12; ++k) {
    for (int l = 0; l < 8; ++l) acc[k][l] = 1.0f + 0.001f * static_cast<float>(k);
  }
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) {
      for (int l = 0; l < 8; ++l) acc[k][l] = acc[k][l] * 0.999999f + 1e-7f;
    }
  }
  for (int k = 0; k < 12; ++k) {
    for (int l = 0; l < 8; ++l) *sink += acc[k][l];
  }
  return 2.0 * 8 * 12 * static_cast<double>(iterations);
#endif
}

// bf16 dot products: each vdpbf16ps does 32 bf16 multiplies and 32 adds into 16 f32 lanes.
inline double bf16_dot_loop(std::size_t iterations, float* sink) {
#if defined(__AVX512BF16__)
  // Distinct starting values: identical chains could be merged by the compiler (seen: a
  // bf16 "peak" twice the hardware's in one translation unit).
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(0.001f * static_cast<float>(k + 1));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-4f));
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 total = acc[0];
  for (int k = 1; k < 12; ++k) total = _mm512_add_ps(total, acc[k]);
  *sink += lane_sum<float>(total);
  return 64.0 * 12 * static_cast<double>(iterations);
#else
  (void)iterations;
  (void)sink;
  return 0.0;
#endif
}

// int8 dot products with the quantized kernels' instructions; returns ops done (2 per
// multiply-add). The int32 lanes wrap (2M iterations overflow them), so they are summed into the
// sink as unsigned: a signed overflow in C++ is undefined (UBSan stops on it).
inline double int8_dot_loop(std::size_t iterations, std::uint32_t* sink) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  __m512i acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_epi32(k + 1);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
  }
  __m512i total = acc[0];
  for (int k = 1; k < 12; ++k) total = _mm512_add_epi32(total, acc[k]);
  *sink += lane_sum<std::uint32_t>(total);
  return 2.0 * 64 * 12 * static_cast<double>(iterations);
#elif defined(__AVX2__) && \
    (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
  __m256i acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_epi32(k + 1);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < 12; ++k) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
      acc[k] = _mm256_dpbusd_epi32(acc[k], a, b);
#else
      acc[k] = _mm256_dpbusd_avx_epi32(acc[k], a, b);
#endif
    }
  }
  __m256i total = acc[0];
  for (int k = 1; k < 12; ++k) total = _mm256_add_epi32(total, acc[k]);
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  for (auto v : lanes) *sink += v;
  return 2.0 * 32 * 12 * static_cast<double>(iterations);
#elif defined(__AVX2__)
  // vpmaddubsw + vpmaddwd + vpaddd per 32 multiply-adds, in inline asm: written with intrinsics,
  // maddubs(a, b) and its madd do not depend on the accumulator, so GCC hoists them out of the
  // loop and the "peak" measured vpaddd alone (seen: 485 GOPs on a Sapphire Rapids core, against
  // ~200 for the real instruction mix); opaque copies of `a` cost a move per chain and spilled
  // the accumulators. 10 chains + a, b, ones and one temporary fit the 16 ymm registers.
  constexpr int chains = 10;
  __m256i acc[chains];
  for (int k = 0; k < chains; ++k) acc[k] = _mm256_set1_epi32(k + 1);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t it = 0; it < iterations; ++it) {
    for (int k = 0; k < chains; ++k) {
      __m256i t;
      asm("vpmaddubsw %[b], %[a], %[t]\n\t"
          "vpmaddwd %[ones], %[t], %[t]\n\t"
          "vpaddd %[t], %[acc], %[acc]"
          : [acc] "+x"(acc[k]), [t] "=&x"(t)
          : [a] "x"(a), [b] "x"(b), [ones] "x"(ones));
    }
  }
  __m256i total = acc[0];
  for (int k = 1; k < chains; ++k) total = _mm256_add_epi32(total, acc[k]);
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  for (auto v : lanes) *sink += v;
  return 2.0 * 32 * chains * static_cast<double>(iterations);
#else
  (void)iterations;
  (void)sink;
  return 0.0;
#endif
}

}  // namespace detail

// The int8 dot-product peak alone at a thread count (best of `repetitions`).
inline double measure_int8_peak(std::size_t threads, int repetitions = 5) {
  thread_pool pool(threads);
  std::vector<std::uint32_t> sink(threads, 0);
  double best = 0;
  for (int r = 0; r < repetitions; ++r) {
    std::vector<double> ops(threads);
    const double s = detail::timed_on_all_threads(
        pool, threads, [&](std::size_t t) { ops[t] = detail::int8_dot_loop(2'000'000, &sink[t]); });
    best = std::max(best, ops[0] * static_cast<double>(threads) / s / 1e9);
  }
  volatile std::uint32_t keep = 0;
  for (auto v : sink) keep = keep + v;
  return best;
}

// Measures the limits at a thread count (takes about a second).
inline machine_limits measure_machine_limits(std::size_t threads, int repetitions = 5) {
  machine_limits m;
  m.threads = threads;
  thread_pool pool(threads);

  // 512 MiB: 16x a 32 MiB last-level cache. Each thread reads its own contiguous part.
  constexpr std::size_t read_bytes = std::size_t{512} << 20;
  const std::size_t words = read_bytes / sizeof(std::uint64_t);
  tensor<std::uint64_t, 1> buffer(words);
  pool.parallel_for(threads, [&](std::size_t t) {  // first touch by the thread that reads it
    const std::size_t b = chunk_begin(words, threads, t), e = chunk_begin(words, threads, t + 1);
    for (std::size_t i = b; i < e; ++i) buffer.data()[i] = i;
  });
  std::vector<std::uint64_t> sums(threads);
  auto read_all = [&](auto kernel) {
    const double s = detail::timed_on_all_threads(pool, threads, [&](std::size_t t) {
      // Chunks in whole 512-byte groups: 64-byte aligned, divisible into 8 streams.
      const std::size_t b = chunk_begin(words / 64, threads, t) * 64;
      const std::size_t e = chunk_begin(words / 64, threads, t + 1) * 64;
      sums[t] += kernel(buffer.data() + b, e - b);
    });
    m.read_gbps = std::max(m.read_gbps, static_cast<double>(read_bytes) / s / 1e9);
  };
  for (int r = 0; r < repetitions; ++r) {
    read_all(detail::read_sum<1>);
    read_all(detail::read_sum<8>);
  }
  buffer = {};

  // Triad over three 128 MiB float arrays.
  constexpr std::size_t triad_n = std::size_t{32} << 20;
  tensor<float, 1> a(triad_n), b(triad_n), c(triad_n);
  pool.parallel_for(threads, [&](std::size_t t) {
    const std::size_t lo = chunk_begin(triad_n, threads, t),
                      hi = chunk_begin(triad_n, threads, t + 1);
    for (std::size_t i = lo; i < hi; ++i) {
      b.data()[i] = 1.0f;
      c.data()[i] = 2.0f;
      a.data()[i] = 0.0f;
    }
  });
  for (int r = 0; r < repetitions; ++r) {
    const double s = detail::timed_on_all_threads(pool, threads, [&](std::size_t t) {
      const std::size_t lo = chunk_begin(triad_n, threads, t);
      const std::size_t hi = chunk_begin(triad_n, threads, t + 1);
      float* __restrict pa = a.data();
      const float* __restrict pb = b.data();
      const float* __restrict pc = c.data();
      for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    m.triad_gbps = std::max(m.triad_gbps, 3.0 * 4.0 * static_cast<double>(triad_n) / s / 1e9);
  }

  std::vector<float> sink(threads, 0.0f);
  constexpr std::size_t fma_iterations = 2'000'000;
  for (int r = 0; r < repetitions; ++r) {
    std::vector<double> flops(threads);
    const double s = detail::timed_on_all_threads(pool, threads, [&](std::size_t t) {
      flops[t] = detail::fma_loop(fma_iterations, &sink[t]);
    });
    m.fma_gflops = std::max(m.fma_gflops, flops[0] * static_cast<double>(threads) / s / 1e9);
    const double s16 = detail::timed_on_all_threads(pool, threads, [&](std::size_t t) {
      flops[t] = detail::bf16_dot_loop(fma_iterations, &sink[t]);
    });
    m.bf16_gflops = std::max(m.bf16_gflops, flops[0] * static_cast<double>(threads) / s16 / 1e9);
  }
  m.int8_gops = measure_int8_peak(threads, repetitions);
  // Keep the results observable so no loop is optimized away.
  volatile std::uint64_t keep = 0;
  for (auto v : sums) keep = keep + v;
  volatile float keep_f = 0;
  for (float v : sink) keep_f = keep_f + v;
  return m;
}

// Limits recorded by an earlier process of the same run: the Google Benchmark JSON of
// `bench_core --benchmark_filter=^machine_limits/` (rows machine_limits/threads:<n> with the
// counters read_GBps, triad_GBps, fma_GFLOPs, bf16_GFLOPs), named by the environment variable
// NPULLM_BENCH_LIMITS. `make bench` sets it, so that every binary of a run divides by the same
// limits that report.md and the roofline show. Empty when the variable is unset; a thread count
// the file lacks is measured in this process. A file measured under another ISA (its context's
// `npullm_isa` differs from this binary's npullm::isa_name(), or is missing: a file older than
// the field) is not used: this process measures the limits with its own code instead and says so
// on stderr, since an AVX-512 FMA peak would understate an AVX2 kernel's share of what AVX2 can
// do.
inline std::map<std::size_t, machine_limits> recorded_limits() {
  std::map<std::size_t, machine_limits> out;
  const char* path = std::getenv("NPULLM_BENCH_LIMITS");
  if (path == nullptr || *path == '\0') return out;
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!in || doc.is_discarded() || !doc.is_object() || !doc.contains("benchmarks")) {
    std::fprintf(stderr, "npullm: NPULLM_BENCH_LIMITS=%s is not a benchmark JSON; measuring\n",
                 path);
    return out;
  }
  std::string isa = "(none recorded)";
  if (doc.contains("context") && doc["context"].is_object()) {
    const auto& c = doc["context"];
    if (c.contains("npullm_isa") && c["npullm_isa"].is_string()) isa = c["npullm_isa"];
  }
  if (const std::string_view own = npullm::isa_name(); isa != own) {
    std::fprintf(stderr,
                 "npullm: NPULLM_BENCH_LIMITS=%s was measured under ISA %s, this binary is built "
                 "for %.*s: measuring the limits again with this binary's code\n",
                 path, isa.c_str(), static_cast<int>(own.size()), own.data());
    return out;
  }
  const std::string prefix = "machine_limits/threads:";
  for (const auto& b : doc["benchmarks"]) {
    const std::string name = b.value("name", "");
    if (name.rfind(prefix, 0) != 0 || b.value("error_occurred", false)) continue;
    machine_limits m;
    m.threads = std::strtoull(name.c_str() + prefix.size(), nullptr, 10);
    m.read_gbps = b.value("read_GBps", 0.0);
    m.triad_gbps = b.value("triad_GBps", 0.0);
    m.fma_gflops = b.value("fma_GFLOPs", 0.0);
    m.bf16_gflops = b.value("bf16_GFLOPs", 0.0);
    m.int8_gops = b.value("int8_GOPs", 0.0);  // 0 in files that lack it: measured on demand
    if (m.threads > 0 && m.read_gbps > 0 && m.fma_gflops > 0) out[m.threads] = m;
  }
  return out;
}

// Measured once per thread count per process (or read from NPULLM_BENCH_LIMITS), then reused.
inline const machine_limits& limits_for(std::size_t threads) {
  static std::mutex mutex;
  static std::map<std::size_t, machine_limits> cache = recorded_limits();
  std::lock_guard lock(mutex);
  auto it = cache.find(threads);
  if (it == cache.end()) it = cache.emplace(threads, measure_machine_limits(threads)).first;
#if defined(__AVX2__)
  if (it->second.int8_gops == 0) it->second.int8_gops = measure_int8_peak(threads);
#endif
  return it->second;
}

}  // namespace npullm::bench
