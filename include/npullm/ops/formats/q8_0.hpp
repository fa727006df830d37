// q8_0: llama.cpp's 8-bit blocks (GGUF type 8).
//
// Block: 32 values, 34 bytes: [0..1] f16 d | [2..33] int8 q[32]; value[i] = q[i] * d.
// Quantizer (llama.cpp's reference, the same blocks bit for bit): d = absmax / 127, codes
// x · (1 / d) rounded half away from zero; d is stored as f16 but the codes use the f32 d.
// Tile unit (one piece, R rows): f16 d[R]; for t in 0..7: R x 4 bytes u[4t + i], u = q + 128
// where the dot product takes u8 codes (VNNI), else q (the sign trick of AVX2's vpmaddubsw).
// 34 R bytes (the file's).
#pragma once

#include <algorithm>
#include <cmath>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q8_0> {
  static constexpr std::string_view name = "q8_0";
  static constexpr int gguf_type = 8;
  static constexpr std::size_t block_values = 32, block_bytes = 34;
  static constexpr piece_layout pieces{false, false, false, 127};
  static constexpr int code_offset = 128;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 34, tile_head_bytes = 2;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q8_0> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * 34;
    out.scale[0] = out.scale[1] = load_f16(b);
    std::memcpy(out.q, b + 2, 32);
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, float16(d));
    for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<std::uint8_t>(std::lround(x[i] * id));
  }
  static void pack(const tile_writer& t) noexcept {
    t.put_f16(t.unit + 2 * t.r, t.pc.scale[0]);
    t.put_bytes(t.unit + 2 * t.R);
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
