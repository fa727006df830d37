// The quantized formats repacked for the kernels (ops::repack, ops/quant_linear.hpp): W's rows in
// tiles of R rows (R = tile_height_of(format): 16 or 8 with AVX-512 VNNI, else 8; one int32
// lane per row in a vector), so that one vector load gives the same 4 codes of R rows and one
// integer dot product against 4 broadcast codes of x adds them into R row sums at once: no
// per-row prologue, no horizontal sums, and the scales of the tile's rows are one contiguous
// vector per piece.
//
// A tile is a run of units (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl: one 32-value piece; q2_k,
// q3_k, q4_k, q5_k, q6_k, iq4_xs: one 256-value super-block), each holding the R rows' factors,
// then their codes as 4-byte chunks (values 4t .. 4t + 3 of a piece) of rows 0 .. R − 1:
//   q4_0  f16 d[R]; for t in 0..3: R x 4 bytes, nibbles lo = u[4t + i], hi = u[16 + 4t + i];
//         u = q + 8 (0..15).                                          18 R bytes (the file's)
//   q4_1  f16 d[R], f16 m[R], then q4_0's nibbles; value d · u + m.    20 R (the file's)
//   q5_0  f16 d[R], q4_0's nibbles of u's low 4 bits, then R x 4 bytes of high bits: bit c of
//         byte i = bit 4 of u[4c + i] (chunk c = 0..7); u = q + 16 (0..31).   22 R (the file's)
//   q5_1  f16 d[R], f16 m[R], then q5_0's nibbles and high bits; value d · u + m.  24 R (file's)
//   iq4_nl f16 d[R], q4_0's nibbles of the table indices (the kernel looks the codes up: the
//         table + 128 as u8 where the dot product takes u8, else as s8).  18 R (the file's)
//   iq4_xs f16 d[R], i8 sc[8][R] (the 6-bit scales − 32), then per piece iq4_nl's nibbles.
//                                                                      138 R (file: 136 R)
//   q8_0  f16 d[R]; for t in 0..7: R x 4 bytes u[4t + i]; u = q + 128 where the dot product
//         takes u8 codes (VNNI), else q (the sign trick of AVX2's vpmaddubsw).   34 R (the file's)
//   q4_k  f16 d[R], f16 dmin[R], u8 sc[8][R], u8 m[8][R] (the 6-bit scales unpacked: +4 bytes
//         per 144, 2.8%); for pieces 2c, 2c + 1 (c in 0..3), t in 0..7: R x 4 bytes, nibbles
//         lo = u_2c[4t + i], hi = u_2c+1[4t + i]; u = nibble.               148 R (file: 144 R)
//   q5_k  q4_k's unit, then per piece R x 4 bytes of high bits (bit t of byte i = bit 4 of
//         u[4t + i]).                                                    180 R (file: 176 R)
//   q6_k  f16 d[R], i8 sc[16][R]; per piece: for t in 0..3 R x 4 bytes of low nibbles (lo =
//         u[4t + i], hi = u[16 + 4t + i]), then for s in 0..1 R x 4 bytes of high 2-bit pairs:
//         bits 0-1, 2-3, 4-5, 6-7 = chunks s, s + 2, s + 4, s + 6; u = q + 32 (0..63).   210 R
//   q3_k  f16 d[R], i8 sc[16][R] (the 6-bit scales − 32, one a half piece); per piece: for s in
//         0..1 R x 4 bytes of 2-bit pairs (bits 0-1, 2-3, 4-5, 6-7 = the low two bits of chunks
//         s, s + 2, s + 4, s + 6), then R x 4 bytes of high bits (bit t of byte i = bit 2 of
//         u[4t + i]); u = q + 4 (0..7).                                  114 R (file: 110 R)
//   q2_k  f16 d[R], f16 dmin[R], u8 sm[16][R] (the file's bytes: scale | min << 4, one a half
//         piece), then per piece q3_k's two planes of 2-bit pairs; u = q (0..3).
//                                                                       84 R (the file's)
//   int8_sym, int4_sym  (npullm's NPU layout: the scales outside the blocks, one per group of
//         G values, G = 32, 64, 128 or K) the tile starts with the scales of its R rows, group
//         by group, in the source's type (f16 or f32: [K / G][R]), then its units are pieces:
//         int8_sym q8_0's codes without the d (32 R bytes), int4_sym q4_0's nibbles without it
//         (16 R; u = q + 8). Bytes: the source's.
// The value is s · (u − o) (− min for q2_k / q4_k, + m for q4_1 / q5_1): the integer offset o rides
// in the dot product's start (−o · Σ x codes of the piece or half, from the activations), so that
// the piece loop is load, unpack (mask / shift), one dot product per chunk and row of x, then one
// convert and one FMA by s · dx per piece (half piece: q6_k) and row of x. Rows past N in the last
// tile are zero (scale 0).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_linear/activations.hpp"

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

