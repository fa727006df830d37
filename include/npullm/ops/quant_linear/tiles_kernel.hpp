// The kernel over repacked tiles (quant_linear/tiles.hpp gives the layout): MR rows of x times
// one tile of R rows of W, all of K, into y's MR x R block. Written once over the ISA's vector
// struct (tiles_isa.hpp); portable builds run the same loops in scalar code (tiles_portable.hpp,
// included at the end). Per unit it loads each code vector once for all MR rows of x, so M <= 16
// (decode, a speculative verify step) and M > 16 (prefill, in groups of MR rows) read the same
// tiles.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "npullm/core/isa.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_linear/activations.hpp"
#include "npullm/ops/quant_linear/tiles.hpp"
#include "npullm/ops/quant_linear/tiles_isa.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

// Rows of x per pass over a tile: 4 for decode-sized M; prefill takes more per pass where the
// registers allow (AVX-512: 32 vectors).
#if defined(NPULLM_QUANT_VNNI512)
inline constexpr std::size_t tile_max_mr = 8;
#else
inline constexpr std::size_t tile_max_mr = 4;
#endif

// IQ4_NL / IQ4_XS's table + 128 (u8 codes for a dot product of u8 by s8; 1 .. 241).
inline constexpr auto iq4_table_biased = [] {
  std::array<std::uint8_t, 16> t{};
  for (std::size_t i = 0; i < 16; ++i) t[i] = static_cast<std::uint8_t>(iq4_values[i] + 128);
  return t;
}();

// Bytes ahead of the unit being read that the kernel prefetches (one stream per thread: the
// hardware prefetchers alone leave the first load of each unit waiting; see gemv_rows), on
// through the tiles of the thread's part (stream_end below), not only to the tile's end.
// Measured on the Zen 4 guest, one 151936 x 1024 GEMV at 1 thread, best of 5 (a noisy shared
// machine): q4_k 10-13 GB/s stopping at the tile's end, 22 on to the part's end; q6_k 14-22
// either way at 1536 bytes, 12-17 at 6144; q8_0 (units of 544 bytes) 19-21 at 1536,
// 22-26 at 6144.
constexpr std::size_t tile_prefetch_bytes(weight_format f) noexcept {
  return f == weight_format::q8_0 ? 6144 : 1536;
}

#if defined(__AVX2__)
// The vector struct of F's tiles (tile_height_of(F) rows a vector).
#if defined(NPULLM_QUANT_VNNI512)
template <weight_format F>
using tile_isa_for = std::conditional_t<tile_height_of(F) == 16, tile_avx512, tile_avx2>;
#else
template <weight_format F>
using tile_isa_for = tile_avx2;
#endif

