// The report generator of `make bench` (benchmarks/report/bench_report.hpp) on a small recorded
// run: fixture/*.json are rows of a real `make bench QUICK=1` run on a 2-core AMD EPYC (limits
// measured by bench_core in that run; a native build, AVX-512 BF16: its npullm_isa and
// npullm_build_isa context keys, which that run predates, were added by hand). Expected figures
// are worked out from those numbers here.
// gnuplot is not needed; where it is installed, the scripts are also rendered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_report.hpp"

namespace {

namespace br = npullm::bench_report;
namespace fs = std::filesystem;

const fs::path fixture = NPULLM_BENCH_REPORT_FIXTURE_DIR;

// The files in the order scripts/bench.sh passes them: the limits, then the binaries.
br::run_data load_fixture() {
  return br::load({fixture / "limits.json", fixture / "bench_kv.json",
                   fixture / "bench_attention.json", fixture / "bench_pyramid.json",
                   fixture / "bench_ops.json", fixture / "bench_generate.json"});
}

const br::result& find(const br::run_data& run, const std::string& name) {
  for (const auto& r : run.results) {
    if (r.name == name) return r;
  }
  throw std::runtime_error("no result " + name);
}

// A gnuplot data file as blocks (separated by blank lines) of rows of fields; comments dropped.
std::vector<std::vector<std::vector<std::string>>> read_blocks(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::vector<std::vector<std::string>>> blocks(1);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) {
      if (!blocks.back().empty()) blocks.emplace_back();
      continue;
    }
    if (line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    blocks.back().push_back(row);
  }
  if (blocks.back().empty()) blocks.pop_back();
  return blocks;
}

// The comment line heading each block of a data file.
std::vector<std::string> block_comments(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '#') out.push_back(line);
  }
  return out;
}

