// The portable build's kernel over repacked tiles (tiles_kernel.hpp's tile_rows without AVX2):
// included by tiles_kernel.hpp, whose definitions it uses (tile_max_mr, the IQ4 tables); it
// includes that header in turn, so that it also compiles on its own (each is guarded).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "npullm/core/isa.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_linear/activations.hpp"
#include "npullm/ops/quant_linear/tiles.hpp"
#include "npullm/ops/quant_linear/tiles_kernel.hpp"

#if !defined(__AVX2__)
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

// Portable: the same integers per row, every row of the tile at once (no prefetch): a chunk's
// R x 4 codes are made into bytes and multiplied by x's 4 codes into 2R pair sums (tile_lanes:
// SSE2's pmaddwd on any x86-64, plain loops elsewhere), folded into the R row sums once a
// piece; a row's floats are summed in the SIMD kernels' order, unit by unit. Zero rows past
// `rows` are computed and not stored.
template <std::size_t C>
struct tile_lanes {
#if defined(__SSE2__)
  __m128i v[C / 8] = {};  // i32 pair sums: lanes 2r and 2r + 1 are row r's
#else
  std::int32_t v[C / 2] = {};
#endif
  // lanes += code(j) · x[j % 4] for the chunk's C codes (each fits int8): the codes made into
  // bytes (byte-wise loops the compiler vectorizes), then with SSE2 sign-extended to 16 bits
  // and multiplied by x's codes pairwise into 32 bits (pmaddwd)
  template <class Code>
  void add(const std::int8_t* x, Code code) noexcept {
    alignas(16) std::int8_t q[C];
    for (std::size_t j = 0; j < C; ++j) q[j] = static_cast<std::int8_t>(code(j));
#if defined(__SSE2__)
    const __m128i xs = _mm_set_epi16(x[3], x[2], x[1], x[0], x[3], x[2], x[1], x[0]);
    for (std::size_t j = 0; j < C; j += 16) {
      const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(q + j));
      const __m128i sign = _mm_cmpgt_epi8(_mm_setzero_si128(), b);
      v[j / 8] = _mm_add_epi32(v[j / 8], _mm_madd_epi16(_mm_unpacklo_epi8(b, sign), xs));
      v[j / 8 + 1] = _mm_add_epi32(v[j / 8 + 1], _mm_madd_epi16(_mm_unpackhi_epi8(b, sign), xs));
    }
#else
    for (std::size_t j = 0; j < C; ++j) v[j / 2] += q[j] * x[j % 4];
#endif
  }
  template <class Get>
  void dot(const std::uint8_t* b, const std::int8_t* x, Get get) noexcept {
    add(x, [&](std::size_t j) { return get(b[j]); });
  }
#if defined(__SSE2__)
  // lanes += lo(j) · xl[j % 4] + hi(j) · xh[j % 4], pr[j] = lo(j) | hi(j) << 8 (two int8 codes:
  // IQ4's two nibbles looked up at once, iq4_pairs); the same integers as add() twice
  void add_pairs(const std::int8_t* xl, const std::int8_t* xh, const std::uint16_t* pr) noexcept {
    const __m128i l = _mm_set_epi16(xl[3], xl[2], xl[1], xl[0], xl[3], xl[2], xl[1], xl[0]);
    const __m128i h = _mm_set_epi16(xh[3], xh[2], xh[1], xh[0], xh[3], xh[2], xh[1], xh[0]);
    for (std::size_t j = 0; j < C; j += 8) {
      const __m128i p = _mm_load_si128(reinterpret_cast<const __m128i*>(pr + j));
      const __m128i lo = _mm_srai_epi16(_mm_slli_epi16(p, 8), 8), hi = _mm_srai_epi16(p, 8);
      v[j / 8] =
          _mm_add_epi32(v[j / 8], _mm_add_epi32(_mm_madd_epi16(lo, l), _mm_madd_epi16(hi, h)));
    }
  }
#endif
  // row r's sum (its 4 codes' products) plus `start`
  [[nodiscard]] std::int32_t row(std::size_t r, std::int32_t start = 0) const noexcept {
#if defined(__SSE2__)
    alignas(16) std::int32_t w[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(w), v[r / 2]);
    return start + w[2 * (r % 2)] + w[2 * (r % 2) + 1];
#else
    return start + v[2 * r] + v[2 * r + 1];
#endif
  }
};

