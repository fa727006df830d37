// Decoding the quantized weight formats (ops/quant_format.hpp): a 32-value piece of a row as
// integer codes and float factors (decode_piece, what the kernels' packing and the reference
// share; each format's own in ops/formats/<name>.hpp) and the dequantize-to-f32 reference, which
// gives ggml's floats bit for bit (the same products, never fused into an FMA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::ops {

// The quantizers, the dequantizers and the block decoding the kernels share: numeric loops the
// compiler vectorizes (and contracts into FMAs) per ISA, so they are the ISA's (core/isa.hpp).
inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// One 32-value piece of row n, piece j (values 32j .. 32j + 31), as signed integer codes q and
// float factors with value[i] = scale[i / 16] * q[i] - offset[i / 16] (each format's decode in
// ops/formats/<name>.hpp; its factors as piece_layout_of gives them). Symmetric formats need
// K % 32 == 0 and G % 32 == 0 here (the piece lies in one group).
inline void decode_piece(const quantized_view& w, std::size_t n, std::size_t j,
                         piece& out) noexcept {
  const auto* row = reinterpret_cast<const std::uint8_t*>(w.data.data() + n * w.row_bytes());
  out.offset[0] = out.offset[1] = 0.0f;
  visit_format(w.format, [&]<weight_format F>(format_constant<F>) {
    format_codec<F>::decode(row, j, out);
    if constexpr (format_layout<F>::block_bytes == 0) {  // the scale from the scales tensor
      out.scale[0] = out.scale[1] = w.scale(n, j * 32 / w.group);
    }
  });
}

}  // namespace quant_detail

// Row n of W as f32 (out: K values), exactly as the format defines each value.
inline void dequantize_row(const quantized_view& w, std::size_t n, std::span<float> out) {
  if (n >= w.rows || out.size() != w.cols) {
    raise(error_code::invalid_shape, "dequantize_row: row ", n, " of ", w.rows, " into ",
          out.size(), " values (want ", w.cols, ")");
  }
  if (!is_block_format(w.format)) {  // any K, any group: element by element
    const auto* u8 = reinterpret_cast<const std::uint8_t*>(w.data.data() + n * w.row_bytes());
    visit_format(w.format, [&]<weight_format F>(format_constant<F>) {
      if constexpr (format_layout<F>::block_bytes == 0) {
        for (std::size_t k = 0; k < w.cols; ++k) {
          const int q = quant_detail::format_codec<F>::code(u8, k);
          out[k] = static_cast<float>(q) * w.scale(n, k / w.group);
        }
      }
    });
    return;
  }
  quant_detail::piece p;
  for (std::size_t j = 0; j < w.cols / 32; ++j) {
    quant_detail::decode_piece(w, n, j, p);
    for (std::size_t i = 0; i < 32; ++i) {
      const float v = quant_detail::product(p.scale[i / 16], static_cast<float>(p.q[i]));
      out[32 * j + i] = piece_layout_of(w.format).offset ? v - p.offset[i / 16] : v;
    }
  }
}

// W as f32: out (N, K).
inline void dequantize(const quantized_view& w, dense_view<float, 2> out) {
  if (out.extent(0) != w.rows || out.extent(1) != w.cols) {
    raise(error_code::invalid_shape, "dequantize: ", to_string(w.format), " [", w.rows, ", ",
          w.cols, "] into ", npullm::detail::format_extents(out.extents()));
  }
  for (std::size_t n = 0; n < w.rows; ++n)
    dequantize_row(w, n, std::span<float>(out.data_handle() + n * w.cols, w.cols));
}

}  // namespace NPULLM_ISA_NAMESPACE

}  // namespace npullm::ops
