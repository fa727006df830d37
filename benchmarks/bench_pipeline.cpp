// Decoder pipeline benchmarks on the generated qwen2-0.5b model (names and counters as in
// shared/DESIGN.md). The model is generated once under models/ (bf16 ~1 GB, f32 ~2 GB).
//   pipeline_prefill/qwen2-0.5b/<w>/p512/threads:n   tokens_per_s; GFLOPs and pct_peak in
//       useful flops (2 x matmul weights x tokens + causal attention, LM head on the last row)
//       against the bf16 dot peak (bf16 weights) or the fp32 FMA peak (f32)
//   pipeline_decode/qwen2-0.5b/<w>/after512/threads:n  128 tokens after a 512-token prefill:
//       tokens_per_s; GBps and pct_bw of the bytes a token must read (every weight once + KV)
//   pipeline_logits/qwen2-0.5b/<w>/p512/threads:n      ratio = all-rows logits / last-row
//       logits prefill time
//   pipeline_decode/qwen2-0.5b/{q4_0,int4_g128}/after512/threads:n  the bf16 model quantized at
//       load (q4_0: Q4_0 layers, Q8_0 embedding / LM head; int4_g128: int4_sym group 128, int8_sym
//       per channel); GBps and pct_bw on the quantized bytes a token reads
//   pipeline_prefill/qwen2-0.5b/{q4_0,q4_0_packed}/p512/threads:n  prefill over those weights,
//       the layers' blocks decoded per call or packed at load (weight_packing::on); GOPs and
//       pct_peak of the int8 dot-product peak
// Weights are bf16 or f32 (or quantized at load); KV is bf16 in blocks of 16.
#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

namespace nb = npullm::bench;
namespace fs = std::filesystem;
using npullm::model::block_kv;
using npullm::model::causal_lm;
using npullm::model::dynamic_attention;
using npullm::model::pipeline_config;

using npullm::bench::pool_for;

template <class W>
fs::path model_dir() {
  return nb::generated_model(
      "qwen2-0.5b", std::is_same_v<W, npullm::bfloat16> ? npullm::dtype::bf16 : npullm::dtype::f32);
}

std::vector<std::int32_t> tokens(std::size_t n, std::size_t vocab) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>((i * 7919 + 13) % vocab);
  return ids;
}

// Matmul weights a token passes through (the LM head counted separately).
double body_params(const npullm::model::model_config& c) {
  return static_cast<double>(c.num_hidden_layers) *
         static_cast<double>(c.hidden_size * (c.q_size() + 2 * c.kv_size()) +
                             c.q_size() * c.hidden_size + 3 * c.hidden_size * c.intermediate_size);
}

template <class W>
using lm_type = causal_lm<pipeline_config<block_kv<npullm::bfloat16, 16>, dynamic_attention<>, W>>;

// Seconds per 512-token prefill (last-row logits) and its useful operations: 2 x matmul weights
// x tokens + causal attention + the LM head on the last row.
template <class Lm>
std::pair<double, double> timed_prefill(benchmark::State& state, Lm& lm) {
  const auto& c = lm.config();
  const auto ids = tokens(512, c.vocab_size);
  const double seconds = nb::timed_loop(state, [&] {
    lm.reset();
    benchmark::DoNotOptimize(lm.prefill(ids).logits.data());
  });
  const double n = 512;
  const double attention =
      4.0 * static_cast<double>(c.head_dim * c.num_attention_heads * c.num_hidden_layers) * n *
      (n + 1) / 2;
  state.counters["tokens_per_s"] = n / seconds;
  return {seconds, 2.0 * body_params(c) * n + attention +
                       2.0 * static_cast<double>(c.vocab_size * c.hidden_size)};
}

template <class W>
void prefill_benchmark(benchmark::State& state, std::size_t threads) {
  lm_type<W> lm(model_dir<W>(), {.max_sequence = 1024, .pool = &pool_for(threads)});
  const auto [seconds, flops] = timed_prefill(state, lm);
  nb::set_flops_counters(state, flops, seconds, threads, std::is_same_v<W, npullm::bfloat16>);
}

// 128 timed decode steps after a 512-token prefill; weight_bytes: what a token reads of the
// weights (every matrix once, the LM head too).
template <class Lm>
void decode_loop(benchmark::State& state, Lm& lm, double weight_bytes, std::size_t threads) {
  const auto& c = lm.config();
  const auto ids = tokens(512, c.vocab_size);
  constexpr std::size_t steps = 128;
  // Only the decode steps are timed; the prefill before them is not.
  std::vector<double> runs;
  for (auto _ : state) {
    state.PauseTiming();
    lm.reset();
    lm.prefill(ids);
    state.ResumeTiming();
    std::array<std::int32_t, 1> next{1};
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < steps; ++i) {
      benchmark::DoNotOptimize(lm.decode(next).logits.data());
      next[0] = static_cast<std::int32_t>((next[0] * 31 + 7) % 1000);
    }
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double seconds = nb::median(runs);
  // Per token: the weights and the KV of ~576 positions (bf16).
  const double kv =
      2.0 * static_cast<double>(c.num_hidden_layers * c.kv_size()) * 2.0 * (512.0 + steps / 2.0);
  const double per_token = seconds / steps;
  state.counters["tokens_per_s"] = 1.0 / per_token;
  nb::set_bandwidth_counters(state, weight_bytes + kv, per_token, threads);
}