// IQ4's codes of a byte's two nibbles: the low one's in the low byte, the high one's above.
inline constexpr auto iq4_pairs = [] {
  std::array<std::uint16_t, 256> t{};
  for (std::size_t b = 0; b < 256; ++b) {
    t[b] = static_cast<std::uint16_t>(static_cast<std::uint8_t>(iq4_values[b & 0xF]) |
                                      static_cast<std::uint8_t>(iq4_values[b >> 4]) << 8);
  }
  return t;
}();

template <weight_format F, std::size_t MR>
void tile_rows(const std::byte* tile, std::size_t units, const quantized_activations& a,
               std::size_t m0, std::size_t rows, const float* bias, float* y, std::size_t ldy,
               const std::byte* /*stream_end*/, tile_scales ts) {
  constexpr std::size_t R = tile_height_of(F), C = 4 * R;
  constexpr std::size_t ub = tile_unit_bytes(F);
  const std::size_t k = a.k, blocks = a.blocks;
  constexpr bool sym = tile_sym(F);
  const auto* scales = reinterpret_cast<const std::uint8_t*>(tile);  // (int8_sym, int4_sym)
  const auto* t8 = scales + tile_scale_bytes(F, units, ts);
  const auto f16 = [](const std::uint8_t* p) {
    return load_f16(reinterpret_cast<const std::byte*>(p));
  };
  // row r's scale of piece u: int8_sym / int4_sym's of its group, else the unit's f16 d
  const auto piece_scale = [&](const std::uint8_t* p, std::size_t u, std::size_t r) {
    if constexpr (sym) {
      const std::uint8_t* g = scales + (u / ts.group_pieces * R + r) * (ts.f16 ? 2 : 4);
      if (ts.f16) return f16(g);
      float v;
      std::memcpy(&v, g, 4);
      return v;
    } else {
      return f16(p + 2 * r);
    }
  };
  const auto low = [](std::uint8_t b) { return int{b & 0xF}; };
  const auto high = [](std::uint8_t b) { return int{b >> 4}; };
  for (std::size_t m = 0; m < MR; ++m) {
    const std::int8_t* xq = a.codes.data() + (m0 + m) * k;
    const float* dx = a.d.data() + (m0 + m) * blocks;
    const float* tot = a.tot.data() + (m0 + m) * blocks;
    const std::int32_t* qs = a.qsum.data() + (m0 + m) * blocks * 2;
    float acc[R] = {};
    for (std::size_t u = 0; u < units; ++u) {
      const std::uint8_t* p = t8 + u * ub;
      if constexpr (F == weight_format::q4_0 || F == weight_format::int4_sym) {
        const std::uint8_t* nb = p + (sym ? 0 : 2 * R);
        tile_lanes<C> l;
        for (std::size_t t = 0; t < 4; ++t) {
          l.dot(nb + t * C, xq + 32 * u + 4 * t, low);
          l.dot(nb + t * C, xq + 32 * u + 16 + 4 * t, high);
        }
        const std::int32_t start = -8 * (qs[2 * u] + qs[2 * u + 1]);
        for (std::size_t r = 0; r < R; ++r) {
          acc[r] =
              std::fma(static_cast<float>(l.row(r, start)), piece_scale(p, u, r) * dx[u], acc[r]);
        }
      } else if constexpr (F == weight_format::q4_1 || F == weight_format::q5_0 ||
                           F == weight_format::q5_1) {
        const std::uint8_t* nb = p + tile_nibbles_at(F);
        const std::uint8_t* hb = p + tile_high_bits_at(F);
        tile_lanes<C> l;
        for (std::size_t t = 0; t < 4; ++t) {
          const std::uint8_t* b = nb + t * C;
          l.add(xq + 32 * u + 4 * t, [&](std::size_t j) {
            return (b[j] & 0xF) | (F == weight_format::q4_1 ? 0 : ((hb[j] >> t) & 1) << 4);
          });
          l.add(xq + 32 * u + 16 + 4 * t, [&](std::size_t j) {
            return (b[j] >> 4) | (F == weight_format::q4_1 ? 0 : ((hb[j] >> (t + 4)) & 1) << 4);
          });
        }
        const std::int32_t start = F == weight_format::q5_0 ? -16 * (qs[2 * u] + qs[2 * u + 1]) : 0;
        for (std::size_t r = 0; r < R; ++r) {
          acc[r] = std::fma(static_cast<float>(l.row(r, start)), f16(p + 2 * r) * dx[u], acc[r]);
          if constexpr (F != weight_format::q5_0) {
            acc[r] = std::fma(f16(p + 2 * R + 2 * r), tot[u], acc[r]);
          }
        }
      } else if constexpr (F == weight_format::iq4_nl || F == weight_format::iq4_xs) {
        float d[R];  // the rows' scales, once a unit
        for (std::size_t r = 0; r < R; ++r) d[r] = f16(p + 2 * r);
        for (std::size_t pc = 0; pc < tile_unit_pieces(F); ++pc) {
          const std::size_t j = tile_unit_pieces(F) * u + pc;
          const std::uint8_t* nb = p + tile_nibbles_at(F) + pc * 16 * R;
          tile_lanes<C> l;
          for (std::size_t t = 0; t < 4; ++t) {
#if defined(__SSE2__)
            // both nibbles of a byte looked up at once (one 16-bit load instead of two byte
            // lookups, the bytes' sign extension by shifts): SSE2 has no byte shuffle
            alignas(16) std::uint16_t pr[C];
            const std::uint8_t* b = nb + t * C;
            for (std::size_t i = 0; i < C; ++i) pr[i] = iq4_pairs[b[i]];
            l.add_pairs(xq + 32 * j + 4 * t, xq + 32 * j + 16 + 4 * t, pr);
#else
            l.dot(nb + t * C, xq + 32 * j + 4 * t,
                  [](std::uint8_t b) { return int{iq4_values[b & 0xF]}; });
            l.dot(nb + t * C, xq + 32 * j + 16 + 4 * t,
                  [](std::uint8_t b) { return int{iq4_values[b >> 4]}; });
#endif
          }
          for (std::size_t r = 0; r < R; ++r) {
            const float s =
                F == weight_format::iq4_xs
                    ? d[r] * static_cast<float>(static_cast<std::int8_t>(p[2 * R + pc * R + r]))
                    : d[r];
            acc[r] = std::fma(static_cast<float>(l.row(r)), s * dx[j], acc[r]);
          }
        }
      } else if constexpr (F == weight_format::q8_0 || F == weight_format::int8_sym) {
        tile_lanes<C> l;
        for (std::size_t t = 0; t < 8; ++t) {
          l.dot(p + (sym ? 0 : 2 * R) + t * C, xq + 32 * u + 4 * t,
                [](std::uint8_t b) { return int{static_cast<std::int8_t>(b)}; });
        }
        for (std::size_t r = 0; r < R; ++r) {
          acc[r] = std::fma(static_cast<float>(l.row(r)), piece_scale(p, u, r) * dx[u], acc[r]);
        }
      } else if constexpr (F == weight_format::q4_k || F == weight_format::q5_k) {
        float d[R], dmin[R];  // the rows' factors, once a unit
        for (std::size_t r = 0; r < R; ++r) {
          d[r] = f16(p + 2 * r);
          dmin[r] = f16(p + 2 * R + 2 * r);
        }
        for (std::size_t pc = 0; pc < 8; ++pc) {
          const std::size_t j = 8 * u + pc, c = pc / 2, shift = (pc % 2) * 4;
          const std::uint8_t* hb = p + 148 * R + pc * C;  // (q5_k)
          tile_lanes<C> l;
          for (std::size_t t = 0; t < 8; ++t) {
            const std::uint8_t* b = p + 20 * R + (c * 8 + t) * C;
            l.add(xq + 32 * j + 4 * t, [&](std::size_t i) {
              const int q = (b[i] >> shift) & 0xF;
              return F == weight_format::q5_k ? q | ((hb[i] >> t) & 1) << 4 : q;
            });
          }
          for (std::size_t r = 0; r < R; ++r) {
            const float s = d[r] * static_cast<float>(p[4 * R + pc * R + r]);
            const float mn = dmin[r] * static_cast<float>(p[12 * R + pc * R + r]);
            acc[r] = std::fma(static_cast<float>(l.row(r)), s * dx[j], acc[r]);
            acc[r] = std::fma(-mn, tot[j], acc[r]);
          }
        }
      } else if constexpr (F == weight_format::q6_k) {
        float d[R];  // the rows' scales, once a unit
        for (std::size_t r = 0; r < R; ++r) d[r] = f16(p + 2 * r);
        for (std::size_t pc = 0; pc < 8; ++pc) {
          const std::size_t j = 8 * u + pc;
          const std::uint8_t* lp = p + 18 * R + pc * 24 * R;
          tile_lanes<C> l[2];  // values 0..15 of the piece, 16..31
          // (unrolled: constant shifts, and the lanes stay in registers instead of the stack)
          NPULLM_UNROLL for (std::size_t chunk = 0; chunk < 8; ++chunk) {
            const std::uint8_t* lo = lp + (chunk % 4) * C;
            const std::uint8_t* hi = lp + 16 * R + (chunk % 2) * C;
            const int ls = static_cast<int>(chunk / 4 * 4), hs = static_cast<int>(chunk / 2 * 2);
            l[chunk / 4].add(xq + 32 * j + 4 * chunk, [&](std::size_t i) {
              return ((lo[i] >> ls) & 0xF) | (((hi[i] >> hs) & 3) << 4);
            });
          }
          for (std::size_t h = 0; h < 2; ++h) {
            for (std::size_t r = 0; r < R; ++r) {
              const float s = d[r] * static_cast<float>(
                                         static_cast<std::int8_t>(p[2 * R + (2 * pc + h) * R + r]));
              const std::int32_t ih = l[h].row(r, -32 * qs[2 * j + h]);
              acc[r] = std::fma(static_cast<float>(ih), s * dx[j], acc[r]);
            }
          }
        }
      } else if constexpr (F == weight_format::q2_k || F == weight_format::q3_k) {
        constexpr bool three = F == weight_format::q3_k;
        float d[R], dmin[R];  // the rows' factors, once a unit
        for (std::size_t r = 0; r < R; ++r) {
          d[r] = f16(p + 2 * r);
          dmin[r] = three ? 0.0f : f16(p + 2 * R + 2 * r);
        }
        const std::uint8_t* sc = p + (three ? 2 : 4) * R;
        for (std::size_t pc = 0; pc < 8; ++pc) {
          const std::size_t j = 8 * u + pc;
          const std::uint8_t* cp = p + (three ? 18 : 20) * R + pc * (three ? 12 : 8) * R;
          tile_lanes<C> l[2];  // values 0..15 of the piece, 16..31
          // (unrolled: constant shifts, and the lanes stay in registers instead of the stack)
          NPULLM_UNROLL for (std::size_t chunk = 0; chunk < 8; ++chunk) {
            const std::uint8_t* lo = cp + (chunk % 2) * C;
            const std::uint8_t* hb = cp + 2 * C;  // (q3_k)
            const int ls = static_cast<int>(chunk / 2 * 2);
            l[chunk / 4].add(xq + 32 * j + 4 * chunk, [&](std::size_t i) {
              return ((lo[i] >> ls) & 3) | (three ? ((hb[i] >> chunk) & 1) << 2 : 0);
            });
          }
          for (std::size_t h = 0; h < 2; ++h) {
            for (std::size_t r = 0; r < R; ++r) {
              const std::uint8_t b = sc[(2 * pc + h) * R + r];
              if constexpr (three) {
                const float s = d[r] * static_cast<float>(static_cast<std::int8_t>(b));
                const std::int32_t ih = l[h].row(r, -4 * qs[2 * j + h]);
                acc[r] = std::fma(static_cast<float>(ih), s * dx[j], acc[r]);
              } else {
                const float s = d[r] * static_cast<float>(b & 0xF);
                const float mn = dmin[r] * static_cast<float>(b >> 4);
                acc[r] = std::fma(static_cast<float>(l[h].row(r)), s * dx[j], acc[r]);
                acc[r] = std::fma(-mn, dx[j] * static_cast<float>(qs[2 * j + h]), acc[r]);
              }
            }
          }
        }
      } else {
        static_assert(
            !has_kernels(F),
            "tile_rows (portable): no branch for this format (ops/formats/format_base.hpp)");
      }
    }
    for (std::size_t r = 0; r < rows; ++r) y[m * ldy + r] = acc[r] + (bias ? bias[r] : 0.0f);
  }
}

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
#endif  // !__AVX2__