std::string read_all(const fs::path& f) {
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class temp_dir {
 public:
  explicit temp_dir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              ("npullm_bench_report_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(BenchReport, NamesSplitIntoPrimitiveSettingsAndThreads) {
  br::result r;
  br::parse_name("attention_decode/h14x2/d64/kv1024/f16/contiguous/cold/threads:2/min_time:0.200",
                 r);
  EXPECT_EQ(r.primitive, "attention_decode");
  EXPECT_EQ(r.name, "attention_decode/h14x2/d64/kv1024/f16/contiguous/cold/threads:2");
  EXPECT_EQ(r.settings_text(), "h14x2/d64/kv1024/f16/contiguous/cold");
  EXPECT_EQ(r.threads, 2u);
  EXPECT_EQ(r.number_after("kv"), 1024.0);
  EXPECT_EQ(r.number_after("d"), 64.0);
  EXPECT_FALSE(r.number_after("h").has_value());  // h14x2 is not a number after "h"

  br::parse_name("kv_fork/blocks10000/bs16/threads:1/manual_time", r);
  EXPECT_EQ(r.name, "kv_fork/blocks10000/bs16/threads:1");
  EXPECT_EQ(r.threads, 1u);
  br::parse_name("kv_metadata/bs16/iterations:1", r);
  EXPECT_EQ(r.name, "kv_metadata/bs16");
  EXPECT_EQ(r.threads, 1u);  // no threads:<n>: one
  EXPECT_EQ(r.settings_text(), "bs16");
}

TEST(BenchReport, NumbersAndTimesReadable) {
  EXPECT_EQ(br::format_number(0), "0");
  EXPECT_EQ(br::format_number(0.06842690247973046), "0.0684");
  EXPECT_EQ(br::format_number(2.075067469379282), "2.08");
  EXPECT_EQ(br::format_number(37.947420044793276), "37.9");
  EXPECT_EQ(br::format_number(123.24235740132964), "123");
  EXPECT_EQ(br::format_number(15.0), "15");  // integral: no decimals
  EXPECT_EQ(br::format_number(63764.16766476918), "63764");
  EXPECT_EQ(br::format_number(208000.0), "208k");
  EXPECT_EQ(br::format_number(318820838.3238459), "319M");
  EXPECT_EQ(br::format_number(2.5e10), "25G");
  EXPECT_EQ(br::format_time(15682.789199999508, "ns"), "15.7 µs");
  EXPECT_EQ(br::format_time(485.26050491712397, "us"), "485 µs");
  EXPECT_EQ(br::format_time(64725.52728571048, "us"), "64.7 ms");
  EXPECT_EQ(br::format_time(10132.425956000588, "ms"), "10.1 s");
  EXPECT_EQ(br::format_time(0.5, "ns"), "0.5 ns");
}

TEST(BenchReport, LoadsRowsLimitsAndContext) {
  const auto run = load_fixture();
  EXPECT_EQ(run.files.size(), 6u);
  // 2 limits + 2 kv + 5 attention + 4 pyramid + 3 linear + 3 generate
  EXPECT_EQ(run.results.size(), 19u);
  ASSERT_EQ(run.machine.size(), 2u);
  const auto* one = run.limits_at(1);
  const auto* two = run.limits_at(2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  EXPECT_DOUBLE_EQ(one->read_gbps, 28.331195423279862);
  EXPECT_DOUBLE_EQ(two->read_gbps, 17.650525965843315);
  EXPECT_DOUBLE_EQ(two->fma_gflops, 145.19513290033802);
  EXPECT_DOUBLE_EQ(two->bf16_gflops, 210.97047862347804);
  EXPECT_EQ(run.context.value("npullm_mode", ""), "quick");
  EXPECT_EQ(run.loads.size(), 6u);
  EXPECT_EQ(run.isa_of.size(), 6u);  // every file's ISA, by binary
  EXPECT_EQ(run.isa_of.at("limits"), "avx512-bf16");
  EXPECT_EQ(run.isa_of.at("bench_ops"), "avx512-bf16");

  const auto& hot = find(run, "attention_decode/h14x2/d64/kv4096/f16/contiguous/hot/threads:2");
  EXPECT_EQ(hot.binary, "bench_attention");
  EXPECT_EQ(hot.time_unit, "us");
  EXPECT_DOUBLE_EQ(*hot.counter("x_naive"), 2.075067469379282);
  EXPECT_FALSE(hot.counter("threads").has_value());  // Google Benchmark's fields are not counters

  const std::vector<std::string> prims = run.primitives();
  const std::vector<std::string> expected = {"kv_fork",          "kv_metadata", "attention_decode",
                                             "attention_prefill", "pyramid_decode", "linear",
                                             "generate"};
  EXPECT_EQ(prims, expected);  // in run order, machine_limits left out
}

TEST(BenchReport, JudgesEachFigureAgainstItsLimit) {
  const auto run = load_fixture();
  const double read2 = 17.650525965843315, fma2 = 145.19513290033802, bf16_2 = 210.97047862347804;

  // Decode attention reports GB/s and GFLOP/s: the roofline, i.e. the larger fraction.
  auto j = br::judge(find(run, "attention_decode/h14x2/d64/kv4096/f16/contiguous/hot/threads:2"),
                     run);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->limit, "roofline");
  EXPECT_NEAR(j->pct, 100 * std::max(6.697919228373868 / read2, 46.88543459861708 / fma2), 1e-9);
  EXPECT_NEAR(j->pct, 37.947420044793276, 1e-6);  // the benchmark's own pct_roofline agrees

  // Memory-bound GEMV: read bandwidth (from cache it can pass 100 %).
  j = br::judge(find(run, "linear/m1/k896/n4864/bf16/cold/threads:2"), run);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->limit, "read bw");
  EXPECT_NEAR(j->pct, 100 * 21.752924294039108 / read2, 1e-9);

  // Compute-bound GEMM: the bf16 dot peak for bf16 weights, the fp32 FMA peak otherwise.
  j = br::judge(find(run, "linear/m512/k896/n4864/bf16/threads:2"), run);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->limit, "bf16 peak");
  EXPECT_NEAR(j->pct, 100 * 126.11515367264218 / bf16_2, 1e-9);
  j = br::judge(find(run, "linear/m512/k896/n4864/f32/threads:2"), run);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->limit, "fp32 peak");
  EXPECT_NEAR(j->pct, 100 * 69.49219983542015 / fma2, 1e-9);

  // No throughput counters: nothing to judge.
  EXPECT_FALSE(br::judge(find(run, "pyramid_decode/c4096/fill25/threads:2"), run));
  EXPECT_FALSE(br::judge(find(run, "kv_fork/blocks10000/bs16/threads:1"), run));
}

