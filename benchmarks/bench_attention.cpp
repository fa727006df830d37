// Flash attention benchmarks (names and counters as in shared/DESIGN.md).
//
// Decode: one query over kv_len keys, per head shape, KV dtype and source, 1 and all threads.
//   "cold" rotates over enough copies of the KV to pass the 32 MiB last-level cache 4x, so the
//   figure is DRAM bandwidth; "hot" reuses one copy.
//   GBps      unique K + V bytes read per second (quantized KV: the blocks' bytes, scales
//             included: 34 / 32 bytes per element for q8_0, 18 / 32 for q4_0)
//   pct_bw    % of the read bandwidth measured in this process at this thread count
//   pct_roofline  % of min(read bandwidth, fp32 FMA peak / arithmetic intensity), with
//             2 * 2 * D * q_heads flops per 2 * D * kv_heads * sizeof(kv) bytes of each key
// Prefill: causal 512x512 and 2048x2048 (present chunk only) and chunked (256 queries over a
//   2048-key f16 past); GFLOPs counts useful flops (4 * D * heads * unmasked pairs), pct_peak
//   is % of the measured fp32 FMA peak.
// Windowed decode: one query at position kv_len - 1 over kv_len f16 keys (cold), with a
//   sliding window (`window<w>`: flash reads only the window) or causal over the whole
//   context (`full`); `stats` runs the window with attention_io::stats set (its cost).
//   keys_read  (key, KV head) pairs flash loaded per call (attention_io::stats)
//   GBps       bytes of those keys' K and V per second; pct_bw as above
// x_naive: speedup over a naive baseline in the same binary: scores by Eigen GEMM, softmax,
//   a second GEMM, per head, on f32 copies of the same K and V (one warm copy).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/attention/flash.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"

namespace {

namespace nb = npullm::bench;
namespace at = npullm::attention;
using npullm::kv::kv_part;
using npullm::kv::kv_shape;
using npullm::kv::kv_tile;

struct head_shape {
  std::size_t q_heads, kv_heads, dim;
  std::string name() const {
    std::string out = "h";  // (appended: GCC 12 warns, wrongly, -Wrestrict on "h" + std::string)
    out += std::to_string(q_heads);
    out += "x";
    out += std::to_string(kv_heads);
    out += "/d";
    out += std::to_string(dim);
    return out;
  }
};

using npullm::bench::pool_for;

void fill_random(float* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
}

// One copy of a layer's KV in some source, holding kv_len keys, and its tiles.
template <class T>
struct kv_copy {
  std::unique_ptr<npullm::kv::contiguous_cache<T>> cache;
  std::unique_ptr<npullm::kv::block_pool<T>> pool;
  std::unique_ptr<npullm::kv::block_table<T>> table;
  std::vector<npullm::kv::format_tile<T>> tiles;

