// npullm demo: a Qwen2-0.5B-shaped decoder end to end on this machine.
//
// Generates the model once (seeded random weights in the real shapes, cached under models/),
// builds a pipeline configured at compile time (bf16 weights, bf16 KV in blocks of 16,
// dynamic flash attention, host backend, all threads), prefills a prompt, decodes greedily
// with a progress bar, and prints tokens/s, where the time went (head / body / tail) and the
// decode's bytes per token against the machine's measured read bandwidth; then the same model
// quantized to int4 at load, decoded the same way, its tokens/s beside the bf16 run's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "machine_limits.hpp"
#include "npullm/batch/generate.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/ops/argmax.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

void progress(const char* label, std::size_t done, std::size_t total, double seconds) {
  constexpr int width = 40;
  const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
  std::printf("\r%-8s [%s%s] %3zu/%zu  %6.1f tokens/s", label,
              std::string(static_cast<std::size_t>(filled), '#').c_str(),
              std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total,
              seconds > 0 ? static_cast<double>(done) / seconds : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::path("models/qwen2-0.5b-bf16");
  const std::size_t prompt_len = 128, new_tokens = 32;
  try {
    {
      const auto t = clock_type::now();
      if (npullm::model::ensure_model(dir,
                                      npullm::model::preset("qwen2-0.5b", npullm::dtype::bf16))) {
        std::printf(
            "generated %s (Qwen2-0.5B shapes, bf16, seeded random weights; once) in %.1f s\n",
            dir.c_str(), since(t));
      }
    }
    const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
    npullm::thread_pool pool(threads);
    using config =
        npullm::model::pipeline_config<npullm::model::block_kv<npullm::bfloat16, 16>,
                                       npullm::model::dynamic_attention<>, npullm::bfloat16>;
    auto t = clock_type::now();
    npullm::model::causal_lm<config> lm(dir, {.max_sequence = 1024, .pool = &pool});
    const auto& c = lm.config();
    std::printf(
        "model: %s, %zu layers, hidden %zu, %zu/%zu heads, vocab %zu (loaded in %.0f ms, mmap)\n",
        std::string(npullm::model::to_string(c.family)).c_str(), c.num_hidden_layers, c.hidden_size,
        c.num_attention_heads, c.num_key_value_heads, c.vocab_size, since(t) * 1e3);
    std::printf("pipeline: bf16 weights, bf16 KV in blocks of 16, flash attention, %zu threads\n\n",
                threads);

    std::vector<std::int32_t> prompt(prompt_len);
    for (std::size_t i = 0; i < prompt_len; ++i)
      prompt[i] = static_cast<std::int32_t>((i * 7919 + 13) % c.vocab_size);
    t = clock_type::now();
    auto out = lm.prefill(prompt);
    const double prefill_s = since(t);
    std::printf("prefill  %zu tokens in %.0f ms: %.0f tokens/s\n", prompt_len, prefill_s * 1e3,
                static_cast<double>(prompt_len) / prefill_s);
    const auto prefill_time = lm.time_spent();
    lm.reset_timings();

    std::vector<std::int32_t> generated;
    std::vector<std::int32_t> next(1);
    const npullm::dense_view<const float, 2> first(out.logits.data(), 1, c.vocab_size);
    npullm::ops::argmax(first, next);
    t = clock_type::now();
    for (std::size_t i = 0; i < new_tokens; ++i) {
      generated.push_back(next[0]);
      const auto step = lm.decode(next);
      npullm::ops::argmax(npullm::dense_view<const float, 2>(step.logits.data(), 1, c.vocab_size),
                          next);
      progress("decode", i + 1, new_tokens, since(t));
    }
    const double decode_s = since(t);
    std::printf("\n");
    std::printf("tokens:  ");
    for (std::size_t i = 0; i < std::min<std::size_t>(generated.size(), 16); ++i)
      std::printf("%d ", generated[i]);
    std::printf("... (random weights: the ids mean nothing, the work is real)\n\n");

    const auto& d = lm.time_spent();
    auto split = [](const char* what, const npullm::model::causal_lm<config>::timings& s) {
      const double total = s.head + s.body + s.tail;
      std::printf("%-8s head %5.1f%%  body %5.1f%%  tail %5.1f%%  (%.0f ms)\n", what,
                  100 * s.head / total, 100 * s.body / total, 100 * s.tail / total, total * 1e3);
    };
    split("prefill", prefill_time);
    split("decode", d);

    // Bytes a decode step must read: every weight once (tied embeddings: the LM head) and the KV.
    std::size_t weight_bytes = c.vocab_size * c.hidden_size;  // LM head (= embeddings)
    weight_bytes += c.num_hidden_layers *
                    (c.hidden_size * (c.q_size() + 2 * c.kv_size()) + c.q_size() * c.hidden_size +
                     3 * c.hidden_size * c.intermediate_size);
    weight_bytes *= sizeof(npullm::bfloat16);
    const double kv_bytes =
        2.0 * static_cast<double>(c.num_hidden_layers * c.kv_size() * sizeof(npullm::bfloat16)) *
        (static_cast<double>(prompt_len) + static_cast<double>(new_tokens) / 2);
    const double per_token = static_cast<double>(weight_bytes) + kv_bytes;
    const double tps = static_cast<double>(new_tokens) / decode_s;
    std::printf("\ndecode   %.1f tokens/s, %.0f MB read per token\n", tps, per_token / 1e6);

    // The same model quantized to int4 at load (the NPU recipe: int4_sym group 128 for the
    // layers, int8_sym per channel for the tied embedding / LM head), the same prompt and
    // steps through the same bf16 pipeline type: the quantized kernels read 4-bit blocks.
    double int4_tps = 0, int4_per_token = 0;
    {
      using npullm::model::quantization;
      using npullm::ops::weight_format;
      t = clock_type::now();
      const auto qw = npullm::model::model_weights<npullm::bfloat16>::load(
          dir, {.projections = quantization{weight_format::int4_sym, 128},
                .embedding_and_head = quantization{weight_format::int8_sym, 0}});
      const double quantize_s = since(t);
      npullm::model::causal_lm<config> q(qw, {.max_sequence = 1024, .pool = &pool});
      const auto qout = q.prefill(prompt);
      npullm::ops::argmax(npullm::dense_view<const float, 2>(qout.logits.data(), 1, c.vocab_size),
                          next);
      t = clock_type::now();
      for (std::size_t i = 0; i < new_tokens; ++i) {
        const auto step = q.decode(next);
        npullm::ops::argmax(npullm::dense_view<const float, 2>(step.logits.data(), 1, c.vocab_size),
                            next);
        progress("int4", i + 1, new_tokens, since(t));
      }
      int4_tps = static_cast<double>(new_tokens) / since(t);
      int4_per_token = static_cast<double>(qw->lm_head.bytes()) + kv_bytes;
      for (const auto& l : qw->layers) {
        for (const auto* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
          int4_per_token += static_cast<double>(m->bytes());
      }
      std::printf(
          "\ndecode   int4 (g128, int8 head) %.1f tokens/s beside bf16 %.1f tokens/s "
          "(x%.2f), %.0f MB read per token; quantized at load in %.1f s\n",
          int4_tps, tps, int4_tps / tps, int4_per_token / 1e6, quantize_s);
    }

    // Batched generation: several prompts at once (continuous batching, one packed decode step
    // for all running sequences), tokens/s per batch size.
    lm.reset();
    std::puts("\nbatched generation (64-token prompts, 16 new tokens each, greedy):");
    for (std::size_t batch : {1u, 4u, 8u}) {
      npullm::batch::generator<decltype(lm)> g(lm, {.max_batch = batch});
      for (std::size_t b = 0; b < batch; ++b) {
        npullm::batch::request r;
        for (std::size_t i = 0; i < 64; ++i)
          r.prompt.push_back(static_cast<std::int32_t>((b * 104729 + i * 7919 + 5) % c.vocab_size));
        r.max_new_tokens = 16;
        g.submit(std::move(r));
      }
      std::size_t produced = 0;
      const std::size_t total = batch * 16;
      const auto start = clock_type::now();
      const std::string label = "batch " + std::to_string(batch);
      g.run([&](std::size_t, std::int32_t, bool) {
        progress(label.c_str(), ++produced, total, since(start));
      });
      std::printf("\n");
    }

    const auto lim = npullm::bench::measure_machine_limits(threads, 3);
    std::printf("  %zu threads: read %.1f GB/s, fp32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s\n",
                threads, lim.read_gbps, lim.fma_gflops, lim.bf16_gflops);
    std::printf("  decode moved %.1f GB/s = %.0f%% of the read bandwidth\n", per_token * tps / 1e9,
                100.0 * per_token * tps / 1e9 / lim.read_gbps);
    std::printf("  int4 decode moved %.1f GB/s = %.0f%% of the read bandwidth\n",
                int4_per_token * int4_tps / 1e9,
                100.0 * int4_per_token * int4_tps / 1e9 / lim.read_gbps);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "\ndemo failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
