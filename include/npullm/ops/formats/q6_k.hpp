// q6_k: llama.cpp's 6-bit K-quant super-blocks (GGUF type 14).
//
// Super-block: 256 values (16 sub-blocks of 16), 210 bytes:
//   [0..127] uint8 ql[128] | [128..191] uint8 qh[64] | [192..207] int8 sc[16] | [208..209] f16 d
//   two halves h = 0, 1 of 128 values, each using ql[64h ..], qh[32h ..]; for l = 0..31:
//     value 128h + l      low nibble of ql[64h + l],       bits 0-1 of qh[32h + l]
//     value 128h + l + 32 low nibble of ql[64h + l + 32],  bits 2-3 of qh[32h + l]
//     value 128h + l + 64 high nibble of ql[64h + l],      bits 4-5 of qh[32h + l]
//     value 128h + l + 96 high nibble of ql[64h + l + 32], bits 6-7 of qh[32h + l]
//   (the nibble is the 6-bit q's low 4 bits, the two qh bits its high 2 bits)
//   value[e] = (d * sc[e / 16]) * (q - 32),  q = 0..63
// Quantizer: per sub-block the least-squares scale (fit_sub_block, symmetric), the scales as
// int8 against d = −(the scale of largest magnitude) / 128 (f16), every value rounded to the
// nearest code under its stored scale.
// Tile unit (one super-block, R rows): f16 d[R], i8 sc[16][R]; per piece: for t in 0..3 R x 4
// bytes of low nibbles (lo = u[4t + i], hi = u[16 + 4t + i]), then for s in 0..1 R x 4 bytes of
// high 2-bit pairs: bits 0-1, 2-3, 4-5, 6-7 = chunks s, s + 2, s + 4, s + 6; u = q + 32
// (0..63). 210 R bytes (the file's).
#pragma once

#include "npullm/ops/formats/sub_block_fit.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::q6_k> {
  static constexpr std::string_view name = "q6_k";
  static constexpr int gguf_type = 14;
  static constexpr std::size_t block_values = 256, block_bytes = 210;
  static constexpr piece_layout pieces{true, false, false, 32};
  static constexpr int code_offset = 32;
  static constexpr std::size_t tile_unit_pieces = 8, tile_row_bytes = 210, tile_head_bytes = 18;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

template <>
struct format_codec<weight_format::q6_k> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::size_t e0 = (j % 8) * 32;  // first value within the super-block
    const std::uint8_t* b = row + (j / 8) * 210;
    const std::size_t h = e0 / 128, quarter = (e0 % 128) / 32;  // half, 32-value quarter
    const std::uint8_t* ql = b + 64 * h + (quarter % 2) * 32;
    const std::uint8_t* qh = b + 128 + 32 * h;
    const int lo_shift = static_cast<int>(quarter / 2) * 4;
    const int hi_shift = static_cast<int>(quarter) * 2;
    for (int l = 0; l < 32; ++l) {
      const int q = ((ql[l] >> lo_shift) & 0xF) | (((qh[l] >> hi_shift) & 3) << 4);
      out.q[l] = static_cast<std::int8_t>(q - 32);
    }
    const float d = load_f16(b + 208);
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    out.scale[0] = d * static_cast<float>(sc[e0 / 16]);
    out.scale[1] = d * static_cast<float>(sc[e0 / 16 + 1]);
  }

  static void quantize(const float* x, std::uint8_t* b) noexcept {
    float sc[16], unused;
    float extreme = 0.0f;
    for (int j = 0; j < 16; ++j) {
      fit_sub_block(x + 16 * j, 16, 31, false, sc[j], unused);
      if (std::fabs(sc[j]) > std::fabs(extreme)) extreme = sc[j];
    }
    const float16 d16(extreme / -128.0f);
    const float d = static_cast<float>(d16);
    store_f16(b + 208, d16);
    std::uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const int is =
          d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -128, 127) : 0;
      b[192 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(is));
      const float step = d * static_cast<float>(is);
      for (int i = 0; i < 16; ++i) {
        const int c = step != 0.0f ? static_cast<int>(std::nearbyint(x[16 * j + i] / step)) : 0;
        q[16 * j + i] = static_cast<std::uint8_t>(std::clamp(c, -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const std::uint8_t* v = q + 128 * h + l;
        b[64 * h + l] = static_cast<std::uint8_t>((v[0] & 0xF) | ((v[64] & 0xF) << 4));
        b[64 * h + l + 32] = static_cast<std::uint8_t>((v[32] & 0xF) | ((v[96] & 0xF) << 4));
        b[128 + 32 * h + l] = static_cast<std::uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) |
                                                        ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
      }
    }
  }

  static void pack(const tile_writer& t) noexcept {
    const std::size_t R = t.R, r = t.r, p = t.p;
    std::uint8_t* u = t.unit;
    if (p == 0) std::memcpy(u + 2 * r, t.block + 208, 2);
    u[2 * R + (2 * p) * R + r] = t.block[192 + 2 * p];
    u[2 * R + (2 * p + 1) * R + r] = t.block[192 + 2 * p + 1];
    std::uint8_t* lo = u + 18 * R + p * 24 * R;
    std::uint8_t* hi = lo + 16 * R;
    for (std::size_t v = 0; v < 32; ++v) {
      const int q = t.pc.q[v] + 32;  // 0..63
      const std::size_t chunk = v / 4, i = v % 4;
      // low nibble: chunk t in 0..3 in load t's low nibbles, t + 4 in its high ones
      lo[((chunk % 4) * R + r) * 4 + i] |= static_cast<std::uint8_t>((q & 0xF) << (chunk / 4 * 4));
      // high pair: chunk c in plane c % 2 at bits 2 (c / 2)
      hi[((chunk % 2) * R + r) * 4 + i] |= static_cast<std::uint8_t>((q >> 4) << (chunk / 2 * 2));
    }
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
