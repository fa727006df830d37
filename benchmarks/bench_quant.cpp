// Quantized linear benchmarks (ops/quant_linear.hpp; names and counters as in shared/DESIGN.md):
// the Qwen2-0.5B MLP projection K = 896, N = 4864 (super-block types: K = 1024, the nearest
// multiple of 256), weights of every format: q8_0, q4_0, q4_k, q6_k, int4_sym with group 128
// (f16 scales), and the other GGUF types (q4_1, q5_0, q5_1, iq4_nl, q5_k, q3_k, q2_k, iq4_xs;
// those without tiles, has_repacked_layout (int8_sym, int4_sym): GEMV and GEMM over the view
// only, no m4 rows).
//   m1 .../cold: GEMV; GBps over the quantized bytes (data + scales) and pct_bw (% of the read
//           bandwidth measured in this process); "cold" rotates over enough weight copies to
//           pass 128 MiB, as bench_ops does.
//   m512: GEMM; GFLOPs (2 M N K) and pct_peak (% of the int8 dot-product peak measured with
//           the kernels' own instructions, machine_limits.hpp int8_gops). Plain AVX2 builds: the
//           peak loop is vpmaddubsw + vpmaddwd + vpaddd per 32 multiply-adds, while the 4-bit
//           GEMMs add 8 vpmaddubsw results in i16 before one vpmaddwd, so they can pass 100%
//           (the bound for any vpmaddubsw kernel is about twice that peak).
//   m512/.../packed: the same GEMM over ops::pack(W) (panels decoded once, at load: each call
//           runs only the micro-kernel); the plain m512 rows decode W's panels in every call.
//   .../repacked: over ops::repack(W) (tiles of 16 or 8 rows, made at load; every M reads them);
//           also m4 (a batch of 4 decode rows), the MLP's down projection k4864/n896 and an LM
//           head n151936 (q8_0, q6_k).
//   x_naive: speedup over the naive route in the same binary: dequantize W to f32 (the
//           reference), then ops::linear over f32 weights.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"

