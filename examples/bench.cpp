// npullm_bench: prefill and decode speed of npullm's pipeline with llama-bench's flags and
// output, so that the two engines can be run side by side on the same GGUF files
// (../shared/peer/side-by-side.sh reads the markdown table's "threads", "test" and "t/s").
//
//   npullm_bench -m model.gguf [-m hf-dir] [-p 512] [-n 128] [-d 0] [-r 5] [-t 1,2]
//                [-o md|csv|json|jsonl] [-ctk TYPE -ctv TYPE | --kv TYPE] [--packing auto|off|on]
//                [--no-limits]
//
// The tests mean what llama-bench means by them: ppP is one prefill of P random tokens in a
// fresh context (logits of the last one); tgN is N single-token decode steps from an empty
// context (logits of each); with a depth D (-d), the context first holds D random tokens,
// prefilled before each run and not timed ("tgN @ dD"). Before the timed runs of a test, one
// untimed warm-up run (the whole prompt for pp, one step for tg); then each of the r runs
// starts from an empty context (or one of depth D). t/s is the mean over the runs of tokens /
// seconds, ± the sample standard deviation; json, jsonl and csv also give the median and every
// run.
//
// The pipeline: weights in the type the files store (model::with_stored_weights; a GGUF file's
// quantized matrices zero-copy from its mapping), KV in one contiguous cache of the -ctk / -ctv
// type (f16 by default, as llama.cpp's; q8_0 and q4_0 are llama.cpp's blocks, read fused by the
// flash attention), dynamic flash attention, the host backend with a thread_pool of t threads
// (the caller's thread included). Besides llama-bench's fields, csv / json / jsonl give npullm's
// own: packing, packed_bytes, kv_bytes (the bytes of the KV cache the test ran with, as
// allocated for its longest context: what shows that -ctk / -ctv took effect), median_ts,
// npullm_isa. Every format also gives each test's figures against the machine
// (bench_roofline.hpp): the bytes a token reads and the GB/s at the measured t/s, as a % of the
// read loop; the GFLOP/s, as a % of the peak of the weights' kind; the limits measured in this
// process once per thread count, before that count's first test (--no-limits: not measured).
//
// Counts are whole numbers in their flag's range (tools/cli.hpp): -p / -n / -d 0 up to
// 999999999, -r from 1, -t 1..1024; a bad one prints the flag and the value, then the usage.
//
// The parts: bench_options.hpp (the command line), bench_report.hpp (what a model is, a test's
// statistics, the printers), bench_roofline.hpp (a test's bytes and flops, the limits); this
// file, the runs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "bench_report.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/weights.hpp"