// Rows of W per tile, by format. AVX-512 VNNI builds: 16 (one zmm of dwords), except the
// formats whose 16-row kernel measured slower than the 8-row one (ymm, vpdpbusd by AVX-512 VL)
// on the Zen 4 guest, m1 GEMV cold at 1 thread: q6_k's LM head (151936 x 1024) 19.1 GB/s in
// 16-row tiles against 25.5 in 8-row ones (its unpacking and two scales per piece: Zen 4 splits
// each zmm operation in two, so the 16-row tile only adds shuffles), q4_k's 17.6-21.8 ->
// 20.3-28 GB/s (k1024 n4864, noisy); q5_k, the same kernel, the other way (13.9 GB/s at 8
// rows, 16.9 at 16 for k4864 n896): it stays at 16; q2_k and q3_k too (k1024 n4864, 1 thread,
// 8 -> 16 rows: m1 16.4 -> 19.2 and 19.3 -> 20.4 GB/s, m512 128 -> 205 and 183 -> 235 GFLOP/s).
// Every other build: 8.
constexpr std::size_t tile_height_of(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI512)
  return f == weight_format::q6_k || f == weight_format::q4_k ? 8 : 16;
#else
  (void)f;
  return 8;
#endif
}

// Whether q8_0's tiles hold u8 codes + 128 (the dot product multiplies u8 by s8) or s8 codes.
constexpr bool tile_q8_biased() noexcept {
#if defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QUANT_VNNI512)
  return true;
#else
  return false;
#endif
}

// Where the scales of int8_sym / int4_sym tiles are (the GGUF formats keep theirs in the units):
// a group's pieces and the scales' type (tiles.hpp's layout above).
struct tile_scales {
  std::size_t group_pieces = 1;
  bool f16 = false;
};
inline tile_scales tile_scales_of(const quantized_view& w) noexcept {
  return {w.group / 32 > 0 ? w.group / 32 : 1, w.scale_type == dtype::f16};
}
constexpr bool tile_sym(weight_format f) noexcept {
  return f == weight_format::int8_sym || f == weight_format::int4_sym;
}
// Bytes of a tile's scales ahead of its units (0 for the GGUF formats).
constexpr std::size_t tile_scale_bytes(weight_format f, std::size_t pieces,
                                       tile_scales s) noexcept {
  return tile_sym(f) ? pieces / s.group_pieces * (s.f16 ? 2 : 4) * tile_height_of(f) : 0;
}

// Pieces per unit and bytes per unit of R rows (0: no tiled layout).
constexpr std::size_t tile_unit_pieces(weight_format f) noexcept {
  return f == weight_format::q2_k || f == weight_format::q3_k || f == weight_format::q4_k ||
                 f == weight_format::q5_k || f == weight_format::q6_k || f == weight_format::iq4_xs
             ? 8
             : 1;
}
constexpr std::size_t tile_unit_bytes(weight_format f) noexcept {
  const std::size_t R = tile_height_of(f);
  switch (f) {
    case weight_format::q4_0: return 18 * R;
    case weight_format::q4_1: return 20 * R;
    case weight_format::q5_0: return 22 * R;
    case weight_format::q5_1: return 24 * R;
    case weight_format::q8_0: return 34 * R;
    case weight_format::iq4_nl: return 18 * R;
    case weight_format::q4_k: return 148 * R;
    case weight_format::q5_k: return 180 * R;
    case weight_format::q6_k: return 210 * R;
    case weight_format::q3_k: return 114 * R;
    case weight_format::q2_k: return 84 * R;
    case weight_format::int8_sym: return 32 * R;
    case weight_format::int4_sym: return 16 * R;
    case weight_format::iq4_xs: return 138 * R;
    default: return 0;
  }
}

constexpr bool has_tiles(weight_format f) noexcept {
  return tile_unit_bytes(f) != 0;
}

// Where a unit's nibbles and (q5_0, q5_1) high bits start, in bytes from the unit.
constexpr std::size_t tile_nibbles_at(weight_format f) noexcept {
  const std::size_t R = tile_height_of(f);
  return f == weight_format::q4_1 || f == weight_format::q5_1 ? 4 * R
         : f == weight_format::iq4_xs                         ? 10 * R
                                                              : 2 * R;
}
constexpr std::size_t tile_high_bits_at(weight_format f) noexcept {
  return tile_nibbles_at(f) + 16 * tile_height_of(f);
}

