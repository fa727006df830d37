// The quantized GEMV's per-row prologue for AVX2 and up (ops/quant_linear/gemv_avx2.hpp runs
// the rows): the integer dot product of 4 codes, the codes' unpacking helpers, each format's
// integer offset, and the scales and offset terms a W row's pieces are multiplied by.
#pragma once

#include "npullm/ops/quant_linear/activations.hpp"

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

// Whether the GEMV reads this format's int8 codes through the sign trick (no VNNI).
constexpr bool sign_trick(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256)
  (void)f;
  return false;
#else
  return info_of(f).code_offset == 128;  // 8-bit codes: q8_0, int8_sym, iq4_nl, iq4_xs
#endif
}

#if defined(__AVX2__)
// ---- 256-bit GEMV ------------------------------------------------------------------------
// Per W row n: a short vector pass over the row's scales (its "prologue") gives, per piece j
// (q6_k: per half piece) and row m of x, S[m][j] = s_j · dx_j, and the row's whole offset term
// off[m] = Σ_halves o_h · dx · Σ codes_h (o: the integer offset times the scale, or q4_k's min),
// so that the loop over pieces does only: unpack the codes, one integer dot product per row of
// x, convert, and one FMA by a broadcast S[m][j] into one of two accumulators (even / odd
// pieces: two chains). No per-piece scalar work, no per-piece offset FMA.

inline float hsum(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Σ over groups of 4 of u (u8 codes) · x (s8; with the sign trick: |w| · sign(x, w)), plus
// corr (the lanes' integer offset terms; not read with the sign trick).
template <bool SignTrick, bool Corr>
[[gnu::always_inline]] inline __m256i gemv_dot(__m256i u, __m256i w, const std::int8_t* x,
                                               const std::int32_t* corr) noexcept {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
#if defined(NPULLM_QUANT_VNNI256)
  (void)w;
  const __m256i c =
      Corr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr)) : _mm256_setzero_si256();
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(c, u, xv);
#else
  return _mm256_dpbusd_avx_epi32(c, u, xv);
#endif
#else
  const __m256i ones = _mm256_set1_epi16(1);
  // maddubs pair sums: |u| <= 63 (q6_k; 4-bit: 15) or <= 127 with the sign trick: no i16
  // saturation.
  if constexpr (SignTrick || !Corr) {
    (void)corr;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, SignTrick ? _mm256_sign_epi8(xv, w) : xv),
                             ones);
  } else {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr)));
  }
#endif
}

// 16 bytes of nibbles -> 32 codes: low nibbles (bytes 0..15), then high nibbles (16..31).
[[gnu::always_inline]] inline __m256i nibbles_lo_hi(const void* p) noexcept {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  const __m256i both = _mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0));
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The 32 bits of qh -> 32 bytes: byte i is 0x10 where bit i is set (Q5_0 / Q5_1's fifth bits,
// in the order nibbles_lo_hi gives the values).
[[gnu::always_inline]] inline __m256i fifth_bits(const void* p) noexcept {
  std::uint32_t qh;
  std::memcpy(&qh, p, 4);
  // byte i <- byte i / 8 of qh (both 128-bit lanes hold qh in their first 4 bytes)
  const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), sel);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}

// IQ4's 4-bit codes (u: 0..15 per byte) -> their int8 values (a 16-entry vpshufb table).
[[gnu::always_inline]] inline __m256i iq4_lookup(__m256i u) noexcept {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4_values));
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), u);
}

template <std::size_t P>
using parity = std::integral_constant<std::size_t, P>;

// The integer offset o (value = s · (u − o)) of a format's codes as the GEMV multiplies them:
// the format's code_offset, except 8-bit codes read by the sign trick (as int8: 0).
constexpr float gemv_int_offset(weight_format f) noexcept {
  const int o = info_of(f).code_offset;
  return o == 128 && sign_trick(f) ? 0.0f : static_cast<float>(o);
}

// Whether the offset term rides in the dot product (corr as vpdpbusd's accumulator input: no
// extra instruction) or, without VNNI (where it would cost an add per piece), in the row's
// prologue as o · Σ_j s_j · dx_j Σ codes_j, 8 pieces per FMA.
constexpr bool dot_corr(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256)
  return gemv_int_offset(f) != 0.0f;
#else
  (void)f;
  return false;
#endif
}

struct gemv_scratch {
  std::vector<float, aligned_allocator<float>> s;  // (MR, bpad, 2 with q6_k) S[m][j]
};