namespace {

using namespace npullm_bench;

using clock_type = std::chrono::steady_clock;

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Bytes of a single-sequence pipeline's KV storage: its contiguous cache, or the ring that
// replaces it when every layer is windowed. What a K / V type really costs: f16 2 bytes an
// element, q8_0 34 bytes a block of 32, q4_0 18.
template <class LM>
std::size_t kv_bytes(const LM& lm) {
  if (const auto* ring = lm.ring_kv_cache()) return ring->storage_bytes();
  return lm.kv_cache().storage_bytes();
}

// Every test of one model at one thread count, through a pipeline with KV of type K.
template <class K, class W>
void run_tests(const std::shared_ptr<const model::model_weights<W>>& weights, const model_info& m,
               std::size_t threads, const machine_limits* limits, const options& o, printer& out) {
  using config = model::pipeline_config<model::contiguous_kv<K>, model::dynamic_attention<>, W>;
  const std::size_t longest =
      *std::max_element(o.depth.begin(), o.depth.end()) +
      std::max(o.prompt.empty() ? 0 : *std::max_element(o.prompt.begin(), o.prompt.end()),
               o.gen.empty() ? 0 : *std::max_element(o.gen.begin(), o.gen.end()));
  npullm::thread_pool pool(threads);
  model::causal_lm<config> lm(
      weights,
      {.max_sequence = std::max<std::size_t>(longest, 1), .pool = &pool, .packing = o.packing});
  const std::size_t vocab = lm.config().vocab_size;
  const model_work work = work_of(*weights, o.packing, lm.packed_bytes());
  std::mt19937 rng(1234);
  auto random_tokens = [&](std::size_t n) {
    std::vector<std::int32_t> ids(n);
    for (auto& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
    return ids;
  };
  // The context a run starts from: empty, or `depth` random tokens (prefilled, not timed).
  auto start = [&](std::size_t depth) {
    lm.reset();
    if (depth > 0) (void)lm.prefill(random_tokens(depth));
  };
  auto measure = [&](result r, auto&& warm_up, auto&& run) {
    r.model = &m;
    r.threads = threads;
    r.time = utc_now();
    r.packed_bytes = lm.packed_bytes();
    r.kv_bytes = kv_bytes(lm);
    r.work = work_of_test(work, r.n_prompt, r.n_gen, r.n_depth, o);
    r.peak_kind = work.peak;
    r.limits = limits;
    start(r.n_depth);
    warm_up();
    const double tokens = static_cast<double>(r.n_prompt + r.n_gen);
    for (std::size_t i = 0; i < o.reps; ++i) {
      start(r.n_depth);
      const auto seconds = run();
      r.ns.push_back(static_cast<std::uint64_t>(seconds * 1e9));
      r.ts.push_back(tokens / seconds);
    }
    out.row(r);
  };
  for (const std::size_t d : o.depth) {
    for (const std::size_t p : o.prompt) {
      measure(
          result{.n_prompt = p, .n_depth = d}, [&] { (void)lm.prefill(random_tokens(p)); },
          [&] {
            const auto ids = random_tokens(p);
            const auto t0 = clock_type::now();
            (void)lm.prefill(ids);
            return std::chrono::duration<double>(clock_type::now() - t0).count();
          });
    }
    for (const std::size_t n : o.gen) {
      measure(
          result{.n_gen = n, .n_depth = d}, [&] { (void)lm.decode(random_tokens(1)); },
          [&] {
            const auto ids = random_tokens(n);  // drawn before the clock starts
            const auto t0 = clock_type::now();
            for (std::size_t i = 0; i < n; ++i) (void)lm.decode(std::span(ids).subspan(i, 1));
            return std::chrono::duration<double>(clock_type::now() - t0).count();
          });
    }
  }
}

void run_model(const std::string& path, const options& o, printer& out) {
  if (!fs::exists(path)) {
    npullm::raise(npullm::error_code::io, "model ", path, ": no such file or directory");
  }
  model::with_stored_weights(path, [&](auto weights) {
    const model_info m = describe(path, *weights);
    for (const std::size_t t : o.threads) {
      // Measured once per thread count in this process (or read from NPULLM_BENCH_LIMITS, as
      // `make bench` hands them), while no pipeline runs.
      const machine_limits* l = o.limits ? &npullm::bench::limits_for(t) : nullptr;
      const std::string& k = o.type_k;  // == o.type_v, or q8_0 / q4_0 (parse_args)
      if (k != o.type_v) {
        run_tests<npullm::kv::mixed<npullm::kv::q8_0, npullm::kv::q4_0>>(weights, m, t, l, o, out);
      } else if (k == "f32") {
        run_tests<float>(weights, m, t, l, o, out);
      } else if (k == "f16") {
        run_tests<npullm::float16>(weights, m, t, l, o, out);
      } else if (k == "bf16") {
        run_tests<npullm::bfloat16>(weights, m, t, l, o, out);
      } else if (k == "q8_0") {
        run_tests<npullm::kv::q8_0>(weights, m, t, l, o, out);
      } else {
        run_tests<npullm::kv::q4_0>(weights, m, t, l, o, out);
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse_args(argc, argv);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "npullm_bench: %.*s\n\n%s", static_cast<int>(e.message().size()),
                 e.message().data(), usage_text);
    return 1;
  }
  printer out(o);
  out.header();
  for (const std::string& m : o.models) {
    try {
      run_model(m, o, out);
    } catch (const npullm::error& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "npullm_bench: %s: %s\n", m.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "npullm_bench: %s: %s\n", m.c_str(), e.what());
      return 1;
    }
  }
  out.footer();
  return 0;
}
