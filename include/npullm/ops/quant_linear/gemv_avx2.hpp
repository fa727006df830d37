// The quantized GEMV for AVX2 and up (M <= 16 rows of x; ops/quant_linear.hpp explains the
// paths): W read in place, row by row, with a per-row prologue of scales (gemv_prologue.hpp).
// AVX-VNNI / AVX-512 VNNI where the compiler targets them.
#pragma once

#include "npullm/ops/quant_linear/activations.hpp"
#include "npullm/ops/quant_linear/gemv_prologue.hpp"

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

#if defined(__AVX2__)
// Calls fn(j, u, w, parity<j % 2>) for every piece j of row n (u: u8 codes; w: the int8 codes,
// read by the sign trick only).
template <weight_format F, class Fn>
[[gnu::always_inline]] inline void for_each_piece(const std::byte* row, std::size_t pieces,
                                                  Fn&& fn) {
  if constexpr (F == weight_format::q4_0 || F == weight_format::int4_sym) {
    constexpr std::size_t bb = F == weight_format::q4_0 ? 18 : 16, at = bb - 16;
    auto codes = [&](std::size_t j) {
      const __m256i u = nibbles_lo_hi(row + bb * j + at);
      // int4_sym: two's complement nibble xor 8 = code + 8 (x is stored evens | odds).
      return F == weight_format::int4_sym ? _mm256_xor_si256(u, _mm256_set1_epi8(0x08)) : u;
    };
    std::size_t j = 0;
    for (; j + 2 <= pieces; j += 2) {
      fn(j, codes(j), __m256i{}, parity<0>{});
      fn(j + 1, codes(j + 1), __m256i{}, parity<1>{});
    }
    if (j < pieces) fn(j, codes(j), __m256i{}, parity<0>{});
  } else if constexpr (F == weight_format::q8_0 || F == weight_format::int8_sym) {
    constexpr std::size_t bb = F == weight_format::q8_0 ? 34 : 32, at = bb - 32;
    auto piece_fn = [&](std::size_t j, auto par) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + bb * j + at));
      if constexpr (sign_trick(F)) {
        fn(j, _mm256_abs_epi8(w), w, par);
      } else {
        fn(j, _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), w, par);
      }
    };
    std::size_t j = 0;
    for (; j + 2 <= pieces; j += 2) {
      piece_fn(j, parity<0>{});
      piece_fn(j + 1, parity<1>{});
    }
    if (j < pieces) piece_fn(j, parity<0>{});
  } else if constexpr (F == weight_format::q4_1 || F == weight_format::q5_0 ||
                       F == weight_format::q5_1 || F == weight_format::iq4_nl) {
    // nibbles at byte `at` of each bb-byte block; q5_0 / q5_1: fifth bits (u32) at `hb`
    constexpr std::size_t bb = block_bytes(F);
    constexpr std::size_t at = F == weight_format::q4_1   ? 4
                               : F == weight_format::q5_0 ? 6
                               : F == weight_format::q5_1 ? 8
                                                          : 2;
    constexpr std::size_t hb = F == weight_format::q5_0 ? 2 : 4;
    auto piece_fn = [&](std::size_t j, auto par) {
      const std::byte* b = row + bb * j;
      __m256i u = nibbles_lo_hi(b + at);
      if constexpr (F == weight_format::q5_0 || F == weight_format::q5_1) {
        u = _mm256_or_si256(u, fifth_bits(b + hb));
      }
      if constexpr (F == weight_format::iq4_nl) {
        const __m256i v = iq4_lookup(u);
        if constexpr (sign_trick(F)) {
          fn(j, _mm256_abs_epi8(v), v, par);
        } else {
          fn(j, _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))), v, par);
        }
      } else {
        fn(j, u, __m256i{}, par);
      }
    };
    std::size_t j = 0;
    for (; j + 2 <= pieces; j += 2) {
      piece_fn(j, parity<0>{});
      piece_fn(j + 1, parity<1>{});
    }
    if (j < pieces) piece_fn(j, parity<0>{});
  } else if constexpr (F == weight_format::iq4_xs) {
    for (std::size_t sb = 0; sb < pieces / 8; ++sb) {
      const std::byte* b = row + 136 * sb + 8;
      NPULLM_UNROLL for (std::size_t ib = 0; ib < 8; ib += 2) {
        const __m256i v0 = iq4_lookup(nibbles_lo_hi(b + 16 * ib));
        const __m256i v1 = iq4_lookup(nibbles_lo_hi(b + 16 * ib + 16));
        if constexpr (sign_trick(F)) {
          fn(8 * sb + ib, _mm256_abs_epi8(v0), v0, parity<0>{});
          fn(8 * sb + ib + 1, _mm256_abs_epi8(v1), v1, parity<1>{});
        } else {
          const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
          fn(8 * sb + ib, _mm256_xor_si256(v0, flip), v0, parity<0>{});
          fn(8 * sb + ib + 1, _mm256_xor_si256(v1, flip), v1, parity<1>{});
        }
      }
    }
  } else if constexpr (F == weight_format::q5_k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    for (std::size_t sb = 0; sb < pieces / 8; ++sb) {
      const std::byte* b = row + 176 * sb;
      // bit `sub` of qh[i] is the fifth bit of value i of sub-block sub: brought to bit 0 by
      // shifting one more each sub-block (16-bit shifts: bit 0 of each byte stays its own)
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      NPULLM_UNROLL for (std::size_t c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
        const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4);
        const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4);
        h = _mm256_srli_epi16(h, 2);
        fn(8 * sb + 2 * c, _mm256_or_si256(_mm256_and_si256(v, low4), h0), __m256i{}, parity<0>{});
        fn(8 * sb + 2 * c + 1, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), h1),
           __m256i{}, parity<1>{});
      }
    }
  } else if constexpr (F == weight_format::q3_k || F == weight_format::q2_k) {
    // 2-bit codes: value i of piece 4t + jj in bits 2jj of byte i of 32-byte group t; q3_k's
    // third bit: bit 4t + jj of hmask[i] (as q5_k's fifth)
    constexpr bool three = F == weight_format::q3_k;
    const __m256i low2 = _mm256_set1_epi8(0x03), bit2 = _mm256_set1_epi8(0x04);
    for (std::size_t sb = 0; sb < pieces / 8; ++sb) {
      const std::byte* b = row + block_bytes(F) * sb;
      __m256i h =
          three ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)) : _mm256_setzero_si256();
      NPULLM_UNROLL for (std::size_t t = 0; t < 2; ++t) {
        __m256i q =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (three ? 32 : 16) + 32 * t));
        NPULLM_UNROLL for (std::size_t jj = 0; jj < 4; jj += 2) {
          __m256i u0 = _mm256_and_si256(q, low2);
          __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(q, 2), low2);
          q = _mm256_srli_epi16(q, 4);
          if constexpr (three) {
            u0 = _mm256_or_si256(u0, _mm256_and_si256(_mm256_slli_epi16(h, 2), bit2));
            u1 = _mm256_or_si256(u1, _mm256_and_si256(_mm256_slli_epi16(h, 1), bit2));
            h = _mm256_srli_epi16(h, 2);
          }
          fn(8 * sb + 4 * t + jj, u0, __m256i{}, parity<0>{});
          fn(8 * sb + 4 * t + jj + 1, u1, __m256i{}, parity<1>{});
        }
      }
    }
  } else if constexpr (F == weight_format::q4_k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (std::size_t sb = 0; sb < pieces / 8; ++sb) {
      const std::byte* b = row + 144 * sb + 16;
      NPULLM_UNROLL for (std::size_t c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * c));
        fn(8 * sb + 2 * c, _mm256_and_si256(v, low4), __m256i{}, parity<0>{});
        fn(8 * sb + 2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), __m256i{},
           parity<1>{});
      }
    }
  } else if constexpr (F == weight_format::q6_k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    for (std::size_t sb = 0; sb < pieces / 8; ++sb) {
      const auto* b = reinterpret_cast<const std::uint8_t*>(row + 210 * sb);
      NPULLM_UNROLL for (std::size_t h = 0; h < 2; ++h) {
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        // Quarter t: low nibble source, qh bits 2t..2t+1 moved to bits 4-5.
        const std::size_t j = 8 * sb + 4 * h;
        fn(j,
           _mm256_or_si256(_mm256_and_si256(l0, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
           __m256i{}, parity<0>{});
        fn(j + 1,
           _mm256_or_si256(_mm256_and_si256(l1, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
           __m256i{}, parity<1>{});
        fn(j + 2,
           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                           _mm256_and_si256(qh, bits45)),
           __m256i{}, parity<0>{});
        fn(j + 3,
           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)),
           __m256i{}, parity<1>{});
      }
    }
  } else {
    static_assert(!has_kernels(F),
                  "for_each_piece: no branch for this format (ops/formats/format_base.hpp)");
  }
}

