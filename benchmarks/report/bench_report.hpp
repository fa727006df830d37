// The report of `make bench`: reads the Google Benchmark JSON files of one run and writes
// report.md (the machine, its measured limits, a table per primitive) and gnuplot data and
// scripts for the plots (roofline, decode attention GB/s vs KV length, pyramid step cost vs
// past length, generation tokens/s vs batch size). Rendering the scripts is left to gnuplot,
// so this code needs nothing but nlohmann_json and is tested without gnuplot installed.
//
// It relies on the conventions of shared/DESIGN.md: names `<primitive>/<settings...>/threads:<n>`
// (Google Benchmark's own suffixes such as /min_time:0.200 are dropped), counters GBps, GFLOPs,
// pct_bw, pct_peak, pct_roofline, x_naive, tokens_per_s, ratio; and on bench_core's rows
// `machine_limits/threads:<n>` (read_GBps, triad_GBps, fma_GFLOPs, bf16_GFLOPs) for the limits,
// and the context keys npullm_isa (the SIMD path a binary was built for: avx512-bf16, avx512,
// avx2, portable) and npullm_build_isa (the NPULLM_ISA option and -march that chose it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace npullm::bench_report {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The machine's limits at one thread count.
struct limits {
  std::size_t threads = 0;
  double read_gbps = 0, triad_gbps = 0, fma_gflops = 0, bf16_gflops = 0;
};

// One benchmark's result.
struct result {
  std::string binary;                 // the JSON file's stem, e.g. bench_attention
  std::string name;                   // without Google Benchmark's suffixes
  std::string primitive;              // the first part of the name
  std::vector<std::string> settings;  // the parts between the primitive and threads:<n>
  std::size_t threads = 1;
  double time = 0;                    // real time per iteration, in time_unit
  std::string time_unit = "ns";
  std::map<std::string, double> counters;
  std::string error;                  // non-empty when the benchmark failed

  [[nodiscard]] std::optional<double> counter(const std::string& key) const {
    const auto it = counters.find(key);
    if (it == counters.end() || !std::isfinite(it->second)) return std::nullopt;
    return it->second;
  }
  [[nodiscard]] std::string settings_text() const {
    std::string s;
    for (const auto& p : settings) s += (s.empty() ? "" : "/") + p;
    return s.empty() ? "-" : s;
  }
  // The setting that starts with `prefix` and continues with digits, as a number.
  [[nodiscard]] std::optional<double> number_after(const std::string& prefix) const {
    for (const auto& p : settings) {
      if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0 &&
          p.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
        return std::stod(p.substr(prefix.size()));
      }
    }
    return std::nullopt;
  }
  [[nodiscard]] bool has_setting(const std::string& s) const {
    return std::find(settings.begin(), settings.end(), s) != settings.end();
  }
};

// Everything one run wrote.
struct run_data {
  json context = json::object();        // the first file's context (machine, date, mode)
  std::map<std::size_t, limits> machine;  // by thread count
  std::vector<result> results;          // in the order of the files, then of each file
  std::vector<std::string> files;       // the files read, in order
  std::vector<double> loads;            // each file's 1-minute load average at its start
  std::vector<double> other_cpu;        // % of CPU time other processes took before each file's
                                        // binary started (scripts/bench.sh samples it)
  std::map<std::string, std::string> isa_of;  // binary -> its context's npullm_isa, where given

  [[nodiscard]] const limits* limits_at(std::size_t threads) const {
    const auto it = machine.find(threads);
    return it == machine.end() ? nullptr : &it->second;
  }
  [[nodiscard]] std::vector<std::string> primitives() const {
    std::vector<std::string> out;
    for (const auto& r : results) {
      if (r.primitive != "machine_limits" &&
          std::find(out.begin(), out.end(), r.primitive) == out.end()) {
        out.push_back(r.primitive);
      }
    }
    return out;
  }
};

namespace detail {

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

inline bool starts_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

// Google Benchmark appends these to names; they say how it ran, not what.
inline bool is_runner_suffix(const std::string& part) {
  static const char* const prefixes[] = {"min_time:", "min_warmup_time:", "iterations:",
                                         "repeats:"};
  for (const char* p : prefixes) {
    if (starts_with(part, p)) return true;
  }
  return part == "manual_time" || part == "real_time" || part == "process_time";
}

inline const std::set<std::string>& reserved_keys() {
  static const std::set<std::string> keys = {
      "name",        "family_index", "per_family_instance_index", "run_name",
      "run_type",    "repetitions",  "repetition_index",          "threads",
      "iterations",  "real_time",    "cpu_time",                  "time_unit",
      "aggregate_name", "aggregate_unit", "error_occurred",       "error_message",
      "label",       "big_o",        "rms"};
  return keys;
}

}  // namespace detail

// Splits a benchmark name into primitive, settings and threads.
inline void parse_name(const std::string& full, result& r) {
  std::vector<std::string> parts;
  for (auto& p : detail::split(full, '/')) {
    if (!detail::is_runner_suffix(p)) parts.push_back(std::move(p));
  }
  r.settings.clear();
  r.threads = 1;
  r.primitive = parts.empty() ? full : parts.front();
  std::string name = r.primitive;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    name += "/" + parts[i];
    if (detail::starts_with(parts[i], "threads:")) {
      r.threads = std::stoul(parts[i].substr(8));
    } else {
      r.settings.push_back(parts[i]);
    }
  }
  r.name = name;
}

