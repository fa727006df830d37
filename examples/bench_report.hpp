// npullm_bench's output (bench.cpp is the program): what a model is (llama-bench's model / size
// / params columns, from a GGUF file's tensors or the weights a model directory binds), one
// test's result with its statistics (mean, sample standard deviation, median) and its figures
// against the machine (bench_roofline.hpp), and the printers of md, csv, json and jsonl with
// llama-bench's fields and npullm's own. A part of bench.cpp, included by it alone.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_options.hpp"
#include "bench_roofline.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/weights.hpp"

namespace npullm_bench {

namespace fs = std::filesystem;

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
    const model::projection<W>* up = w.layers.empty()            ? nullptr
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
  std::string time = {};                   // when the test started, UTC (ISO 8601)
  std::vector<std::uint64_t> ns = {};      // per run
  std::vector<double> ts = {};             // tokens / second per run
  std::size_t packed_bytes = 0;            // the pipeline's packed weight copies
  std::size_t kv_bytes = 0;                // the pipeline's KV cache, as allocated
  test_work work = {};                     // per token: bytes it reads, flops (bench_roofline.hpp)
  std::string peak_kind = "f32";           // model_work::peak
  const machine_limits* limits = nullptr;  // at r.threads; null with --no-limits

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

// A result's figures against the machine: bytes and flops per token times the mean t/s, and
// their share of the limits at its thread count (0 where --no-limits measured none).
struct figures {
  double bytes = 0, gbps = 0, read_gbps = 0, pct_read = 0;
  double gflops = 0, peak_gflops = 0, pct_peak = 0;
  std::string peak_kind;
};

figures figures_of(const result& r) {
  const double ts = mean(r.ts);
  figures f{.bytes = r.work.weight_bytes + r.work.kv_bytes, .peak_kind = r.peak_kind};
  f.gbps = f.bytes * ts / 1e9;
  f.gflops = r.work.flops * ts / 1e9;
  if (r.limits != nullptr) {
    f.read_gbps = r.limits->read_gbps;
    f.peak_gflops = peak_gflops(*r.limits, f.peak_kind);
    f.pct_read = f.read_gbps > 0 ? 100 * f.gbps / f.read_gbps : 0;
    f.pct_peak = f.peak_gflops > 0 ? 100 * f.gflops / f.peak_gflops : 0;
  }
  return f;
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
// order; then npullm's own (packing, packed_bytes, kv_bytes, median_ts, npullm_isa), then the
// figures against the machine (per token: bytes_per_token = weight_ + kv_read_bytes_per_token,
// flops_per_token; at the mean t/s: gbps, gflops; the limits at the test's threads and the
// shares of them: read_loop_gbps, pct_read_loop, peak_kind, peak_gflops, pct_peak; 0 for the
// limits and shares with --no-limits).
struct field {
  std::string name;
  std::string value;
  bool quoted;  // a string (json: quoted, csv: quoted)
};

std::vector<field> fields_of(const result& r, const options& o) {
  static const std::string cpu = cpu_info();
  const model_info& m = *r.model;
  auto u = [](std::size_t v) { return std::to_string(v); };
  const figures g = figures_of(r);
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
      {"bytes_per_token", number(g.bytes), false},
      {"weight_bytes_per_token", number(r.work.weight_bytes), false},
      {"kv_read_bytes_per_token", number(r.work.kv_bytes), false},
      {"gbps", number(g.gbps), false},
      {"read_loop_gbps", number(g.read_gbps), false},
      {"pct_read_loop", number(g.pct_read), false},
      {"flops_per_token", number(r.work.flops), false},
      {"gflops", number(g.gflops), false},
      {"peak_kind", g.peak_kind, true},
      {"peak_gflops", number(g.peak_gflops), false},
      {"pct_peak", number(g.pct_peak), false},
  };
}

class printer {
 public:
  explicit printer(const options& o) : o_(o) {}

  void header() {
    if (o_.output == "md") {
      // llama-bench's columns, then the figures against the machine (figures_of): MB a token
      // reads, GB/s, % of the read loop, GFLOP/s, % of the peak of the weights' kind.
      std::printf(
          "| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s | %8s | %7s | %6s | %8s | "
          "%6s |\n",
          "model", "size", "params", "backend", "threads", "test", "t/s", "MB/tok", "GB/s",
          "% read", "GFLOP/s", "% peak");
      auto rule = [](std::size_t n) { return std::string(n - 1, '-') + ":"; };
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                  std::string(30, '-').c_str(), rule(10).c_str(), rule(10).c_str(),
                  std::string(10, '-').c_str(), rule(7).c_str(), rule(15).c_str(), rule(20).c_str(),
                  rule(8).c_str(), rule(7).c_str(), rule(6).c_str(), rule(8).c_str(),
                  rule(6).c_str());
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
      const figures g = figures_of(r);
      char pct_read[16] = "-", pct_peak[16] = "-";
      if (r.limits != nullptr) {
        std::snprintf(pct_read, sizeof pct_read, "%.0f", g.pct_read);
        std::snprintf(pct_peak, sizeof pct_peak, "%.0f", g.pct_peak);
        limits_[r.threads] = r.limits;
      }
      std::printf(
          "| %-30s | %10s | %10s | %-10s | %7zu | %15s | %21s | %8.1f | %7.1f | %6s | "
          "%8.1f | %6s |\n",
          m.type.c_str(), size, params, "CPU", r.threads, r.test().c_str(), ts, g.bytes / 1e6,
          g.gbps, pct_read, g.gflops, pct_peak);
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
      for (const auto& [threads, l] : limits_)
        std::printf("limits, %s\n", describe_limits(*l).c_str());
    } else if (o_.output == "json") {
      std::printf("\n]\n");
    }
    std::fflush(stdout);
  }

 private:
  const options& o_;
  std::size_t rows_ = 0;
  std::map<std::size_t, const machine_limits*> limits_;  // md's footer: those the rows used
};
}  // namespace npullm_bench
