// npullm_bench: prefill and decode speed of npullm's pipeline with llama-bench's flags and
// output, so that the two engines can be run side by side on the same GGUF files
// (../shared/peer/side-by-side.sh reads the markdown table's "threads", "test" and "t/s").
//
//   npullm_bench -m model.gguf [-m hf-dir] [-p 512] [-n 128] [-d 0] [-r 5] [-t 1,2]
//                [-o md|csv|json|jsonl] [-ctk TYPE -ctv TYPE | --kv TYPE] [--packing auto|off|on]
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
// npullm_isa.
//
// Counts are whole numbers in their flag's range (tools/cli.hpp): -p / -n / -d 0 up to
// 999999999, -r from 1, -t 1..1024; a bad one prints the flag and the value, then the usage.
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/weights.hpp"
#include "tools/cli.hpp"

namespace {

namespace fs = std::filesystem;
namespace model = npullm::model;
namespace cli = npullm_tools::cli;

constexpr const char* usage_text =
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
    "\n"
    "t/s is the mean over the runs of tokens / seconds, +- the sample standard deviation;\n"
    "csv, json and jsonl also give the median and the samples.\n";

struct options {
  std::vector<std::string> models;
  std::vector<std::size_t> prompt{512}, gen{128}, depth{0};
  std::size_t reps = 5;
  std::vector<std::size_t> threads;
  std::string output = "md";
  std::string type_k = "f16", type_v = "f16";  // KV element types (kv_types below)
  model::weight_packing packing = model::weight_packing::automatic;
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
constexpr std::size_t max_count = 999'999'999;

// A comma list of counts in [min, max]; a bad item is refused naming the flag and the item.
std::vector<std::size_t> parse_counts(std::string_view flag, std::string_view s,
                                      std::string_view what, std::size_t min, std::size_t max) {
  std::vector<std::size_t> out;
  for (const std::string& item : split(s))
    out.push_back(cli::integer<std::size_t>(flag, item, what, min, max));
  return out;
}

// The KV element types -ctk / -ctv take (llama.cpp's names), each a pipeline instantiation.
constexpr std::array<std::string_view, 5> kv_types = {"f32", "f16", "bf16", "q8_0", "q4_0"};

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

// ---- what the model is: llama-bench's model / size / params columns -------------------------

struct model_info {
  std::string filename = {};  // as given
  std::string type = {};      // "<family> <params> <weight type>", llama-bench's model column
  std::size_t size = 0;       // bytes of every tensor, as stored
  std::size_t params = 0;
};

// llama.cpp's general.file_type values (its llama_ftype enum) that name a file's mix.
std::optional<std::string> gguf_file_type_name(std::uint64_t ftype) {
  static const std::map<std::uint64_t, std::string> names = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},
      {8, "Q5_0"},    {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"},
      {13, "Q3_K_L"}, {14, "Q4_K_S"}, {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},
      {18, "Q6_K"},   {25, "IQ4_NL"}, {30, "IQ4_XS"}, {32, "BF16"}};
  const auto it = names.find(ftype);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

std::string params_label(std::size_t params) {
  char buf[32];
  if (params >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(params) / 1e9);
  } else if (params >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.0fM", static_cast<double>(params) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fK", static_cast<double>(params) / 1e3);
  }
  return buf;
}