TEST(BenchReport, PlacesKernelsOnTheRoofline) {
  const auto run = load_fixture();
  // Decode attention: its own flops over its own bytes (3584 kv flops over 512 kv bytes).
  auto p = br::place(find(run, "attention_decode/h14x2/d64/kv1024/f16/contiguous/cold/threads:2"));
  ASSERT_TRUE(p);
  EXPECT_NEAR(p->intensity, 7.0, 1e-9);
  EXPECT_NEAR(p->gflops, 33.53358369196751, 1e-9);

  // GEMM 512x896 by 896x4864 bf16: 2 M N K flops over W (bf16) + x + y (f32).
  p = br::place(find(run, "linear/m512/k896/n4864/bf16/threads:2"));
  ASSERT_TRUE(p);
  const double flops = 2.0 * 512 * 4864 * 896;
  const double bytes = 4864.0 * 896 * 2 + 4.0 * 512 * 896 + 4.0 * 512 * 4864;
  EXPECT_NEAR(p->intensity, flops / bytes, 1e-9);
  EXPECT_NEAR(p->gflops, 126.11515367264218, 1e-9);

  // GEMV reports GB/s of W only; with bf16 W and M = 1, flops equal W's bytes.
  p = br::place(find(run, "linear/m1/k896/n4864/bf16/cold/threads:2"));
  ASSERT_TRUE(p);
  EXPECT_NEAR(p->intensity, 2.0 * 4864 * 896 / (4864.0 * 896 * 2 + 4 * 896 + 4 * 4864), 1e-12);
  EXPECT_NEAR(p->gflops, 21.752924294039108, 1e-9);

  // Causal 512 x 512 prefill, 14 query / 2 KV heads of 64: 512 * 513 / 2 pairs.
  p = br::place(find(run, "attention_prefill/h14x2/d64/causal512x512/threads:2"));
  ASSERT_TRUE(p);
  const double pf = 4.0 * 64 * 14 * (512.0 * 513 / 2);
  const double pb = 2.0 * 4 * 14 * 512 * 64 + 2.0 * 4 * 2 * 512 * 64;
  EXPECT_NEAR(p->intensity, pf / pb, 1e-9);

  EXPECT_FALSE(br::place(find(run, "generate/qwen2-0.5b/bf16/batch4/threads:2")));
}

TEST(BenchReport, MarkdownHasMachineLimitsAndATablePerPrimitive) {
  const auto run = load_fixture();
  const std::string md = br::markdown(run, br::plots(run));
  auto has = [&](const std::string& s) {
    EXPECT_NE(md.find(s), std::string::npos) << "missing: " << s << "\n---\n" << md;
  };
  has("quick mode (`make bench QUICK=1`)");
  has("| CPU | AMD EPYC |");
  has("| caches | L1d 32 KiB, L2 1 MiB, L3 32 MiB (shared by 2) |");
  // The ISA the kernels and the limits were built for, and how it was chosen.
  has("| ISA | avx512-bf16 (NPULLM_ISA=native, -march=native) |\n");
  has("every thread running at once, with code built for the same ISA as the benchmarks, "
      "avx512-bf16); every benchmark of the run divides by these.");
  has("| load average (1 min) as each binary started | 4.54 to 5.39 (the benchmarks' own threads "
      "too) |");
  // Limits: read, triad, fp32, bf16, and the ridge points fp32 / read, bf16 / read.
  has("| 1 | 28.3 | 25.2 | 118 | 235 | 4.16 | 8.28 |");
  has("| 2 | 17.7 | 19.4 | 145 | 211 | 8.23 | 12.0 |");
  // One table per primitive, with the columns its counters call for.
  has("### attention_decode\n\nFrom `bench_attention`.\n\n"
      "| settings | threads | time | GB/s | GFLOP/s | % of limit | limit | × naive |");
  has("| `h14x2/d64/kv4096/f16/contiguous/hot` | 2 | 485 µs | 6.70 | 46.9 | 37.9 | roofline | "
      "2.08 |");
  has("| `h14x2/d64/kv1024/f16/contiguous/cold` | 2 | 170 µs | 4.79 | 33.5 | 27.1 | roofline | - "
      "|");
  has("| `m1/k896/n4864/bf16/cold` | 2 | 611 µs | 21.8 | - | 123 | read bw | - |");
  has("| `m512/k896/n4864/bf16` | 2 | 35.0 ms | - | 126 | 59.8 | bf16 peak | 2.33 |");
  has("| `m512/k896/n4864/f32` | 2 | 64.7 ms | - | 69.5 | 47.9 | fp32 peak | 1.28 |");
  has("| `h14x2/d64/causal512x512` | 2 | 10.9 ms | 41.8 | 28.8 | fp32 peak | 10.9 |");
  // Primitives without GB/s or GFLOP/s show their own counters.
  has("| settings | threads | time | full_us | pyramid_us | ratio | variant |");
  has("| `c4096/fill25` | 2 | 133 µs | 283 | 87.3 | 0.309 | 4 |");
  has("| `qwen2-0.5b/bf16/batch16` | 2 | 62.3 s | 32.9 | 2.58 |");
  has("| `blocks10000/bs16` | 1 | 15.7 µs | 319M | 63764 |");
  // Summary: the median and the best fraction of its limit per primitive (47.9, 59.8, 123).
  has("| linear | 3 | 59.8 % | 123 % of read bw | `m1/k896/n4864/bf16/cold` (2 threads) | 2.33 | "
      "0 |");
  has("| pyramid_decode | 4 | - | - | - | - | 0 |");
  // The plots, embedded.
  has("![Roofline: every kernel against the measured limits](roofline.png)");
  has("(decode_kv.png)");
  has("(pyramid.png)");
  has("(generate.png)");
  EXPECT_EQ(md.find("### machine_limits"), std::string::npos);  // limits have their own section
}

