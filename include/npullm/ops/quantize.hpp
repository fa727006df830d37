// Quantizers of the weight formats (ops/quant_format.hpp): quantize(w, format) turns an f32
// (N, K) matrix into an owning quantized_matrix.
//
// Each format's quantizer is in its header, ops/formats/<name>.hpp (round to nearest): the
// 32-value GGUF formats (q8_0, q4_0, q4_1, q5_0, q5_1) are llama.cpp's reference quantizers, the
// same blocks bit for bit; the K-quants and IQ4 fit each sub-block's scale (and min) by least
// squares over 21 candidate roundings (formats/sub_block_fit.hpp, fit_iq4), the factors rounded
// to the super-block's grid, then every value rounded to the nearest code under the stored
// factors (on llama.cpp's test model their squared error is 0.83-1.0 of llama-quantize's, no
// importance matrix). The symmetric formats quantize here, per group: scale = absmax / the
// largest code (int8_sym 127, int4_sym 7), q = round(x / scale); an f16 scale is rounded up to
// the next f16 where rounding to nearest would make |x| / scale exceed the largest code (every
// element within scale / 2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::ops {

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// An f16 scale >= s / 1 (rounded to nearest, then up one step if that fell below s), so that
// codes computed against it stay within range.
inline float16 f16_scale_at_least(float s) noexcept {
  float16 h(s);
  if (static_cast<float>(h) < s) h = float16::from_bits(static_cast<std::uint16_t>(h.bits() + 1));
  return h;
}

inline int round_code(float x, float inv, int lo, int hi) noexcept {
  const int q = static_cast<int>(std::nearbyint(x * inv));
  return std::clamp(q, lo, hi);
}

// One block of a GGUF format (block_values(f) values x) into its block_bytes(f) bytes b, as the
// format's quantizer rounds (ops/formats/<name>.hpp). Nothing for the symmetric formats (no
// blocks: quantize() quantizes their rows).
inline void quantize_block(weight_format f, const float* x, std::byte* b) noexcept {
  visit_format(f, [&]<weight_format F>(format_constant<F>) {
    if constexpr (format_layout<F>::block_bytes != 0) {
      format_codec<F>::quantize(x, reinterpret_cast<std::uint8_t*>(b));
    }
  });
}

}  // namespace quant_detail

// Quantizes w (N, K) f32 to `format` (see the top of this file). group and scale_type apply to
// *_sym only (group 32, 64, 128 or K; scale f16 or f32); K a multiple of the block
// (invalid_shape).
inline quantized_matrix quantize(dense_view<const float, 2> w, weight_format format,
                                 std::size_t group = 0, dtype scale_type = dtype::f16) {
  const std::size_t n = w.extent(0), k = w.extent(1);
  if (is_block_format(format) && k % block_values(format) != 0) {
    raise(error_code::invalid_shape, "quantize: ", to_string(format), " K = ", k,
          " is not a multiple of its block of ", block_values(format));
  }
  if (!is_block_format(format)) {
    if (group != 32 && group != 64 && group != 128 && group != k) {
      raise(error_code::invalid_argument, "quantize: ", to_string(format), " group ", group,
            " (want 32, 64, 128 or K = ", k, ")");
    }
    if (group == 0 || k % group != 0) {
      raise(error_code::invalid_shape, "quantize: ", to_string(format), " K = ", k,
            " is not a multiple of the group ", group);
    }
    if (scale_type != dtype::f16 && scale_type != dtype::f32) {
      raise(error_code::unsupported, "quantize: scale type ", to_string(scale_type),
            " (want f16 or f32)");
    }
  }
  const std::size_t rb = row_bytes(format, k);
  std::vector<std::byte> data(n * rb, std::byte{0});
  const float* src = w.data_handle();
  const auto ld = static_cast<std::size_t>(w.stride(0));
  if (w.stride(1) != 1) raise(error_code::unsupported, "quantize: rows of w must be dense");
  if (is_block_format(format)) {
    const std::size_t bb = block_bytes(format), bv = block_values(format);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < k / bv; ++j) {
        quant_detail::quantize_block(format, src + r * ld + bv * j, data.data() + r * rb + j * bb);
      }
    }
    return quantized_matrix(format, n, k, std::move(data));
  }
  const std::size_t groups = k / group, ss = size_of(scale_type);
  std::vector<std::byte> scales(n * groups * ss, std::byte{0});
  visit_format(format, [&]<weight_format F>(format_constant<F>) {
    if constexpr (format_layout<F>::block_bytes == 0) {
      using codec = quant_detail::format_codec<F>;
      for (std::size_t r = 0; r < n; ++r) {
        auto* row = reinterpret_cast<std::uint8_t*>(data.data() + r * rb);
        for (std::size_t g = 0; g < groups; ++g) {
          const float* x = src + r * ld + g * group;
          float amax = 0.0f;
          for (std::size_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
          float s = amax / static_cast<float>(codec::max_code);
          std::byte* sp = scales.data() + (r * groups + g) * ss;
          if (scale_type == dtype::f16) {
            const float16 h = quant_detail::f16_scale_at_least(s);
            quant_detail::store_f16(sp, h);
            s = static_cast<float>(h);
          } else {
            std::memcpy(sp, &s, 4);
          }
          const float inv = s != 0.0f ? 1.0f / s : 0.0f;
          for (std::size_t i = 0; i < group; ++i) {
            codec::store_code(
                row, g * group + i,
                quant_detail::round_code(x[i], inv, -codec::max_code, codec::max_code));
          }
        }
      }
    }
  });
  return quantized_matrix(format, n, k, std::move(data), std::move(scales), group, scale_type);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