#if defined(NPULLM_QUANT_VNNI512)
// AVX-512 VNNI: pieces j and j + 1 in one zmm (u8 codes; x's codes for them are contiguous).
// One scale per piece: q4_0, int4_sym, q8_0, int8_sym.
constexpr bool gemv_pairs(weight_format f) noexcept {
  return f == weight_format::q4_0 || f == weight_format::int4_sym || f == weight_format::q8_0 ||
         f == weight_format::int8_sym;
}

template <weight_format F>
[[gnu::always_inline]] inline __m512i gemv_codes2(const std::byte* row, std::size_t j) noexcept {
  if constexpr (F == weight_format::q4_0 || F == weight_format::int4_sym) {
    constexpr std::size_t bb = F == weight_format::q4_0 ? 18 : 16, at = bb - 16;
    const __m256i a = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + bb * j + at)));
    const __m256i b = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + bb * (j + 1) + at)));
    const __m512i z = _mm512_maskz_srlv_epi64(
        0xFF, _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(a), b, 1),
        _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    if constexpr (F == weight_format::q4_0) {
      return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    } else {  // (z & 0x0F) ^ 0x08: the two's complement nibble + 8
      return _mm512_ternarylogic_epi32(z, _mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x08), 0x6A);
    }
  } else {
    __m512i z;
    if constexpr (F == weight_format::q8_0) {
      z = _mm512_maskz_inserti64x4(
          0xFF,
          _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 34 * j + 2))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 34 * (j + 1) + 2)), 1);
    } else {
      z = _mm512_loadu_si512(row + 32 * j);
    }
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
}
#endif

