// iq4_xs: llama.cpp's 4-bit super-blocks on iq4_nl's grid (GGUF type 23).
//
// Super-block: 256 values, 136 bytes: [0..1] f16 d | [2..3] u16 sh | [4..7] sl[4] | [8..135]
// 8 pieces of 16 bytes as iq4_nl's; piece p's scale is d * (ls - 32) with ls = nibble p of sl
// (little-endian) | ((sh >> 2p) & 3) << 4.
// Quantizer: fit_iq4 per piece, the 8 scales rounded to 6 bits against d = −(the scale of
// largest magnitude) / 32, each value to the nearest table value under its stored scale.
// Tile unit (one super-block, R rows): f16 d[R], i8 sc[8][R] (the 6-bit scales − 32), then per
// piece iq4_nl's nibbles. 138 R bytes (file: 136 R).
#pragma once

#include <algorithm>

#include "npullm/ops/formats/iq4_nl.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::iq4_xs> {
  static constexpr std::string_view name = "iq4_xs";
  static constexpr int gguf_type = 23;
  static constexpr std::size_t block_values = 256, block_bytes = 136;
  static constexpr piece_layout pieces{false, false, false, 127};
  static constexpr int code_offset = 128;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 138, tile_head_bytes = 10;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// IQ4_XS's six-bit scale of piece ib (0..7), as stored (the scale is d · (that − 32)): nibble ib
// of scales_l (4 bytes, little-endian) and bits 2 · ib .. 2 · ib + 1 of scales_h (u16).
inline int iq4_xs_scale(const std::uint8_t* b, std::size_t ib) noexcept {
  const int sh = b[2] | (b[3] << 8);
  return ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
}

template <>
struct format_codec<weight_format::iq4_xs> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + (j / 8) * 136;
    const float d = load_f16(b);
    out.scale[0] = out.scale[1] = d * static_cast<float>(iq4_xs_scale(b, j % 8) - 32);
    iq4_decode_nibbles(b + 8 + 16 * (j % 8), out);
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float sc[8], extreme = 0.0f;
    for (int j = 0; j < 8; ++j) {
      sc[j] = fit_iq4(x + 32 * j);
      if (std::fabs(sc[j]) > std::fabs(extreme)) extreme = sc[j];
    }
    const float16 d16(extreme / -32.0f);
    const float d = static_cast<float>(d16);
    std::fill_n(b, 136, std::uint8_t{0});
    store_f16(b, d16);
    std::uint16_t sh = 0;
    for (int j = 0; j < 8; ++j) {
      const int is =
          d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -32, 31) : 0;
      const int v = is + 32;
      b[4 + j / 2] = static_cast<std::uint8_t>(b[4 + j / 2] | ((v & 0xF) << (4 * (j % 2))));
      sh = static_cast<std::uint16_t>(sh | ((v >> 4) << (2 * j)));
      iq4_codes(x + 32 * j, d * static_cast<float>(is), b + 8 + 16 * j);
    }
    std::memcpy(b + 2, &sh, 2);
  }
  static void pack(const tile_writer& t) noexcept {
    if (t.p == 0) std::memcpy(t.unit + 2 * t.r, t.block, 2);
    t.unit[2 * t.R + t.p * t.R + t.r] = static_cast<std::uint8_t>(iq4_xs_scale(t.block, t.p) - 32);
    iq4_pack_nibbles(t, t.unit + 10 * t.R + t.p * 16 * t.R, t.block + 8 + 16 * t.p);
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
