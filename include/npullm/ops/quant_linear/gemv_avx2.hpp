// The quantized GEMV for AVX2 and up (M <= 16 rows of x; ops/quant_linear.hpp explains the
// paths): W read in place, row by row, with a per-row prologue of scales. AVX-VNNI / AVX-512
// VNNI where the compiler targets them.
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
  return f == weight_format::q8_0 || f == weight_format::int8_sym || f == weight_format::iq4_nl ||
         f == weight_format::iq4_xs;
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

// The integer offset o (value = s · (u − o)) of a format's codes as the GEMV multiplies them.
constexpr float gemv_int_offset(weight_format f) noexcept {
  switch (f) {
    case weight_format::q4_0:
    case weight_format::int4_sym: return 8.0f;
    case weight_format::q6_k: return 32.0f;
    case weight_format::q5_0: return 16.0f;
    case weight_format::q3_k: return 4.0f;
    case weight_format::q8_0:
    case weight_format::int8_sym:
    case weight_format::iq4_nl:
    case weight_format::iq4_xs: return sign_trick(f) ? 0.0f : 128.0f;
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q4_1:
    case weight_format::q5_1:
    case weight_format::q2_k: return 0.0f;  // codes from 0: the min is a separate offset
  }
  return 0.0f;
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

// The 32-value formats with one f16 scale at the start of each block: the block's bytes.
constexpr int head_scale_block(weight_format f) noexcept {
  switch (f) {
    case weight_format::q4_0:
    case weight_format::iq4_nl: return 18;
    case weight_format::q8_0: return 34;
    case weight_format::q5_0: return 22;
    default: return 0;
  }
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
