// q5_0: llama.cpp's 5-bit blocks (GGUF type 6).
//
// Block: 32 values, 22 bytes: [0..1] f16 d | [2..5] u32 qh | [6..21] uint8 b[16];
//   q[i] = (b[i] & 0xF) | bit i of qh << 4, q[i + 16] = (b[i] >> 4) | bit i + 16 of qh << 4,
//   value = (q - 16) * d.
// Quantizer: q4_0's with 16 levels a side (d = −extreme / 16).
// Tile unit (one piece, R rows): f16 d[R], q4_0's nibbles of u's low 4 bits, then R x 4 bytes of
// high bits: bit c of byte i = bit 4 of u[4c + i] (chunk c = 0..7); u = q + 16 (0..31).
// 22 R bytes (the file's).
#pragma once

#include "npullm/ops/formats/q4_0.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q5_0> {
  static constexpr std::string_view name = "q5_0";
  static constexpr int gguf_type = 6;
  static constexpr std::size_t block_values = 32, block_bytes = 22;
  static constexpr piece_layout pieces{false, false, false, 16};
  static constexpr int code_offset = 16;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 22, tile_head_bytes = 2;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q5_0> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * 22;
    out.scale[0] = out.scale[1] = load_f16(b);
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const std::uint8_t* nib = b + 6;
    for (int i = 0; i < 16; ++i) {
      out.q[i] = static_cast<std::int8_t>(((nib[i] & 0xF) | (((qh >> i) & 1) << 4)) - 16);
      out.q[i + 16] =
          static_cast<std::int8_t>(((nib[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
    }
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    quantize_extreme_block<true>(x, b);
  }
  static void pack(const tile_writer& t) noexcept {
    t.put_f16(t.unit + 2 * t.r, t.pc.scale[0]);
    const auto code = [&](std::size_t v) { return t.pc.q[v] + 16; };
    t.put_nibbles(t.unit + 2 * t.R, code);
    t.put_high_bits(t.unit + 18 * t.R, code);
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
