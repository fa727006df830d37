// The quantized formats repacked for the kernels (ops::repack, ops/quant_linear.hpp): W's rows in
// tiles of R rows (R = tile_height_of(format): 16 or 8 with AVX-512 VNNI, else 8; one int32
// lane per row in a vector), so that one vector load gives the same 4 codes of R rows and one
// integer dot product against 4 broadcast codes of x adds them into R row sums at once: no
// per-row prologue, no horizontal sums, and the scales of the tile's rows are one contiguous
// vector per piece.
//
// A tile is a run of units (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl: one 32-value piece; q2_k,
// q3_k, q4_k, q5_k, q6_k, iq4_xs: one 256-value super-block), each holding the R rows' factors,
// then their codes as 4-byte chunks (values 4t .. 4t + 3 of a piece) of rows 0 .. R − 1. Each
// format's unit is described, and written (format_codec<F>::pack), in its header
// ops/formats/<name>.hpp; its bytes per row are format_layout<F>::tile_row_bytes. int8_sym and
// int4_sym (the scales outside the blocks, one per group of G values, G = 32, 64, 128 or K) start
// the tile with the scales of its R rows, group by group, in the source's type (f16 or f32:
// [K / G][R]), then their units are pieces.
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
  return !is_block_format(f);
}
// Bytes of a tile's scales ahead of its units (0 for the GGUF formats).
constexpr std::size_t tile_scale_bytes(weight_format f, std::size_t pieces,
                                       tile_scales s) noexcept {
  return tile_sym(f) ? pieces / s.group_pieces * (s.f16 ? 2 : 4) * tile_height_of(f) : 0;
}

// Pieces per unit and bytes per unit of R rows (0: no tiled layout).
constexpr std::size_t tile_unit_pieces(weight_format f) noexcept {
  return info_of(f).tile_unit_pieces;
}
constexpr std::size_t tile_unit_bytes(weight_format f) noexcept {
  return info_of(f).tile_row_bytes * tile_height_of(f);
}

constexpr bool has_tiles(weight_format f) noexcept {
  return has_kernels(f);  // (a tile layout is what has_kernels reads)
}

// Where a unit's codes (nibbles; q5_0, q5_1: then their high bits) start, in bytes from the unit.
constexpr std::size_t tile_nibbles_at(weight_format f) noexcept {
  return info_of(f).tile_head_bytes * tile_height_of(f);
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
  auto* units = reinterpret_cast<std::uint8_t*>(dst + sb);
  visit_format(f, [&]<weight_format F>(format_constant<F>) {
    using layout = format_layout<F>;
    piece pc;
    for (std::size_t r = 0; r < rows; ++r) {
      const auto* row =
          reinterpret_cast<const std::uint8_t*>(w.data.data() + (n0 + r) * w.row_bytes());
      for (std::size_t j = 0; j < pieces; ++j) {
        decode_piece(w, n0 + r, j, pc);
        const std::size_t unit = j / upieces;
        // int8_sym, int4_sym: the scale as stored (f16 bits or f32), once a group
        if constexpr (layout::block_bytes == 0) {
          if (j % ts.group_pieces == 0) {
            const std::size_t g = j / ts.group_pieces, es = ts.f16 ? 2 : 4;
            std::memcpy(scales + (g * R + r) * es,
                        w.scales.data() + ((n0 + r) * w.groups() + g) * es, es);
          }
        }
        const std::uint8_t* block = layout::block_bytes != 0
                                        ? row + j * 32 / layout::block_values * layout::block_bytes
                                        : nullptr;
        if constexpr (layout::tile_row_bytes != 0) {  // (repack refuses a format without)
          format_codec<F>::pack(
              tile_writer{units + unit * ub, R, r, j % upieces, block, pc, tile_q8_biased()});
        }
      }
    }
  });
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
