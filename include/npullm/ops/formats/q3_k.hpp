// q3_k: llama.cpp's 3-bit K-quant super-blocks (GGUF type 11).
//
// Super-block: 256 values (16 sub-blocks of 16), 110 bytes: [0..31] uint8 hm[32] |
// [32..95] uint8 qs[64] | [96..107] s[12]: 16 six-bit scales | [108..109] f16 d
//   value i of 32-value piece p = 4t + u (t = 0, 1; u = 0..3): q = (qs[32t + i] >> 2u) & 3,
//   minus 4 where bit p of hm[i] is clear (q in -4..3); value = d * (sc[e / 16] - 32) * q with
//   sc[i] = (i < 8 ? s[i] & 0xF : s[i - 8] >> 4) | ((s[8 + i % 4] >> 2 (i / 4)) & 3) << 4
// Quantizer: per sub-block the least-squares scale (fit_sub_block, symmetric), the scales as
// signed 6 bits against d = −(the scale of largest magnitude) / 32 (f16), every value rounded to
// the nearest code under its stored scale.
// Tile unit (one super-block, R rows): f16 d[R], i8 sc[16][R] (the 6-bit scales − 32, one a half
// piece); per piece: for s in 0..1 R x 4 bytes of 2-bit pairs (bits 0-1, 2-3, 4-5, 6-7 = the
// low two bits of chunks s, s + 2, s + 4, s + 6), then R x 4 bytes of high bits (bit t of byte
// i = bit 2 of u[4t + i]); u = q + 4 (0..7). 114 R bytes (file: 110 R).
#pragma once

#include "npullm/ops/formats/sub_block_fit.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q3_k> {
  static constexpr std::string_view name = "q3_k";
  static constexpr int gguf_type = 11;
  static constexpr std::size_t block_values = 256, block_bytes = 110;
  static constexpr piece_layout pieces{true, false, false, 4};
  static constexpr int code_offset = 4;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 114, tile_head_bytes = 18;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// Q3_K's six-bit scale i (0..15) from the 12 packed bytes, as stored (0..63; the scale is
// d · (that − 32)): low four bits in byte i (i < 8) or the high nibble of byte i − 8, high two
// bits in byte 8 + i % 4 at bit 2 · (i / 4).
inline int q3_k_scale(const std::uint8_t* s, std::size_t i) noexcept {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  return lo | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
}

// q3_k's and q2_k's quantizer and tile pieces (Three: q3_k; else q2_k, ops/formats/q2_k.hpp).
template <bool Three>
struct k16_block {
  static constexpr std::size_t bytes = Three ? 110 : 84;

  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float sc[16], mn[16], extreme = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float bj;
      fit_sub_block(x + 16 * j, 16, 3, !Three, sc[j], bj);
      mn[j] = -bj;
      if (Three ? std::fabs(sc[j]) > std::fabs(extreme) : sc[j] > extreme) extreme = sc[j];
      max_mn = std::max(max_mn, mn[j]);
    }
    // q3_k: signed 6-bit scales (−32..31; the extreme maps to −32); q2_k: 4-bit scales and mins
    const float16 d16(Three ? extreme / -32.0f : extreme / 15.0f), m16(max_mn / 15.0f);
    const float d = static_cast<float>(d16), dm = Three ? 0.0f : static_cast<float>(m16);
    std::uint8_t* qs = b + (Three ? 32 : 16);
    std::fill_n(b, bytes, std::uint8_t{0});
    if (Three) {
      store_f16(b + 108, d16);
    } else {
      store_f16(b + 80, d16);
      store_f16(b + 82, m16);
    }
    for (int j = 0; j < 16; ++j) {
      int is, im = 0;
      if (Three) {
        is = d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -32, 31) : 0;
        const int v = is + 32;  // q3_k_scale's inverse
        std::uint8_t* s = b + 96;
        s[j % 8] = static_cast<std::uint8_t>(s[j % 8] | ((v & 0xF) << (j < 8 ? 0 : 4)));
        s[8 + j % 4] = static_cast<std::uint8_t>(s[8 + j % 4] | ((v >> 4) << (2 * (j / 4))));
      } else {
        is = d > 0.0f ? std::min(15, static_cast<int>(std::nearbyint(sc[j] / d))) : 0;
        im = dm > 0.0f ? std::min(15, static_cast<int>(std::nearbyint(mn[j] / dm))) : 0;
        b[j] = static_cast<std::uint8_t>(is | (im << 4));
      }
      const float step = d * static_cast<float>(is), off = dm * static_cast<float>(im);
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i, p = e / 32, at = e % 32;  // piece p = 4t + u, value at
        const int c = step != 0.0f ? static_cast<int>(std::nearbyint((x[e] + off) / step)) : 0;
        const int u = Three ? std::clamp(c, -4, 3) + 4 : std::clamp(c, 0, 3);
        qs[32 * (p / 4) + at] =
            static_cast<std::uint8_t>(qs[32 * (p / 4) + at] | ((u & 3) << (2 * (p % 4))));
        if (Three && u >= 4) b[at] = static_cast<std::uint8_t>(b[at] | (1 << p));
      }
    }
  }

  // The unit: d (and q2_k's dmin), a scale byte per half piece, then per piece the two planes
  // of 2-bit pairs (and q3_k's plane of high bits).
  static void pack(const tile_writer& t) noexcept {
    const std::size_t R = t.R, r = t.r, p = t.p;
    std::uint8_t* u = t.unit;
    const std::uint8_t* b = t.block;
    if (p == 0) {
      std::memcpy(u + 2 * r, b + (Three ? 108 : 80), 2);
      if (!Three) std::memcpy(u + 2 * R + 2 * r, b + 82, 2);
    }
    for (std::size_t h = 0; h < 2; ++h) {
      u[(Three ? 2 : 4) * R + (2 * p + h) * R + r] =
          Three ? static_cast<std::uint8_t>(q3_k_scale(b + 96, 2 * p + h) - 32) : b[2 * p + h];
    }
    std::uint8_t* pairs = u + (Three ? 18 : 20) * R + p * (Three ? 12 : 8) * R;
    for (std::size_t v = 0; v < 32; ++v) {
      const int q = t.pc.q[v] + (Three ? 4 : 0);  // 0..7, 0..3
      const std::size_t chunk = v / 4, i = v % 4;
      pairs[((chunk % 2) * R + r) * 4 + i] |= static_cast<std::uint8_t>((q & 3) << (chunk / 2 * 2));
      if (Three) pairs[(2 * R + r) * 4 + i] |= static_cast<std::uint8_t>((q >> 2) << chunk);
    }
  }
};

template <>
struct format_codec<weight_format::q3_k> : k16_block<true> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::size_t sub = j % 8;
    const std::uint8_t* b = row + (j / 8) * 110;
    const float d = load_f16(b + 108);
    out.scale[0] = d * static_cast<float>(q3_k_scale(b + 96, 2 * sub) - 32);
    out.scale[1] = d * static_cast<float>(q3_k_scale(b + 96, 2 * sub + 1) - 32);
    const std::uint8_t* q = b + 32 + 32 * (sub / 4);
    const int shift = 2 * static_cast<int>(sub % 4);
    for (int i = 0; i < 32; ++i) {  // high bit clear: code − 4
      out.q[i] = static_cast<std::int8_t>(((q[i] >> shift) & 3) - (((b[i] >> sub) & 1) ? 0 : 4));
    }
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