// y[m, n0 .. n0 + rows) for the MR rows of x from m0 (rows <= R of the tile are stored).
// stream_end: the end of the run of contiguous tiles this tile is read in (the thread's part),
// so that the prefetch runs on into the next tile, not past the part (nullptr: this tile's end).
// ts: where int8_sym / int4_sym tiles keep their scales (tiles.hpp; unused by the GGUF formats).
template <weight_format F, std::size_t MR>
void tile_rows(const std::byte* tile, std::size_t units, const quantized_activations& a,
               std::size_t m0, std::size_t rows, const float* bias, float* y, std::size_t ldy,
               const std::byte* stream_end, tile_scales ts) {
  using V = tile_isa_for<F>;
  using vi = V::i;
  using vf = V::f;
  constexpr std::size_t R = V::rows, C = 4 * R;  // C: bytes of one chunk vector
  static_assert(R == tile_height_of(F), "tile_rows: the vector struct must hold a tile's rows");
  constexpr std::size_t ub = tile_unit_bytes(F);
  const std::size_t k = a.k, blocks = a.blocks;
  const std::int8_t* xq = a.codes.data() + m0 * k;
  const float* dx = a.d.data() + m0 * blocks;
  const float* tot = a.tot.data() + m0 * blocks;
  const std::int32_t* qs = a.qsum.data() + m0 * blocks * 2;
  const vi low4 = V::bytes(0x0F);
  vf acc[MR];
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) acc[m] = V::zerof();
  // 4 codes of x row m from value v of the row
  const auto x4 = [&](std::size_t m, std::size_t v) { return V::bcast4(xq + m * k + v); };
  // int8_sym / int4_sym: the units after the scales; a group's scales in sg for its pieces
  constexpr bool sym = tile_sym(F);
  const std::byte* scales = tile;
  if constexpr (sym) tile += tile_scale_bytes(F, units, ts);
  vf sg = V::zerof();
  std::size_t group_left = 0;
  const char* end =
      reinterpret_cast<const char*>(stream_end != nullptr ? stream_end : tile + units * ub);
  for (std::size_t u = 0; u < units; ++u) {
    const std::byte* p = tile + u * ub;
    if constexpr (sym) {
      if (group_left == 0) {
        sg = ts.f16 ? V::f16(scales) : V::loadf(reinterpret_cast<const float*>(scales));
        scales += (ts.f16 ? 2 : 4) * R;
        group_left = ts.group_pieces;
      }
      --group_left;
    }
    const char* pf = reinterpret_cast<const char*>(p) + tile_prefetch_bytes(F);
    for (std::size_t o = 0; o < ub; o += 64) {
      if (pf + o < end) _mm_prefetch(pf + o, _MM_HINT_T0);
    }
    if constexpr (F == weight_format::q4_0 || F == weight_format::int4_sym) {
      const std::size_t j = u;
      const vf s = sym ? sg : V::f16(p);
      const std::byte* nib = p + (sym ? 0 : 2 * R);
      vi lo[4], hi[4];
      NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
        const vi v = V::load(nib + t * C);
        lo[t] = V::and_(v, low4);
        hi[t] = V::and_(V::template srl16<4>(v), low4);
      }
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const std::int32_t* q = qs + (m * blocks + j) * 2;
        vi ia = V::set1(-8 * (q[0] + q[1]));
        vi sm = V::small_begin(ia);  // codes <= 15: 8 dots in one small sum (tiles_isa.hpp)
        NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
          sm = V::small_dot(sm, lo[t], x4(m, 32 * j + 4 * t));
          sm = V::small_dot(sm, hi[t], x4(m, 32 * j + 16 + 4 * t));
        }
        ia = V::small_end(sm, ia);
        acc[m] = V::fmadd(V::cvt(ia), V::mul(s, V::set1f(dx[m * blocks + j])), acc[m]);
      }
    } else if constexpr (F == weight_format::q4_1 || F == weight_format::q5_0 ||
                         F == weight_format::q5_1) {
      constexpr bool five = F != weight_format::q4_1, offset = F != weight_format::q5_0;
      const std::size_t j = u;
      const vf s = V::f16(p);
      vi lo[4], hi[4];
      // chunk t's high bits from bit t, chunk t + 4's from bit t + 4, moved to bit 4
      vi hl = V::set1(0), hh = V::set1(0);
      const vi bit4 = V::bytes(0x10);
      if constexpr (five) {
        hh = V::load(p + tile_high_bits_at(F));
        hl = V::template sll16<4>(hh);
      }
      NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
        const vi v = V::load(p + tile_nibbles_at(F) + t * C);
        lo[t] = V::and_(v, low4);
        hi[t] = V::and_(V::template srl16<4>(v), low4);
        if constexpr (five) {
          lo[t] = V::or_(lo[t], V::and_(hl, bit4));
          hi[t] = V::or_(hi[t], V::and_(hh, bit4));
          hl = V::template srl16<1>(hl);
          hh = V::template srl16<1>(hh);
        }
      }
      const vf mins = offset ? V::f16(p + 2 * R) : V::zerof();
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const std::int32_t* q = qs + (m * blocks + j) * 2;
        vi ia = V::set1(offset ? 0 : -16 * (q[0] + q[1]));
        // small sums (tiles_isa.hpp): q4_1's 8 dots in one (codes <= 15), five-bit codes'
        // (<= 31) in two of 4, the low chunks' then the high ones'
        vi sm = V::small_begin(ia);
        NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
          sm = V::small_dot(sm, lo[t], x4(m, 32 * j + 4 * t));
        }
        if constexpr (five) {
          ia = V::small_end(sm, ia);
          sm = V::small_begin(ia);
        }
        NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
          sm = V::small_dot(sm, hi[t], x4(m, 32 * j + 16 + 4 * t));
        }
        ia = V::small_end(sm, ia);
        acc[m] = V::fmadd(V::cvt(ia), V::mul(s, V::set1f(dx[m * blocks + j])), acc[m]);
        if constexpr (offset) acc[m] = V::fmadd(mins, V::set1f(tot[m * blocks + j]), acc[m]);
      }
    } else if constexpr (F == weight_format::iq4_nl || F == weight_format::iq4_xs) {
      // The codes looked up from the indices: table + 128 as u8 where dot takes u8 (VNNI: the
      // offset 128 rides in the start), else the signed table (vpmaddubsw's sign trick).
      constexpr bool xs = F == weight_format::iq4_xs;
      const vi table =
          V::table16(tile_q8_biased() ? static_cast<const void*>(iq4_table_biased.data())
                                      : static_cast<const void*>(iq4_values));
      constexpr std::size_t pieces = tile_unit_pieces(F);
      const vf d = V::f16(p);
      for (std::size_t pc = 0; pc < pieces; ++pc) {
        const std::size_t j = pieces * u + pc;
        const std::byte* np = p + tile_nibbles_at(F) + pc * 16 * R;
        vi lo[4], hi[4];
        NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
          const vi v = V::load(np + t * C);
          lo[t] = V::lookup(table, V::and_(v, low4));
          hi[t] = V::lookup(table, V::and_(V::template srl16<4>(v), low4));
        }
        const vf s = xs ? V::mul(d, V::s8(p + 2 * R + pc * R)) : d;
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const std::int32_t* q = qs + (m * blocks + j) * 2;
          vi ia = V::set1(tile_q8_biased() ? -128 * (q[0] + q[1]) : 0);
          NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
            if constexpr (tile_q8_biased()) {
              ia = V::dot(ia, lo[t], x4(m, 32 * j + 4 * t));
              ia = V::dot(ia, hi[t], x4(m, 32 * j + 16 + 4 * t));
            } else {
              ia = V::dot_signed(ia, lo[t], x4(m, 32 * j + 4 * t));
              ia = V::dot_signed(ia, hi[t], x4(m, 32 * j + 16 + 4 * t));
            }
          }
          acc[m] = V::fmadd(V::cvt(ia), V::mul(s, V::set1f(dx[m * blocks + j])), acc[m]);
        }
      }
    } else if constexpr (F == weight_format::q8_0 || F == weight_format::int8_sym) {
      const std::size_t j = u;
      const vf s = sym ? sg : V::f16(p);
      const std::byte* codes = p + (sym ? 0 : 2 * R);
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const std::int32_t* q = qs + (m * blocks + j) * 2;
        vi ia = V::set1(tile_q8_biased() ? -128 * (q[0] + q[1]) : 0);
        NPULLM_UNROLL for (std::size_t t = 0; t < 8; ++t) {
          const vi w = V::load(codes + t * C);
          if constexpr (tile_q8_biased()) {  // the layout's choice (tiles.hpp)
            ia = V::dot(ia, w, x4(m, 32 * j + 4 * t));
          } else {
            ia = V::dot_signed(ia, w, x4(m, 32 * j + 4 * t));
          }
        }
        acc[m] = V::fmadd(V::cvt(ia), V::mul(s, V::set1f(dx[m * blocks + j])), acc[m]);
      }
    } else if constexpr (F == weight_format::q4_k || F == weight_format::q5_k) {
      constexpr bool five = F == weight_format::q5_k;
      const vf d = V::f16(p), dmin = V::f16(p + 2 * R);
      const std::byte* sc = p + 4 * R;
      const std::byte* mn = p + 12 * R;
      const std::byte* codes = p + 20 * R;
      const vi bit4 = V::bytes(0x10);
      NPULLM_UNROLL for (std::size_t c = 0; c < 4; ++c) {
        const std::size_t ja = 8 * u + 2 * c, jb = ja + 1;
        // the two pieces' sums, in small sums (tiles_isa.hpp) of 8 dots (q4_k's codes <= 15)
        // or 4 (q5_k's <= 31)
        vi ia[MR], ib[MR], wa[MR], wb[MR];
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          ia[m] = ib[m] = V::set1(0);
          wa[m] = V::small_begin(ia[m]);
          wb[m] = V::small_begin(ib[m]);
        }
        // q5_k: the two pieces' high bits, chunk t's moved from bit t to bit 4 (t < 4: from
        // the plane shifted left by 4, then right by 1 per chunk; t >= 4: from the plane)
        vi ha = V::set1(0), hb = V::set1(0), ga = ha, gb = hb;
        if constexpr (five) {
          ha = V::load(p + 148 * R + 2 * c * C);
          hb = V::load(p + 148 * R + (2 * c + 1) * C);
          ga = V::template sll16<4>(ha);
          gb = V::template sll16<4>(hb);
        }
        NPULLM_UNROLL for (std::size_t t = 0; t < 8; ++t) {
          const vi v = V::load(codes + (c * 8 + t) * C);
          vi lo = V::and_(v, low4), hi = V::and_(V::template srl16<4>(v), low4);
          if constexpr (five) {
            if (t == 4) {
              ga = ha;
              gb = hb;
              NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
                ia[m] = V::small_end(wa[m], ia[m]);
                ib[m] = V::small_end(wb[m], ib[m]);
                wa[m] = V::small_begin(ia[m]);
                wb[m] = V::small_begin(ib[m]);
              }
            }
            lo = V::or_(lo, V::and_(ga, bit4));
            hi = V::or_(hi, V::and_(gb, bit4));
            ga = V::template srl16<1>(ga);
            gb = V::template srl16<1>(gb);
          }
          NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
            wa[m] = V::small_dot(wa[m], lo, x4(m, 32 * ja + 4 * t));
            wb[m] = V::small_dot(wb[m], hi, x4(m, 32 * jb + 4 * t));
          }
        }
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          ia[m] = V::small_end(wa[m], ia[m]);
          ib[m] = V::small_end(wb[m], ib[m]);
        }
        const vf sa = V::mul(d, V::u8(sc + 2 * c * R)), sb = V::mul(d, V::u8(sc + (2 * c + 1) * R));
        const vf ma = V::mul(dmin, V::u8(mn + 2 * c * R));
        const vf mb = V::mul(dmin, V::u8(mn + (2 * c + 1) * R));
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          acc[m] = V::fmadd(V::cvt(ia[m]), V::mul(sa, V::set1f(dx[m * blocks + ja])), acc[m]);
          acc[m] = V::fnmadd(ma, V::set1f(tot[m * blocks + ja]), acc[m]);
          acc[m] = V::fmadd(V::cvt(ib[m]), V::mul(sb, V::set1f(dx[m * blocks + jb])), acc[m]);
          acc[m] = V::fnmadd(mb, V::set1f(tot[m * blocks + jb]), acc[m]);
        }
      }
    } else if constexpr (F == weight_format::q6_k) {
      const vf d = V::f16(p);
      const std::byte* sc = p + 2 * R;
      const vi bits45 = V::bytes(0x30);
      NPULLM_UNROLL for (std::size_t pc = 0; pc < 8; ++pc) {
        const std::size_t j = 8 * u + pc;
        const std::byte* lp = p + 18 * R + pc * 24 * R;
        const vi h[2] = {V::load(lp + 16 * R), V::load(lp + 16 * R + C)};
        // each half's sum in small sums (tiles_isa.hpp) of 2 dots (codes <= 63)
        vi i0[MR], i1[MR], w0[MR], w1[MR];
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const std::int32_t* q = qs + (m * blocks + j) * 2;
          i0[m] = V::set1(-32 * q[0]);
          i1[m] = V::set1(-32 * q[1]);
          w0[m] = V::small_begin(i0[m]);
          w1[m] = V::small_begin(i1[m]);
        }
        NPULLM_UNROLL for (std::size_t t = 0; t < 4; ++t) {
          if (t == 2) {
            NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
              i0[m] = V::small_end(w0[m], i0[m]);
              i1[m] = V::small_end(w1[m], i1[m]);
              w0[m] = V::small_begin(i0[m]);
              w1[m] = V::small_begin(i1[m]);
            }
          }
          const vi l = V::load(lp + t * C);
          // chunk t: high pair at bits 2 (t / 2) of plane t % 2; chunk t + 4: 4 bits higher
          const vi hv = h[t % 2];
          const vi h0 = t < 2 ? V::template sll16<4>(hv) : V::template sll16<2>(hv);
          const vi h1 = t < 2 ? hv : V::template srl16<2>(hv);
          const vi u0 = V::or_(V::and_(l, low4), V::and_(h0, bits45));
          const vi u1 = V::or_(V::and_(V::template srl16<4>(l), low4), V::and_(h1, bits45));
          NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
            w0[m] = V::small_dot(w0[m], u0, x4(m, 32 * j + 4 * t));
            w1[m] = V::small_dot(w1[m], u1, x4(m, 32 * j + 16 + 4 * t));
          }
        }
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          i0[m] = V::small_end(w0[m], i0[m]);
          i1[m] = V::small_end(w1[m], i1[m]);
        }
        const vf s0 = V::mul(d, V::s8(sc + 2 * pc * R)),
                 s1 = V::mul(d, V::s8(sc + (2 * pc + 1) * R));
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const vf x = V::set1f(dx[m * blocks + j]);
          acc[m] = V::fmadd(V::cvt(i0[m]), V::mul(s0, x), acc[m]);
          acc[m] = V::fmadd(V::cvt(i1[m]), V::mul(s1, x), acc[m]);
        }
      }
    } else if constexpr (F == weight_format::q2_k || F == weight_format::q3_k) {
      constexpr bool three = F == weight_format::q3_k;
      constexpr std::size_t piece_bytes = (three ? 12 : 8) * R;
      const vf d = V::f16(p);
      const vf dmin = three ? V::zerof() : V::f16(p + 2 * R);
      const std::byte* sc = p + (three ? 2 : 4) * R;
      const vi low2 = V::bytes(0x03), bit2 = V::bytes(0x04);
      NPULLM_UNROLL for (std::size_t pc = 0; pc < 8; ++pc) {
        const std::size_t j = 8 * u + pc;
        const std::byte* cp = p + (three ? 18 : 20) * R + pc * piece_bytes;
        // chunk t's low bits at bits 2 (t / 2) of plane t % 2 (both planes shifted right by 2
        // after each odd t); q3_k: its high bit from bit t of the third plane, moved to bit 2
        // (t < 4: from the plane shifted left by 2, then right by 1 a chunk; t >= 4: from the
        // plane shifted right by 2)
        vi l0 = V::load(cp), l1 = V::load(cp + C);
        vi hb = V::set1(0), g = hb;
        if constexpr (three) {
          hb = V::load(cp + 2 * C);
          g = V::template sll16<2>(hb);
        }
        // each half's sum in small sums (tiles_isa.hpp) of 4 dots (codes <= 7)
        vi i0[MR], i1[MR], w0[MR], w1[MR];
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const std::int32_t* q = qs + (m * blocks + j) * 2;
          i0[m] = V::set1(three ? -4 * q[0] : 0);
          i1[m] = V::set1(three ? -4 * q[1] : 0);
          w0[m] = V::small_begin(i0[m]);
          w1[m] = V::small_begin(i1[m]);
        }
        NPULLM_UNROLL for (std::size_t t = 0; t < 8; ++t) {
          if constexpr (three) {
            if (t == 4) g = V::template srl16<2>(hb);
          }
          vi c = V::and_(t % 2 == 0 ? l0 : l1, low2);
          if constexpr (three) {
            c = V::or_(c, V::and_(g, bit2));
            g = V::template srl16<1>(g);
          }
          if (t % 2 == 1) {
            l0 = V::template srl16<2>(l0);
            l1 = V::template srl16<2>(l1);
          }
          NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
            if (t < 4) {
              w0[m] = V::small_dot(w0[m], c, x4(m, 32 * j + 4 * t));
            } else {
              w1[m] = V::small_dot(w1[m], c, x4(m, 32 * j + 4 * t));
            }
          }
        }
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          i0[m] = V::small_end(w0[m], i0[m]);
          i1[m] = V::small_end(w1[m], i1[m]);
        }
        const std::byte* s0p = sc + 2 * pc * R;
        const std::byte* s1p = s0p + R;
        const vf s0 = V::mul(d, three ? V::s8(s0p) : V::u4lo(s0p));
        const vf s1 = V::mul(d, three ? V::s8(s1p) : V::u4lo(s1p));
        const vf m0 = three ? V::zerof() : V::mul(dmin, V::u4hi(s0p));
        const vf m1 = three ? V::zerof() : V::mul(dmin, V::u4hi(s1p));
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const float xd = dx[m * blocks + j];
          [[maybe_unused]] const std::int32_t* q = qs + (m * blocks + j) * 2;  // (q2_k's mins)
          const vf x = V::set1f(xd);
          acc[m] = V::fmadd(V::cvt(i0[m]), V::mul(s0, x), acc[m]);
          if constexpr (!three) {
            acc[m] = V::fnmadd(m0, V::set1f(xd * static_cast<float>(q[0])), acc[m]);
          }
          acc[m] = V::fmadd(V::cvt(i1[m]), V::mul(s1, x), acc[m]);
          if constexpr (!three) {
            acc[m] = V::fnmadd(m1, V::set1f(xd * static_cast<float>(q[1])), acc[m]);
          }
        }
      }
    } else {
      static_assert(!has_kernels(F),
                    "tile_rows: no branch for this format (ops/formats/format_base.hpp)");
    }
  }
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
    float* ym = y + m * ldy;
    if (rows == R) {
      V::storef(ym, bias ? V::add(acc[m], V::loadf(bias)) : acc[m]);
    } else {
      alignas(64) float out[R];
      V::storef(out, acc[m]);
      for (std::size_t r = 0; r < rows; ++r) ym[r] = out[r] + (bias ? bias[r] : 0.0f);
    }
  }
}
#endif  // __AVX2__

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

// Portable builds: the same kernel in scalar code (SSE2 where the target has it).
#if !defined(__AVX2__)
#include "npullm/ops/quant_linear/tiles_portable.hpp"
#endif

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