  kv_copy(const head_shape& hs, std::size_t kv_len, std::size_t block, std::uint64_t seed) {
    const kv_shape shape{1, hs.kv_heads, hs.dim};
    std::vector<float> row(hs.kv_heads * hs.dim);
    auto fill = [&](auto& dst) {
      auto part_row = [&](std::size_t j, auto part) {  // K or V of token j, its format
        fill_random(row.data(), row.size(), seed * 1000003 + j * 2 + static_cast<int>(part.part));
        auto t = dst.token_kv(j, 0, part);  // (kv_heads, D units)
        for (std::size_t h = 0; h < hs.kv_heads; ++h)
          npullm::kv::quantize_row(row.data() + h * hs.dim, hs.dim, &t(h, 0));
      };
      for (std::size_t j = 0; j < kv_len; ++j) {
        part_row(j, npullm::kv::k_part);
        part_row(j, npullm::kv::v_part);
      }
    };
    if (block == 0) {
      cache = std::make_unique<npullm::kv::contiguous_cache<T>>(shape, kv_len);
      cache->append(kv_len);
      fill(*cache);
      tiles.push_back(cache->tile(0, 0));
    } else {
      pool =
          std::make_unique<npullm::kv::block_pool<T>>(shape, block, (kv_len + block - 1) / block);
      table = std::make_unique<npullm::kv::block_table<T>>(*pool);
      table->append(kv_len);
      fill(*table);
      for (std::size_t i = 0; i < table->tile_count(); ++i) tiles.push_back(table->tile(0, i));
    }
  }
};

// The naive baseline: per head, s = K q (Eigen GEMM/GEMV), softmax, o = V^T p; causal.
struct naive_attention {
  std::vector<Eigen::MatrixXf> k, v;  // per KV head: (kv_len, D)
  naive_attention(const head_shape& hs, std::size_t kv_len, std::uint64_t seed) {
    for (std::size_t h = 0; h < hs.kv_heads; ++h) {
      k.emplace_back(kv_len, hs.dim);
      v.emplace_back(kv_len, hs.dim);
      fill_random(k.back().data(), k.back().size(), seed + 2 * h);
      fill_random(v.back().data(), v.back().size(), seed + 2 * h + 1);
    }
  }
  // q: (q_heads, q_len, D) row-major; queries are the last q_len positions (causal).
  void run(const head_shape& hs, const float* q, std::size_t q_len, float* out) const {
    const std::size_t group = hs.q_heads / hs.kv_heads;
    const Eigen::Index kv_len = k[0].rows();
    for (std::size_t h = 0; h < hs.q_heads; ++h) {
      const auto& kh = k[h / group];
      const auto& vh = v[h / group];
      Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> qh(
          q + h * q_len * hs.dim, static_cast<Eigen::Index>(q_len),
          static_cast<Eigen::Index>(hs.dim));
      Eigen::MatrixXf s =
          (qh * kh.transpose()) / std::sqrt(static_cast<float>(hs.dim));  // (q_len, kv)
      for (Eigen::Index i = 0; i < s.rows(); ++i) {
        const Eigen::Index last = kv_len - static_cast<Eigen::Index>(q_len) + i;  // causal
        for (Eigen::Index j = last + 1; j < kv_len; ++j) s(i, j) = -INFINITY;
        const float m = s.row(i).maxCoeff();
        s.row(i) = (s.row(i).array() - m).exp();
        s.row(i) /= s.row(i).sum();
      }
      Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> oh(
          out + h * q_len * hs.dim, static_cast<Eigen::Index>(q_len),
          static_cast<Eigen::Index>(hs.dim));
      oh.noalias() = s * vh;
    }
  }
};

template <class T>
void decode_benchmark(benchmark::State& state, head_shape hs, std::size_t kv_len, std::size_t block,
                      bool cold, std::size_t threads) {
  const double bytes = static_cast<double>(kv_len * hs.kv_heads * hs.dim) *
                       (npullm::kv::bytes_per_element<npullm::kv::key_format_t<T>> +
                        npullm::kv::bytes_per_element<npullm::kv::value_format_t<T>>);
  const std::size_t copies =
      cold
          ? std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(128.0 * (1 << 20) / bytes)))
          : 1;
  std::vector<kv_copy<T>> kv;
  for (std::size_t c = 0; c < copies; ++c) kv.emplace_back(hs, kv_len, block, c + 1);
  std::vector<float> q(hs.q_heads * hs.dim), out(q.size());
  fill_random(q.data(), q.size(), 77);
  const at::attention_io io{npullm::dense_view<const float, 3>(q.data(), hs.q_heads, 1, hs.dim),
                            npullm::dense_view<float, 3>(out.data(), hs.q_heads, 1, hs.dim),
                            {},
                            1.0f / std::sqrt(static_cast<float>(hs.dim))};
  const auto& pool = pool_for(threads);
  std::size_t next = 0;
  const double seconds = nb::timed_loop(state, [&] {
    const auto& c = kv[next++ % copies];
    at::flash_attention(io, std::span<const npullm::kv::format_tile<T>>(c.tiles),
                        static_cast<const kv_tile<float>*>(nullptr), at::no_mask{}, pool);
    benchmark::DoNotOptimize(out.data());
  });
  nb::set_bandwidth_counters(state, bytes, seconds, threads);
  const double flops = 4.0 * static_cast<double>(hs.dim * hs.q_heads * kv_len);
  const auto& lim = nb::limits_for(threads);
  const double roofline_seconds =
      std::max(bytes / (lim.read_gbps * 1e9), flops / (lim.fma_gflops * 1e9));
  state.counters["GFLOPs"] = flops / seconds / 1e9;
  state.counters["pct_roofline"] = 100.0 * roofline_seconds / seconds;
  if (!cold) {
    naive_attention naive(hs, kv_len, 5);
    state.counters["x_naive"] =
        nb::median_seconds(5, [&] { naive.run(hs, q.data(), 1, out.data()); }) / seconds;
  }
}

