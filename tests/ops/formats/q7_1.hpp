// q7_1: a weight format test_format_extension.cpp adds from outside the library
// (NPULLM_EXTRA_WEIGHT_FORMATS, ops/formats/format_base.hpp), with no kernels of its own.
//
// Block: 32 values, 36 bytes: [0..1] f16 d | [2..3] f16 m | [4..35] uint8 q[32] (0..127);
// value[i] = q[i] * d + m. Quantizer: d = (max − min) / 127, m = min, codes (x − min) / d
// rounded half up, d and m stored as f16 (the codes use the f32 d).
#pragma once

#include <algorithm>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q7_1> {
  static constexpr std::string_view name = "q7_1";
  static constexpr int gguf_type = -1;
  static constexpr std::size_t block_values = 32, block_bytes = 36;
  static constexpr piece_layout pieces{false, true, false, 127};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 0, tile_head_bytes = 0;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q7_1> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * 36;
    out.scale[0] = out.scale[1] = load_f16(b);
    out.offset[0] = out.offset[1] = -load_f16(b + 2);
    std::memcpy(out.q, b + 4, 32);
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float d = (hi - lo) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, float16(d));
    store_f16(b + 2, float16(lo));
    for (int i = 0; i < 32; ++i) {
      b[4 + i] =
          static_cast<std::uint8_t>(std::min(127, static_cast<int>((x[i] - lo) * id + 0.5f)));
    }
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
