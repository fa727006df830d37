// Pyramid attention vs the single full-capacity static variant (names and counters as in
// shared/DESIGN.md). For decode (1 query, 1 present slot) and a chunked-prefill step (256
// queries), at past lengths of 5%, 25%, 50% and 100% of the largest past (C - q), C = 4096 and
// 16384, q = 256: one layer's attention (14/2 heads, D 64, f16 KV in a contiguous cache) run
// through the variant the plan selects and through the largest variant, medians of several
// runs each in the same process.
//   ratio         pyramid / full static time (the targets: <= 0.35 at 25%, <= 1.05 at
//                 100%)
//   pyramid_us, full_us   the two medians
// The per-step mask build is outside the timed region: it happens once per step for all layers.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "bench_util.hpp"
#include "npullm/attention/pyramid.hpp"

namespace {

namespace nb = npullm::bench;
namespace at = npullm::attention;
using npullm::kv::kv_part;
using npullm::kv::kv_tile;

using npullm::bench::pool_for;

void pyramid_benchmark(benchmark::State& state, std::size_t capacity, std::size_t fill_pct,
                       bool decode, std::size_t threads) {
  constexpr std::size_t q = 256, q_heads = 14, kv_heads = 2, dim = 64;
  const at::pyramid_plan plan(q, capacity);
  const std::size_t slots = decode ? 1 : q;
  const std::size_t past_len = plan.max_past() * fill_pct / 100;
  npullm::kv::contiguous_cache<npullm::float16> cache({1, kv_heads, dim}, plan.max_past());
  cache.append(plan.max_past());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (kv_part part : {kv_part::k, kv_part::v}) {
    auto b = cache.buffer(0, part);
    for (std::size_t h = 0; h < kv_heads; ++h) {
      for (std::size_t j = 0; j < plan.max_past(); ++j) {
        for (std::size_t d = 0; d < dim; ++d) b(h, j, d) = npullm::float16(u(rng));
      }
    }
  }
  npullm::tensor<float, 3> qv(q_heads, slots, dim), out(q_heads, slots, dim),
      pk(kv_heads, slots, dim), pv(kv_heads, slots, dim);
  for (auto* t : {&qv, &pk, &pv}) {
    for (std::size_t i = 0; i < t->size(); ++i) t->data()[i] = u(rng);
  }
  npullm::tensor<float, 2> mask(slots, plan.max_past() + slots);
  for (std::size_t r = 0; r < slots; ++r) {
    for (std::size_t j = 0; j < mask.extent(1); ++j) {
      const bool visible = j < plan.max_past() ? j < past_len : j - plan.max_past() <= r;
      mask.view()(r, j) = visible ? 0.0f : -INFINITY;
    }
  }
  const at::pyramid_step small(plan, mask.view(), past_len, slots);
  const at::pyramid_step full(plan, mask.view(), past_len, slots,
                              plan.at(plan.variant_count() - 1));
  const kv_tile<float> present{pk.view(), pv.view(), 0};
  const at::attention_io io{qv.view(), out.view(), {}, 0.125f};
  const auto& pool = pool_for(threads);
  auto run = [&](const at::pyramid_step& step) {
    const kv_tile<npullm::float16> past = at::pyramid_past(cache, 0, step);
    at::pyramid_attention(io, std::span<const kv_tile<npullm::float16>>(&past, 1), present, step,
                          pool);
    benchmark::DoNotOptimize(out.data());
  };
  const double pyramid_s = nb::timed_loop(state, [&] { run(small); });
  const double full_s = nb::median_seconds(decode ? 50 : 5, [&] { run(full); });
  state.counters["ratio"] = pyramid_s / full_s;
  state.counters["pyramid_us"] = pyramid_s * 1e6;
  state.counters["full_us"] = full_s * 1e6;
  state.counters["variant"] = static_cast<double>(small.variant().index);
}

void register_all() {
  for (bool decode : {true, false}) {
    for (std::size_t capacity : {4096u, 16384u}) {
      for (std::size_t fill : {5u, 25u, 50u, 100u}) {
        for (std::size_t threads : nb::thread_counts()) {
          const std::string name = std::string(decode ? "pyramid_decode" : "pyramid_prefill") +
                                   "/c" + std::to_string(capacity) + "/fill" +
                                   std::to_string(fill) + "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), pyramid_benchmark, capacity, fill, decode,
                                       threads)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
