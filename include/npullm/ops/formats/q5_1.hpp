// q5_1: llama.cpp's 5-bit blocks with a min (GGUF type 7).
//
// Block: 32 values, 24 bytes: [0..1] f16 d | [2..3] f16 m | [4..7] u32 qh | [8..23] b[16];
//   q as q5_0's (the nibble and bit i of qh as bit 4), value = q * d + m.
// Quantizer: q4_1's with 31 levels (d = (max − min) / 31).
// Tile unit (one piece, R rows): f16 d[R], f16 m[R], then q5_0's nibbles and high bits of
// u = the code. 24 R bytes (the file's).
#pragma once

#include "npullm/ops/formats/q4_1.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q5_1> {
  static constexpr std::string_view name = "q5_1";
  static constexpr int gguf_type = 7;
  static constexpr std::size_t block_values = 32, block_bytes = 24;
  static constexpr piece_layout pieces{false, true, false, 31};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 24, tile_head_bytes = 4;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q5_1> : min_block<true> {};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