// y rows [m0, m0 + MR), columns [n0, n1).
template <weight_format F, std::size_t MR>
void gemv_rows(const quantized_view& w, const quantized_activations& a, std::size_t m0,
               std::size_t n0, std::size_t n1, const float* bias, float* y, std::size_t ldy,
               gemv_scratch& t) {
  constexpr bool halves = piece_layout_of(F).half_scales;  // a scale per half piece
  const std::size_t k = a.k, blocks = a.blocks, ns = halves ? 2 * a.bpad : a.bpad;
  const std::int8_t* xq = a.codes.data() + m0 * k;
  const std::int32_t* corr = a.corr.empty() ? nullptr : a.corr.data() + m0 * k / 4;
  t.s.resize(MR * ns);
  float* s = t.s.data();
  const sym_scales sym(w);
  // W's rows [n0, n1) are read as 4 streams (4 contiguous quarters, one row of each in turn),
  // each prefetched ~2 KiB ahead into L1. Measured on the cold k896 n4864 benchmark, 1 thread:
  // one stream (a row after the next) reached 9-10 GB/s whatever the prefetch distance or hint,
  // 2 streams 11-13, 4 streams 11.5-16.6 (read_sum: 14 GB/s with one stream, 16.5 with 2 to 8:
  // the DRAM side serves several streams better than one); without software prefetch, half
  // that (the hardware prefetchers alone leave the first load of each piece the hot spot).
  const std::size_t rb = w.row_bytes();
  constexpr std::size_t prefetch_bytes = 2048, max_streams = 4;
  const std::size_t ahead = std::max<std::size_t>(1, prefetch_bytes / std::max<std::size_t>(rb, 1));
  const std::size_t len = n1 - n0, streams = std::min(max_streams, std::max<std::size_t>(len, 1));
  const std::size_t per_stream = (len + streams - 1) / streams;
  for (std::size_t i = 0; i < per_stream * streams; ++i) {
    const std::size_t st = i % streams, n = n0 + st * per_stream + i / streams;
    const std::size_t end = std::min(n1, n0 + (st + 1) * per_stream);
    if (n >= end) continue;
    if (n + ahead < end) {
      const char* next = reinterpret_cast<const char*>(w.data.data() + (n + ahead) * rb);
      for (std::size_t o = 0; o < rb; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
    }
    float off[MR] = {};
    gemv_row_prologue<F, MR>(w, sym, n, a, m0, s, ns, off);
    __m256 acc[MR][2];
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
#if defined(NPULLM_QUANT_VNNI512)
    if constexpr (gemv_pairs(F)) {
      // Two pieces per zmm, two accumulators (4 pieces per step); an odd last piece below.
      const std::byte* row = w.data.data() + n * rb;
      const __m512i sel = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
      __m512 acc2[MR][2];
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        acc2[m][0] = acc2[m][1] = _mm512_setzero_ps();
      }
      auto step = [&](std::size_t j, auto par) {
        const __m512i u = gemv_codes2<F>(row, j);
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const __m512i xv = _mm512_loadu_si512(xq + m * k + 32 * j);
          const __m512i c = _mm512_loadu_si512(corr + (m * k + 32 * j) / 4);
          const __m512 dot = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_dpbusd_epi32(c, u, xv));
          const __m512 sc = _mm512_maskz_permutexvar_ps(
              0xFFFF, sel,
              _mm512_castps128_ps512(
                  _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s + m * ns + j)))));
          acc2[m][par] = _mm512_fmadd_ps(dot, sc, acc2[m][par]);
        }
      };
      std::size_t j = 0;
      for (; j + 4 <= blocks; j += 4) {
        step(j, parity<0>{});
        step(j + 2, parity<1>{});
      }
      if (j + 2 <= blocks) {
        step(j, parity<0>{});
        j += 2;
      }
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const __m512 t2 = _mm512_add_ps(acc2[m][0], acc2[m][1]);
        acc[m][0] = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, t2, 0),
                                  _mm512_maskz_extractf32x8_ps(0xFF, t2, 1));
      }
      if (j < blocks) {  // the odd last piece, 256 bits wide
        for_each_piece<F>(
            row + (F == weight_format::q4_0       ? 18
                   : F == weight_format::q8_0     ? 34
                   : F == weight_format::int4_sym ? 16
                                                  : 32) *
                      j,
            1, [&](std::size_t, __m256i u, __m256i wv, auto) {
              NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
                const __m256 dot = _mm256_cvtepi32_ps(
                    gemv_dot<false, true>(u, wv, xq + m * k + 32 * j, corr + (m * k + 32 * j) / 4));
                acc[m][1] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(s + m * ns + j), acc[m][1]);
              }
            });
      }
    } else
#endif
      for_each_piece<F>(
          w.data.data() + n * rb, blocks, [&](std::size_t j, __m256i u, __m256i wv, auto par) {
            NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
              const __m256 dot = _mm256_cvtepi32_ps(gemv_dot<sign_trick(F), dot_corr(F)>(
                  u, wv, xq + m * k + 32 * j, corr + (m * k + 32 * j) / 4));
              __m256 sc;
              if constexpr (halves) {
                sc = _mm256_set_m128(_mm_broadcast_ss(s + m * ns + 2 * j + 1),
                                     _mm_broadcast_ss(s + m * ns + 2 * j));
              } else {
                sc = _mm256_broadcast_ss(s + m * ns + j);
              }
              acc[m][par] = _mm256_fmadd_ps(dot, sc, acc[m][par]);
            }
          });
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
      y[m * ldy + n] = hsum(_mm256_add_ps(acc[m][0], acc[m][1])) - off[m] + (bias ? bias[n] : 0.0f);
    }
  }
}

#endif  // __AVX2__

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