// Reads one Google Benchmark JSON document (as text) into `run`. `binary` names its rows.
inline void add_json(run_data& run, const std::string& text, const std::string& binary) {
  const json doc = json::parse(text);
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array()) {
    throw std::runtime_error(binary + ": not a Google Benchmark JSON document");
  }
  if (doc.contains("context") && doc["context"].is_object()) {
    for (const auto& [k, v] : doc["context"].items()) {
      if (!run.context.contains(k)) run.context[k] = v;
    }
    const auto& load = doc["context"].value("load_avg", json::array());
    if (load.is_array() && !load.empty() && load[0].is_number()) {
      run.loads.push_back(load[0].get<double>());
    }
    const std::string other = doc["context"].value("npullm_other_cpu_pct", "");
    if (!other.empty() && other.find_first_not_of("0123456789.") == std::string::npos) {
      run.other_cpu.push_back(std::stod(other));
    }
    const auto& isa = doc["context"].value("npullm_isa", json());
    if (isa.is_string()) run.isa_of[binary] = isa.get<std::string>();
  }
  // Where repetitions produced aggregates, the median stands for the benchmark.
  std::set<std::string> with_median;
  for (const auto& b : doc["benchmarks"]) {
    if (b.value("run_type", "") == "aggregate" && b.value("aggregate_name", "") == "median") {
      with_median.insert(b.value("run_name", ""));
    }
  }
  std::map<std::string, std::size_t> seen;  // name -> index in run.results (last one wins)
  for (const auto& b : doc["benchmarks"]) {
    const bool aggregate = b.value("run_type", "iteration") == "aggregate";
    if (aggregate && b.value("aggregate_name", "") != "median") continue;
    if (!aggregate && with_median.count(b.value("run_name", b.value("name", "")))) continue;
    result r;
    r.binary = binary;
    parse_name(aggregate ? b.value("run_name", "") : b.value("name", ""), r);
    r.time = b.value("real_time", 0.0);
    r.time_unit = b.value("time_unit", "ns");
    if (b.value("error_occurred", false)) {
      r.error = b.value("error_message", std::string("error"));
      if (r.error.empty()) r.error = "error";
    }
    for (const auto& [k, v] : b.items()) {
      if (v.is_number() && !detail::reserved_keys().count(k)) r.counters[k] = v.get<double>();
    }
    if (r.primitive == "machine_limits" && r.error.empty()) {
      limits m;
      m.threads = r.threads;
      m.read_gbps = r.counter("read_GBps").value_or(0);
      m.triad_gbps = r.counter("triad_GBps").value_or(0);
      m.fma_gflops = r.counter("fma_GFLOPs").value_or(0);
      m.bf16_gflops = r.counter("bf16_GFLOPs").value_or(0);
      if (m.read_gbps > 0 && m.fma_gflops > 0) run.machine[m.threads] = m;
    }
    const auto it = seen.find(r.name);
    if (it != seen.end()) {
      run.results[it->second] = std::move(r);
    } else {
      seen[r.name] = run.results.size();
      run.results.push_back(std::move(r));
    }
  }
}

