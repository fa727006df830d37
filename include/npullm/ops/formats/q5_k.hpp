// q5_k: llama.cpp's 5-bit K-quant super-blocks (GGUF type 13).
//
// Super-block: 256 values, 176 bytes: [0..1] f16 d | [2..3] f16 dmin | [4..15] scales and mins
// packed as q4_k's | [16..47] uint8 qh[32] | [48..175] b[128] as q4_k's nibbles; value i of
// sub-block j: q = nibble | (bit j of qh[i]) << 4 (0..31), value = (d * sc[j]) * q - (dmin * m[j]).
// Quantizer: q4_k's with 31 levels.
// Tile unit (one super-block, R rows): q4_k's unit, then per piece R x 4 bytes of high bits (bit
// t of byte i = bit 4 of u[4t + i]). 180 R bytes (file: 176 R).
#pragma once

#include "npullm/ops/formats/q4_k.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q5_k> {
  static constexpr std::string_view name = "q5_k";
  static constexpr int gguf_type = 13;
  static constexpr std::size_t block_values = 256, block_bytes = 176;
  static constexpr piece_layout pieces{false, true, false, 31};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 180, tile_head_bytes = 20;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q5_k> : k_min_block<true> {};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