TEST(BenchReport, WritesReportAndPlotData) {
  const auto run = load_fixture();
  temp_dir dir("write");
  const auto written = br::write_report(run, dir.path());
  std::vector<std::string> names;
  for (const auto& p : written) names.push_back(p.name);
  const std::vector<std::string> expected = {"roofline", "decode_kv", "pyramid", "generate"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(read_all(dir.path() / "report.md"), br::markdown(run, written));
  for (const auto& n : names) {
    const std::string gp = read_all(dir.path() / "plots" / (n + ".gp"));
    EXPECT_NE(gp.find("set terminal pngcairo"), std::string::npos) << n;
    EXPECT_NE(gp.find("set output '" + n + ".png'"), std::string::npos) << n;
    EXPECT_NE(gp.find("'plots/" + n + ".dat'"), std::string::npos) << n;
    EXPECT_NE(gp.find("set xlabel"), std::string::npos) << n;
    EXPECT_NE(gp.find("set ylabel"), std::string::npos) << n;
  }

  // Roofline: one panel (2 threads), a block per primitive (cold and hot apart), the roofs.
  const auto roof = read_blocks(dir.path() / "plots" / "roofline.dat");
  const auto roof_titles = block_comments(dir.path() / "plots" / "roofline.dat");
  ASSERT_EQ(roof.size(), 5u);
  ASSERT_EQ(roof_titles.size(), 5u);
  EXPECT_NE(roof_titles[0].find("threads 2 attention_decode (cold)"), std::string::npos);
  EXPECT_NE(roof_titles[1].find("threads 2 attention_decode (hot)"), std::string::npos);
  EXPECT_NE(roof_titles[2].find("threads 2 attention_prefill:"), std::string::npos);
  EXPECT_NE(roof_titles[3].find("threads 2 linear:"), std::string::npos);
  EXPECT_NE(roof_titles[4].find("threads 2 linear (cold)"), std::string::npos);
  EXPECT_EQ(roof[0].size(), 3u);  // three cold decode rows
  EXPECT_NEAR(std::stod(roof[0][0][0]), 7.0, 1e-6);
  EXPECT_NEAR(std::stod(roof[0][0][1]), 33.5335837, 1e-6);
  EXPECT_EQ(roof[0][0][2], "h14x2/d64/kv1024/f16/contiguous/cold");
  ASSERT_EQ(roof[3].size(), 2u);  // the two GEMMs
  const double gemm_ai = 2.0 * 512 * 4864 * 896 / (4864.0 * 896 * 2 + 4.0 * 512 * 896 +
                                                   4.0 * 512 * 4864);
  EXPECT_NEAR(std::stod(roof[3][1][0]), gemm_ai, 1e-5);
  EXPECT_NEAR(std::stod(roof[3][1][1]), 126.115154, 1e-5);
  EXPECT_EQ(roof[3][1][2], "m512/k896/n4864/bf16");
  const std::string roof_gp = read_all(dir.path() / "plots" / "roofline.gp");
  EXPECT_NE(roof_gp.find("roof(x, 17.650526, 145.195133)"), std::string::npos) << roof_gp;
  EXPECT_NE(roof_gp.find("roof(x, 17.650526, 210.970479)"), std::string::npos) << roof_gp;
  EXPECT_NE(roof_gp.find("set logscale xy"), std::string::npos);

  // Decode attention vs KV length: contiguous cold (1024, 4096), block16 cold, contiguous hot.
  const auto kv = read_blocks(dir.path() / "plots" / "decode_kv.dat");
  const auto kv_titles = block_comments(dir.path() / "plots" / "decode_kv.dat");
  ASSERT_EQ(kv.size(), 3u);
  EXPECT_NE(kv_titles[0].find("block16, cold"), std::string::npos);
  EXPECT_NE(kv_titles[1].find("contiguous, cold"), std::string::npos);
  EXPECT_NE(kv_titles[2].find("contiguous, hot"), std::string::npos);
  ASSERT_EQ(kv[1].size(), 2u);
  EXPECT_EQ(kv[1][0][0], "1024");
  EXPECT_NEAR(std::stod(kv[1][0][1]), 4.79051196, 1e-6);
  EXPECT_EQ(kv[1][1][0], "4096");
  EXPECT_NEAR(std::stod(kv[1][1][1]), 5.55522238, 1e-6);
  EXPECT_NE(kv_titles[0].find("threads 2 h14x2/d64"), std::string::npos);
  EXPECT_NE(read_all(dir.path() / "plots" / "decode_kv.gp").find("17.650526 w l dt 2"),
            std::string::npos);  // the read bandwidth line

  // Pyramid: past = fill% of C - 256 = 3840; the variant's past capacity is its index x 256.
  const auto py = read_blocks(dir.path() / "plots" / "pyramid.dat");
  ASSERT_EQ(py.size(), 1u);
  ASSERT_EQ(py[0].size(), 4u);
  const char* pasts[] = {"192", "960", "1920", "3840"};
  const char* capacities[] = {"256", "1024", "2048", "3840"};
  const char* pyramid_us[] = {"19.639", "87.289", "160.238", "283.05"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(py[0][i][0], pasts[i]);
    EXPECT_EQ(py[0][i][1], pyramid_us[i]);
    EXPECT_EQ(py[0][i][3], capacities[i]);
  }
  EXPECT_EQ(py[0][0][2], "287.007");  // the full static variant at the same step

  // Generation: tokens/s against batch size.
  const auto gen = read_blocks(dir.path() / "plots" / "generate.dat");
  ASSERT_EQ(gen.size(), 1u);
  ASSERT_EQ(gen[0].size(), 3u);
  EXPECT_EQ(gen[0][0][0], "1");
  EXPECT_EQ(gen[0][1][0], "4");
  EXPECT_EQ(gen[0][2][0], "16");
  EXPECT_NEAR(std::stod(gen[0][2][1]), 32.8907288, 1e-6);

  // Where gnuplot is installed (make bench installs it; make test does not), the scripts draw.
  if (std::system("command -v gnuplot > /dev/null 2>&1") == 0) {
    for (const auto& n : names) {
      const std::string cmd =
          "cd '" + dir.path().string() + "' && gnuplot plots/" + n + ".gp 2> gnuplot_" + n + ".log";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << read_all(dir.path() / ("gnuplot_" + n + ".log"));
      EXPECT_TRUE(read_all(dir.path() / ("gnuplot_" + n + ".log")).empty()) << n;
      ASSERT_TRUE(fs::exists(dir.path() / (n + ".png"))) << n;
      EXPECT_GT(fs::file_size(dir.path() / (n + ".png")), 10000u) << n;
    }
  }
}

TEST(BenchReport, FailedRowsAggregatesAndRunsWithoutLimits) {
  br::run_data run;
  br::add_json(run, R"({
    "context": {"num_cpus": 4, "npullm_other_cpu_pct": "35"},
    "benchmarks": [
      {"name": "linear/m1/k8/n8/f32/threads:4", "run_name": "linear/m1/k8/n8/f32/threads:4",
       "run_type": "iteration", "real_time": 1.0, "time_unit": "us",
       "error_occurred": true, "error_message": "out of memory"},
      {"name": "linear/m8/k8/n8/f32/threads:4/repeats:3", "run_type": "iteration",
       "run_name": "linear/m8/k8/n8/f32/threads:4/repeats:3", "real_time": 9.0, "time_unit": "us",
       "GBps": 1.0, "pct_bw": 5.0},
      {"name": "linear/m8/k8/n8/f32/threads:4/repeats:3_median", "run_type": "aggregate",
       "aggregate_name": "median", "run_name": "linear/m8/k8/n8/f32/threads:4/repeats:3",
       "real_time": 2.0, "time_unit": "us", "GBps": 3.0, "pct_bw": 12.5},
      {"name": "linear/m8/k8/n8/f32/threads:4/repeats:3_mean", "run_type": "aggregate",
       "aggregate_name": "mean", "run_name": "linear/m8/k8/n8/f32/threads:4/repeats:3",
       "real_time": 5.0, "time_unit": "us", "GBps": 2.0, "pct_bw": 8.0}
    ]})",
               "bench_x");
  ASSERT_EQ(run.results.size(), 2u);
  EXPECT_EQ(run.results[0].error, "out of memory");
  EXPECT_FALSE(br::place(run.results[0]));
  // The median stands for the repetitions.
  EXPECT_EQ(run.results[1].name, "linear/m8/k8/n8/f32/threads:4");
  EXPECT_DOUBLE_EQ(*run.results[1].counter("GBps"), 3.0);
  // No limits in this run: the benchmark's own percentage.
  const auto j = br::judge(run.results[1], run);
  ASSERT_TRUE(j);
  EXPECT_DOUBLE_EQ(j->pct, 12.5);
  const std::string md = br::markdown(run);
  EXPECT_NE(md.find("No `machine_limits` rows in this run"), std::string::npos) << md;
  EXPECT_NE(md.find("| CPU time other processes took, sampled before each binary | 35 to 35 % "
                    "(other processes were running: figures are low and noisy) |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| `m1/k8/n8/f32` | 4 | failed: out of memory | | | |\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| `m8/k8/n8/f32` | 4 | 2 µs | 3 | 12.5 | read bw |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| linear | 2 | 12.5 % | 12.5 % of read bw |"), std::string::npos) << md;
  EXPECT_TRUE(br::plots(run).empty());  // nothing to draw without limits or figures

  EXPECT_EQ(md.find("| ISA |"), std::string::npos) << md;  // no ISA recorded: no row
  EXPECT_THROW(br::add_json(run, "{\"benchmarks\": [", "truncated"), std::exception);
  EXPECT_THROW(br::add_json(run, "{\"context\": {}}", "no_rows"), std::runtime_error);
}