// Writes rows [n0, n0 + rows) of w (rows <= R) as one tile at dst (tile bytes: K / 32 /
// unit pieces units).
inline void pack_tile(const quantized_view& w, std::size_t n0, std::size_t rows, std::byte* dst) {
  const weight_format f = w.format;
  const std::size_t R = tile_height_of(f);
  const std::size_t pieces = w.cols / 32, upieces = tile_unit_pieces(f);
  const std::size_t ub = tile_unit_bytes(f);
  const tile_scales ts = tile_scales_of(w);
  const std::size_t sb = tile_scale_bytes(f, pieces, ts);
  std::fill_n(dst, sb + pieces / upieces * ub, std::byte{0});
  std::byte* const scales = dst;  // (int8_sym, int4_sym)
  dst += sb;
  const auto put_f16 = [](std::byte* p, float v) {
    const std::uint16_t b = float16(v).bits();
    std::memcpy(p, &b, 2);
  };
  auto* d8 = reinterpret_cast<std::uint8_t*>(dst);
  piece pc;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::byte* row = w.data.data() + (n0 + r) * w.row_bytes();
    for (std::size_t j = 0; j < pieces; ++j) {
      decode_piece(w, n0 + r, j, pc);
      const std::size_t unit = j / upieces, p = j % upieces;
      std::uint8_t* u = d8 + unit * ub;
      // q4_0's nibbles (u & 15 of values 4t + i and 16 + 4t + i) at `at`
      const auto put_nibbles = [&](std::uint8_t* at, const auto& code) {
        for (std::size_t t = 0; t < 4; ++t) {
          for (std::size_t i = 0; i < 4; ++i) {
            const int lo = code(4 * t + i) & 0xF, hi = code(16 + 4 * t + i) & 0xF;
            at[(t * R + r) * 4 + i] = static_cast<std::uint8_t>(lo | (hi << 4));
          }
        }
      };
      // q8_0's codes (+ 128 where the tiles are biased) of chunks t = 0..7 at `at`
      const auto put_bytes = [&](std::uint8_t* at) {
        for (std::size_t t = 0; t < 8; ++t) {
          for (std::size_t i = 0; i < 4; ++i) {
            const int q = pc.q[4 * t + i];
            at[(t * R + r) * 4 + i] = static_cast<std::uint8_t>(tile_q8_biased() ? q + 128 : q);
          }
        }
      };
      // the high bits of a 5-bit code (q5_0, q5_1, q5_k): bit v / 4 of row r's byte v % 4 at `at`
      const auto put_high_bits = [&](std::uint8_t* at, const auto& code) {
        for (std::size_t v = 0; v < 32; ++v) {
          at[r * 4 + v % 4] |= static_cast<std::uint8_t>(((code(v) >> 4) & 1) << (v / 4));
        }
      };
      switch (f) {
        case weight_format::q4_0: {
          put_f16(dst + unit * ub + 2 * r, pc.scale[0]);
          put_nibbles(u + 2 * R, [&](std::size_t v) { return pc.q[v] + 8; });
          break;
        }
        case weight_format::int8_sym:
        case weight_format::int4_sym: {  // the scale as stored (f16 bits or f32), once a group
          if (j % ts.group_pieces == 0) {
            const std::size_t g = j / ts.group_pieces, es = ts.f16 ? 2 : 4;
            std::memcpy(scales + (g * R + r) * es,
                        w.scales.data() + ((n0 + r) * w.groups() + g) * es, es);
          }
          if (f == weight_format::int4_sym) {
            put_nibbles(u, [&](std::size_t v) { return pc.q[v] + 8; });
          } else {
            put_bytes(u);
          }
          break;
        }
        case weight_format::q4_1:
        case weight_format::q5_0:
        case weight_format::q5_1: {
          const bool offset = f != weight_format::q5_0;  // decode_piece: offset = −m
          const int bias = f == weight_format::q5_0 ? 16 : 0;
          put_f16(dst + unit * ub + 2 * r, pc.scale[0]);
          if (offset) put_f16(dst + unit * ub + 2 * R + 2 * r, -pc.offset[0]);
          const auto code = [&](std::size_t v) { return pc.q[v] + bias; };
          put_nibbles(u + tile_nibbles_at(f), code);
          if (f != weight_format::q4_1) put_high_bits(u + tile_high_bits_at(f), code);
          break;
        }
        case weight_format::iq4_nl:
        case weight_format::iq4_xs: {  // the indices, from the row (decode_piece gives values)
          const bool xs = f == weight_format::iq4_xs;
          const auto* b = reinterpret_cast<const std::uint8_t*>(row) + (xs ? 136 * unit : 18 * j);
          const std::uint8_t* nib = xs ? b + 8 + 16 * p : b + 2;
          if (p == 0) std::memcpy(u + 2 * r, b, 2);
          if (xs) u[2 * R + p * R + r] = static_cast<std::uint8_t>(iq4_xs_scale(b, p) - 32);
          put_nibbles(u + tile_nibbles_at(f) + p * 16 * R,
                      [&](std::size_t v) { return v < 16 ? nib[v] & 0xF : nib[v - 16] >> 4; });
          break;
        }
        case weight_format::q8_0: {
          put_f16(dst + unit * ub + 2 * r, pc.scale[0]);
          put_bytes(u + 2 * R);
          break;
        }
        case weight_format::q4_k:
        case weight_format::q5_k: {
          const std::byte* b = row + (f == weight_format::q5_k ? 176 : 144) * unit;
          if (p == 0) {
            std::memcpy(u + 2 * r, b, 2);
            std::memcpy(u + 2 * R + 2 * r, b + 2, 2);
          }
          int sc, m;
          q4_k_scale_min(reinterpret_cast<const std::uint8_t*>(b + 4), p, sc, m);
          u[4 * R + p * R + r] = static_cast<std::uint8_t>(sc);
          u[12 * R + p * R + r] = static_cast<std::uint8_t>(m);
          const std::size_t c = p / 2, shift = (p % 2) * 4;
          for (std::size_t t = 0; t < 8; ++t) {
            for (std::size_t i = 0; i < 4; ++i) {
              u[20 * R + ((c * 8 + t) * R + r) * 4 + i] |=
                  static_cast<std::uint8_t>((pc.q[4 * t + i] & 0xF) << shift);
            }
          }
          if (f == weight_format::q5_k) {
            put_high_bits(u + 148 * R + p * 4 * R, [&](std::size_t v) { return pc.q[v]; });
          }
          break;
        }
        case weight_format::q6_k: {
          const std::byte* b = row + 210 * unit;
          if (p == 0) std::memcpy(u + 2 * r, b + 208, 2);
          u[2 * R + (2 * p) * R + r] = static_cast<std::uint8_t>(b[192 + 2 * p]);
          u[2 * R + (2 * p + 1) * R + r] = static_cast<std::uint8_t>(b[192 + 2 * p + 1]);
          std::uint8_t* lo = u + 18 * R + p * 24 * R;
          std::uint8_t* hi = lo + 16 * R;
          for (std::size_t v = 0; v < 32; ++v) {
            const int q = pc.q[v] + 32;  // 0..63
            const std::size_t chunk = v / 4, i = v % 4;
            // low nibble: chunk t in 0..3 in load t's low nibbles, t + 4 in its high ones
            lo[((chunk % 4) * R + r) * 4 + i] |=
                static_cast<std::uint8_t>((q & 0xF) << (chunk / 4 * 4));
            // high pair: chunk c in plane c % 2 at bits 2 (c / 2)
            hi[((chunk % 2) * R + r) * 4 + i] |=
                static_cast<std::uint8_t>((q >> 4) << (chunk / 2 * 2));
          }
          break;
        }
        case weight_format::q3_k:
        case weight_format::q2_k: {
          const bool three = f == weight_format::q3_k;
          const auto* b = reinterpret_cast<const std::uint8_t*>(row) + (three ? 110 : 84) * unit;
          if (p == 0) {
            std::memcpy(u + 2 * r, b + (three ? 108 : 80), 2);
            if (!three) std::memcpy(u + 2 * R + 2 * r, b + 82, 2);
          }
          for (std::size_t h = 0; h < 2; ++h) {
            u[(three ? 2 : 4) * R + (2 * p + h) * R + r] =
                three ? static_cast<std::uint8_t>(q3_k_scale(b + 96, 2 * p + h) - 32)
                      : b[2 * p + h];
          }
          std::uint8_t* pairs = u + (three ? 18 : 20) * R + p * (three ? 12 : 8) * R;
          for (std::size_t v = 0; v < 32; ++v) {
            const int q = pc.q[v] + (three ? 4 : 0);  // 0..7, 0..3
            const std::size_t chunk = v / 4, i = v % 4;
            pairs[((chunk % 2) * R + r) * 4 + i] |=
                static_cast<std::uint8_t>((q & 3) << (chunk / 2 * 2));
            if (three) pairs[(2 * R + r) * 4 + i] |= static_cast<std::uint8_t>((q >> 2) << chunk);
          }
          break;
        }
        default: break;
      }
    }
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