// The weight type of a file: general.file_type when it names one, else the type holding most
// of the matrices' bytes.
template <class Weights>
model_info describe(const std::string& path, const Weights& w) {
  model_info m{.filename = path};
  std::string weight_type;
  const auto& c = w.config();
  if (fs::is_regular_file(path)) {
    const auto file = npullm::io::gguf_file::open(path);
    std::map<std::string, std::size_t> bytes_of_type;
    for (const npullm::io::gguf_tensor_info& t : file->tensors()) {
      m.size += t.nbytes;
      m.params += t.elements;
      if (t.n_dims >= 2) bytes_of_type[npullm::io::ggml_type_name(t.type)] += t.nbytes;
    }
    if (const auto ft = file->find_uint("general.file_type")) {
      if (const auto name = gguf_file_type_name(*ft)) weight_type = *name;
    }
    if (weight_type.empty() && !bytes_of_type.empty()) {
      weight_type =
          std::max_element(bytes_of_type.begin(), bytes_of_type.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; })
              ->first;
    }
  } else {
    // A model directory: the matrices and vectors the pipeline binds, as stored (a quantized
    // matrix: its blocks and scales).
    using W = typename Weights::weight_type;
    auto matrix = [&](const model::projection<W>& p) {
      m.size += p.bytes();
      m.params += p.rows() * p.cols();
    };
    auto vector = [&](const auto& v, std::size_t element_bytes) {
      m.size += v.size() * element_bytes;
      m.params += v.size();
    };
    matrix(w.embed);
    if (w.lm_head.identity() != w.embed.identity()) matrix(w.lm_head);
    vector(w.final_norm, sizeof(W));
    for (const auto& l : w.layers) {
      model::for_each_projection(l, matrix);  // the experts too
      if (l.moe.present()) {
        vector(l.moe.router, sizeof(float));
        vector(l.moe.shared_expert_gate, sizeof(float));
      }
      for (const auto* n :
           {&l.input_norm, &l.post_norm, &l.q_norm, &l.k_norm, &l.attn_out_norm, &l.mlp_out_norm})
        vector(*n, sizeof(W));
      for (const auto* b : {&l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias}) vector(*b, sizeof(W));
    }
    const model::projection<W>* up = w.layers.empty()             ? nullptr
                                     : w.layers[0].moe.present() ? &w.layers[0].moe.up[0]
                                                                 : &w.layers[0].up;
    weight_type = up == nullptr || !up->is_quantized()
                      ? std::string(npullm::to_string(npullm::dtype_of<W>))
                      : std::string(npullm::ops::to_string(up->quantized->format));
    std::transform(weight_type.begin(), weight_type.end(), weight_type.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
  }
  // llama-bench's names for the mixtures: "qwen2moe 8x1.3M", "llama 8x..." as the architecture.
  const std::string family = std::string(model::to_string(c.family)) +
                             (c.moe.experts != 0 && c.family != model::model_family::llama &&
                                      c.family != model::model_family::mistral
                                  ? "moe"
                                  : "");
  m.type = family + " " + params_label(m.params) + " " + weight_type;
  return m;
}

// ---- one test's result and the printers ------------------------------------------------------

struct result {
  const model_info* model = nullptr;
  std::size_t threads = 0, n_prompt = 0, n_gen = 0, n_depth = 0;
  std::string time = {};               // when the test started, UTC (ISO 8601)
  std::vector<std::uint64_t> ns = {};  // per run
  std::vector<double> ts = {};         // tokens / second per run
  std::size_t packed_bytes = 0;        // the pipeline's packed weight copies
  std::size_t kv_bytes = 0;            // the pipeline's KV cache, as allocated

  [[nodiscard]] std::string test() const {
    return (n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen)) +
           (n_depth > 0 ? " @ d" + std::to_string(n_depth) : "");
  }
};

template <class T>
double mean(const std::vector<T>& v) {
  double s = 0;
  for (const T x : v) s += static_cast<double>(x);
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

// Sample standard deviation (n - 1); 0 for fewer than two runs.
template <class T>
double stddev(const std::vector<T>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (const T x : v) s += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

std::string cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::size_t b = colon + 1;
        while (b < line.size() && line[b] == ' ') ++b;
        return line.substr(b);
      }
    }
  }
  return "";
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string csv_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

template <class T>
std::string join(const std::vector<T>& v, std::string_view sep, auto&& fmt) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += sep;
    out += fmt(v[i]);
  }
  return out;
}

// The fields of csv, json and jsonl, llama-bench's names where they mean the same, in its
// order; then npullm's own (packing, packed_bytes, kv_bytes, median_ts, npullm_isa).
struct field {
  std::string name;
  std::string value;
  bool quoted;  // a string (json: quoted, csv: quoted)
};

std::vector<field> fields_of(const result& r, const options& o) {
  static const std::string cpu = cpu_info();
  const model_info& m = *r.model;
  auto u = [](std::size_t v) { return std::to_string(v); };
  return {
      {"build_commit", "npullm", true},
      {"cpu_info", cpu, true},
      {"backends", "CPU", true},
      {"model_filename", m.filename, true},
      {"model_type", m.type, true},
      {"model_size", u(m.size), false},
      {"model_n_params", u(m.params), false},
      {"n_threads", u(r.threads), false},
      {"type_k", o.type_k, true},
      {"type_v", o.type_v, true},
      {"n_prompt", u(r.n_prompt), false},
      {"n_gen", u(r.n_gen), false},
      {"n_depth", u(r.n_depth), false},
      {"test_time", r.time, true},
      {"avg_ns", u(static_cast<std::size_t>(mean(r.ns))), false},
      {"stddev_ns", u(static_cast<std::size_t>(stddev(r.ns))), false},
      {"avg_ts", number(mean(r.ts)), false},
      {"stddev_ts", number(stddev(r.ts)), false},
      {"median_ts", number(median(r.ts)), false},
      {"packing", std::string(packing_name(o.packing)), true},
      {"packed_bytes", u(r.packed_bytes), false},
      {"kv_bytes", u(r.kv_bytes), false},
      {"npullm_isa", std::string(npullm::isa_name()), true},
  };
}