// A binary built for another ISA than the limits (a stale build directory, a hand-made run) is
// named in the machine section: its percentages are not of what its own ISA can do.
TEST(BenchReport, NamesBinariesBuiltForAnotherIsaThanTheLimits) {
  br::run_data run;
  br::add_json(run, R"({
    "context": {"npullm_isa": "avx2", "npullm_build_isa": "NPULLM_ISA=avx2, -march=x86-64-v3"},
    "benchmarks": [
      {"name": "machine_limits/threads:1", "run_type": "iteration", "real_time": 1.0,
       "time_unit": "ms", "read_GBps": 20.0, "triad_GBps": 18.0, "fma_GFLOPs": 60.0,
       "bf16_GFLOPs": 0.0}]})",
               "limits");
  br::add_json(run, R"({
    "context": {"npullm_isa": "avx2"},
    "benchmarks": [{"name": "linear/m1/k8/n8/f32/threads:1", "run_type": "iteration",
                    "real_time": 1.0, "time_unit": "us", "GBps": 10.0}]})",
               "bench_ops");
  std::string md = br::markdown(run);
  EXPECT_NE(md.find("| ISA | avx2 (NPULLM_ISA=avx2, -march=x86-64-v3) |\n"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| 1 | 20 | 18 | 60 | - |"), std::string::npos) << md;  // no bf16 peak
  br::add_json(run, R"({
    "context": {"npullm_isa": "avx512-bf16"},
    "benchmarks": [{"name": "attention_decode/h1x1/d8/threads:1", "run_type": "iteration",
                    "real_time": 1.0, "time_unit": "us", "GBps": 10.0}]})",
               "bench_attention");
  md = br::markdown(run);
  EXPECT_NE(md.find("| ISA | avx2 (NPULLM_ISA=avx2, -march=x86-64-v3); built for other ISAs, so "
                    "not comparable with these limits: bench_attention: avx512-bf16 |\n"),
            std::string::npos)
      << md;
}

}  // namespace
