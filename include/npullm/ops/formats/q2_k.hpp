// q2_k: llama.cpp's 2-bit K-quant super-blocks (GGUF type 10).
//
// Super-block: 256 values (16 sub-blocks of 16), 84 bytes: [0..15] uint8 s[16] (low nibble:
// scale, high nibble: min of sub-block e / 16) | [16..79] uint8 qs[64] | [80..81] f16 d |
// [82..83] f16 dmin; q as q3_k's low two bits (0..3), value = (d * (s & 0xF)) * q - (dmin * (s >>
// 4)) Quantizer: q3_k's (ops/formats/q3_k.hpp) with a min: per sub-block the least-squares scale
// and min, both rounded to 4 bits against d = the largest scale / 15 and dmin = the largest min
// / 15. Tile unit (one super-block, R rows): f16 d[R], f16 dmin[R], u8 sm[16][R] (the file's bytes:
// scale | min << 4, one a half piece), then per piece q3_k's two planes of 2-bit pairs; u = q
// (0..3). 84 R bytes (the file's).
#pragma once

#include "npullm/ops/formats/q3_k.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q2_k> {
  static constexpr std::string_view name = "q2_k";
  static constexpr int gguf_type = 10;
  static constexpr std::size_t block_values = 256, block_bytes = 84;
  static constexpr piece_layout pieces{true, true, true, 3};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 84, tile_head_bytes = 20;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q2_k> : k16_block<false> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::size_t sub = j % 8;
    const std::uint8_t* b = row + (j / 8) * 84;
    const float d = load_f16(b + 80), dmin = load_f16(b + 82);
    for (std::size_t h = 0; h < 2; ++h) {
      const std::uint8_t sc = b[2 * sub + h];
      out.scale[h] = d * static_cast<float>(sc & 0xF);
      out.offset[h] = product(dmin, static_cast<float>(sc >> 4));
    }
    const std::uint8_t* q = b + 16 + 32 * (sub / 4);
    const int shift = 2 * static_cast<int>(sub % 4);
    for (int i = 0; i < 32; ++i) out.q[i] = static_cast<std::int8_t>((q[i] >> shift) & 3);
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
