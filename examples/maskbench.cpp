// npullm_maskbench: MaskBench's method (maskbench.hpp) on MaskBench files, one thread.
//
//   npullm_maskbench --vocab VOCAB.gguf [--every K] [--limit N] [--verbose] FILE|DIR...
//
//   --vocab FILE   the tokenizer (MaskBench: ../shared/vocab/ggml-vocab-llama-bpe.gguf)
//   --every K      only every K-th file of the sorted list (a deterministic sample)
//   --limit N      at most N files
//   --verbose      one line per file that does not pass (compile error, or which tests fail);
//                  then the slowest masks, the slowest compiles and the compile errors by reason
// Prints one table per split, then the total in MaskBench's form: one row per metric, the
// metric's name first, npullm's value last. TBM: one mask (compute + commit) in microseconds;
// TTFM: the schema's compile time in microseconds. A schema over 10 s counts as a timeout.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tools/cli.hpp"
#include "tools/maskbench.hpp"

namespace {

namespace fs = std::filesystem;

struct totals {
  std::size_t files = 0, passing = 0, compile_errors = 0, validation = 0, invalidation = 0,
              crashes = 0, timeouts = 0;
  std::vector<double> tbm, ttfm;
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i =
      std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}
double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (const double x : v) s += x;
  return s / static_cast<double>(v.size());
}

void print(const std::string& title, totals t) {
  std::printf("\n%s (%zu files)\n", title.c_str(), t.files);
  const std::pair<const char*, double> rows[] = {
      {"TBM avg", mean(t.tbm)},
      {"TBM p50", percentile(t.tbm, 50)},
      {"TBM p75", percentile(t.tbm, 75)},
      {"TBM p90", percentile(t.tbm, 90)},
      {"TBM p95", percentile(t.tbm, 95)},
      {"TBM p99", percentile(t.tbm, 99)},
      {"TBM p100", t.tbm.empty() ? 0 : *std::max_element(t.tbm.begin(), t.tbm.end())},
      {"TTFM avg", mean(t.ttfm)},
      {"TTFM p50", percentile(t.ttfm, 50)},
      {"TTFM p99", percentile(t.ttfm, 99)},
  };
  std::printf("| metric | npullm |\n|---|---:|\n");
  for (const auto& [name, v] : rows) std::printf("| %s | %.1f |\n", name, v);
  std::printf("| masks | %zu |\n", t.tbm.size());
  std::printf("| passing | %zu |\n", t.passing);
  std::printf("| compile error | %zu |\n", t.compile_errors);
  std::printf("| validation error | %zu |\n", t.validation);
  std::printf("| invalidation error | %zu |\n", t.invalidation);
  std::printf("| crash | %zu |\n", t.crashes);
  std::printf("| timeout (> 10 s) | %zu |\n", t.timeouts);
}