template <class W>
void decode_benchmark(benchmark::State& state, std::size_t threads) {
  lm_type<W> lm(model_dir<W>(), {.max_sequence = 1024, .pool = &pool_for(threads)});
  const auto& c = lm.config();
  decode_loop(state, lm,
              (body_params(c) + static_cast<double>(c.vocab_size * c.hidden_size)) * sizeof(W),
              threads);
}

// The bf16 model quantized at load (loaded once per format): q4_0 = Q4_0 layers + Q8_0
// embedding / LM head (tied), int4_g128 = int4_sym group 128 + int8_sym per channel (the NPU
// recipe). Norms stay bf16; the pipeline is the bf16 one.
std::shared_ptr<const npullm::model::model_weights<npullm::bfloat16>> quantized_weights(
    const std::string& format) {
  using npullm::model::quantization;
  using npullm::ops::weight_format;
  static std::map<std::string,
                  std::shared_ptr<const npullm::model::model_weights<npullm::bfloat16>>>
      cache;
  auto& w = cache[format];
  if (!w) {
    npullm::model::load_options o;
    if (format == "q4_0") {
      o = {.projections = quantization{weight_format::q4_0, 0},
           .embedding_and_head = quantization{weight_format::q8_0, 0}};
    } else {
      o = {.projections = quantization{weight_format::int4_sym, 128},
           .embedding_and_head = quantization{weight_format::int8_sym, 0}};
    }
    w = npullm::model::model_weights<npullm::bfloat16>::load(model_dir<npullm::bfloat16>(), o);
  }
  return w;
}

void quantized_decode_benchmark(benchmark::State& state, std::size_t threads, std::string format) {
  const auto w = quantized_weights(format);
  lm_type<npullm::bfloat16> lm(w, {.max_sequence = 1024, .pool = &pool_for(threads)});
  double bytes = static_cast<double>(w->lm_head.bytes());
  for (const auto& l : w->layers) {
    for (const auto* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      bytes += static_cast<double>(p->bytes());
  }
  decode_loop(state, lm, bytes, threads);
}

// Prefill 512 over the quantized layers (LM head on the last row): `packed` decodes the layers
// once at load into int8 panels (weight_packing::on), else the GEMM decodes W's blocks per call.
// pct_peak against the int8 dot-product peak (machine_limits: the kernels' own instructions),
// the path the quantized GEMMs take (activations are quantized to int8 per 32).
void quantized_prefill_benchmark(benchmark::State& state, std::size_t threads, std::string format,
                                 bool packed) {
  const auto w = quantized_weights(format);
  lm_type<npullm::bfloat16> lm(w, {.max_sequence = 1024,
                                   .pool = &pool_for(threads),
                                   .packing = packed ? npullm::model::weight_packing::on
                                                     : npullm::model::weight_packing::off});
  const auto [seconds, ops] = timed_prefill(state, lm);
  const double gops = ops / seconds / 1e9;
  const auto& m = nb::limits_for(threads);
  state.counters["GOPs"] = gops;
  state.counters["pct_peak"] = 100.0 * gops / (m.int8_gops > 0 ? m.int8_gops : m.fma_gflops);
  state.counters["packed_MB"] = static_cast<double>(lm.packed_bytes()) / 1e6;
}

template <class W>
void logits_benchmark(benchmark::State& state, std::size_t threads) {
  lm_type<W> lm(model_dir<W>(), {.max_sequence = 1024, .pool = &pool_for(threads)});
  const auto ids = tokens(512, lm.config().vocab_size);
  const double last = nb::timed_loop(state, [&] {
    lm.reset();
    benchmark::DoNotOptimize(lm.prefill(ids).logits.data());
  });
  const double all = nb::median_seconds(3, [&] {
    lm.reset();
    benchmark::DoNotOptimize(
        lm.prefill(ids, npullm::batch::output_selection::all_rows()).logits.data());
  });
  state.counters["ratio"] = all / last;
}

template <class W>
void register_type(const char* w) {
  for (std::size_t threads : nb::thread_counts()) {
    const std::string t = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(
        (std::string("pipeline_prefill/qwen2-0.5b/") + w + "/p512" + t).c_str(),
        prefill_benchmark<W>, threads)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    benchmark::RegisterBenchmark(
        (std::string("pipeline_decode/qwen2-0.5b/") + w + "/after512" + t).c_str(),
        decode_benchmark<W>, threads)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
    benchmark::RegisterBenchmark(
        (std::string("pipeline_logits/qwen2-0.5b/") + w + "/p512" + t).c_str(), logits_benchmark<W>,
        threads)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2);
  }
}

}  // namespace

void register_quantized() {
  for (std::size_t threads : nb::thread_counts()) {
    for (const char* f : {"q4_0", "int4_g128"}) {
      benchmark::RegisterBenchmark((std::string("pipeline_decode/qwen2-0.5b/") + f +
                                    "/after512/threads:" + std::to_string(threads))
                                       .c_str(),
                                   quantized_decode_benchmark, threads, std::string(f))
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
    }
    for (const bool packed : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string("pipeline_prefill/qwen2-0.5b/q4_0") + (packed ? "_packed" : "") +
           "/p512/threads:" + std::to_string(threads))
              .c_str(),
          quantized_prefill_benchmark, threads, std::string("q4_0"), packed)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
  }
}

int main(int argc, char** argv) {
  register_type<npullm::bfloat16>("bf16");
  register_quantized();
  register_type<float>("f32");
  return npullm::bench::run_benchmarks(argc, argv);
}
