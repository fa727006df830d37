// npullm_bench's command line (bench.cpp is the program): the usage, the options, and
// parse_args, which refuses a bad flag or value with npullm::error (invalid_argument) naming
// them (tools/cli.hpp). A part of bench.cpp, included by it alone.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/model/pipeline_config.hpp"
#include "tools/cli.hpp"

namespace npullm_bench {

namespace model = npullm::model;
namespace cli = npullm_tools::cli;

inline constexpr const char* usage_text =
    "usage: npullm_bench [options]\n"
    "\n"
    "Prefill and decode tokens/s of npullm's pipeline, with llama-bench's flags and output.\n"
    "\n"
    "options:\n"
    "  -h, --help               this message\n"
    "  -m, --model FILE|DIR     a GGUF file or a Hugging Face model directory (config.json +\n"
    "                           safetensors); repeat it or give a comma list (required)\n"
    "  -p, --n-prompt N[,N...]  prefill tests: one prefill of N tokens in a fresh context\n"
    "                           (default 512; 0: none)\n"
    "  -n, --n-gen N[,N...]     decode tests: N single-token steps from an empty context\n"
    "                           (default 128; 0: none)\n"
    "  -d, --n-depth D[,D...]   run every test after D tokens of context (prefilled before\n"
    "                           each run, not timed; default 0)\n"
    "  -r, --repetitions R      timed runs of each test (default 5)\n"
    "  -t, --threads T[,T...]   threads (default: the hardware threads)\n"
    "  -o, --output FORMAT      md (default), csv, json or jsonl\n"
    "  -ctk, --cache-type-k T   K cache type: f32, f16 (default, as llama.cpp), bf16, q8_0, q4_0\n"
    "  -ctv, --cache-type-v T   V cache type, the same list; K and V may differ only as\n"
    "                           -ctk q8_0 -ctv q4_0 (kv::mixed<q8_0, q4_0>: each K / V pair\n"
    "                           is a pipeline compiled into this program)\n"
    "  --kv TYPE                both at once\n"
    "  --packing MODE           the weights' packing (model::weight_packing): auto (default),\n"
    "                           off, or on (quantized layers also get int8 GEMM panels)\n"
    "  --no-limits              do not measure the machine's limits (a second or two per\n"
    "                           thread count); the % columns show -, their fields 0\n"
    "\n"
    "t/s is the mean over the runs of tokens / seconds, +- the sample standard deviation;\n"
    "csv, json and jsonl also give the median and the samples.\n"
    "\n"
    "Beside t/s, the figures against the machine, per test and thread count:\n"
    "  MB/tok   the bytes a token reads at least: the weights one pass reads (in the form the\n"
    "           pipeline reads them: tiles or panels where it packed them, else the file's;\n"
    "           a mixture's experts k of n; not the embedding), once a decode step, once a\n"
    "           prefill (divided by its tokens), plus the K and V read at the test's depth\n"
    "  GB/s     MB/tok x t/s\n"
    "  % read   of the read loop's GB/s (benchmarks/machine_limits.hpp), measured in this\n"
    "           process at the same threads: what bounds a decode step\n"
    "  GFLOP/s  (2 x the parameters a token multiplies + attention's 4 x heads x head_dim x\n"
    "           keys seen) x t/s; the LM head counts once a prefill (its last row)\n"
    "  % peak   of the peak of the weights' kind, measured likewise: the int8 dot product for\n"
    "           quantized weights, the bf16 dot product for bf16 ones, else the f32 FMA\n"
    "           (limits below the table); what bounds a prefill\n"
    "csv / json / jsonl: bytes_per_token, weight_bytes_per_token, kv_read_bytes_per_token,\n"
    "gbps, read_loop_gbps, pct_read_loop, flops_per_token, gflops, peak_kind, peak_gflops,\n"
    "pct_peak.\n";

struct options {
  std::vector<std::string> models;
  std::vector<std::size_t> prompt{512}, gen{128}, depth{0};
  std::size_t reps = 5;
  std::vector<std::size_t> threads;
  std::string output = "md";
  std::string type_k = "f16", type_v = "f16";  // KV element types (kv_types below)
  model::weight_packing packing = model::weight_packing::automatic;
  bool limits = true;  // measure the machine's limits (--no-limits: not)
};

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  for (;;) {
    const std::size_t e = s.find(',', b);
    out.emplace_back(s.substr(b, e == std::string_view::npos ? s.npos : e - b));
    if (e == std::string_view::npos) return out;
    b = e + 1;
  }
}

// The largest token count or repetition count a flag takes (nine digits, as before).
inline constexpr std::size_t max_count = 999'999'999;

