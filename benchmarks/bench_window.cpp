// Sliding-window decode at long context: the same model with a 4096-token window on every
// layer (Mistral style) and without one, decoding after an 8192-token prompt.
//   pipeline_decode/mistral-40m/ctx8192/<window4096|full>/<contiguous|block16>/threads:n
//       tokens_per_s (median over the decode steps of several runs), kv_read_MB per token
//       (the K/V bytes the attention of one token reads: every layer, both K and V), GBps and
//       pct_bw of weights + that KV against the machine's read bandwidth.
// The model (generated once under models/, bf16, ~80 MB): hidden 512, 8 layers, 8 query / 2 KV
// heads of 64, intermediate 1408, vocabulary 32000; small enough that the 8k prefill before the
// timed steps takes seconds, large enough that the KV of 8k positions (33 MB at bf16) is a real
// share of what a token reads. Windowed: the contiguous pipeline keeps a ring of ~4.6k
// positions, the block pipeline releases blocks behind the window.
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

namespace nb = npullm::bench;
namespace fs = std::filesystem;
using namespace npullm::model;

constexpr std::size_t context = 8192, window = 4096, steps = 32;

fs::path model_dir(bool windowed) {
  model_spec spec = preset("tiny-mistral", npullm::dtype::bf16, 11);
  model_config& c = spec.config;
  c.hidden_size = 512;
  c.intermediate_size = 1408;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.max_position_embeddings = 32768;
  c.layer_windows.assign(c.num_hidden_layers, windowed ? window : 0);
  const fs::path dir = std::string("models/mistral-40m-") + (windowed ? "window4096" : "full");
  ensure_model(dir, spec);
  return dir;
}

template <class Kv>
void decode_benchmark(benchmark::State& state, bool windowed, std::size_t threads) {
  using lm_type = causal_lm<pipeline_config<Kv, dynamic_attention<>, npullm::bfloat16>>;
  lm_type lm(model_dir(windowed), {.max_sequence = context + 2 * steps,
                                   .kv_capacity = context + 2 * steps,
                                   .pool = &nb::pool_for(threads),
                                   .step_rows = 512});
  const auto& c = lm.config();
  std::vector<std::int32_t> ids(context);
  for (std::size_t i = 0; i < context; ++i)
    ids[i] = static_cast<std::int32_t>((i * 7919 + 13) % c.vocab_size);
  std::vector<double> per_token;
  for (auto _ : state) {
    state.PauseTiming();
    lm.reset();
    lm.prefill(ids);
    state.ResumeTiming();
    std::array<std::int32_t, 1> next{1};
    for (std::size_t i = 0; i < steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(lm.decode(next).logits.data());
      per_token.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      next[0] = static_cast<std::int32_t>((next[0] * 31 + 7) % 1000);
    }
  }
  const double seconds = nb::median(per_token);
  const double keys = static_cast<double>(windowed ? window : context + steps / 2);
  const double kv = 2.0 * static_cast<double>(c.num_hidden_layers * c.kv_size()) * 2.0 * keys;
  const double weights =
      static_cast<double>(c.num_hidden_layers) *
          static_cast<double>(c.hidden_size * (c.q_size() + 2 * c.kv_size()) +
                              c.q_size() * c.hidden_size + 3 * c.hidden_size * c.intermediate_size) *
          2.0 +
      static_cast<double>(c.vocab_size * c.hidden_size) * 2.0;
  state.counters["tokens_per_s"] = 1.0 / seconds;
  state.counters["kv_read_MB"] = kv / 1e6;
  nb::set_bandwidth_counters(state, weights + kv, seconds, threads);
}

void register_all() {
  for (std::size_t threads : nb::thread_counts()) {
    for (const bool windowed : {true, false}) {
      const std::string name = std::string("pipeline_decode/mistral-40m/ctx8192/") +
                               (windowed ? "window4096" : "full");
      const std::string t = "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark((name + "/contiguous" + t).c_str(),
                                   decode_benchmark<contiguous_kv<npullm::bfloat16>>, windowed,
                                   threads)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(2);
      benchmark::RegisterBenchmark((name + "/block16" + t).c_str(),
                                   decode_benchmark<block_kv<npullm::bfloat16, 16>>, windowed,
                                   threads)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return nb::run_benchmarks(argc, argv);
}
