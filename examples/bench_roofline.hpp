// npullm_bench's figures against the machine (bench.cpp is the program): what a test must read
// and compute per token, from the model's shape and the forms of the weights the pipeline reads,
// and the limits that bound it, measured in this process by benchmarks/machine_limits.hpp (the
// code `make bench`'s binaries use): the read loop's GB/s and the dot-product peak of the
// weights' kind, at the test's thread count. A part of bench.cpp, included by it alone.
//
// A test of T tokens at depth D (ppT: one pass of T rows; tgT: T passes of one row), per token:
//   bytes = weights a pass reads x passes / T + K and V read / T
//     the weights in the form the pipeline reads: its tiles or panels where it packed a matrix
//     (lm.packed_bytes(), shared among the packed matrices by their stored bytes), else as stored
//     in the file; a mixture's experts k of n (on average), its router; the LM head; not the
//     embedding (one row a token), norms, biases or activations (KiB a pass);
//     K and V: a decode step at context c reads c positions (step i of tgT: c = D + i + 1; a
//     windowed layer its last w), a prefill at least each of its D + T positions once
//   flops = 2 x the parameters a token multiplies in the layers (experts k of n, the router)
//     + 2 x vocab x hidden x passes / T (the LM head: each decode step, a prefill's last row)
//     + 4 x heads x head_dim x the keys a query sees on average (QK^T and PV)
// GB/s = bytes x t/s and GFLOP/s = flops x t/s are lower bounds of what the kernels did (a
// prefill's attention reads K and V once per tile of queries, a GEMM its weights once per tile
// of rows), so a decode near 100 % of the read loop is as fast as this machine reads memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "machine_limits.hpp"  // benchmarks/ (npullm::bench::limits_for)
#include "npullm/core/dtype.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/quant_linear.hpp"