// A comma list of counts in [min, max]; a bad item is refused naming the flag and the item.
std::vector<std::size_t> parse_counts(std::string_view flag, std::string_view s,
                                      std::string_view what, std::size_t min, std::size_t max) {
  std::vector<std::size_t> out;
  for (const std::string& item : split(s))
    out.push_back(cli::integer<std::size_t>(flag, item, what, min, max));
  return out;
}

// The KV element types -ctk / -ctv take (llama.cpp's names), each a pipeline instantiation.
inline constexpr std::array<std::string_view, 5> kv_types = {"f32", "f16", "bf16", "q8_0", "q4_0"};

// A bad command line is npullm::error (invalid_argument) naming the flag and the value: main
// prints the message, then the usage, exit status 1.
options parse_args(int argc, char** argv) {
  options o;
  bool prompt_set = false, gen_set = false, depth_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (a == "--no-limits") {
      o.limits = false;
      continue;
    }
    if (i + 1 >= argc) {
      npullm::raise(npullm::error_code::invalid_argument, "unknown option or missing value: ", a);
    }
    const std::string_view v = argv[++i];
    if (a == "-m" || a == "--model") {
      for (std::string& m : split(v)) {
        if (m.empty()) cli::refuse(a, v, "an empty model path");
        o.models.push_back(std::move(m));
      }
    } else if (a == "-p" || a == "--n-prompt") {
      // Repeated flags add to the list, as llama-bench's do; the first replaces the default.
      if (!std::exchange(prompt_set, true)) o.prompt.clear();
      for (std::size_t p : parse_counts(a, v, "n_prompt", 0, max_count)) o.prompt.push_back(p);
    } else if (a == "-n" || a == "--n-gen") {
      if (!std::exchange(gen_set, true)) o.gen.clear();
      for (std::size_t n : parse_counts(a, v, "n_gen", 0, max_count)) o.gen.push_back(n);
    } else if (a == "-d" || a == "--n-depth") {
      if (!std::exchange(depth_set, true)) o.depth.clear();
      for (std::size_t d : parse_counts(a, v, "n_depth", 0, max_count)) o.depth.push_back(d);
    } else if (a == "-r" || a == "--repetitions") {
      o.reps = cli::integer<std::size_t>(a, v, "repetitions", 1, max_count);
    } else if (a == "-t" || a == "--threads") {
      for (std::size_t t : parse_counts(a, v, "threads", 1, cli::max_threads))
        o.threads.push_back(t);
    } else if (a == "-o" || a == "--output") {
      if (v != "md" && v != "csv" && v != "json" && v != "jsonl")
        cli::refuse(a, v, "the output must be md, csv, json or jsonl");
      o.output = v;
    } else if (a == "-ctk" || a == "--cache-type-k" || a == "-ctv" || a == "--cache-type-v" ||
               a == "--kv") {
      if (std::find(kv_types.begin(), kv_types.end(), v) == kv_types.end())
        cli::refuse(a, v, "the cache type must be f32, f16, bf16, q8_0 or q4_0");
      if (a != "-ctv" && a != "--cache-type-v") o.type_k = v;
      if (a != "-ctk" && a != "--cache-type-k") o.type_v = v;
    } else if (a == "--packing") {
      if (v == "auto" || v == "automatic") {
        o.packing = model::weight_packing::automatic;
      } else if (v == "off") {
        o.packing = model::weight_packing::off;
      } else if (v == "on") {
        o.packing = model::weight_packing::on;
      } else {
        cli::refuse(a, v, "the packing must be auto, off or on");
      }
    } else {
      npullm::raise(npullm::error_code::invalid_argument, "unknown option: ", a);
    }
  }
  if (o.models.empty()) {
    npullm::raise(npullm::error_code::invalid_argument,
                  "no model: give -m FILE.gguf or -m MODEL_DIR");
  }
  if (o.type_k != o.type_v && !(o.type_k == "q8_0" && o.type_v == "q4_0")) {
    npullm::raise(npullm::error_code::invalid_argument, "-ctk ", o.type_k, " and -ctv ", o.type_v,
                  ": K and V in different types are built for -ctk q8_0 -ctv q4_0 only; give "
                  "that pair or the same type to both");
  }
  if (o.threads.empty()) {
    o.threads.push_back(
        std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, cli::max_threads));
  }
  std::erase(o.prompt, std::size_t{0});
  std::erase(o.gen, std::size_t{0});
  return o;
}

std::string_view packing_name(model::weight_packing p) {
  switch (p) {
    case model::weight_packing::off: return "off";
    case model::weight_packing::on: return "on";
    case model::weight_packing::automatic: break;
  }
  return "auto";
}
}  // namespace npullm_bench