// q4_k's 12 packed bytes -> 8 six-bit scales (low qword) and 8 mins (high qword), the order of
// q4_k_scale_min (as llama.cpp unpacks them).
inline void q4_k_unpack_scales(const std::byte* p, std::uint64_t& sc, std::uint64_t& mn) noexcept {
  std::uint32_t u[3];
  std::memcpy(u, p, 12);
  constexpr std::uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const std::uint32_t m1 = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const std::uint32_t m0 = u[1] & k1;
  const std::uint32_t s1 = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const std::uint32_t s0 = u[0] & k1;
  sc = s0 | (static_cast<std::uint64_t>(s1) << 32);
  mn = m0 | (static_cast<std::uint64_t>(m1) << 32);
}

// 8 bytes (u8) -> 8 f32.
inline __m256 u8x8_to_ps(std::uint64_t v) noexcept {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(v))));
}

// What the symmetric formats' scale reads need, computed once per call (divisions included).
struct sym_scales {
  std::size_t groups = 0, per = 1, ss = 4;  // groups per row, pieces per group, scale bytes
  bool one = false;                         // one group per row
  __m256i idx{};                            // piece i of 8 -> group offset
  const std::byte* end = nullptr;           // end of the scales tensor
  explicit sym_scales(const quantized_view& w) {
    if (is_block_format(w.format)) return;
    groups = w.groups();
    per = w.group / 32;
    ss = size_of(w.scale_type);
    one = per == w.cols / 32;
    idx = one ? _mm256_setzero_si256()
              : _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), per == 1   ? 0
                                                                             : per == 2 ? 1
                                                                                        : 2);
    end = w.scales.data() + w.scales.size();
  }
};

// The first 4 bytes of blocks j .. j + 7 of a row of BB-byte blocks (lanes past the row's
// `valid` blocks: 0, never read).
template <int BB>
[[gnu::always_inline]] inline __m256i block_heads8(const std::byte* row, std::size_t j,
                                                   std::size_t valid) noexcept {
  const __m256i idx = _mm256_setr_epi32(0, BB, 2 * BB, 3 * BB, 4 * BB, 5 * BB, 6 * BB, 7 * BB);
  const auto* base = reinterpret_cast<const int*>(row + BB * j);
  if (valid == 8) return _mm256_i32gather_epi32(base, idx, 1);
  // the row's last blocks: no read past them
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, idx, mask, 1);
}

// The f16 in the low (High = false) or high half of each dword of v, as 8 f32.
template <bool High>
[[gnu::always_inline]] inline __m256 f16_halves(__m256i v) noexcept {
  // The chosen 16 bits of each dword into the low 8 bytes of each 128-bit lane.
  constexpr char a = High ? 2 : 0, b = High ? 3 : 1;
  const __m256i pick = _mm256_setr_epi8(a, b, a + 4, b + 4, a + 8, b + 8, a + 12, b + 12, -1, -1,
                                        -1, -1, -1, -1, -1, -1, a, b, a + 4, b + 4, a + 8, b + 8,
                                        a + 12, b + 12, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
}

// The 8 six-bit scales of an IQ4_XS super-block (iq4_xs_scale), less 32, times its d.
inline __m256 iq4_xs_scales8(const std::byte* b) noexcept {
  std::uint16_t sh;
  std::uint32_t sl;
  std::memcpy(&sh, b + 2, 2);
  std::memcpy(&sl, b + 4, 4);
  // nibble i of sl -> byte i; 2-bit field i of sh -> byte i
  std::uint64_t lo = sl;
  lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
  lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
  lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
  std::uint64_t hi = sh;
  hi = (hi | hi << 24) & 0x000000FF000000FFull;
  hi = (hi | hi << 12) & 0x000F000F000F000Full;
  hi = (hi | hi << 6) & 0x0303030303030303ull;
  const __m256 ls = u8x8_to_ps(lo | hi << 4);
  return _mm256_mul_ps(_mm256_sub_ps(ls, _mm256_set1_ps(32.0f)), _mm256_set1_ps(load_f16(b)));
}

// The 32-value formats with one f16 scale at the start of each block (q4_0, q5_0, q8_0,
// iq4_nl): the block's bytes (0 for the others).
constexpr int head_scale_block(weight_format f) noexcept {
  const format_info& i = info_of(f);
  return i.block_values == 32 && !i.pieces.offset && has_kernels(f)
             ? static_cast<int>(i.block_bytes)
             : 0;
}

// The row's scales for pieces j .. j + 7 (j a multiple of 8; lanes past the row's pieces: 0),
// built in registers: a vector load over several recent scalar stores cannot be forwarded and
// stalls until they retire (measured: ~25% of the GEMV's time when the f16 scales went through
// a buffer). One scale per piece: q4_0, q5_0, q8_0, iq4_nl, iq4_xs, int4_sym, int8_sym.

template <weight_format F>
[[gnu::always_inline]] inline __m256 gemv_scales8(const quantized_view& w, const sym_scales& g,
                                                  const std::byte* row, std::size_t n,
                                                  std::size_t j, std::size_t pieces) noexcept {
  const std::size_t valid = std::min<std::size_t>(8, pieces - j);
  if constexpr (head_scale_block(F) != 0) {
    (void)w;
    (void)g;
    (void)n;
    return f16_halves<false>(block_heads8<head_scale_block(F)>(row, j, valid));
  } else if constexpr (F == weight_format::iq4_xs) {  // a super-block per 8 pieces
    (void)w;
    (void)g;
    (void)n;
    (void)valid;
    return iq4_xs_scales8(row + 136 * (j / 8));
  } else {
    (void)row;
    // Pieces j .. j + 7 read groups g0 + (i / per), or group 0 (one group per row).
    const std::size_t g0 = g.one ? 0 : j / g.per;
    const std::byte* p = w.scales.data() + (n * g.groups + g0) * g.ss;
    __m256 g8;
    if (p + 8 * g.ss <= g.end) {
      g8 = w.scale_type == dtype::f16
               ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
               : _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else {  // the matrix's last groups: through memory, once per call
      alignas(32) float tmp[8] = {};
      for (std::size_t i = 0; i < g.groups - g0 && i < 8; ++i) tmp[i] = w.scale(n, g0 + i);
      g8 = _mm256_load_ps(tmp);
    }
    const __m256 s8 = _mm256_permutevar8x32_ps(g8, g.idx);
    if (valid == 8) return s8;
    // Lanes past the row's pieces may hold the next row's scales: zero them.
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_and_ps(s8, _mm256_castsi256_ps(keep));
  }
}

// dx Σ codes of pieces j .. j + 7 of one row of x: sums (2 per piece, the halves') added
// pairwise (hadd within 128-bit lanes gives pieces 0 1 4 5 | 2 3 6 7: reordered). Past the
// row's pieces it reads the next row's sums or the 16 floats of finite slack at sums' end.
[[gnu::always_inline]] inline __m256 piece_sums8(const float* sm) noexcept {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_hadd_ps(_mm256_loadu_ps(sm), _mm256_loadu_ps(sm + 8))), 0xD8));
}

