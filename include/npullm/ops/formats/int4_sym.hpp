// int4_sym: npullm's NPU layout, 4-bit symmetric codes with the scales in a tensor of their own.
//
// As int8_sym with 4-bit two's-complement q in [-8, 7], two per byte: row n is ceil(K / 2)
// bytes, element 2i in the LOW nibble of byte i, element 2i + 1 in the high nibble (an odd K
// leaves the last high nibble 0). The order OpenVINO's i4 uses.
// Quantizer (ops/quantize.hpp, shared with int8_sym): per group scale = absmax / 7, q =
// round(x / scale), in [-7, 7] (an f16 scale rounded up where rounding to nearest would put an
// element past 7).
// Tile: int8_sym's scales ahead of the units; a unit is one piece: q4_0's nibbles without the d
// (16 R bytes; u = q + 8). Bytes: the source's.
#pragma once

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::int4_sym> {
  static constexpr std::string_view name = "int4_sym";
  static constexpr int gguf_type = -1;
  static constexpr std::size_t block_values = 1, block_bytes = 0, code_bits = 4;
  static constexpr piece_layout pieces{false, false, false, 8};
  static constexpr int code_offset = 8;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 16, tile_head_bytes = 0;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::int4_sym> {
  static constexpr int max_code = 7;
  static int code(const std::uint8_t* row, std::size_t k) noexcept {
    const std::uint8_t b = row[k / 2];
    return k % 2 == 0 ? static_cast<std::int8_t>(b << 4) >> 4 : static_cast<std::int8_t>(b) >> 4;
  }
  static void store_code(std::uint8_t* row, std::size_t k, int q) noexcept {
    const auto nib = static_cast<std::uint8_t>(q & 0xF);
    row[k / 2] = static_cast<std::uint8_t>(row[k / 2] | (k % 2 == 0 ? nib : nib << 4));
  }
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* p = row + j * 16;
    for (int i = 0; i < 16; ++i) {
      out.q[2 * i] = static_cast<std::int8_t>(static_cast<std::int8_t>(p[i] << 4) >> 4);
      out.q[2 * i + 1] = static_cast<std::int8_t>(static_cast<std::int8_t>(p[i]) >> 4);
    }
  }
  static void pack(const tile_writer& t) noexcept {
    t.put_nibbles(t.unit, [&](std::size_t v) { return t.pc.q[v] + 8; });
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
