// int8_sym: npullm's NPU layout, 8-bit symmetric codes with the scales in a tensor of their own.
//
// data (N, K) int8 row-major; scales (N, K / G) row-major, f16 or f32; value[n][k] = q[n][k] *
// scale[n][k / G]. G = 32, 64, 128, or K (one group per output channel).
// Quantizer (ops/quantize.hpp, shared with int4_sym): per group scale = absmax / 127, q =
// round(x / scale) (an f16 scale rounded up to the next f16 where rounding to nearest would make
// |x| / scale exceed 127).
// Tile: the R rows' scales group by group in the source's type ([K / G][R]) ahead of the units;
// a unit is one piece: q8_0's codes without the d (32 R bytes). Bytes: the source's.
#pragma once

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::int8_sym> {
  static constexpr std::string_view name = "int8_sym";
  static constexpr int gguf_type = -1;
  static constexpr std::size_t block_values = 1, block_bytes = 0, code_bits = 8;
  static constexpr piece_layout pieces{false, false, false, 127};
  static constexpr int code_offset = 128;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 32, tile_head_bytes = 0;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::int8_sym> {
  static constexpr int max_code = 127;
  static int code(const std::uint8_t* row, std::size_t k) noexcept {
    return static_cast<std::int8_t>(row[k]);
  }
  static void store_code(std::uint8_t* row, std::size_t k, int q) noexcept {
    row[k] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
  }
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    std::memcpy(out.q, row + j * 32, 32);
  }
  static void pack(const tile_writer& t) noexcept { t.put_bytes(t.unit); }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
