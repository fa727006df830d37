// KV cache bookkeeping: operations per second for append (per token and per block), fork,
// truncate and prefix lookup on pools of 1k, 10k and 100k blocks, and the bytes of metadata
// each block costs. Single-threaded by contract (a pool belongs to one scheduler thread).
// Only the operation itself is timed (manual time), not the setup between operations.
#include <benchmark/benchmark.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/core/dtype.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"
#include "npullm/kv/prefix_cache.hpp"

namespace {

using namespace npullm::kv;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t block_size = 16;
constexpr kv_shape shape{1, 1, 8};  // bookkeeping does not depend on the KV size

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// Operations are timed in batches of this many: one clock read per batch keeps the clock's
// own cost (~20 ns) out of figures of a few nanoseconds.
constexpr std::size_t batch = 64;

// append(n) until the pool is full, then reset (untimed) and go on.
void append_benchmark(benchmark::State& state, std::size_t blocks, std::size_t tokens_per_call) {
  block_pool<float> pool(shape, block_size, blocks);
  block_table<float> table(pool);
  const std::size_t capacity = blocks * block_size;
  for (auto _ : state) {
    if (table.length() + batch * tokens_per_call > capacity) table.reset();
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < batch; ++i) benchmark::DoNotOptimize(table.append(tokens_per_call));
    state.SetIterationTime(seconds_since(start));
  }
  const auto calls = static_cast<double>(state.iterations() * batch);
  state.counters["ops_per_s"] = benchmark::Counter(calls, benchmark::Counter::kIsRate);
  state.counters["tokens_per_s"] =
      benchmark::Counter(calls * static_cast<double>(tokens_per_call), benchmark::Counter::kIsRate);
}

// fork() of a table holding half the pool, and destroying the fork (both timed: a fork's life).
void fork_benchmark(benchmark::State& state, std::size_t blocks) {
  block_pool<float> pool(shape, block_size, blocks);
  block_table<float> table(pool);
  table.append(blocks / 2 * block_size);
  for (auto _ : state) {
    const auto start = clock_type::now();
    {
      block_table<float> copy = table.fork();
      benchmark::DoNotOptimize(copy.blocks().data());
    }
    state.SetIterationTime(seconds_since(start));
  }
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["blocks_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * (blocks / 2)), benchmark::Counter::kIsRate);
}

// truncate() dropping the last block (speculative rollback), a batch at a time; the re-append
// is not timed.
void truncate_benchmark(benchmark::State& state, std::size_t blocks) {
  block_pool<float> pool(shape, block_size, blocks);
  block_table<float> table(pool);
  table.append(blocks / 2 * block_size - 3);
  for (auto _ : state) {
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < batch; ++i) table.truncate(table.length() - block_size);
    state.SetIterationTime(seconds_since(start));
    table.append(batch * block_size);
  }
  state.counters["ops_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * batch),
                                                   benchmark::Counter::kIsRate);
}

// Longest-prefix lookup of a prompt whose first 64 blocks are cached, in a cache holding
// every block of the pool (chains of 64 blocks).
void prefix_lookup_benchmark(benchmark::State& state, std::size_t blocks) {
  block_pool<float> pool(shape, block_size, blocks);
  prefix_cache<float> cache(pool);
  constexpr std::size_t chain = 64;
  std::vector<block_table<float>> tables;
  std::vector<std::vector<token_id>> prompts;
  for (std::size_t c = 0; c < blocks / chain; ++c) {
    std::vector<token_id> tokens(chain * block_size);
    std::iota(tokens.begin(), tokens.end(), static_cast<token_id>(c * 7919));
    tables.emplace_back(pool);
    tables.back().append(tokens.size());
    cache.insert(tables.back(), tokens);
    tokens.push_back(1);  // one more token: the whole chain can match
    prompts.push_back(std::move(tokens));
  }
  std::size_t i = 0, matched = 0;
  for (auto _ : state) {
    const auto& prompt = prompts[i++ % prompts.size()];
    const auto start = clock_type::now();
    const auto m = cache.match(prompt);
    state.SetIterationTime(seconds_since(start));
    matched += m.size();
  }
  if (matched != state.iterations() * chain) state.SkipWithError("lookup missed cached blocks");
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["blocks_per_s"] =
      benchmark::Counter(static_cast<double>(matched), benchmark::Counter::kIsRate);
  state.counters["cached_blocks"] = static_cast<double>(cache.size());
}

