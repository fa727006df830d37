// test_isa_mix: what each ISA's copy of kernels.cpp is given and what it computed. Plain types
// only: the copies' npullm types differ per ISA (core/isa.hpp), these cross between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace isa_mix {

using bytes = std::vector<std::uint8_t>;

// The quantized formats every copy runs: two 32-value formats and two k-quants, all four with a
// tiled layout (ops::repack), so that each copy runs its GEMV, GEMM, packed and tiled kernels.
inline constexpr std::string_view quant_formats[] = {"q8_0", "q4_0", "q4_k", "q6_k"};
inline constexpr std::size_t quant_k = 256;  // K of the quantized linear: one k-quant super-block
// The quantized linear's paths, in the order of mix_result::quant_linear's entries per format.
inline constexpr std::string_view quant_paths[] = {"gemv", "gemm", "packed gemm", "tiles gemv",
                                                   "tiles gemm"};
// KV formats of the attention over quantized KV, in the order of mix_result::kv_attention.
inline constexpr std::string_view kv_formats[] = {"q8_0", "q4_0", "k q8_0 / v q4_0"};
inline constexpr std::size_t kv_heads = 2, q_heads = 4, head_dim = 64;

struct mix_input {
  std::span<const float> x, w;    // f32 linear: x (m, 64), w (n, 64); attention: q = k = v = x
  std::span<const float> xq, wq;  // quantized linear: x (mq, quant_k), w (nq, quant_k)
  // wq in each of quant_formats, quantized once (by main.cpp), so that every copy's kernels
  // read the same bytes.
  std::vector<bytes> weights;
  // Quantized attention: queries (q_heads, q_rows, head_dim) at the last q_rows of kv_rows
  // positions (causal) over kv_rows keys of (kv_heads, kv_rows, head_dim) f32 K and V, and the
  // same K and V as q8_0 and q4_0 units (kv::quantize_row, by main.cpp).
  std::size_t q_rows = 0, kv_rows = 0;
  std::span<const float> q, k, v;
  bytes k_q8_0, v_q8_0, k_q4_0, v_q4_0;
};

struct mix_result {
  std::string_view isa;
  std::vector<float> linear, attention;         // f32: ops::linear, flash attention over f32 KV
  std::vector<bytes> quantized;                 // ops::quantize(wq) per quant_formats, by this copy
  std::vector<std::vector<float>> dequantized;  // ops::dequantize of input.weights
  std::vector<std::vector<float>> quant_linear;  // per format, per quant_paths: y (rows, nq)
  bytes k_q8_0, k_q4_0;                          // kv::quantize_row of input.k, by this copy
  std::vector<float> k_q8_0_back, k_q4_0_back;   // kv::dequantize_row of input.k_q8_0 / _q4_0
  std::vector<std::vector<float>> kv_attention;  // per kv_formats: flash attention's output
  // The other ops over `linear` (m, n) and x: ops::softmax of linear, ops::argmax of its rows,
  // ops::gather of rows 3, 0, 3 of w as f16 and of input.weights[q4_k], ops::apply_rope of x
  // as (m, 1, 64) at positions 0 .. m - 1.
  std::vector<float> softmax, gathered, rope;
  std::vector<std::int32_t> argmax;
};

mix_result run_native(const mix_input& in);
mix_result run_avx2(const mix_input& in);
mix_result run_baseline(const mix_input& in);

}  // namespace isa_mix
