// Token masks of one compiled grammar shared by several sequences (issue 57, "masks in
// parallel"): 8 token_matchers on one token_grammar (a JSON Schema over Llama 3's vocabulary,
// ../shared/vocab/ggml-vocab-llama-bpe.gguf; not registered, saying so, without it), each
// replaying the tokens of one valid instance (a mask, then the token accepted), split over T
// threads. The automaton is warmed first (one replay), so every run walks the same states.
//
// grammar_masks/<cache>/threads:T: masks/s with T threads. `walk`: no mask cache (every mask
// walks the trie: the work that one lock per grammar used to serialize); `cached`: the default
// budget (16 MiB), where states met again copy their mask.
// grammar_masks_ratio/<cache>: each iteration runs the 8 matchers on 1 thread, then on 2, and
// reports masks_per_s_1t, masks_per_s_2t and ratio_2t_1t (the issue's target: >= 1.8 for the
// walk) from the medians of the same run, so that the load of a shared machine weighs on both.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/grammar/token_matcher.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
namespace g = npullm::grammar;

constexpr const char* schema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0},
    "name": {"type": "string", "maxLength": 64},
    "email": {"type": "string"},
    "role": {"enum": ["admin", "editor", "viewer"]},
    "active": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "address": {
      "type": "object",
      "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
      },
      "required": ["street", "city", "zip"], "additionalProperties": false
    },
    "scores": {"type": "array", "items": {"type": "number"}}
  },
  "required": ["id", "name", "email", "role", "active", "tags", "address", "scores"],
  "additionalProperties": false
})";
constexpr const char* instance =
    R"({"id": 4211, "name": "Jos\u00e9 Ram\u00edrez de la Fuente", "email": "jose.ramirez@example.org", )"
    R"("role": "editor", "active": true, "tags": ["backend", "on-call", "grammar", "C++20"], )"
    R"("address": {"street": "1200 Market Street, Suite 400", "city": "San Francisco", )"
    R"("zip": "94103"}, "scores": [0.75, 12.5, -3.0e2, 1024]})";

constexpr int sequences = 8;

struct setup {
  std::shared_ptr<g::token_grammar> grammar;
  std::vector<std::int32_t> ids;
};

// A persistent second thread (as a server's decode threads are): a thread made per run
// starts on its maker's core and, on a loaded machine, waits there for the balancer for much
// of a 25 ms run.
class helper {
 public:
  helper() : thread_([this] { loop(); }) {}
  helper(const helper&) = delete;
  helper& operator=(const helper&) = delete;
  ~helper() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> job) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
    }
    wake_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return !job_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return job_ || stop_; });
      if (!job_) return;
      lock.unlock();
      job_();
      lock.lock();
      job_ = nullptr;
      done_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  bool stop_ = false;
  std::thread thread_;
};

// The 8 sequences on 1 thread or 2 (this one and the helper); returns masks computed.
std::size_t replay(const setup& s, std::size_t threads, helper* second = nullptr) {
  auto one = [&s](int first, int step) {
    std::vector<std::uint64_t> mask(s.grammar->words());
    for (int q = first; q < sequences; q += step) {
      g::token_matcher m(s.grammar);
      for (const std::int32_t id : s.ids) {
        m.fill_mask(mask);
        if (!g::mask_test(mask, id)) std::abort();  // the instance is valid: never
        m.accept(id);
      }
      m.fill_mask(mask);
      benchmark::DoNotOptimize(mask.data());
    }
  };
  if (threads == 2 && second != nullptr) {
    second->start([&] { one(1, 2); });
    one(0, 2);
    second->wait();
  } else {
    one(0, 1);
  }
  return static_cast<std::size_t>(sequences) * (s.ids.size() + 1);
}

void masks_benchmark(benchmark::State& state, const setup* s, std::size_t threads) {
  helper second;
  std::size_t masks = 0;
  for (auto _ : state) masks += replay(*s, threads, &second);
  state.counters["masks_per_s"] =
      benchmark::Counter(static_cast<double>(masks), benchmark::Counter::kIsRate);
  state.counters["states"] = static_cast<double>(s->grammar->state_count());
}

// The process's CPU time (all threads), seconds.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Besides the wall-clock ratio, what a loaded machine cannot hide: parallelism_2t, the CPU
// seconds of the 2-thread run over its wall seconds (above 1 only if the threads ran at once:
// a grammar-wide lock keeps it at 1 or below), and cpu_2t_1t, the CPU per mask on 2 threads
// over 1 (1 when sharing costs nothing: no lock waits, no cache lines bouncing).
void ratio_benchmark(benchmark::State& state, const setup* s) {
  using clock = std::chrono::steady_clock;
  std::vector<double> t1, t2, c1, c2, par;
  std::size_t masks = 0;
  helper second;
  for (auto _ : state) {
    const auto a = clock::now();
    const double ca = cpu_seconds();
    masks = replay(*s, 1);
    const auto b = clock::now();
    const double cb = cpu_seconds();
    replay(*s, 2, &second);
    const auto c = clock::now();
    const double cc = cpu_seconds();
    t1.push_back(std::chrono::duration<double>(b - a).count());
    t2.push_back(std::chrono::duration<double>(c - b).count());
    c1.push_back(cb - ca);
    c2.push_back(cc - cb);
    par.push_back((cc - cb) / t2.back());
  }
  const double m1 = npullm::bench::median(t1), m2 = npullm::bench::median(t2);
  state.counters["masks_per_s_1t"] = static_cast<double>(masks) / m1;
  state.counters["masks_per_s_2t"] = static_cast<double>(masks) / m2;
  state.counters["ratio_2t_1t"] = m1 / m2;
  state.counters["cpu_2t_1t"] = npullm::bench::median(c2) / npullm::bench::median(c1);
  state.counters["parallelism_2t"] = npullm::bench::median(par);
  state.counters["masks"] = static_cast<double>(masks);
}

void register_all() {
  const fs::path file = fs::path(NPULLM_VOCAB_DIR) / "ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(file)) {
    std::fprintf(stderr, "bench_grammar: %s absent: no benchmarks registered\n", file.c_str());
    return;
  }
  const auto tok = npullm::text::tokenizer::from_gguf(file);
  const auto index = std::make_shared<const g::token_index>(g::token_index::of(tok));
  const auto ids = tok.encode(instance, {.add_special = false});
  for (const bool cached : {false, true}) {
    auto* s = new setup{std::make_shared<g::token_grammar>(
                            g::json_schema_grammar(schema), index,
                            g::grammar_memory{.mask_bytes = cached ? std::size_t{16} << 20 : 0}),
                        ids};  // lives as long as the benchmarks
    replay(*s, 1);             // warm: the automaton's states and rows, the loop masks
    const std::string name = cached ? "cached" : "walk";
    for (const std::size_t t : {1, 2})
      benchmark::RegisterBenchmark(
          ("grammar_masks/" + name + "/threads:" + std::to_string(t)).c_str(), masks_benchmark, s,
          t)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    benchmark::RegisterBenchmark(("grammar_masks_ratio/" + name).c_str(), ratio_benchmark, s)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
