// Tokenizer throughput: encode and decode of a long text (this project's README.md, ~50 KB of
// English prose, code and tables, repeated to 1 MiB) with the vocabularies of ../shared/vocab
// (benchmarks without their file are not registered; the binary says which).
// Names: tokenizer_<encode|decode>/<vocab>/<bytes>/threads:1; counters tokens_per_s, MBps.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

std::string long_text(std::size_t bytes) {
  std::ifstream in(fs::path(NPULLM_SOURCE_DIR) / "README.md", std::ios::binary);
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string text;
  if (readme.empty()) return text;
  while (text.size() < bytes) text += readme;
  text.resize(bytes);
  // Not cut inside a character.
  return text.substr(0, npullm::text::complete_utf8_prefix(text));
}

void encode_benchmark(benchmark::State& state, std::shared_ptr<const npullm::text::tokenizer> tok,
                      const std::string* text) {
  std::vector<std::int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    tok->encode(*text, ids, {.add_special = false});
    benchmark::DoNotOptimize(ids.data());
  }
  const auto it = static_cast<double>(state.iterations());
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(ids.size()) * it, benchmark::Counter::kIsRate);
  state.counters["MBps"] =
      benchmark::Counter(static_cast<double>(text->size()) * it / 1e6, benchmark::Counter::kIsRate);
}

void decode_benchmark(benchmark::State& state, std::shared_ptr<const npullm::text::tokenizer> tok,
                      const std::string* text) {
  const auto ids = tok->encode(*text, {.add_special = false});
  std::string out;
  for (auto _ : state) {
    out = tok->decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  if (out != *text) state.SkipWithError("decode(encode(text)) != text");
  const auto it = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(ids.size()) * it, benchmark::Counter::kIsRate);
  state.counters["MBps"] =
      benchmark::Counter(static_cast<double>(text->size()) * it / 1e6, benchmark::Counter::kIsRate);
}

void register_all() {
  static const std::string text = long_text(1 << 20);
  if (text.empty()) {
    std::fprintf(stderr, "bench_text: %s/README.md not readable: no benchmarks\n",
                 NPULLM_SOURCE_DIR);
    return;
  }
  for (const char* name : {"qwen2", "llama-bpe", "gpt-2", "llama-spm"}) {
    const fs::path file =
        fs::path(NPULLM_VOCAB_DIR) / (std::string("ggml-vocab-") + name + ".gguf");
    if (!fs::exists(file)) {
      std::fprintf(stderr, "bench_text: %s absent: its benchmarks are not registered\n",
                   file.c_str());
      continue;
    }
    auto tok =
        std::make_shared<const npullm::text::tokenizer>(npullm::text::tokenizer::from_gguf(file));
    const std::string suffix = std::string(name) + "/" + std::to_string(text.size()) + "/threads:1";
    benchmark::RegisterBenchmark(("tokenizer_encode/" + suffix).c_str(), encode_benchmark, tok,
                                 &text)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("tokenizer_decode/" + suffix).c_str(), decode_benchmark, tok,
                                 &text)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return npullm::bench::run_benchmarks(argc, argv);
}
