// iq4_nl: llama.cpp's 4-bit blocks on a non-uniform grid (GGUF type 20).
//
// Block: 32 values, 18 bytes as q4_0's, the nibble an index into a fixed table of 16 int8 values
// (iq4_values): value[i] = d * iq4_values[nibble] (low nibbles values 0..15, high 16..31).
// Quantizer: a least-squares d over the table per block (fit_iq4), each value to the nearest
// table value times the stored d.
// Tile unit (one piece, R rows): f16 d[R], q4_0's nibbles of the table indices (the kernel looks
// the codes up: the table + 128 as u8 where the dot product takes u8, else as s8). 18 R bytes
// (the file's).
#pragma once

#include <cmath>

#include "npullm/ops/formats/format_base.hpp"

namespace npullm::ops {

template <>
struct format_layout<weight_format::iq4_nl> {
  static constexpr std::string_view name = "iq4_nl";
  static constexpr int gguf_type = 20;
  static constexpr std::size_t block_values = 32, block_bytes = 18;
  static constexpr piece_layout pieces{false, false, false, 127};
  static constexpr int code_offset = 128;
  static constexpr std::size_t tile_unit_pieces = 1, tile_row_bytes = 18, tile_head_bytes = 2;
};

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// The 16 values of IQ4_NL / IQ4_XS's 4-bit codes (a non-uniform grid, denser near zero).
inline constexpr std::int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

// The nearest of IQ4's 16 values times d to each of 32 values x, as the block's 16 bytes of
// nibbles (value i: low nibble of byte i, value i + 16: high nibble).
inline void iq4_codes(const float* x, float d, std::uint8_t* out) noexcept {
  for (int i = 0; i < 16; ++i) out[i] = 0;
  for (int i = 0; i < 32; ++i) {
    int best = 0;
    float err = INFINITY;
    for (int c = 0; c < 16; ++c) {
      const float e = std::fabs(x[i] - d * static_cast<float>(iq4_values[c]));
      if (e < err) {
        err = e;
        best = c;
      }
    }
    out[i % 16] = static_cast<std::uint8_t>(out[i % 16] | (best << (i < 16 ? 0 : 4)));
  }
}

// IQ4's scale for 32 values x (least squares): 21 candidates that map the extreme near the
// table's ends, each value to its nearest table value, d refit to those values; the best fit.
inline float fit_iq4(const float* x) noexcept {
  float extreme = 0.0f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  if (extreme == 0.0f) return 0.0f;
  double best = INFINITY;
  float out = extreme / -127.0f;
  for (int step = -10; step <= 10; ++step) {
    const float d0 = extreme / (-127.0f + 2.0f * static_cast<float>(step));
    double svx = 0, svv = 0;
    int v[32];
    for (int i = 0; i < 32; ++i) {
      float err = INFINITY;
      for (int c = 0; c < 16; ++c) {
        const float e = std::fabs(x[i] - d0 * static_cast<float>(iq4_values[c]));
        if (e < err) {
          err = e;
          v[i] = iq4_values[c];
        }
      }
      svx += static_cast<double>(v[i]) * x[i];
      svv += static_cast<double>(v[i]) * v[i];
    }
    if (svv <= 0) continue;
    const double d = svx / svv;
    double err = 0;
    for (int i = 0; i < 32; ++i) err += (d * v[i] - x[i]) * (d * v[i] - x[i]);
    if (err < best) {
      best = err;
      out = static_cast<float>(d);
    }
  }
  return out;
}

// 16 bytes of table indices (iq4_nl's, iq4_xs's pieces) as the codes of one piece.
inline void iq4_decode_nibbles(const std::uint8_t* nib, piece& out) noexcept {
  for (int i = 0; i < 16; ++i) {
    out.q[i] = iq4_values[nib[i] & 0xF];
    out.q[i + 16] = iq4_values[nib[i] >> 4];
  }
}

// The piece's table indices (from the source block: decode gives values) as q4_0's nibbles.
inline void iq4_pack_nibbles(const tile_writer& t, std::uint8_t* at,
                             const std::uint8_t* nib) noexcept {
  t.put_nibbles(at, [&](std::size_t v) { return v < 16 ? nib[v] & 0xF : nib[v - 16] >> 4; });
}

template <>
struct format_codec<weight_format::iq4_nl> {
  static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept {
    const std::uint8_t* b = row + j * 18;
    out.scale[0] = out.scale[1] = load_f16(b);
    iq4_decode_nibbles(b + 2, out);
  }
  static void quantize(const float* x, std::uint8_t* b) noexcept {
    const float16 d16(fit_iq4(x));
    store_f16(b, d16);
    iq4_codes(x, static_cast<float>(d16), b + 2);
  }
  static void pack(const tile_writer& t) noexcept {
    std::memcpy(t.unit + 2 * t.r, t.block, 2);
    iq4_pack_nibbles(t, t.unit + 2 * t.R, t.block + 2);
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