class printer {
 public:
  explicit printer(const options& o) : o_(o) {}

  void header() {
    if (o_.output == "md") {
      std::printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s |\n", "model", "size",
                  "params", "backend", "threads", "test", "t/s");
      std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(30, '-').c_str(),
                  std::string(9, '-').c_str(), std::string(9, '-').c_str(),
                  std::string(10, '-').c_str(), std::string(6, '-').c_str(),
                  std::string(14, '-').c_str(), std::string(19, '-').c_str());
    } else if (o_.output == "json") {
      std::printf("[\n");
    } else if (o_.output == "csv") {
      const model_info none;
      const auto f = fields_of(result{.model = &none}, o_);
      std::printf("%s,samples_ns,samples_ts\n",
                  join(f, ",", [](const field& x) { return x.name; }).c_str());
    }
    std::fflush(stdout);
  }

  void row(const result& r) {
    const auto f = fields_of(r, o_);
    const auto ts_list = join(r.ts, ", ", number);
    const auto ns_list = join(r.ns, ", ", [](std::uint64_t v) { return std::to_string(v); });
    if (o_.output == "md") {
      const model_info& m = *r.model;
      char size[32], params[32], ts[64];
      const double mib = static_cast<double>(m.size) / (1024.0 * 1024.0);
      if (mib < 1024) {
        std::snprintf(size, sizeof size, "%.2f MiB", mib);
      } else {
        std::snprintf(size, sizeof size, "%.2f GiB", mib / 1024);
      }
      if (m.params < 1000000000) {
        std::snprintf(params, sizeof params, "%.2f M", static_cast<double>(m.params) / 1e6);
      } else {
        std::snprintf(params, sizeof params, "%.2f B", static_cast<double>(m.params) / 1e9);
      }
      // "±" is two bytes of UTF-8: one more byte of width keeps the column aligned.
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", mean(r.ts), stddev(r.ts));
      std::printf("| %-30s | %10s | %10s | %-10s | %7zu | %15s | %21s |\n", m.type.c_str(), size,
                  params, "CPU", r.threads, r.test().c_str(), ts);
    } else if (o_.output == "csv") {
      std::printf(
          "%s,%s,%s\n",
          join(f, ",", [](const field& x) { return x.quoted ? csv_string(x.value) : x.value; })
              .c_str(),
          csv_string(ns_list).c_str(), csv_string(ts_list).c_str());
    } else {
      const bool lines = o_.output == "jsonl";
      std::string body;
      for (const field& x : f) {
        body += lines ? "" : "    ";
        body += json_string(x.name) + ": " + (x.quoted ? json_string(x.value) : x.value);
        body += lines ? ", " : ",\n";
      }
      body += lines ? "" : "    ";
      body += "\"samples_ns\": [ " + ns_list + " ]";
      body += lines ? ", " : ",\n    ";
      body += "\"samples_ts\": [ " + ts_list + " ]";
      if (lines) {
        std::printf("{%s}\n", body.c_str());
      } else {
        std::printf("%s  {\n%s\n  }", rows_++ > 0 ? ",\n" : "", body.c_str());
      }
    }
    std::fflush(stdout);
  }

  void footer() {
    if (o_.output == "md") {
      std::printf("\nbuild: npullm (kernels: %s)\n", std::string(npullm::isa_name()).c_str());
    } else if (o_.output == "json") {
      std::printf("\n]\n");
    }
    std::fflush(stdout);
  }

 private:
  const options& o_;
  std::size_t rows_ = 0;
};

// ---- the runs --------------------------------------------------------------------------------

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
               std::size_t threads, const options& o, printer& out) {
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
      const std::string& k = o.type_k;  // == o.type_v, or q8_0 / q4_0 (parse_args)
      if (k != o.type_v) {
        run_tests<npullm::kv::mixed<npullm::kv::q8_0, npullm::kv::q4_0>>(weights, m, t, o, out);
      } else if (k == "f32") {
        run_tests<float>(weights, m, t, o, out);
      } else if (k == "f16") {
        run_tests<npullm::float16>(weights, m, t, o, out);
      } else if (k == "bf16") {
        run_tests<npullm::bfloat16>(weights, m, t, o, out);
      } else if (k == "q8_0") {
        run_tests<npullm::kv::q8_0>(weights, m, t, o, out);
      } else {
        run_tests<npullm::kv::q4_0>(weights, m, t, o, out);
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