inline std::string read_text(const fs::path& f) {
  std::ifstream in(f);
  if (!in) throw std::runtime_error("cannot read " + f.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Reads the files in order (the limits file first, then the benchmark binaries' files); each
// file's rows are named by its stem.
inline run_data load(const std::vector<fs::path>& files) {
  run_data run;
  for (const auto& f : files) {
    add_json(run, read_text(f), f.stem().string());
    run.files.push_back(f.filename().string());
  }
  return run;
}

// ---- judging a result against the limits ----------------------------------------------------

// A figure as a percentage of the limit that applies to it.
struct judgement {
  double pct = 0;
  std::string limit;  // "read bw", "fp32 peak", "bf16 peak", "roofline"
};

// Memory-bound figures (GBps) against the read bandwidth; compute-bound ones (GFLOPs) against
// the fp32 FMA peak, or the bf16 dot-product peak for bf16 weights (as bench_util.hpp's
// set_flops_counters); both reported: against the roofline min(bandwidth x intensity, fp32
// peak), i.e. the larger of the two fractions. Computed from the run's limits; where the run
// has none for this thread count, the benchmark's own pct_* counter is used.
inline std::optional<judgement> judge(const result& r, const run_data& run) {
  const auto gbps = r.counter("GBps");
  const auto gflops = r.counter("GFLOPs");
  if (const limits* m = run.limits_at(r.threads)) {
    if (gbps && gflops) {
      return judgement{100.0 * std::max(*gbps / m->read_gbps, *gflops / m->fma_gflops),
                       "roofline"};
    }
    if (gbps) return judgement{100.0 * *gbps / m->read_gbps, "read bw"};
    if (gflops) {
      const bool bf16 = r.has_setting("bf16") && m->bf16_gflops > 0;
      return judgement{100.0 * *gflops / (bf16 ? m->bf16_gflops : m->fma_gflops),
                       bf16 ? "bf16 peak" : "fp32 peak"};
    }
    return std::nullopt;
  }
  if (auto v = r.counter("pct_roofline")) return judgement{*v, "roofline"};
  if (auto v = r.counter("pct_bw")) return judgement{*v, "read bw"};
  if (auto v = r.counter("pct_peak")) return judgement{*v, "peak"};
  return std::nullopt;
}

// ---- roofline placement -----------------------------------------------------------------------

// A kernel on the roofline: arithmetic intensity (flop per byte) and attained GFLOP/s.
struct roofline_point {
  double intensity = 0, gflops = 0;
};

inline double dtype_bytes(const result& r) {
  if (r.has_setting("f32")) return 4;
  if (r.has_setting("f16") || r.has_setting("bf16")) return 2;
  return 0;
}

// Where a benchmark reports both GBps and GFLOPs, its own bytes and flops place it. Otherwise
// the shape in its name does, for the kernels whose traffic is known from the shape:
//   linear/m<M>/k<K>/n<N>/<w>:   2MNK flops over W (N K elements of <w>) + x (M K f32) +
//                                y (M N f32); GBps there counts W alone
//   attention_prefill/h<Q>x<KV>/d<D>/causal<n>x<n> or chunk<q>/past<p>/f16: the reported GFLOPs
//                                over Q and O (f32), the present K and V (f32), the past (f16)
inline std::optional<roofline_point> place(const result& r) {
  if (!r.error.empty()) return std::nullopt;
  const auto gbps = r.counter("GBps");
  const auto gflops = r.counter("GFLOPs");
  if (r.primitive == "linear") {
    const auto m = r.number_after("m"), k = r.number_after("k"), n = r.number_after("n");
    const double w = dtype_bytes(r);
    if (!m || !k || !n || w == 0) return std::nullopt;
    const double flops = 2.0 * *m * *n * *k;
    const double weight_bytes = *n * *k * w;
    const double bytes = weight_bytes + 4.0 * *m * *k + 4.0 * *m * *n;
    double rate = 0;  // GFLOP/s
    if (gflops) {
      rate = *gflops;
    } else if (gbps) {
      rate = flops / (weight_bytes / *gbps);  // seconds = weight_bytes / (GBps * 1e9)
    } else {
      return std::nullopt;
    }
    return roofline_point{flops / bytes, rate};
  }
  if (r.primitive == "attention_prefill" && gflops) {
    std::optional<double> q, p = 0.0;
    std::string shape = r.settings.empty() ? "" : r.settings[0];
    const auto x = shape.find('x');
    if (shape.size() < 4 || shape[0] != 'h' || x == std::string::npos) return std::nullopt;
    const double q_heads = std::stod(shape.substr(1, x - 1));
    const double kv_heads = std::stod(shape.substr(x + 1));
    const auto d = r.number_after("d");
    for (const auto& s : r.settings) {
      if (detail::starts_with(s, "causal")) q = std::stod(s.substr(6));  // causal<n>x<n>
    }
    if (!q) q = r.number_after("chunk");
    if (auto past = r.number_after("past")) p = past;
    if (!q || !d) return std::nullopt;
    const double pairs = *q * *p + *q * (*q + 1) / 2;
    const double flops = 4.0 * *d * q_heads * pairs;
    const double bytes = 2.0 * 4 * q_heads * *q * *d + 2.0 * 4 * kv_heads * *q * *d +
                         2.0 * 2 * kv_heads * *p * *d;
    return roofline_point{flops / bytes, *gflops};
  }
  if (gbps && gflops && *gbps > 0 && *gflops > 0) return roofline_point{*gflops / *gbps, *gflops};
  return std::nullopt;
}

// ---- formatting ------------------------------------------------------------------------------

// Three significant figures, with k/M/G past 10^4 (rates of millions of operations per second).
inline std::string format_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  const double a = std::fabs(v);
  if (a >= 1e10) {
    std::snprintf(buf, sizeof buf, "%.3gG", v / 1e9);
  } else if (a >= 1e7) {
    std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  } else if (a >= 1e5) {
    std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  } else if (a >= 100 || (v == std::floor(v) && a < 1e5)) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
  } else if (a >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else if (a == 0) {
    return "0";
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

// A time given in Google Benchmark's unit (ns, us, ms, s), in the unit that reads best.
inline std::string format_time(double t, const std::string& unit) {
  const double s = t * (unit == "ns" ? 1e-9 : unit == "us" ? 1e-6 : unit == "ms" ? 1e-3 : 1.0);
  const double a = std::fabs(s);
  if (a < 1e-6) return format_number(s * 1e9) + " ns";
  if (a < 1e-3) return format_number(s * 1e6) + " µs";
  if (a < 1) return format_number(s * 1e3) + " ms";
  return format_number(s) + " s";
}

// A number as gnuplot data: full precision, '.' decimal point whatever the locale.
inline std::string data_number(double v) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os.precision(9);
  os << v;
  return os.str();
}

// ---- plots -----------------------------------------------------------------------------------

// One gnuplot figure: data (blocks separated by two blank lines, addressed by `index`) and a
// script that draws it into <name>.png, run from the report's directory.
struct plot {
  std::string name, title, data, script;
};

namespace detail {

inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Gnuplot's enhanced text treats _ ^ @ & { } as markup; titles come from benchmark names.
inline std::string plain(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '_' || c == '^' || c == '@' || c == '&' || c == '{' || c == '}') out += '\\';
    out += c;
  }
  return out;
}

inline std::string header(const std::string& name, int width, int height) {
  std::ostringstream gp;
  gp << "# Drawn by gnuplot from plots/" << name << ".dat; written by npullm_bench_report.\n"
     << "set terminal pngcairo size " << width << "," << height
     << " enhanced font 'sans,11' linewidth 1.5\n"
     << "set output '" << name << ".png'\n"
     << "set datafile separator whitespace\n"
     << "set grid xtics ytics mxtics mytics lc rgb '#dddddd' lw 0.5\n"
     << "set key outside right top box opaque\n";
  return gp.str();
}

inline const char* color(std::size_t i) {
  static const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                        "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return palette[i % 10];
}

// Filled circle, triangle, square, diamond, pentagon, inverted triangle.
inline int filled_point(std::size_t i) {
  static const int types[] = {7, 9, 5, 13, 15, 11};
  return types[i % 6];
}

inline std::string thread_label(std::size_t t) {
  return std::to_string(t) + (t == 1 ? " thread" : " threads");
}

// ", 2 threads" where a figure mixes thread counts, nothing where it has one.
inline std::string thread_label_suffix(std::size_t t, std::size_t thread_counts) {
  return thread_counts > 1 ? ", " + thread_label(t) : "";
}

}  // namespace detail

// Every kernel that can be placed (see place()), against each thread count's memory roof
// (read bandwidth x intensity) and compute roofs (fp32 FMA, bf16 dot): one panel per thread
// count, one point style per primitive.
inline std::optional<plot> roofline_plot(const run_data& run) {
  std::map<std::size_t, std::map<std::string, std::vector<std::pair<roofline_point, std::string>>>>
      panels;
  std::vector<std::string> families;
  for (const auto& r : run.results) {
    const auto p = place(r);
    if (!p || p->intensity <= 0 || p->gflops <= 0 || !run.limits_at(r.threads)) continue;
    // Cold (data from DRAM) and hot (from cache) runs of a kernel are told apart.
    const std::string family =
        r.primitive + (r.has_setting("cold") ? " (cold)" : r.has_setting("hot") ? " (hot)" : "");
    panels[r.threads][family].push_back({*p, r.settings_text()});
    if (std::find(families.begin(), families.end(), family) == families.end()) {
      families.push_back(family);
    }
  }
  if (panels.empty()) return std::nullopt;
  plot pl{"roofline", "Roofline: every kernel against the measured limits", "", ""};
  std::ostringstream data, gp;
  double xmin = 1e30, xmax = 0, ymin = 1e30, ymax = 0;
  int index = 0;
  std::map<std::pair<std::size_t, std::string>, int> block;
  for (const auto& [threads, fams] : panels) {
    for (const auto& [family, points] : fams) {
      data << "# threads " << threads << " " << family
           << ": intensity_flop_per_byte GFLOP_per_s settings\n";
      for (const auto& [p, label] : points) {
        data << data_number(p.intensity) << " " << data_number(p.gflops) << " " << label << "\n";
        xmin = std::min(xmin, p.intensity);
        xmax = std::max(xmax, p.intensity);
        ymin = std::min(ymin, p.gflops);
        ymax = std::max(ymax, p.gflops);
      }
      data << "\n\n";
      block[{threads, family}] = index++;
    }
    const limits& m = *run.limits_at(threads);
    const double peak = std::max(m.fma_gflops, m.bf16_gflops);
    ymax = std::max(ymax, peak);
    xmin = std::min(xmin, m.fma_gflops / m.read_gbps);
    xmax = std::max(xmax, peak / m.read_gbps);
  }
  const double x0 = std::pow(10, std::floor(std::log10(xmin / 2)));
  const double x1 = std::pow(10, std::ceil(std::log10(xmax * 3)));
  const double y0 = std::pow(10, std::floor(std::log10(ymin / 2)));
  const double y1 = std::pow(10, std::ceil(std::log10(ymax * 2)));
  const int width = 760 * static_cast<int>(panels.size()) + 260;
  gp << detail::header(pl.name, width, 720)
     << "set logscale xy 10\n"
     << "set format x '%g'\nset format y '%g'\n"
     << "set xrange [" << data_number(x0) << ":" << data_number(x1) << "]\n"
     << "set yrange [" << data_number(y0) << ":" << data_number(y1) << "]\n"
     << "set xlabel 'arithmetic intensity (flop/byte)'\n"
     << "set ylabel 'attained performance (GFLOP/s)'\n"
     << "set key inside left top Left reverse box opaque font ',10'\n"
     << "set samples 400\n"
     << "roof(x, bw, peak) = (bw * x < peak) ? bw * x : peak\n"
     << "set multiplot layout 1," << panels.size() << " title "
     << detail::quoted(pl.title + "  (points above the memory roof ran from cache)")
     << " font ',13'\n";
  for (const auto& [threads, fams] : panels) {
    const limits& m = *run.limits_at(threads);
    gp << "set title " << detail::quoted(detail::thread_label(threads)) << "\n"
       << "plot roof(x, " << data_number(m.read_gbps) << ", " << data_number(m.fma_gflops)
       << ") w l lw 2.5 lc rgb '#000000' t "
       << detail::quoted("read " + format_number(m.read_gbps) + " GB/s, fp32 FMA " +
                         format_number(m.fma_gflops) + " GFLOP/s");
    if (m.bf16_gflops > 0) {
      gp << ", \\\n     roof(x, " << data_number(m.read_gbps) << ", "
         << data_number(m.bf16_gflops) << ") w l lw 2 dt 2 lc rgb '#555555' t "
         << detail::quoted("bf16 dot " + format_number(m.bf16_gflops) + " GFLOP/s");
    }
    for (std::size_t f = 0; f < families.size(); ++f) {
      const auto it = block.find({threads, families[f]});
      if (it == block.end()) continue;
      gp << ", \\\n     'plots/" << pl.name << ".dat' index " << it->second
         << " u 1:2 w p pt " << detail::filled_point(f) << " ps 1.3 lc rgb '"
         << detail::color(f) << "' t " << detail::quoted(detail::plain(families[f]));
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";
  pl.data = data.str();
  pl.script = gp.str();
  return pl;
}

// attention_decode: GB/s against KV length, one line per KV source (contiguous, blocks) and
// cache state (cold solid, hot dashed), one panel per head shape (columns) and thread count
// (rows), for one KV dtype (f16 when present), with the read bandwidth as a dashed black line.
inline std::optional<plot> decode_kv_plot(const run_data& run) {
  struct point {
    double kv, gbps;
  };
  std::vector<const result*> rows;
  for (const auto& r : run.results) {
    if (r.primitive == "attention_decode" && r.error.empty() && r.counter("GBps") &&
        r.number_after("kv") && r.settings.size() >= 2) {
      rows.push_back(&r);
    }
  }
  if (rows.empty()) return std::nullopt;
  auto dtype = [](const result& r) -> std::string {
    for (const char* t : {"f16", "bf16", "f32"}) {
      if (r.has_setting(t)) return t;
    }
    return "";
  };
  std::string chosen = dtype(*rows.front());
  for (const auto* r : rows) {
    if (dtype(*r) == "f16") chosen = "f16";
  }
  std::vector<std::string> shapes, series;
  std::set<std::size_t> thread_set;
  // panels[{threads, shape}][series] = points
  std::map<std::pair<std::size_t, std::string>, std::map<std::string, std::vector<point>>> panels;
  for (const auto* r : rows) {
    if (dtype(*r) != chosen) continue;
    const std::string shape = r->settings[0] + "/" + r->settings[1];
    std::string source = "?", state;
    for (const auto& s : r->settings) {
      if (s == "contiguous" || detail::starts_with(s, "block")) source = s;
      if (s == "cold" || s == "hot") state = s;
    }
    const std::string name = source + (state.empty() ? "" : ", " + state);
    panels[{r->threads, shape}][name].push_back({*r->number_after("kv"), *r->counter("GBps")});
    thread_set.insert(r->threads);
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
    if (std::find(series.begin(), series.end(), name) == series.end()) series.push_back(name);
  }
  std::sort(series.begin(), series.end(), [](const std::string& a, const std::string& b) {
    // cold before hot, then contiguous before block16 before block256
    const bool ah = a.find("hot") != std::string::npos, bh = b.find("hot") != std::string::npos;
    if (ah != bh) return !ah;
    auto rank = [](const std::string& s) {
      if (detail::starts_with(s, "contiguous")) return 0.0;
      return std::atof(s.c_str() + 5);
    };
    return rank(a) < rank(b);
  });
  std::map<std::string, std::size_t> source_color;  // cold and hot of a source share a color
  for (const auto& s : series) {
    source_color.emplace(s.substr(0, s.find(',')), source_color.size());
  }
  plot pl{"decode_kv", "Decode attention (" + chosen + " KV): bandwidth vs KV length", "", ""};
  std::ostringstream data, gp;
  int index = 0;
  double xmin = 1e30, xmax = 0;
  std::map<std::pair<std::pair<std::size_t, std::string>, std::string>, int> block;
  for (auto& [panel, by_series] : panels) {
    for (auto& [name, points] : by_series) {
      std::sort(points.begin(), points.end(),
                [](const point& a, const point& b) { return a.kv < b.kv; });
      data << "# threads " << panel.first << " " << panel.second << " " << name
           << ": kv_tokens GB_per_s\n";
      for (const auto& p : points) {
        data << data_number(p.kv) << " " << data_number(p.gbps) << "\n";
        xmin = std::min(xmin, p.kv);
        xmax = std::max(xmax, p.kv);
      }
      data << "\n\n";
      block[{panel, name}] = index++;
    }
  }
  const int cols = static_cast<int>(shapes.size()), rows_n = static_cast<int>(thread_set.size());
  gp << detail::header(pl.name, std::max(900, 560 * cols), 440 * rows_n + 200)
     << "set logscale x 2\n"
     << "set format x '%.0f'\n"
     << "set xrange [" << data_number(xmin / 1.5) << ":" << data_number(xmax * 1.5) << "]\n"
     << "set xlabel 'KV length (tokens)'\n"
     << "set ylabel 'K + V read (GB/s)'\n"
     // One key for the figure, below the panels (the colors mean the same in every panel).
     << "set key at screen 0.5, screen 0.02 center bottom horizontal Left reverse box opaque "
        "font ',10' maxrows 2\n"
     << "set multiplot layout " << rows_n << "," << cols << " title "
     << detail::quoted(pl.title + "; dashed black: read bandwidth") << " font ',13' margins "
     << "0.07, 0.98, " << data_number(0.1 + 0.06 / rows_n) << ", 0.9 spacing 0.07, 0.11\n";
  bool first_panel = true;
  for (std::size_t threads : thread_set) {
    for (const auto& shape : shapes) {
      gp << "set title " << detail::quoted(shape + ", " + detail::thread_label(threads)) << "\n";
      if (!first_panel) gp << "unset key\n";
      const auto has = panels.find({threads, shape});
      if (has == panels.end()) {
        gp << "set multiplot next\n";
        continue;
      }
      double top = 0;  // each panel on its own scale: shapes differ several-fold
      for (const auto& [name, points] : has->second) {
        for (const auto& p : points) top = std::max(top, p.gbps);
      }
      if (const limits* m = run.limits_at(threads)) top = std::max(top, m->read_gbps);
      gp << "set yrange [0:" << data_number(top * 1.12) << "]\nplot ";
      bool first = true;
      if (const limits* m = run.limits_at(threads)) {
        gp << data_number(m->read_gbps) << " w l dt 2 lw 2 lc rgb '#000000' notitle";
        first = false;
      }
      for (const auto& s : series) {
        const auto it = block.find({{threads, shape}, s});
        if (it == block.end()) continue;
        const bool hot = s.find("hot") != std::string::npos;
        const std::string source = s.substr(0, s.find(','));
        gp << (first ? "" : ", \\\n     ") << "'plots/" << pl.name << ".dat' index "
           << it->second << " u 1:2 w lp lw 2 pt " << (hot ? 6 : 7) << " ps 1.2 dt "
           << (hot ? 2 : 1) << " lc rgb '" << detail::color(source_color[source]) << "' t "
           << detail::quoted(s);
        first = false;
      }
      gp << "\n";
      first_panel = false;
    }
  }
  gp << "unset multiplot\n";
  pl.data = data.str();
  pl.script = gp.str();
  return pl;
}

// Pyramid attention vs the full static variant: step cost against the past length, one panel
// per mode (decode, 256-query prefill chunk) and capacity C; past = fill% of (C - 256), the
// largest past of bench_pyramid's plan (q = 256). Each pyramid point is labelled with the past
// capacity of the variant it ran (variant i holds i x 256 tokens).
inline std::optional<plot> pyramid_plot(const run_data& run) {
  constexpr double q = 256;
  struct point {
    double past, pyramid_us, full_us, capacity;
  };
  std::map<std::pair<std::string, double>, std::map<std::size_t, std::vector<point>>> panels;
  std::set<std::size_t> thread_set;
  for (const auto& r : run.results) {
    if (!detail::starts_with(r.primitive, "pyramid_") || !r.error.empty()) continue;
    const auto c = r.number_after("c"), fill = r.number_after("fill");
    const auto py = r.counter("pyramid_us"), full = r.counter("full_us");
    if (!c || !fill || !py || !full) continue;
    const double past = std::floor((*c - q) * *fill / 100);
    const double capacity = r.counter("variant").value_or(-1) * q;
    panels[{r.primitive, *c}][r.threads].push_back({past, *py, *full, capacity});
    thread_set.insert(r.threads);
  }
  if (panels.empty()) return std::nullopt;
  std::set<double> capacities;
  std::set<std::string> modes;
  for (const auto& [k, v] : panels) {
    capacities.insert(k.second);
    modes.insert(k.first);
  }
  plot pl{"pyramid", "Pyramid attention vs full static: step cost vs past length", "", ""};
  std::ostringstream data, gp;
  gp << detail::header(pl.name, 620 * static_cast<int>(capacities.size()) + 120,
                       480 * static_cast<int>(modes.size()) + 80)
     << "set xlabel 'past length (tokens)'\n"
     << "set key inside left top horizontal Left reverse box opaque font ',10' maxrows 2\n"
     << "set offsets graph 0.03, graph 0.03, graph 0.1, 0\n"
     << "set multiplot layout " << modes.size() << "," << capacities.size() << " title "
     << detail::quoted(pl.title + " (14/2 heads, d 64, f16 KV; labels: the past capacity of "
                                  "the variant that ran)")
     << " font ',13'\n";
  int index = 0;
  bool first_panel = true;
  for (const auto& mode : modes) {
    for (double cap : capacities) {
      const auto it = panels.find({mode, cap});
      const std::string title = (mode == "pyramid_decode" ? "decode (1 query)"
                                 : mode == "pyramid_prefill"
                                     ? "prefill chunk (256 queries)"
                                     : detail::plain(mode)) +
                                ", capacity " + format_number(cap);
      gp << "set title " << detail::quoted(title) << "\n";
      if (!first_panel) gp << "unset key\n";  // the same styles in every panel
      if (it == panels.end()) {
        gp << "set multiplot next\n";  // not measured in this run
        continue;
      }
      first_panel = false;
      double most = 0;
      for (const auto& [threads, points] : it->second) {
        for (const auto& p : points) most = std::max({most, p.pyramid_us, p.full_us});
      }
      const bool ms = most >= 1e4;  // µs up to 10 ms, then ms
      const std::string y = ms ? "($2/1000)" : "2", y_full = ms ? "($3/1000)" : "3";
      gp << "set ylabel 'one layer, one step (" << (ms ? "ms" : "µs") << ")'\n"
         << "set yrange [0:" << data_number((ms ? most / 1000 : most) * 1.35) << "]\n"
         << "set xrange [0:" << data_number((cap - q) * 1.1) << "]\nplot ";
      std::size_t color = 0;
      bool first = true;
      for (auto& [threads, points] : it->second) {
        std::sort(points.begin(), points.end(),
                  [](const point& a, const point& b) { return a.past < b.past; });
        data << "# " << mode << " c" << cap << " threads " << threads
             << ": past_tokens pyramid_us full_static_us variant_past_capacity\n";
        for (const auto& p : points) {
          data << data_number(p.past) << " " << data_number(p.pyramid_us) << " "
               << data_number(p.full_us) << " " << data_number(p.capacity) << "\n";
        }
        data << "\n\n";
        const std::string t = detail::thread_label_suffix(threads, thread_set.size());
        gp << (first ? "" : ", \\\n     ") << "'plots/" << pl.name << ".dat' index " << index
           << " u 1:" << y << " w lp lw 2 pt 7 ps 1.3 lc rgb '" << detail::color(color) << "' t "
           << detail::quoted("pyramid" + t);
        if (first) {  // the variant a past selects does not depend on the thread count
          gp << ", \\\n     'plots/" << pl.name << ".dat' index " << index << " u 1:" << y
             << ":(sprintf('%d', $4)) w labels offset 2.2,-1 font ',9' tc rgb '#333333' "
                "notitle";
        }
        gp << ", \\\n     'plots/" << pl.name << ".dat' index " << index << " u 1:" << y_full
           << " w lp lw 2 dt 2 pt 4 ps 1.2 lc rgb '" << detail::color(color) << "' t "
           << detail::quoted("full static (largest variant)" + t);
        first = false;
        ++index;
        ++color;
      }
      gp << "\n";
    }
  }
  gp << "unset multiplot\n";
  pl.data = data.str();
  pl.script = gp.str();
  return pl;
}

// Batched generation: tokens/s against batch size (one line per model/dtype and thread count).
inline std::optional<plot> generate_plot(const run_data& run) {
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  double xmax = 1, ymax = 0;
  for (const auto& r : run.results) {
    if (r.primitive != "generate" || !r.error.empty()) continue;
    const auto batch = r.number_after("batch");
    const auto tps = r.counter("tokens_per_s");
    if (!batch || !tps) continue;
    std::string name;
    for (const auto& s : r.settings) {
      if (!detail::starts_with(s, "batch")) name += (name.empty() ? "" : " ") + s;
    }
    name += ", " + detail::thread_label(r.threads);
    series[name].push_back({*batch, *tps});
    xmax = std::max(xmax, *batch);
    ymax = std::max(ymax, *tps);
  }
  if (series.empty()) return std::nullopt;
  plot pl{"generate", "Batched generation: throughput vs batch size", "", ""};
  std::ostringstream data, gp;
  gp << detail::header(pl.name, 1000, 620) << "set logscale x 2\n"
     << "set format x '%.0f'\n"
     << "set xrange [0.8:" << data_number(xmax * 1.25) << "]\n"
     << "set yrange [0:" << data_number(ymax * 1.2) << "]\n"
     << "set xlabel 'batch size (sequences decoded together)'\n"
     << "set ylabel 'generated tokens/s (prefill included)'\n"
     << "set key inside left top Left reverse box opaque\n"
     << "set title " << detail::quoted(pl.title + " (128-token prompts, 128 new tokens each)")
     << " font ',13'\nplot ";
  int index = 0;
  for (auto& [name, points] : series) {
    std::sort(points.begin(), points.end());
    data << "# " << name << ": batch tokens_per_s\n";
    for (const auto& [b, t] : points) data << data_number(b) << " " << data_number(t) << "\n";
    data << "\n\n";
    gp << (index ? ", \\\n     " : "") << "'plots/" << pl.name << ".dat' index " << index
       << " u 1:2 w lp lw 2 pt 7 ps 1.4 lc rgb '" << detail::color(index) << "' t "
       << detail::quoted(detail::plain(name)) << ", \\\n     'plots/" << pl.name
       << ".dat' index " << index
       << " u 1:2:(sprintf('%.1f', $2)) w labels offset 0,1.2 font ',10' notitle";
    ++index;
  }
  gp << "\n";
  pl.data = data.str();
  pl.script = gp.str();
  return pl;
}

// ---- report.md ---------------------------------------------------------------------------

namespace detail {

inline std::string context_string(const json& c, const char* key) {
  if (!c.contains(key)) return "";
  const auto& v = c[key];
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

inline std::string bytes_text(double b) {
  if (b >= 1 << 20) return format_number(b / (1 << 20)) + " MiB";
  if (b >= 1 << 10) return format_number(b / (1 << 10)) + " KiB";
  return format_number(b) + " B";
}

inline std::string caches_text(const json& c) {
  if (!c.contains("caches") || !c["caches"].is_array()) return "";
  std::string out;
  for (const auto& k : c["caches"]) {
    const std::string type = k.value("type", "");
    if (type == "Instruction") continue;
    out += (out.empty() ? "" : ", ") + std::string("L") + std::to_string(k.value("level", 0)) +
           (type == "Data" ? "d" : "") + " " + bytes_text(k.value("size", 0.0));
    const int sharing = k.value("num_sharing", 1);
    if (sharing > 1) out += " (shared by " + std::to_string(sharing) + ")";
  }
  return out;
}

// Markdown table cells cannot hold '|'.
inline std::string cell(std::string s) {
  for (std::size_t i = s.find('|'); i != std::string::npos; i = s.find('|', i + 2)) {
    s.replace(i, 1, "\\|");
  }
  return s;
}

inline const std::set<std::string>& judged_counters() {
  // Shown through the computed "% of limit" column or the GB/s, GFLOP/s, x naive columns.
  static const std::set<std::string> keys = {"GBps",         "GFLOPs",     "pct_bw",
                                             "pct_peak",     "pct_roofline", "peak_GFLOPs",
                                             "x_naive"};
  return keys;
}

}  // namespace detail

// report.md: the machine, the limits, a summary, the plots, one table per primitive.
// `plots` names the figures written beside it (<name>.png).
inline std::string markdown(const run_data& run, const std::vector<plot>& plots = {}) {
  const json& c = run.context;
  std::ostringstream md;
  const std::string mode = detail::context_string(c, "npullm_mode");
  md << "# npullm benchmark report\n\n";
  md << "Written by `npullm_bench_report` from " << run.files.size()
     << " Google Benchmark JSON files (`json/`)";
  if (!mode.empty()) {
    md << "; " << (mode == "quick" ? "quick mode (`make bench QUICK=1`)" : "full mode (`make bench`)");
  }
  md << ".\n\n";

  md << "## Machine\n\n| | |\n|---|---|\n";
  auto row = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) md << "| " << k << " | " << detail::cell(v) << " |\n";
  };
  row("CPU", detail::context_string(c, "cpu_model"));
  std::string cpus = detail::context_string(c, "num_cpus");
  if (!cpus.empty()) {
    cpus += " logical CPUs";
    const std::string mhz = detail::context_string(c, "mhz_per_cpu");
    if (!mhz.empty()) cpus += " at " + mhz + " MHz";
  }
  row("CPUs", cpus);
  row("caches", detail::caches_text(c));
  row("memory", detail::context_string(c, "memory"));
  row("compiler", detail::context_string(c, "compiler"));
  // The ISA of the first file (the limits, as scripts/bench.sh passes them); any binary built
  // for another one is named, since its figures are not comparable with these limits.
  std::string isa = detail::context_string(c, "npullm_isa");
  if (!isa.empty()) {
    const std::string build = detail::context_string(c, "npullm_build_isa");
    if (!build.empty()) isa += " (" + build + ")";
    std::string others;
    for (const auto& [binary, i] : run.isa_of) {
      if (i != detail::context_string(c, "npullm_isa")) {
        others += (others.empty() ? "" : ", ") + binary + ": " + i;
      }
    }
    if (!others.empty()) {
      isa += "; built for other ISAs, so not comparable with these limits: " + others;
    }
  }
  row("ISA", isa);
  row("npullm commit", detail::context_string(c, "npullm_commit"));
  row("date", detail::context_string(c, "date"));
  row("host", detail::context_string(c, "host_name"));
  if (!run.other_cpu.empty()) {
    const auto [lo, hi] = std::minmax_element(run.other_cpu.begin(), run.other_cpu.end());
    std::string other = format_number(*lo) + " to " + format_number(*hi) + " %";
    if (*hi > 10) other += " (other processes were running: figures are low and noisy)";
    row("CPU time other processes took, sampled before each binary", other);
  }
  if (!run.loads.empty()) {
    const auto [lo, hi] = std::minmax_element(run.loads.begin(), run.loads.end());
    row("load average (1 min) as each binary started",
        format_number(*lo) + " to " + format_number(*hi) + " (the benchmarks' own threads too)");
  }
  std::string lib = detail::context_string(c, "library_build_type");
  if (!lib.empty()) {
    lib = "Google Benchmark library built as " + lib;
    if (lib.find("debug") != std::string::npos) {
      lib += " (Debian's build; it only times, the kernels are Release)";
    }
  }
  row("harness", lib);
  md << "\n";

  md << "## Measured limits\n\n";
  if (run.machine.empty()) {
    md << "No `machine_limits` rows in this run: the percentages below are the benchmarks' own "
          "counters.\n\n";
  } else {
    md << "Measured once in this run by `bench_core` (`benchmarks/machine_limits.hpp`: the best "
          "of several repetitions, every thread running at once";
    if (const std::string isa = detail::context_string(c, "npullm_isa"); !isa.empty()) {
      md << ", with code built for the same ISA as the benchmarks, " << isa;
    }
    md << "); every benchmark of the run divides by these.\n\n"
       << "| threads | read GB/s | triad GB/s | fp32 FMA GFLOP/s | bf16 dot GFLOP/s | "
          "ridge fp32 (flop/byte) | ridge bf16 (flop/byte) |\n"
       << "|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& [t, m] : run.machine) {
      md << "| " << t << " | " << format_number(m.read_gbps) << " | "
         << format_number(m.triad_gbps) << " | " << format_number(m.fma_gflops) << " | "
         << (m.bf16_gflops > 0 ? format_number(m.bf16_gflops) : "-") << " | "
         << format_number(m.fma_gflops / m.read_gbps) << " | "
         << (m.bf16_gflops > 0 ? format_number(m.bf16_gflops / m.read_gbps) : "-") << " |\n";
    }
    md << "\n";
  }

  // Summary: per primitive, the best fraction of its limit and the best speedup over naive.
  const auto prims = run.primitives();
  md << "## Summary\n\n"
     << "| primitive | benchmarks | median % of limit | best % of limit | where | best × naive "
        "| failed |\n"
     << "|---|---:|---:|---:|---|---:|---:|\n";
  for (const auto& p : prims) {
    std::size_t count = 0, failed = 0;
    std::optional<judgement> best;
    const result* best_row = nullptr;
    std::optional<double> best_naive;
    std::vector<double> pcts;
    for (const auto& r : run.results) {
      if (r.primitive != p) continue;
      ++count;
      if (!r.error.empty()) {
        ++failed;
        continue;
      }
      const auto j = judge(r, run);
      if (j) pcts.push_back(j->pct);
      if (j && (!best || j->pct > best->pct)) {
        best = j;
        best_row = &r;
      }
      if (auto x = r.counter("x_naive"); x && (!best_naive || *x > *best_naive)) best_naive = x;
    }
    std::string median = "-";
    if (!pcts.empty()) {
      std::sort(pcts.begin(), pcts.end());
      const std::size_t n = pcts.size();
      median = format_number(n % 2 ? pcts[n / 2] : (pcts[n / 2 - 1] + pcts[n / 2]) / 2) + " %";
    }
    md << "| " << detail::cell(p) << " | " << count << " | " << median << " | "
       << (best ? format_number(best->pct) + " % of " + best->limit : "-") << " | "
       << (best_row ? "`" + detail::cell(best_row->settings_text()) + "` (" +
                          detail::thread_label(best_row->threads) + ")"
                    : "-")
       << " | " << (best_naive ? format_number(*best_naive) : "-") << " | " << failed << " |\n";
  }
  md << "\n";

  if (!plots.empty()) {
    md << "## Plots\n\n";
    for (const auto& pl : plots) {
      md << "### " << pl.title << "\n\n![" << pl.title << "](" << pl.name << ".png)\n\n"
         << "Data: `plots/" << pl.name << ".dat`, script: `plots/" << pl.name << ".gp`.\n\n";
    }
  }

  md << "## Results\n\n"
     << "Time: Google Benchmark's real time per iteration. GB/s and GFLOP/s: the benchmark's "
        "counters. % of limit: GB/s against the read bandwidth, GFLOP/s against the fp32 FMA "
        "peak (bf16 dot peak for bf16 weights), both against the roofline (the larger of the "
        "two fractions), at the benchmark's thread count. × naive: speedup over the naive "
        "baseline measured in the same binary. Other columns: the benchmark's own counters. Above "
        "100 % of the read bandwidth: the data came from cache (benchmarks not marked cold "
        "reuse one copy), while the limit is DRAM's.\n\n";
  for (const auto& p : prims) {
    std::vector<const result*> rows;
    for (const auto& r : run.results) {
      if (r.primitive == p) rows.push_back(&r);
    }
    bool any_gbps = false, any_gflops = false, any_pct = false, any_naive = false;
    std::vector<std::string> others;
    for (const auto* r : rows) {
      any_gbps |= r->counter("GBps").has_value();
      any_gflops |= r->counter("GFLOPs").has_value();
      any_pct |= judge(*r, run).has_value();
      any_naive |= r->counter("x_naive").has_value();
      for (const auto& [k, v] : r->counters) {
        if (!detail::judged_counters().count(k) &&
            std::find(others.begin(), others.end(), k) == others.end()) {
          others.push_back(k);
        }
      }
    }
    md << "### " << p << "\n\n";
    if (!rows.empty()) md << "From `" << rows.front()->binary << "`.\n\n";
    md << "| settings | threads | time |";
    std::string rule = "|---|---:|---:|";
    if (any_gbps) md << " GB/s |", rule += "---:|";
    if (any_gflops) md << " GFLOP/s |", rule += "---:|";
    if (any_pct) md << " % of limit | limit |", rule += "---:|---|";
    if (any_naive) md << " × naive |", rule += "---:|";
    for (const auto& o : others) md << " " << detail::cell(o) << " |", rule += "---:|";
    md << "\n" << rule << "\n";
    for (const auto* r : rows) {
      md << "| `" << detail::cell(r->settings_text()) << "` | " << r->threads << " | ";
      if (!r->error.empty()) {
        md << "failed: " << detail::cell(r->error) << " |";
        const std::size_t cols = (any_gbps ? 1 : 0) + (any_gflops ? 1 : 0) +
                                 (any_pct ? 2 : 0) + (any_naive ? 1 : 0) + others.size();
        for (std::size_t i = 0; i < cols; ++i) md << " |";
        md << "\n";
        continue;
      }
      md << format_time(r->time, r->time_unit) << " |";
      auto num = [&](const std::string& k) {
        const auto v = r->counter(k);
        md << " " << (v ? format_number(*v) : "-") << " |";
      };
      if (any_gbps) num("GBps");
      if (any_gflops) num("GFLOPs");
      if (any_pct) {
        const auto j = judge(*r, run);
        md << " " << (j ? format_number(j->pct) : "-") << " | " << (j ? j->limit : "-") << " |";
      }
      if (any_naive) num("x_naive");
      for (const auto& o : others) num(o);
      md << "\n";
    }
    md << "\n";
  }
  return md.str();
}

// Every figure this run has data for.
inline std::vector<plot> plots(const run_data& run) {
  std::vector<plot> out;
  for (auto p : {roofline_plot(run), decode_kv_plot(run), pyramid_plot(run), generate_plot(run)}) {
    if (p) out.push_back(std::move(*p));
  }
  return out;
}

// Writes <dir>/report.md and <dir>/plots/<name>.{dat,gp}; returns the plots written. Render
// them from <dir>: `gnuplot plots/<name>.gp` draws <dir>/<name>.png.
inline std::vector<plot> write_report(const run_data& run, const fs::path& dir) {
  fs::create_directories(dir / "plots");
  const auto figures = plots(run);
  for (const auto& p : figures) {
    std::ofstream(dir / "plots" / (p.name + ".dat")) << p.data;
    std::ofstream(dir / "plots" / (p.name + ".gp")) << p.script;
  }
  std::ofstream out(dir / "report.md");
  out << markdown(run, figures);
  if (!out) throw std::runtime_error("cannot write " + (dir / "report.md").string());
  return figures;
}

}  // namespace npullm::bench_report
