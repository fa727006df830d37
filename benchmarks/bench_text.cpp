// Tokenizer throughput: encode and decode of a long text (this project's README.md and the
// docs/ pages in name order, ~100 KB of English prose, code and tables, repeated to 1 MiB; the
// README alone was that text until it moved to docs/) with the vocabularies of ../shared/vocab
// (benchmarks without their file are not registered; the binary says which).
// Names: tokenizer_<encode|decode>/<vocab>/<bytes>/threads:1; counters tokens_per_s, MBps.
//
// Chat template rendering (text/jinja.hpp): the Qwen3 template (Qwen2's vocabulary GGUF carries
// it) parsed once, then a conversation rendered per iteration: a system prompt and N turns
// (user / assistant alternating, the last a user's, one assistant answer with a <think> block).
// chat_render/qwen3/turns:N/<vars|messages>: `vars` renders prebuilt variables
// (template_program::render), `messages` goes through chat_template::apply from chat_message
// values (building the JSON each time, as an application does). Counter us_per_render: the
// median of the iterations (the target: <= 50 us for 10 turns).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bench_util.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

std::string long_text(std::size_t bytes) {
  std::vector<fs::path> files{fs::path(NPULLM_SOURCE_DIR) / "README.md"};
  std::vector<fs::path> docs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(NPULLM_SOURCE_DIR) / "docs", ec))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  std::sort(docs.begin(), docs.end());
  files.insert(files.end(), docs.begin(), docs.end());
  std::string readme;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    readme.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
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

std::vector<npullm::text::chat_message> chat_turns(int turns) {
  std::vector<npullm::text::chat_message> m = {
      {"system", "You are a helpful assistant. Answer briefly and precisely."}};
  for (int k = 0; k < turns; ++k) {
    if (k % 2 == 0) {
      m.push_back({"user", "Question " + std::to_string(k / 2 + 1) +
                               ": what is the capital of France, and why is it there?"});
    } else if (k == 1) {
      m.push_back({"assistant",
                   "<think>\nThe user asks about Paris; recall its history.\n</think>\n\nParis: "
                   "it grew on an island of the Seine."});
    } else {
      m.push_back({"assistant", "Paris, on the Seine, since the Middle Ages."});
    }
  }
  return m;
}

void chat_render_benchmark(benchmark::State& state,
                           std::shared_ptr<const npullm::text::chat_template> tmpl,
                           std::shared_ptr<const npullm::text::jinja::template_program> program,
                           int turns, bool prebuilt) {
  const auto messages = chat_turns(turns);
  npullm::text::jinja::json vars = npullm::text::jinja::json::object();
  vars["messages"] = npullm::text::jinja::json::array();
  for (const auto& m : messages) vars["messages"].push_back(m.to_json());
  vars["add_generation_prompt"] = true;
  vars["bos_token"] = "";
  vars["eos_token"] = "<|im_end|>";
  std::string text;
  const double seconds = npullm::bench::timed_loop(state, [&] {
    text = prebuilt ? program->render(vars) : tmpl->apply(messages, true);
    benchmark::DoNotOptimize(text.data());
  });
  if (text.find("<|im_start|>assistant\n") == std::string::npos)
    state.SkipWithError("no generation prompt in the text");
  state.counters["us_per_render"] = seconds * 1e6;
  state.counters["bytes"] = static_cast<double>(text.size());
}

void register_all() {
  const fs::path qwen2 = fs::path(NPULLM_VOCAB_DIR) / "ggml-vocab-qwen2.gguf";
  if (fs::exists(qwen2)) {
    const auto vocab = npullm::text::vocabulary::from_gguf(qwen2);
    auto tmpl = std::make_shared<const npullm::text::chat_template>(
        npullm::text::chat_template::from_vocabulary(vocab));
    auto program = std::make_shared<const npullm::text::jinja::template_program>(
        npullm::text::jinja::template_program::parse(vocab.chat_template.value_or("")));
    for (const int turns : {10, 40}) {
      for (const bool prebuilt : {true, false}) {
        benchmark::RegisterBenchmark(("chat_render/qwen3/turns:" + std::to_string(turns) +
                                      (prebuilt ? "/vars" : "/messages"))
                                         .c_str(),
                                     chat_render_benchmark, tmpl, program, turns, prebuilt)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  } else {
    std::fprintf(stderr, "bench_text: %s absent: chat_render is not registered\n", qwen2.c_str());
  }
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