namespace {

namespace nb = npullm::bench;
using npullm::ops::weight_format;

struct format_case {
  const char* name;
  weight_format format;
  std::size_t group;
  std::size_t k;
};

// q4_k, q6_k: random super-blocks with small f16 scales (kept from before they had quantizers:
// the figures stay comparable); every other format through ops::quantize.
npullm::ops::quantized_matrix make_weights(const format_case& f, std::size_t n, std::mt19937& rng,
                                           std::vector<std::byte>& raw,
                                           npullm::ops::quantized_view& view) {
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  if (f.format == weight_format::q4_k || f.format == weight_format::q6_k) {
    raw.resize(n * npullm::ops::row_bytes(f.format, f.k));
    for (auto& b : raw) b = static_cast<std::byte>(rng() & 0xFF);
    const std::size_t bb = npullm::ops::block_bytes(f.format);
    for (std::size_t blk = 0; blk < raw.size() / bb; ++blk) {
      const std::uint16_t bits = npullm::float16(1e-3f).bits();
      if (f.format == weight_format::q4_k) {
        for (int h = 0; h < 2; ++h) std::memcpy(raw.data() + blk * bb + 2 * h, &bits, 2);
      } else {
        std::memcpy(raw.data() + blk * bb + 208, &bits, 2);
      }
    }
    view = npullm::ops::quantized_view(f.format, n, f.k, raw);
    return {};
  }
  std::vector<float> w(n * f.k);
  for (float& v : w) v = u(rng);
  auto q = npullm::ops::quantize(npullm::dense_view<const float, 2>(w.data(), n, f.k), f.format,
                                 f.group, npullm::dtype::f16);
  view = q.view();
  return q;
}

enum class layout { view, packed, repacked };

void quant_benchmark(benchmark::State& state, format_case f, std::size_t m, std::size_t n,
                     bool cold, std::size_t threads, layout lay) {
  const std::size_t k = f.k;
  const bool packed = lay == layout::packed, repacked = lay == layout::repacked;
  std::mt19937 rng(1);
  std::vector<std::byte> raw0;
  npullm::ops::quantized_view v0;
  auto q0 = make_weights(f, n, rng, raw0, v0);
  const double bytes = static_cast<double>(v0.data.size() + v0.scales.size());
  const std::size_t copies =
      cold ? std::max<std::size_t>(1, static_cast<std::size_t>(128.0 * (1 << 20) / bytes) + 1) : 1;
  std::vector<npullm::ops::quantized_matrix> owned;
  std::vector<std::vector<std::byte>> raws(copies);
  std::vector<npullm::ops::quantized_view> views(copies);
  views[0] = v0;
  for (std::size_t c = 1; c < copies; ++c) {
    // Copies of the first one's bytes (GGUF blocks hold their scales): quantizing ~50 copies
    // anew takes minutes with the IQ4 search.
    if (f.format != weight_format::int4_sym && f.format != weight_format::int8_sym) {
      raws[c].assign(v0.data.begin(), v0.data.end());
      views[c] = npullm::ops::quantized_view(f.format, n, k, raws[c]);
    } else {
      owned.push_back(make_weights(f, n, rng, raws[c], views[c]));
    }
  }
  npullm::tensor<float, 2> x(m, k), y(m, n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  const auto& pool = nb::pool_for(threads);
  std::size_t next = 0;
  std::vector<npullm::ops::packed_quantized> packs;
  if (packed) {
    for (const auto& v : views) packs.push_back(npullm::ops::pack(v, pool));
  }
  std::vector<npullm::ops::repacked_quantized> tiles;
  if (repacked) {
    for (const auto& v : views) tiles.push_back(npullm::ops::repack(v, pool));
  }
  const double seconds = nb::timed_loop(state, [&] {
    if (repacked) {
      npullm::ops::linear(x.view(), tiles[next++ % copies], y.view(), {}, pool);
    } else if (packed) {
      npullm::ops::linear(x.view(), packs[next++ % copies], y.view(), {}, pool);
    } else {
      npullm::ops::linear(x.view(), views[next++ % copies], y.view(), {}, pool);
    }
    benchmark::DoNotOptimize(y.data());
  });
  if (m <= 16) {
    nb::set_bandwidth_counters(state, bytes, seconds, threads);
  } else {
    const double gops = 2.0 * static_cast<double>(m * n * k) / seconds / 1e9;
    state.counters["GFLOPs"] = gops;
    const auto& lim = nb::limits_for(threads);
    const double peak = lim.int8_gops > 0 ? lim.int8_gops : lim.fma_gflops;
    state.counters["pct_peak"] = 100.0 * gops / peak;
    state.counters["peak_GFLOPs"] = peak;
  }
  // Naive: dequantize (the reference), then the f32 linear, per call.
  npullm::tensor<float, 2> wf(n, k);
  state.counters["x_naive"] =
      nb::median_seconds(3,
                         [&] {
                           npullm::ops::dequantize(v0, wf.view());
                           npullm::ops::linear<float>(x.view(), wf.view(), y.view(), {}, pool);
                         }) /
      seconds;
  state.SetLabel(std::string(npullm::ops::NPULLM_ISA_NAMESPACE::detail::quant_dot_name()));
}

}  // namespace

int main(int argc, char** argv) {
  const format_case formats[] = {{"q8_0", weight_format::q8_0, 0, 896},
                                 {"q4_0", weight_format::q4_0, 0, 896},
                                 {"q4_k", weight_format::q4_k, 0, 1024},
                                 {"q6_k", weight_format::q6_k, 0, 1024},
                                 {"int4_g128", weight_format::int4_sym, 128, 896},
                                 {"q4_1", weight_format::q4_1, 0, 896},
                                 {"q5_0", weight_format::q5_0, 0, 896},
                                 {"q5_1", weight_format::q5_1, 0, 896},
                                 {"iq4_nl", weight_format::iq4_nl, 0, 896},
                                 {"q5_k", weight_format::q5_k, 0, 1024},
                                 {"q3_k", weight_format::q3_k, 0, 1024},
                                 {"q2_k", weight_format::q2_k, 0, 1024},
                                 {"iq4_xs", weight_format::iq4_xs, 0, 1024}};
  const char* names[] = {"", "/packed", "/repacked"};
  const auto add = [&](const format_case& f, std::size_t m, std::size_t n, layout lay) {
    for (const std::size_t threads : nb::thread_counts()) {
      const bool cold = m <= 16;
      const std::string name = "linear/m" + std::to_string(m) + "/k" + std::to_string(f.k) + "/n" +
                               std::to_string(n) + "/" + f.name + (cold ? "/cold" : "") +
                               names[static_cast<int>(lay)] + "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), quant_benchmark, f, m, n, cold, threads, lay)
          ->Unit(benchmark::kMicrosecond);
    }
  };
  for (const std::size_t m : {1u, 4u, 512u}) {
    for (const layout lay : {layout::view, layout::packed, layout::repacked}) {
      if (m <= 16 && lay == layout::packed) continue;  // GEMV reads the source view either way
      for (const auto& f : formats) {
        if (lay == layout::repacked && !npullm::ops::has_repacked_layout(f.format)) continue;
        // m4: the formats with tiles (its point is view vs tiles at a few decode rows).
        if (m == 4 && !npullm::ops::has_repacked_layout(f.format)) continue;
        add(f, m, 4864, lay);
      }
    }
  }
  // The MLP's down projection (K = 4864 = 19 q4_k super-blocks: q4_k / q6_k take K = 4864 too).
  for (const layout lay : {layout::view, layout::repacked}) {
    for (const auto& f : formats) {
      if (f.format == weight_format::int4_sym) continue;
      add({f.name, f.format, f.group, 4864}, 1, 896, lay);
    }
  }
  // An LM head: Qwen2's 151936-token vocabulary over hidden 896 (the Qwen2-0.5B files' tied
  // q8_0 head) and 1024 (the MoE files' q6_k / q8_0 output), over tiles: a decode step's biggest
  // matrix (a third to a half of its bytes).
  for (const auto& f : formats) {
    if (f.format != weight_format::q8_0 && f.format != weight_format::q6_k) continue;
    if (f.format == weight_format::q8_0) add(f, 1, 151936, layout::repacked);
    add({f.name, f.format, f.group, 1024}, 1, 151936, layout::repacked);
  }
  return npullm::bench::run_benchmarks(argc, argv);
}