// Decode at position kv_len - 1 with a sliding window of `window` keys (0: causal over all of
// them), cold KV, the past as the pipeline hands it over (a tile per block of the whole past).
template <class T>
void window_decode_benchmark(benchmark::State& state, head_shape hs, std::size_t kv_len,
                             std::size_t block, std::size_t window, bool with_stats,
                             std::size_t threads) {
  const double all_bytes = 2.0 * static_cast<double>(kv_len * hs.kv_heads * hs.dim * sizeof(T));
  const std::size_t copies =
      std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(128.0 * (1 << 20) / all_bytes)));
  std::vector<kv_copy<T>> kv;
  for (std::size_t c = 0; c < copies; ++c) kv.emplace_back(hs, kv_len, block, c + 1);
  std::vector<float> q(hs.q_heads * hs.dim), out(q.size());
  fill_random(q.data(), q.size(), 77);
  at::flash_stats stats;
  const at::attention_io io{npullm::dense_view<const float, 3>(q.data(), hs.q_heads, 1, hs.dim),
                            npullm::dense_view<float, 3>(out.data(), hs.q_heads, 1, hs.dim),
                            {},
                            1.0f / std::sqrt(static_cast<float>(hs.dim)),
                            with_stats ? &stats : nullptr};
  const auto& pool = pool_for(threads);
  const std::size_t position = kv_len - 1;
  auto call = [&](const at::attention_io& a, const kv_copy<T>& c) {
    const auto* none = static_cast<const kv_tile<float>*>(nullptr);
    if (window == 0) {
      at::flash_attention(a, std::span<const kv_tile<T>>(c.tiles), none, at::causal{position},
                          pool);
    } else {
      at::flash_attention(a, std::span<const kv_tile<T>>(c.tiles), none,
                          at::sliding_window{window, position}, pool);
    }
  };
  at::flash_stats once;  // what one call reads
  at::attention_io counted = io;
  counted.stats = &once;
  call(counted, kv[0]);
  std::size_t next = 0;
  const double seconds = nb::timed_loop(state, [&] {
    call(io, kv[next++ % copies]);
    benchmark::DoNotOptimize(out.data());
  });
  const double bytes =
      2.0 * static_cast<double>(once.keys_read) * static_cast<double>(hs.dim * sizeof(T));
  nb::set_bandwidth_counters(state, bytes, seconds, threads);
  state.counters["keys_read"] = static_cast<double>(once.keys_read);
}

// Causal prefill of q_len queries over a past of past_len f16 keys plus the present chunk.
void prefill_benchmark(benchmark::State& state, head_shape hs, std::size_t q_len,
                       std::size_t past_len, std::size_t threads) {
  const std::size_t total = past_len + q_len;
  std::vector<float> q(hs.q_heads * q_len * hs.dim), out(q.size());
  std::vector<float> pk(hs.kv_heads * q_len * hs.dim), pv(pk.size());
  fill_random(q.data(), q.size(), 1);
  fill_random(pk.data(), pk.size(), 2);
  fill_random(pv.data(), pv.size(), 3);
  std::unique_ptr<kv_copy<npullm::float16>> past;
  if (past_len > 0) past = std::make_unique<kv_copy<npullm::float16>>(hs, past_len, 0, 4);
  const kv_tile<float> present{
      npullm::kv::make_kv_view<const float>(pk.data(), hs.kv_heads, q_len, hs.dim, q_len * hs.dim),
      npullm::kv::make_kv_view<const float>(pv.data(), hs.kv_heads, q_len, hs.dim, q_len * hs.dim),
      past_len};
  const at::attention_io io{npullm::dense_view<const float, 3>(q.data(), hs.q_heads, q_len, hs.dim),
                            npullm::dense_view<float, 3>(out.data(), hs.q_heads, q_len, hs.dim),
                            {},
                            1.0f / std::sqrt(static_cast<float>(hs.dim))};
  const auto& pool = pool_for(threads);
  const std::vector<kv_tile<npullm::float16>> none;
  const auto& tiles = past ? past->tiles : none;
  const double seconds = nb::timed_loop(state, [&] {
    at::flash_attention(io, std::span<const kv_tile<npullm::float16>>(tiles), &present,
                        at::causal{past_len}, pool);
    benchmark::DoNotOptimize(out.data());
  });
  // Unmasked (query, key) pairs: query i sees past_len + i + 1 keys.
  const double pairs = static_cast<double>(q_len) * static_cast<double>(past_len) +
                       static_cast<double>(q_len) * static_cast<double>(q_len + 1) / 2.0;
  nb::set_flops_counters(state, 4.0 * static_cast<double>(hs.dim * hs.q_heads) * pairs, seconds,
                         threads);
  naive_attention naive(hs, total, 5);
  state.counters["x_naive"] =
      nb::median_seconds(3, [&] { naive.run(hs, q.data(), q_len, out.data()); }) / seconds;
}

