// q4_1: llama.cpp's 4-bit blocks with a min (GGUF type 3).
//
// Block: 32 values, 20 bytes: [0..1] f16 d | [2..3] f16 m | [4..19] uint8 b[16];
//   value[i] = (b[i] & 0xF) * d + m, value[i + 16] = (b[i] >> 4) * d + m.
// decode gives offset = −m. Quantizer (llama.cpp's reference, bit for bit): d = (max − min) / 15,
// m = min, codes (x − min) / d rounded half up; d and m stored as f16, the codes use the f32 d.
// Tile unit (one piece, R rows): f16 d[R], f16 m[R], then q4_0's nibbles of u = the code.
// 20 R bytes (the file's).
#pragma once

#include <algorithm>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q4_1> {
  static constexpr std::string_view name = "q4_1";
  static constexpr int gguf_type = 3;
  static constexpr std::size_t block_values = 32, block_bytes = 20;
  static constexpr piece_layout pieces{false, true, false, 15};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 20, tile_head_bytes = 4;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// q4_1's and q5_1's blocks (Five: 5-bit codes, the fifth bits in a u32 after d and m).
template <bool Five>
struct min_block {
  static constexpr std::size_t bytes = Five ? 24 : 20;

  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * bytes;
    out.scale[0] = out.scale[1] = load_f16(b);
    out.offset[0] = out.offset[1] = -load_f16(b + 2);  // value = d · u + m: offset −m
    std::uint32_t qh = 0;
    if (Five) std::memcpy(&qh, b + 4, 4);
    const std::uint8_t* nib = b + (Five ? 8 : 4);
    for (int i = 0; i < 16; ++i) {
      out.q[i] = static_cast<std::int8_t>((nib[i] & 0xF) | (((qh >> i) & 1) << 4));
      out.q[i + 16] = static_cast<std::int8_t>((nib[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
    }
  }

  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const int top = Five ? 31 : 15;
    const float d = (hi - lo) / static_cast<float>(top), id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, float16(d));
    store_f16(b + 2, float16(lo));
    std::uint32_t qh = 0;
    for (int i = 0; i < 16; ++i) {
      const int c0 = std::min(top, static_cast<int>(product(x[i] - lo, id) + 0.5f));
      const int c1 = std::min(top, static_cast<int>(product(x[i + 16] - lo, id) + 0.5f));
      b[(Five ? 8 : 4) + i] = static_cast<std::uint8_t>((c0 & 0xF) | ((c1 & 0xF) << 4));
      qh |= static_cast<std::uint32_t>((c0 >> 4) & 1) << i;
      qh |= static_cast<std::uint32_t>((c1 >> 4) & 1) << (i + 16);
    }
    if (Five) std::memcpy(b + 4, &qh, 4);
  }

  // d and m ahead of the codes: nibbles at 4 R, the high bits (Five) after them at 20 R.
  static void pack(const tile_writer& t) noexcept {
    t.put_f16(t.unit + 2 * t.r, t.pc.scale[0]);
    t.put_f16(t.unit + 2 * t.R + 2 * t.r, -t.pc.offset[0]);
    const auto code = [&](std::size_t v) { return int{t.pc.q[v]}; };
    t.put_nibbles(t.unit + 4 * t.R, code);
    if (Five) t.put_high_bits(t.unit + 20 * t.R, code);
  }
};

template <>
struct format_codec<weight_format::q4_1> : min_block<false> {};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
