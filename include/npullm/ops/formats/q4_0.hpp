// q4_0: llama.cpp's 4-bit blocks (GGUF type 2).
//
// Block: 32 values, 18 bytes: [0..1] f16 d | [2..17] uint8 b[16];
//   value[i]      = ((b[i] & 0xF) - 8) * d     i = 0..15  (low nibbles: first half)
//   value[i + 16] = ((b[i] >> 4) - 8) * d                 (high nibbles: second half)
// Quantizer (llama.cpp's reference, bit for bit): d = −(the value of largest magnitude) / 8, so
// that it maps to the lowest code; codes x · (1 / d) rounded half up, clamped to the top code (a
// value of the other sign than the extreme is off by up to |d|); d stored as f16, the codes use
// the f32 d.
// Tile unit (one piece, R rows): f16 d[R]; for t in 0..3: R x 4 bytes, nibbles lo = u[4t + i],
// hi = u[16 + 4t + i]; u = q + 8 (0..15). 18 R bytes (the file's).
#pragma once

#include <algorithm>
#include <cmath>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q4_0> {
  static constexpr std::string_view name = "q4_0";
  static constexpr int gguf_type = 2;
  static constexpr std::size_t block_values = 32, block_bytes = 18;
  static constexpr piece_layout pieces{false, false, false, 8};
  static constexpr int code_offset = 8;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 18, tile_head_bytes = 2;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// q4_0's and q5_0's quantizer (Five: 5-bit codes, the fifth bits in a u32 after d).
template <bool Five>
inline void quantize_extreme_block(const float* x, std::uint8_t* b) noexcept {
  float amax = 0.0f, extreme = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      extreme = x[i];
    }
  }
  const float d = extreme / (Five ? -16.0f : -8.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
  const float half = Five ? 16.5f : 8.5f;
  const int top = Five ? 31 : 15;
  store_f16(b, float16(d));
  std::uint32_t qh = 0;
  for (int i = 0; i < 16; ++i) {
    // x · id >= −top − 1 - rounding: the sum is positive, truncation rounds it down
    const int lo = std::min(top, static_cast<int>(product(x[i], id) + half));
    const int hi = std::min(top, static_cast<int>(product(x[i + 16], id) + half));
    b[(Five ? 6 : 2) + i] = static_cast<std::uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    qh |= static_cast<std::uint32_t>((lo >> 4) & 1) << i;
    qh |= static_cast<std::uint32_t>((hi >> 4) & 1) << (i + 16);
  }
  if (Five) std::memcpy(b + 2, &qh, 4);
}

template <>
struct format_codec<weight_format::q4_0> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * 18;
    out.scale[0] = out.scale[1] = load_f16(b);
    const std::uint8_t* nib = b + 2;
    for (int i = 0; i < 16; ++i) {
      out.q[i] = static_cast<std::int8_t>((nib[i] & 0xF) - 8);
      out.q[i + 16] = static_cast<std::int8_t>((nib[i] >> 4) - 8);
    }
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    quantize_extreme_block<false>(x, b);
  }
  static void pack(const tile_writer& t) noexcept {
    t.put_f16(t.unit + 2 * t.r, t.pc.scale[0]);
    t.put_nibbles(t.unit + 2 * t.R, [&](std::size_t v) { return t.pc.q[v] + 8; });
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
