// q4_k: llama.cpp's 4-bit K-quant super-blocks (GGUF type 12).
//
// Super-block: 256 values (8 sub-blocks of 32), 144 bytes:
//   [0..1] f16 d | [2..3] f16 dmin | [4..15] s[12]: 8 six-bit scales sc[j], 8 six-bit mins
//   m[j] | [16..143] uint8 b[128]
//   j < 4:  sc[j] = s[j] & 63,                          m[j] = s[j + 4] & 63
//   j >= 4: sc[j] = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4,
//           m[j]  = (s[j + 4] >> 4)  | (s[j]     >> 6) << 4
//   (the top two bits of s[0..7] carry the high bits of sub-blocks 4..7's scale / min)
//   sub-blocks 2c and 2c + 1 (c = 0..3) share the 32 bytes b[32c .. 32c + 31]: low nibbles are
//   sub-block 2c, high nibbles sub-block 2c + 1, element order within each.
//   value[32j + i] = (d * sc[j]) * q - (dmin * m[j]),  q = the nibble (0..15)
// Quantizer: per sub-block the least-squares scale and min (fit_sub_block), rounded to 6 bits
// against d = the largest scale / 63 and dmin = the largest min / 63 (f16), then every value
// rounded to the nearest code under the stored factors.
// Tile unit (one super-block, R rows): f16 d[R], f16 dmin[R], u8 sc[8][R], u8 m[8][R] (the
// 6-bit scales unpacked: + 4 bytes per 144, 2.8 %); for pieces 2c, 2c + 1 (c in 0..3), t in
// 0..7: R x 4 bytes, nibbles lo = u_2c[4t + i], hi = u_2c+1[4t + i]; u = the nibble.
// 148 R bytes (file: 144 R).
#pragma once

#include "npullm/ops/formats/sub_block_fit.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q4_k> {
  static constexpr std::string_view name = "q4_k";
  static constexpr int gguf_type = 12;
  static constexpr std::size_t block_values = 256, block_bytes = 144;
  static constexpr piece_layout pieces{false, true, false, 15};
  static constexpr int code_offset = 0;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 148, tile_head_bytes = 20;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// Q4_K's six-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void q4_k_scale_min(const std::uint8_t* s, std::size_t j, int& sc, int& m) noexcept {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// q4_k's and q5_k's super-blocks (Five: a plane of fifth bits qh[32] before the nibbles).
template <bool Five>
struct k_min_block {
  static constexpr std::size_t bytes = Five ? 176 : 144;

  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::size_t sub = j % 8;
    const std::uint8_t* b = row + (j / 8) * bytes;
    const float d = load_f16(b), dmin = load_f16(b + 2);
    int sc, m;
    q4_k_scale_min(b + 4, sub, sc, m);
    out.scale[0] = out.scale[1] = d * static_cast<float>(sc);
    out.offset[0] = out.offset[1] = product(dmin, static_cast<float>(m));
    const std::uint8_t* qh = b + 16;
    const std::uint8_t* nib = b + (Five ? 48 : 16) + 32 * (sub / 2);
    const int shift = static_cast<int>(sub % 2) * 4;
    for (int i = 0; i < 32; ++i) {
      const int hi = Five ? ((qh[i] >> sub) & 1) << 4 : 0;
      out.q[i] = static_cast<std::int8_t>(((nib[i] >> shift) & 0xF) | hi);
    }
  }

  static void quantize(const float* x, std::uint8_t* b) noexcept {
    const int top = Five ? 31 : 15;
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; ++j) {
      float bj;
      fit_sub_block(x + 32 * j, 32, top, true, sc[j], bj);
      mn[j] = -bj;
      max_sc = std::max(max_sc, sc[j]);
      max_mn = std::max(max_mn, mn[j]);
    }
    const float16 d16(max_sc / 63.0f), m16(max_mn / 63.0f);
    const float d = static_cast<float>(d16), dm = static_cast<float>(m16);
    store_f16(b, d16);
    store_f16(b + 2, m16);
    std::uint8_t* s = b + 4;
    std::fill_n(s, 12, std::uint8_t{0});
    std::uint8_t* qh = b + 16;
    std::uint8_t* nib = b + (Five ? 48 : 16);
    if (Five) std::fill_n(qh, 32, std::uint8_t{0});
    for (int j = 0; j < 8; ++j) {
      const int is = d > 0.0f ? std::min(63, static_cast<int>(std::nearbyint(sc[j] / d))) : 0;
      const int im = dm > 0.0f ? std::min(63, static_cast<int>(std::nearbyint(mn[j] / dm))) : 0;
      if (j < 4) {
        s[j] = static_cast<std::uint8_t>(s[j] | is);
        s[j + 4] = static_cast<std::uint8_t>(s[j + 4] | im);
      } else {
        s[j + 4] = static_cast<std::uint8_t>((is & 0xF) | ((im & 0xF) << 4));
        s[j - 4] = static_cast<std::uint8_t>(s[j - 4] | ((is >> 4) << 6));
        s[j] = static_cast<std::uint8_t>(s[j] | ((im >> 4) << 6));
      }
      const float step = d * static_cast<float>(is), off = dm * static_cast<float>(im);
      for (int i = 0; i < 32; ++i) {
        const int c =
            step > 0.0f ? static_cast<int>(std::nearbyint((x[32 * j + i] + off) / step)) : 0;
        const int q = std::clamp(c, 0, top);
        std::uint8_t& byte = nib[32 * (j / 2) + i];
        byte = static_cast<std::uint8_t>(j % 2 == 0 ? (byte & 0xF0) | (q & 0xF)
                                                    : (byte & 0x0F) | ((q & 0xF) << 4));
        if (Five) qh[i] = static_cast<std::uint8_t>(qh[i] | ((q >> 4) << j));
      }
    }
  }

  // The unit: d, dmin, the scales and mins as bytes, the nibbles of piece pairs (at 20 R), and
  // (Five) a plane of high bits per piece at 148 R.
  static void pack(const tile_writer& t) noexcept {
    const std::size_t R = t.R, r = t.r, p = t.p;
    std::uint8_t* u = t.unit;
    if (p == 0) {
      std::memcpy(u + 2 * r, t.block, 2);
      std::memcpy(u + 2 * R + 2 * r, t.block + 2, 2);
    }
    int sc, m;
    q4_k_scale_min(t.block + 4, p, sc, m);
    u[4 * R + p * R + r] = static_cast<std::uint8_t>(sc);
    u[12 * R + p * R + r] = static_cast<std::uint8_t>(m);
    const std::size_t c = p / 2, shift = (p % 2) * 4;
    for (std::size_t ch = 0; ch < 8; ++ch) {
      for (std::size_t i = 0; i < 4; ++i) {
        u[20 * R + ((c * 8 + ch) * R + r) * 4 + i] |=
            static_cast<std::uint8_t>((t.pc.q[4 * ch + i] & 0xF) << shift);
      }
    }
    if (Five) t.put_high_bits(u + 148 * R + p * 4 * R, [&](std::size_t v) { return t.pc.q[v]; });
  }
};

template <>
struct format_codec<weight_format::q4_k> : k_min_block<false> {};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