// Q3_K's 16 six-bit scales (q3_k_scale) less 32, as int8 (as llama.cpp unpacks them).
inline __m128i q3_k_scales16(const std::byte* p) noexcept {
  std::uint32_t u[3];
  std::memcpy(u, p, 12);
  constexpr std::uint32_t k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const __m128i v =
      _mm_setr_epi32(static_cast<int>((u[0] & k2) | ((u[2] & k3) << 4)),
                     static_cast<int>((u[1] & k2) | (((u[2] >> 2) & k3) << 4)),
                     static_cast<int>(((u[0] >> 4) & k2) | (((u[2] >> 4) & k3) << 4)),
                     static_cast<int>(((u[1] >> 4) & k2) | (((u[2] >> 6) & k3) << 4)));
  return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

// Row n's prologue: S[m][j] = s_j · dx_j for the MR rows of x (formats with half scales: per
// half piece, S[m][2j + h]), and off[m], subtracted from the row's sum: the mins' term
// Σ_j m_j · dx_j Σ codes_j (q4_k, q5_k; per half for q2_k; q4_1 / q5_1 add theirs: −m), or,
// where it does not ride in the dot product (dot_corr), the integer offset's o · Σ s · dx Σ codes.
template <weight_format F, std::size_t MR>
[[gnu::always_inline]] inline void gemv_row_prologue(const quantized_view& w, const sym_scales& g,
                                                     std::size_t n, const quantized_activations& a,
                                                     std::size_t m0, float* s, std::size_t ns,
                                                     float* off) noexcept {
  const std::size_t pieces = w.cols / 32, bpad = a.bpad;
  const std::byte* row = w.data.data() + n * w.row_bytes();
  const float* dx = a.dpad.data() + m0 * bpad;
  const float* sums = a.sums.data() + m0 * a.blocks * 2;
  constexpr float o = gemv_int_offset(F);
  __m256 o8[MR];
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) o8[m] = _mm256_setzero_ps();
  if constexpr (F == weight_format::q4_k || F == weight_format::q5_k) {
    constexpr std::size_t bb = F == weight_format::q4_k ? 144 : 176;
    for (std::size_t j = 0; j < pieces; j += 8) {
      const std::byte* b = row + bb * (j / 8);
      std::uint64_t sc, mn;
      q4_k_unpack_scales(b + 4, sc, mn);
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int*>(b)));
      const __m256 ws = _mm256_mul_ps(u8x8_to_ps(sc), _mm256_broadcastss_ps(dd));
      const __m256 wm = _mm256_mul_ps(u8x8_to_ps(mn), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        _mm256_store_ps(s + m * ns + j, _mm256_mul_ps(ws, _mm256_loadu_ps(dx + m * bpad + j)));
        o8[m] = _mm256_fmadd_ps(wm, piece_sums8(sums + m * a.blocks * 2 + 2 * j), o8[m]);
      }
    }
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = hsum(o8[m]);
  } else if constexpr (F == weight_format::q4_1 || F == weight_format::q5_1) {
    constexpr int bb = F == weight_format::q4_1 ? 20 : 24;
    for (std::size_t j = 0; j < pieces; j += 8) {
      // d and m of pieces j .. j + 7 (0 past the row's pieces)
      const __m256i dm = block_heads8<bb>(row, j, std::min<std::size_t>(8, pieces - j));
      const __m256 d8 = f16_halves<false>(dm), m8 = f16_halves<true>(dm);
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        _mm256_store_ps(s + m * ns + j, _mm256_mul_ps(d8, _mm256_loadu_ps(dx + m * bpad + j)));
        o8[m] = _mm256_fmadd_ps(m8, piece_sums8(sums + m * a.blocks * 2 + 2 * j), o8[m]);
      }
    }
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = -hsum(o8[m]);
  } else if constexpr (piece_layout_of(F).half_scales) {  // q6_k, q3_k, q2_k: 16 scales
    constexpr std::size_t bb = block_bytes(F);
    for (std::size_t j = 0; j < pieces; j += 8) {
      const std::byte* b = row + bb * (j / 8);
      __m128i sc;  // the 16 scales as int8 (q2_k: u8 nibbles), d: their factor
      __m256 d, m0v = _mm256_setzero_ps(), m1v = _mm256_setzero_ps();
      if constexpr (F == weight_format::q6_k) {
        d = _mm256_set1_ps(load_f16(b + 208));
        sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
      } else if constexpr (F == weight_format::q3_k) {
        d = _mm256_set1_ps(load_f16(b + 108));
        sc = q3_k_scales16(b + 96);
      } else {  // q2_k: scale (low nibble) and min (high nibble) per 16
        d = _mm256_set1_ps(load_f16(b + 80));
        const __m256 dmin = _mm256_set1_ps(load_f16(b + 82));
        const __m128i both = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
        const __m128i mins = _mm_and_si128(_mm_srli_epi16(both, 4), _mm_set1_epi8(0x0F));
        sc = _mm_and_si128(both, _mm_set1_epi8(0x0F));
        m0v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins)), dmin);
        m1v =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mins, 8))), dmin);
      }
      const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
      const __m256 s1 =
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d);
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const float* sm = sums + m * a.blocks * 2 + 2 * j;  // dx Σ codes per half, in order
        if constexpr (F == weight_format::q2_k) {
          o8[m] = _mm256_fmadd_ps(m0v, _mm256_loadu_ps(sm), o8[m]);
          o8[m] = _mm256_fmadd_ps(m1v, _mm256_loadu_ps(sm + 8), o8[m]);
        } else if constexpr (!dot_corr(F)) {  // o · s per half times dx Σ codes of the half
          o8[m] = _mm256_fmadd_ps(s0, _mm256_loadu_ps(sm), o8[m]);
          o8[m] = _mm256_fmadd_ps(s1, _mm256_loadu_ps(sm + 8), o8[m]);
        }
        const __m256 d8 = _mm256_loadu_ps(dx + m * bpad + j);  // dx of pieces j .. j + 7
        // dx per half: d0 d0 d1 d1 d2 d2 d3 d3 | d4 d4 .. d7 d7
        const __m256 lo = _mm256_unpacklo_ps(d8, d8), hi = _mm256_unpackhi_ps(d8, d8);
        _mm256_store_ps(s + m * ns + 2 * j,
                        _mm256_mul_ps(s0, _mm256_permute2f128_ps(lo, hi, 0x20)));
        _mm256_store_ps(s + m * ns + 2 * j + 8,
                        _mm256_mul_ps(s1, _mm256_permute2f128_ps(lo, hi, 0x31)));
      }
    }
    if constexpr (F == weight_format::q2_k) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = hsum(o8[m]);
    } else if constexpr (!dot_corr(F)) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = o * hsum(o8[m]);
    }
  } else {
    for (std::size_t j = 0; j < pieces; j += 8) {
      const __m256 s8 = gemv_scales8<F>(w, g, row, n, j, pieces);  // 0 past the row's pieces
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        _mm256_store_ps(s + m * ns + j, _mm256_mul_ps(s8, _mm256_loadu_ps(dx + m * bpad + j)));
        if constexpr (!dot_corr(F) && o != 0.0f) {  // (times s8's zero lanes past the row)
          o8[m] = _mm256_fmadd_ps(s8, piece_sums8(sums + m * a.blocks * 2 + 2 * j), o8[m]);
        }
      }
    }
    if constexpr (!dot_corr(F) && o != 0.0f) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = o * hsum(o8[m]);
    }
  }
}

#endif  // __AVX2__

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
