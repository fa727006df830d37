// npullm_bench_report --out <dir> <limits.json> <bench_x.json>...
// Writes <dir>/report.md and the gnuplot data and scripts <dir>/plots/<name>.{dat,gp}, and
// prints the name of every plot written, one per line (scripts/bench.sh renders them with
// `gnuplot plots/<name>.gp` from <dir>).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench_report.hpp"

int main(int argc, char** argv) {
  namespace br = npullm::bench_report;
  std::vector<br::fs::path> files;
  br::fs::path out = ".";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: %s --out <dir> <benchmark JSON files...>\n", argv[0]);
      return 0;
    } else {
      files.emplace_back(a);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s --out <dir> <benchmark JSON files...>\n", argv[0]);
    return 2;
  }
  try {
    // A binary that crashed leaves a truncated file: report what the others measured.
    br::run_data run;
    for (const auto& f : files) {
      try {
        br::add_json(run, br::read_text(f), f.stem().string());
        run.files.push_back(f.filename().string());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "npullm_bench_report: skipping %s: %s\n", f.c_str(), e.what());
      }
    }
    for (const auto& p : br::write_report(run, out)) std::printf("%s\n", p.name.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npullm_bench_report: %s\n", e.what());
    return 1;
  }
  return 0;
}