// Bytes of bookkeeping per block: the pool's arrays, a table's entry, a prefix-cache entry.
void metadata_benchmark(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(block_pool<float>::metadata_bytes_per_block());
  state.counters["pool_B_per_block"] =
      static_cast<double>(block_pool<float>::metadata_bytes_per_block());
  state.counters["table_B_per_block"] = static_cast<double>(sizeof(block_id));
  // entry (flag, hash, parent, two vectors) + the block's token ids + one hash-index node.
  state.counters["prefix_cache_B_per_block"] =
      static_cast<double>(1 + 8 + sizeof(block_id) + 2 * sizeof(std::vector<token_id>) +
                          block_size * sizeof(token_id) + sizeof(block_id) + 8 + 2 * sizeof(void*));
}

// A 1024-token prefill's KV writes as the pipeline does them: for every layer and token, the
// token's K and V slots (token_kv: a bounds-checked subview) filled from the step's f32 rows,
// in Qwen2-0.5B's shape (24 layers, 2 KV heads, head_dim 64) at bf16. 2 * 24 * 1024 token_kv
// calls a prefill: what a slot lookup costs shows here.
template <class Cache>
void prefill_kv_write_benchmark(benchmark::State& state, Cache& cache) {
  constexpr std::size_t tokens = 1024;
  const kv_shape s = cache.shape();
  std::vector<float> present(s.kv_heads * tokens * s.head_dim, 0.25f);  // (kv_heads, tokens, D)
  cache.append(tokens);
  for (auto _ : state) {
    for (std::size_t layer = 0; layer < s.layers; ++layer) {
      for (std::size_t t = 0; t < tokens; ++t) {
        auto ks = cache.token_kv(t, layer, kv_part::k);  // (kv_heads, D)
        auto vs = cache.token_kv(t, layer, kv_part::v);
        for (std::size_t h = 0; h < s.kv_heads; ++h) {
          const float* src = present.data() + (h * tokens + t) * s.head_dim;
          for (std::size_t d = 0; d < s.head_dim; ++d) {
            ks(h, d) = npullm::from_float<npullm::bfloat16>(src[d]);
            vs(h, d) = npullm::from_float<npullm::bfloat16>(src[d] * 0.5f);
          }
        }
      }
    }
    benchmark::ClobberMemory();
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
  state.counters["slots_per_s"] = benchmark::Counter(  // token_kv calls
      static_cast<double>(state.iterations() * tokens * s.layers * 2), benchmark::Counter::kIsRate);
}

constexpr kv_shape qwen2_kv{24, 2, 64};

void prefill_kv_write_block(benchmark::State& state) {
  block_pool<npullm::bfloat16> pool(qwen2_kv, block_size, 1024 / block_size);
  block_table<npullm::bfloat16> table(pool);
  struct source {  // the table, with the pool's shape
    block_table<npullm::bfloat16>& t;
    kv_shape shape() const { return t.pool().shape(); }
    void append(std::size_t n) { t.append(n); }
    auto token_kv(std::size_t pos, std::size_t layer, kv_part part) {
      return t.token_kv(pos, layer, part);
    }
  } src{table};
  prefill_kv_write_benchmark(state, src);
}

void prefill_kv_write_contiguous(benchmark::State& state) {
  contiguous_cache<npullm::bfloat16> cache(qwen2_kv, 1024);
  prefill_kv_write_benchmark(state, cache);
}

void register_all() {
  for (std::size_t blocks : {std::size_t{1000}, std::size_t{10000}, std::size_t{100000}}) {
    const std::string b = "/blocks" + std::to_string(blocks) + "/bs16/threads:1";
    benchmark::RegisterBenchmark(("kv_append/token" + b).c_str(), append_benchmark, blocks, 1)
        ->UseManualTime();
    benchmark::RegisterBenchmark(("kv_append/block" + b).c_str(), append_benchmark, blocks,
                                 block_size)
        ->UseManualTime();
    benchmark::RegisterBenchmark(("kv_fork" + b).c_str(), fork_benchmark, blocks)->UseManualTime();
    benchmark::RegisterBenchmark(("kv_truncate" + b).c_str(), truncate_benchmark, blocks)
        ->UseManualTime();
    benchmark::RegisterBenchmark(("kv_prefix_lookup/chain64" + b).c_str(), prefix_lookup_benchmark,
                                 blocks)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark("kv_metadata/bs16", metadata_benchmark)->Iterations(1);
  benchmark::RegisterBenchmark("kv_prefill_write/tokens1024/l24/h2/d64/bf16/block16/threads:1",
                               prefill_kv_write_block)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kv_prefill_write/tokens1024/l24/h2/d64/bf16/contiguous/threads:1",
                               prefill_kv_write_contiguous)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