// f16, q8_0, ...; a mixed format as k<K>v<V> (k q8_0, v q4_0: kq8_0vq4_0).
template <class T>
std::string dtype_name() {
  if constexpr (npullm::kv::kv_element<T>) {
    return std::string(npullm::kv::kv_element_name<T>());
  } else {
    // (Appended: GCC 12 warns, wrongly, -Wrestrict on "literal" + std::string.)
    std::string out = "k";
    out += dtype_name<npullm::kv::key_format_t<T>>();
    out += "v";
    out += dtype_name<npullm::kv::value_format_t<T>>();
    return out;
  }
}

// Quantized KV (q8_0, q4_0, K q8_0 with V q4_0): the context lengths (16k, 64k), contiguous
// and blocks of 16.
template <class T>
void register_decode(const head_shape& hs) {
  constexpr bool quantized =  // a quantized format, or K and V in two (kv::mixed)
      !npullm::kv::kv_element<T> || npullm::kv::quantized_kv_element<T>;
  for (std::size_t kv_len : {1024u, 4096u, 16384u, 65536u}) {
    if (quantized && kv_len < 16384) continue;
    for (std::size_t block : {0u, 16u, 256u}) {
      if (quantized && block == 256) continue;
      for (bool cold : {false, true}) {
        for (std::size_t threads : nb::thread_counts()) {
          std::ostringstream name;  // (not "literal" + std::string: GCC 12's -Wrestrict)
          name << "attention_decode/" << hs.name() << "/kv" << kv_len << "/" << dtype_name<T>()
               << "/";
          if (block == 0) {
            name << "contiguous";
          } else {
            name << "block" << block;
          }
          name << "/" << (cold ? "cold" : "hot") << "/threads:" << threads;
          benchmark::RegisterBenchmark(name.str().c_str(), decode_benchmark<T>, hs, kv_len, block,
                                       cold, threads)
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.2);
        }
      }
    }
  }
}

// Decode at 8k context: window 4096 against the whole context, Qwen2-0.5B and Mistral heads.
void register_window_decode() {
  for (const head_shape& hs : {head_shape{14, 2, 64}, head_shape{32, 8, 128}}) {
    for (std::size_t block : {0u, 16u}) {
      for (std::size_t window : {4096u, 0u}) {
        for (bool with_stats : {false, true}) {
          if (with_stats && window == 0) continue;
          for (std::size_t threads : nb::thread_counts()) {
            const std::string name =
                "attention_decode/" + hs.name() + "/kv8192/f16/" +
                (block == 0 ? "contiguous" : "block" + std::to_string(block)) + "/" +
                (window == 0 ? "full" : "window" + std::to_string(window)) +
                (with_stats ? "/stats" : "") + "/cold/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), window_decode_benchmark<npullm::float16>, hs,
                                         8192, block, window, with_stats, threads)
                ->Unit(benchmark::kMicrosecond)
                ->MinTime(0.2);
          }
        }
      }
    }
  }
}

void register_all() {
  register_window_decode();
  for (const head_shape& hs :
       {head_shape{14, 2, 64}, head_shape{32, 8, 128}, head_shape{8, 8, 128}}) {
    register_decode<npullm::float16>(hs);
    register_decode<npullm::bfloat16>(hs);
    register_decode<float>(hs);
  }
  for (const head_shape& hs : {head_shape{14, 2, 64}, head_shape{8, 8, 128}}) {
    register_decode<npullm::kv::q8_0>(hs);
    register_decode<npullm::kv::q4_0>(hs);
    register_decode<npullm::kv::mixed<npullm::kv::q8_0, npullm::kv::q4_0>>(hs);
  }
  for (const head_shape& hs : {head_shape{14, 2, 64}, head_shape{32, 8, 128}}) {
    for (std::size_t threads : nb::thread_counts()) {
      const std::string t = "/threads:" + std::to_string(threads);
      for (std::size_t n : {512u, 2048u}) {
        benchmark::RegisterBenchmark(("attention_prefill/" + hs.name() + "/causal" +
                                      std::to_string(n) + "x" + std::to_string(n) + t)
                                         .c_str(),
                                     prefill_benchmark, hs, n, 0, threads)
            ->Unit(benchmark::kMillisecond);
      }
      benchmark::RegisterBenchmark(
          ("attention_prefill/" + hs.name() + "/chunk256/past2048/f16" + t).c_str(),
          prefill_benchmark, hs, 256, 2048, threads)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