void add(totals& t, const npullm_tools::maskbench::file_result& r) {
  ++t.files;
  t.passing += r.passing();
  t.compile_errors += !r.compiled;
  t.validation += r.validation_errors;
  t.invalidation += r.invalidation_errors;
  t.timeouts += r.seconds > 10;
  t.tbm.insert(t.tbm.end(), r.tbm_us.begin(), r.tbm_us.end());
  if (r.compiled) t.ttfm.push_back(r.ttfm_us);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string vocab;
    std::size_t every = 1, limit = static_cast<std::size_t>(-1);
    bool verbose = false;
    std::vector<fs::path> inputs;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--vocab") {
        vocab = npullm_tools::cli::value(argc, argv, i);
      } else if (a == "--every") {
        every = npullm_tools::cli::integer<std::size_t>(a, npullm_tools::cli::value(argc, argv, i),
                                                        "every", 1, 1000000);
      } else if (a == "--limit") {
        limit = npullm_tools::cli::integer<std::size_t>(a, npullm_tools::cli::value(argc, argv, i),
                                                        "limit", 1, 100000000);
      } else if (a == "--verbose") {
        verbose = true;
      } else if (a == "-h" || a == "--help") {
        std::printf(
            "usage: %s --vocab VOCAB.gguf [--every K] [--limit N] [--verbose] FILE|DIR...\n",
            argv[0]);
        return 0;
      } else {
        inputs.emplace_back(a);
      }
    }
    if (vocab.empty() || inputs.empty()) {
      std::fprintf(stderr,
                   "usage: %s --vocab VOCAB.gguf [--every K] [--limit N] [--verbose] FILE|DIR...\n",
                   argv[0]);
      return 2;
    }
    std::vector<fs::path> files;
    for (const auto& in : inputs) {
      if (fs::is_directory(in)) {
        std::vector<fs::path> found;
        for (const auto& e : fs::directory_iterator(in))
          if (e.path().extension() == ".json") found.push_back(e.path());
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
      } else {
        files.push_back(in);
      }
    }
    std::vector<fs::path> chosen;
    for (std::size_t k = 0; k < files.size() && chosen.size() < limit; k += every)
      chosen.push_back(files[k]);

    const auto tok = npullm::text::tokenizer::from_gguf(vocab);
    const auto index =
        std::make_shared<const npullm::grammar::token_index>(npullm::grammar::token_index::of(tok));
    std::map<std::string, totals> splits;
    totals all;
    std::map<std::string, std::size_t> reasons;
    std::vector<std::pair<double, std::string>> slowest;         // per file: its slowest mask
    std::vector<std::pair<std::size_t, std::string>> most_slow;  // per file: masks over 500 us
    std::vector<std::pair<double, std::string>>
        slowest_compile;  // per file: compile time, refused or not
    for (const auto& f : chosen) {
      npullm_tools::maskbench::file_result r;
      try {
        r = npullm_tools::maskbench::run_file(f, tok, index);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "crash: %s: %s\n", f.string().c_str(), e.what());
        ++all.crashes;
        ++splits[npullm_tools::maskbench::split_of(f.filename().string())].crashes;
        continue;
      }
      if (!r.tbm_us.empty())
        slowest.emplace_back(*std::max_element(r.tbm_us.begin(), r.tbm_us.end()), r.name);
      most_slow.emplace_back(
          std::count_if(r.tbm_us.begin(), r.tbm_us.end(), [](double t) { return t > 500; }),
          r.name);
      slowest_compile.emplace_back(r.ttfm_us, r.compiled ? r.name : r.name + " (refused)");
      add(splits[r.split], r);
      add(all, r);
      if (!r.compiled) {
        std::string key =
            r.error.substr(r.error.find(": ") == std::string::npos ? 0 : r.error.find(": ") + 2);
        if (key.size() > 90) key.resize(90);
        ++reasons[key];
      }
      if (verbose && !r.passing()) {
        if (!r.compiled) {
          std::printf("compile error: %s: %s\n", r.name.c_str(), r.error.c_str());
        } else {
          std::printf("fail: %s: %zu validation, %zu invalidation errors of %zu tests\n",
                      r.name.c_str(), r.validation_errors, r.invalidation_errors, r.tests);
          std::printf("  %s\n", r.first_failure.c_str());
        }
      }
    }
    if (verbose) {
      std::sort(slowest.rbegin(), slowest.rend());
      std::printf("\nslowest masks (us, file):\n");
      for (std::size_t k = 0; k < slowest.size() && k < 15; ++k)
        std::printf("%10.1f  %s\n", slowest[k].first, slowest[k].second.c_str());
      std::sort(slowest_compile.rbegin(), slowest_compile.rend());
      std::printf(
          "\nslowest compiles (us, file; a refusal named so, TTFM counts only the compiled):\n");
      for (std::size_t k = 0; k < slowest_compile.size() && k < 15; ++k)
        std::printf("%10.1f  %s\n", slowest_compile[k].first, slowest_compile[k].second.c_str());
      std::sort(most_slow.rbegin(), most_slow.rend());
      std::printf("\nmost masks over 500 us (count, file):\n");
      for (std::size_t k = 0; k < most_slow.size() && k < 30 && most_slow[k].first > 0; ++k)
        std::printf("%10zu  %s\n", most_slow[k].first, most_slow[k].second.c_str());
      std::vector<std::pair<std::size_t, std::string>> top;
      for (const auto& [k, n] : reasons) top.emplace_back(n, k);
      std::sort(top.rbegin(), top.rend());
      std::printf("\ncompile errors by reason:\n");
      for (std::size_t k = 0; k < top.size() && k < 40; ++k)
        std::printf("%6zu  %s\n", top[k].first, top[k].second.c_str());
    }
    for (const auto& [name, t] : splits) print(name, t);
    print("total", all);
    return 0;
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "error: %.*s\n", static_cast<int>(e.message().size()), e.message().data());
    return 1;
  }
}