namespace npullm_bench {

using npullm::bench::machine_limits;

// One forward pass of a model, apart from its attention, and its attention's shape.
struct model_work {
  double pass_weight_bytes = 0;  // the weights one pass reads (the LM head included)
  double token_params = 0;       // parameters the layers multiply per token (the router too)
  double head_params = 0;        // the LM head's vocab x hidden, multiplied once a pass
  std::size_t heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<std::size_t> windows;  // [layers]: 0 (full attention) or the window
  std::string peak = "f32";          // whose peak bounds the products: int8, bf16 or f32
};

// Which matrices the pipeline copies (causal_lm_build.hpp, pack_weights; projection.hpp's
// project() then reads the copy, at every step size): `automatic` tiles the quantized ones that
// have a tiled layout (the LM head too) and packs the layers' dense ones into panels where that
// pays (ops::packing_pays: not bf16 with AVX-512 BF16); `on` packs every layer's matrix into
// panels (quantized ones into int8 panels), not the LM head; `off` none.
template <class W>
bool packed_by_pipeline(const model::projection<W>& p, bool lm_head, model::weight_packing how) {
  switch (how) {
    case model::weight_packing::off: return false;
    case model::weight_packing::on: return !lm_head;
    case model::weight_packing::automatic: break;
  }
  if (p.is_quantized())
    return npullm::ops::has_repacked_layout(p.quantized->format) && p.cols() % 32 == 0;
  return !lm_head && npullm::ops::packing_pays<W>();
}

// The work of one pass of `w` through a pipeline that packed `packed_bytes` of copies `how`.
template <class W>
model_work work_of(const model::model_weights<W>& w, model::weight_packing how,
                   std::size_t packed_bytes) {
  const auto& c = w.config();
  model_work m;
  m.heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim;
  for (std::size_t l = 0; l < c.num_hidden_layers; ++l) m.windows.push_back(c.window(l));
  // fn(matrix, share of the tokens that read it, whether it is the LM head), for every matrix a
  // pass reads; an expert's share is k / n.
  const double expert_share = c.moe.experts == 0 ? 1.0
                                                 : static_cast<double>(c.moe.experts_per_token) /
                                                       static_cast<double>(c.moe.experts);
  auto each_matrix = [&](auto&& fn) {
    for (const auto& l : w.layers) {
      auto is_expert = [&](const model::projection<W>& p) {
        for (const auto* v : {&l.moe.gate, &l.moe.up, &l.moe.down})
          if (!v->empty() && &p >= v->data() && &p < v->data() + v->size()) return true;
        return false;
      };
      model::for_each_projection(l, [&](const model::projection<W>& p) {
        fn(p, is_expert(p) ? expert_share : 1.0, false);
      });
    }
    fn(w.lm_head, 1.0, true);
  };
  double copied_stored = 0;  // the stored bytes of the packed matrices, every expert's
  if (packed_bytes > 0) {
    each_matrix([&](const model::projection<W>& p, double, bool head) {
      if (packed_by_pipeline(p, head, how)) copied_stored += static_cast<double>(p.bytes());
    });
  }
  const double ratio = copied_stored > 0 ? static_cast<double>(packed_bytes) / copied_stored : 1.0;
  double quantized_params = 0;
  each_matrix([&](const model::projection<W>& p, double share, bool head) {
    const double stored = static_cast<double>(p.bytes());
    const double read =
        packed_bytes > 0 && packed_by_pipeline(p, head, how) ? stored * ratio : stored;
    m.pass_weight_bytes += share * read;
    const double params = share * static_cast<double>(p.rows() * p.cols());
    (head ? m.head_params : m.token_params) += params;
    if (p.is_quantized()) quantized_params += params;
  });
  for (const auto& l : w.layers) {  // the router: f32, every expert's row for every token
    m.pass_weight_bytes += static_cast<double>(l.moe.router.size() * sizeof(float));
    m.token_params += static_cast<double>(l.moe.router.size());
  }
  if (2 * quantized_params > m.token_params + m.head_params) {
    m.peak = "int8";  // the quantized kernels' integer dot products
  } else if constexpr (npullm::dtype_of<W> == npullm::dtype::bf16) {
    m.peak = "bf16";
  }
  return m;
}

// Sum over contexts c = a .. b of min(c, window) (window 0: c): the keys the queries at those
// contexts see.
inline double keys_seen(std::size_t a, std::size_t b, std::size_t window) {
  auto sum = [](double lo, double hi) { return hi < lo ? 0.0 : (lo + hi) * (hi - lo + 1) / 2; };
  if (window == 0 || b <= window) return sum(static_cast<double>(a), static_cast<double>(b));
  if (a > window) return static_cast<double>(window) * static_cast<double>(b - a + 1);
  return sum(static_cast<double>(a), static_cast<double>(window)) +
         static_cast<double>(window) * static_cast<double>(b - window);
}

// K and V bytes of one position's element pair in llama.cpp's KV types (q8_0: 34 bytes a block
// of 32, q4_0: 18).
inline double kv_element_bytes(const std::string& type) {
  if (type == "f32") return 4;
  if (type == "q8_0") return 34.0 / 32;
  if (type == "q4_0") return 18.0 / 32;
  return 2;  // f16, bf16
}

// Per token of one test (the header's formulas).
struct test_work {
  double weight_bytes = 0, kv_bytes = 0, flops = 0;
};

inline test_work work_of_test(const model_work& m, std::size_t prompt, std::size_t gen,
                              std::size_t depth, const options& o) {
  const std::size_t tokens = prompt > 0 ? prompt : gen;
  const double t = static_cast<double>(tokens), passes = prompt > 0 ? 1.0 : t;
  const double kv_position = static_cast<double>(m.kv_heads * m.head_dim) *
                             (kv_element_bytes(o.type_k) + kv_element_bytes(o.type_v));
  double keys = 0, kv_read = 0;
  for (const std::size_t w : m.windows) {
    const double seen = keys_seen(depth + 1, depth + tokens, w);
    keys += seen;
    kv_read += prompt > 0
                   ? static_cast<double>(w == 0 ? depth + tokens : std::min(depth + tokens, w))
                   : seen;
  }
  return {.weight_bytes = m.pass_weight_bytes * passes / t,
          .kv_bytes = kv_read * kv_position / t,
          .flops = 2 * m.token_params + 2 * m.head_params * passes / t +
                   4.0 * static_cast<double>(m.heads * m.head_dim) * keys / t};
}

// The peak of a kind in GFLOP/s (int8: GOP/s, 2 a multiply-add); where the build measured none
// (no AVX-512 BF16, a portable build without int8 kernels) the f32 FMA peak, the kernels' then.
inline double peak_gflops(const machine_limits& l, std::string& kind) {
  if (kind == "int8" && l.int8_gops > 0) return l.int8_gops;
  if (kind == "bf16" && l.bf16_gflops > 0) return l.bf16_gflops;
  kind = "f32";
  return l.fma_gflops;
}

// "read 28.1 GB/s, f32 118, bf16 235, int8 470 GFLOP/s" for the footer.
inline std::string describe_limits(const machine_limits& l) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "%zu thread%s: read %.1f GB/s, f32 FMA %.0f, bf16 dot %.0f, int8 dot %.0f GFLOP/s",
                l.threads, l.threads == 1 ? "" : "s", l.read_gbps, l.fma_gflops, l.bf16_gflops,
                l.int8_gops);
  return buf;
}

}  // namespace npullm_bench
