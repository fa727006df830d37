// linear over quantized weights: y (M, N) = x (M, K) f32 · W^T (+ bias), W a quantized_view
// (ops/quant.hpp) read block by block, never through a dequantized copy.
//
// As llama.cpp does, x is quantized once per call to int8 codes per block of 32 (f32 scale
// dx = absmax / 127, round to nearest; plus dx · Σ codes per half block, for the formats whose
// values carry an offset or a min), then each 32-value piece of W is an integer dot product of
// its codes with x's codes, scaled in f32 by the piece's scale(s) and dx and accumulated in f32:
//
//   Σ_k w_k x_k ≈ Σ_pieces [ dx · Σ_lanes s_lane · dot_lane  −  o · dx · Σ_k xq_k ]
//
// where the piece's value is w = s · u − o with u the unsigned codes the kernel multiplies
// (q4_0: nibble, o = 8d; int4_sym: nibble xor 8, o = 8s; q4_k: nibble, s = d·sc, o = dmin·m;
// q6_k: 6-bit code, o = 32s per 16; q8_0 / int8_sym with VNNI: code + 128, o = 128d). The only
// error beyond f32 rounding is x's rounding: |err| <= Σ_k |w_k| · dx_block(k) / 2.
//
// Paths (the integer dot product per ISA: AVX-512 VNNI / AVX-VNNI `vpdpbusd` where the
// compiler targets them, else AVX2 `vpmaddubsw` + `vpmaddwd`; portable: scalar integers):
//   M <= 16 (GEMV)  W read in place, row by row, each row once per group of up to 4 rows of x
//                   (x's rows in groups of 4 share the unpacked piece; M > 4 reads W M/4 times).
//                   Per W row a short vector prologue builds S[m][j] = s_j · dx_j for every
//                   piece (scales gathered / permuted in registers, q4_k's packed 6-bit scales
//                   unpacked as llama.cpp does) and the row's offset or min term; the piece loop
//                   then only unpacks codes (shift + mask), takes one dot product per row of x
//                   and adds cvt(dot) · S into one of two f32 accumulators. With VNNI the
//                   integer offset rides in the dot product (per-call `corr` lanes −o · Σ4 xq as
//                   vpdpbusd's accumulator input); without, in the prologue (8 pieces per FMA).
//                   AVX-512 VNNI takes two pieces per zmm (q4_0, int4_sym, q8_0, int8_sym).
//                   The int8 formats without VNNI use the sign trick (|w| · sign(x, w)), since
//                   maddubs's u8 operand cannot hold w + 128 without saturating the i16 sums.
//                   A thread reads its rows as 4 streams, each software-prefetched 2 KiB ahead
//                   (one stream could not pass ~10 GB/s here; see gemv_rows).
//   M > 16 (GEMM)   per panel of P output columns (AVX-512 VNNI: 32, else 8) the W rows are
//                   decoded into an interleaved panel: for each piece, 8 chunks of (P columns ×
//                   4 codes) as signed int8, plus per-column scales and integer corrections;
//                   then a micro-kernel of MR rows of x × P columns broadcasts 4 codes of x (as
//                   u8: code + 128) and takes one dot product per chunk for all P columns at
//                   once: no horizontal sums. (Σ (xq + 128) w = Σ xq w + 128 Σ w: the panel
//                   carries −128 Σ w per column as the accumulator's start.) Plain AVX2 adds up
//                   to 8 chunks' vpmaddubsw pair sums in i16 (|pair| <= 2 · 255 · 8 for codes in
//                   −8..8; q4_k's codes are stored −8..7 for it) before one vpmaddwd, so its
//                   4-bit GEMMs run fewer instructions than machine_limits' int8 peak loop
//                   (vpmaddubsw + vpmaddwd + vpaddd per chunk) and can report over 100% of it.
//                   linear over a quantized_view decodes each panel per call (~40% of the GEMM's
//                   time); pack() decodes them once, at load (packed_quantized below), and the
//                   linear overload for it runs only the micro-kernel.
//   portable        the same two shapes in scalar integer code (pieces decoded one by one).
// The f32 multiply per piece and accumulator (cvt, scale, FMA: 3 instructions per 8 vpdpbusd
// in the AVX-512 micro-kernel) cannot be deferred: x's scale changes every 32 values and the
// tests' error bound is the one of per-32 activation blocks. That caps the VNNI micro-kernel
// at 8 / 11 of the vpdpbusd peak (q4_k, with its min FMA: 8 / 12).
// No f32 dequantize-in-register path was written (so none was measured against the integer
// paths). K must be a multiple of 32 (every format; a symmetric format's group too).
// Threads split N into contiguous parts; results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/quant.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define NPULLM_QUANT_VNNI512 1
#endif
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define NPULLM_QUANT_VNNI256 1
#endif

// The integer dot-product instruction this build's quantized kernels use.
constexpr std::string_view quant_dot_name() noexcept {
#if defined(NPULLM_QUANT_VNNI512)
  return "avx512-vnni vpdpbusd";
#elif defined(NPULLM_QUANT_VNNI256)
  return "avx-vnni vpdpbusd";
#elif defined(__AVX2__)
  return "avx2 vpmaddubsw+vpmaddwd";
#else
  return "scalar";
#endif
}

inline constexpr std::size_t quant_gemv_max_m = 16;

struct packed_access;  // pack() and the panels of a packed_quantized

// ---- activations: x rows quantized per block of 32 -------------------------------------------

// codes: (M, K) int8 (or u8 = code + 128 when `biased`); d: (M, K/32) scales;
// sums: (M, K/32, 2) dx · Σ codes over values 0..15 and 16..31 of the block (natural order).
// For the SIMD GEMV also: dpad (M, bpad = blocks rounded up to 8, zero-padded) the scales again,
// and corr (M, K / 4) int32: −o · Σ of each 4 consecutive stored codes, the integer offset term
// of a dot product lane (value = s · (u − o)), so that Σ_lane u · x + corr = Σ_lane (u − o) · x.
struct quantized_activations {
  std::size_t m = 0, k = 0, blocks = 0, bpad = 0;
  std::vector<std::int8_t> codes;
  std::vector<float> d, dpad;
  std::vector<float> sums;
  std::vector<float> tot;  // (M, K/32): dx · Σ codes of the block (the two sums added)
  std::vector<std::int32_t> corr;
};

// One block of 32 values: its int8 codes c (round half away from zero of x · 127 / absmax, in
// [-127, 127]) stored to q as the kernels read them (pair_split: the 16 even values then the 16
// odd ones; biased: c + 128 as u8), its scale d = absmax / 127 (returned) and the sums of codes
// 0..15 and 16..31. The AVX2 form gives the scalar form's results bit for bit: the same float
// operations (one multiply, one add of ±0.5, truncation) on each value; the maximum is exact.
inline float quantize_block(const float* xb, std::int8_t* q, bool pair_split, bool biased, int& s0,
                            int& s1) noexcept {
#if defined(__AVX2__)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);  // a NaN value is skipped
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float a = _mm_cvtss_f32(m4);
  const float d = a / 127.0f, inv = a > 0.0f ? 127.0f / a : 0.0f;
  const __m256 vinv = _mm256_set1_ps(inv), half = _mm256_set1_ps(0.5f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 t = _mm256_mul_ps(v[i], vinv);
    // t + (t >= 0 ? 0.5 : -0.5): the sign of t on 0.5 (t = -0 gets -0.5: truncates to 0 too).
    const __m256 r = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(sign, t)));
    c[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(r), lo), hi);
  }
  const auto hsum = [](__m256i x) {
    __m128i y = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0x4e));
    y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0xb1));
    return _mm_cvtsi128_si32(y);
  };
  s0 = hsum(_mm256_add_epi32(c[0], c[1]));
  s1 = hsum(_mm256_add_epi32(c[2], c[3]));
  // packs interleave 128-bit lanes: 32-bit groups come out as 0, 2, 4, 6, 1, 3, 5, 7.
  const __m256i b =
      _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  __m256i v8 = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (pair_split) {  // per 128-bit half: evens then odds; then both halves' evens first
    const __m256i evens_odds =
        _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                         12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    v8 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v8, evens_odds), 0xd8);
  }
  if (biased) v8 = _mm256_xor_si256(v8, _mm256_set1_epi8(static_cast<char>(0x80)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v8);
  return d;
#else
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
  const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  s0 = s1 = 0;
  std::int8_t c[32];
  for (int i = 0; i < 32; ++i) {
    // Round half away from zero; |x · inv| <= 127 (inv from the same amax).
    const float v = xb[i] * inv;
    const float r = v + (std::signbit(v) ? -0.5f : 0.5f);
    c[i] = static_cast<std::int8_t>(r >= -127.0f && r <= 127.0f ? static_cast<int>(r)
                                    : r > 0.0f                  ? 127
                                                                : -127);
    (i < 16 ? s0 : s1) += c[i];
  }
  for (int i = 0; i < 32; ++i) {
    const std::int8_t v = c[pair_split ? (i < 16 ? 2 * i : 2 * (i - 16) + 1) : i];
    q[i] = biased ? static_cast<std::int8_t>(static_cast<std::uint8_t>(v) ^ 0x80u) : v;
  }
  return d;
#endif
}

// pair_split: store each block as its 16 even values then its 16 odd ones (int4_sym's nibble
// order, so that GEMV unpacks a byte's two nibbles to positions i and i + 16, as for q4_0).
// gemv_offset: o for corr and dpad (the GEMV's form), or 0: neither.
// Rows are split over the policy's threads when there are many (a prefill step's activations).
template <threading_policy Policy = serial>
void quantize_activations(const float* x, std::size_t ldx, std::size_t m, std::size_t k,
                          bool pair_split, bool biased, quantized_activations& out,
                          int gemv_offset = -1, const Policy& policy = {}) {
  out.m = m;
  out.k = k;
  out.blocks = k / 32;
  out.bpad = (out.blocks + 7) / 8 * 8;
  out.codes.resize(m * k);
  out.d.resize(m * out.blocks);
  out.sums.resize(m * out.blocks * 2 + 16);  // + finite slack that the GEMV's last chunk reads
  out.tot.resize(m * out.blocks);
  if (gemv_offset >= 0) {
    out.dpad.assign(m * out.bpad, 0.0f);
    out.corr.resize(gemv_offset > 0 ? m * k / 4 : 0);
  }
  const auto rows = [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) {
      for (std::size_t j = 0; j < out.blocks; ++j) {
        int s0 = 0, s1 = 0;
        std::int8_t* dst = out.codes.data() + r * k + 32 * j;
        const float d = quantize_block(x + r * ldx + 32 * j, dst, pair_split, biased, s0, s1);
        out.d[r * out.blocks + j] = d;
        if (gemv_offset >= 0) out.dpad[r * out.bpad + j] = d;
        if (gemv_offset > 0) {
          for (int l = 0; l < 8; ++l) {
            out.corr[(r * k + 32 * j) / 4 + l] =
                -gemv_offset * (dst[4 * l] + dst[4 * l + 1] + dst[4 * l + 2] + dst[4 * l + 3]);
          }
        }
        const float a = d * static_cast<float>(s0), b = d * static_cast<float>(s1);
        out.sums[(r * out.blocks + j) * 2] = a;
        out.sums[(r * out.blocks + j) * 2 + 1] = b;
        out.tot[r * out.blocks + j] = a + b;
      }
    }
  };
  const std::size_t parts = m >= 64 ? std::min(m / 32, policy.concurrency()) : 1;
  if (parts <= 1) return rows(0, m);
  policy.parallel_for(
      parts, [&](std::size_t p) { rows(chunk_begin(m, parts, p), chunk_begin(m, parts, p + 1)); });
}

// Whether the GEMV reads this format's int8 codes through the sign trick (no VNNI).
constexpr bool sign_trick(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256)
  (void)f;
  return false;
#else
  return f == weight_format::q8_0 || f == weight_format::int8_sym;
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

template <std::size_t P>
using parity = std::integral_constant<std::size_t, P>;

// The integer offset o (value = s · (u − o)) of a format's codes as the GEMV multiplies them.
constexpr float gemv_int_offset(weight_format f) noexcept {
  switch (f) {
    case weight_format::q4_0:
    case weight_format::int4_sym: return 8.0f;
    case weight_format::q6_k: return 32.0f;
    case weight_format::q8_0:
    case weight_format::int8_sym: return sign_trick(f) ? 0.0f : 128.0f;
    default: return 0.0f;  // q4_k: its min is a separate offset
  }
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

// The row's scales for pieces j .. j + 7 (j a multiple of 8; lanes past the row's pieces: 0),
// built in registers: a vector load over several recent scalar stores cannot be forwarded and
// stalls until they retire (measured: ~25% of the GEMV's time when the f16 scales went through
// a buffer). One scale per piece: q4_0, q8_0, int4_sym, int8_sym.
template <weight_format F>
[[gnu::always_inline]] inline __m256 gemv_scales8(const quantized_view& w, const sym_scales& g,
                                                  const std::byte* row, std::size_t n,
                                                  std::size_t j, std::size_t pieces) noexcept {
  const std::size_t valid = std::min<std::size_t>(8, pieces - j);
  if constexpr (F == weight_format::q4_0 || F == weight_format::q8_0) {
    (void)w;
    (void)g;
    (void)n;
    constexpr int bb = F == weight_format::q4_0 ? 18 : 34;
    const __m256i idx = _mm256_setr_epi32(0, bb, 2 * bb, 3 * bb, 4 * bb, 5 * bb, 6 * bb, 7 * bb);
    // Low 16 bits of each dword into the low 8 bytes of each 128-bit lane.
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const auto* base = reinterpret_cast<const int*>(row + bb * j);
    __m256i v;
    if (valid == 8) {
      v = _mm256_i32gather_epi32(base, idx, 1);
    } else {  // the row's last pieces: no read past them
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, idx, mask, 1);
    }
    const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
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

// Row n's prologue: S[m][j] = s_j · dx_j for the MR rows of x (q6_k: per half piece), and
// off[m]: q4_k's min term Σ_j dmin · m_j · dx_j Σ codes_j (the other formats' offsets are in corr).
template <weight_format F, std::size_t MR>
[[gnu::always_inline]] inline void gemv_row_prologue(const quantized_view& w, const sym_scales& g,
                                                     std::size_t n, const quantized_activations& a,
                                                     std::size_t m0, float* s, std::size_t ns,
                                                     float* off) noexcept {
  const std::size_t pieces = w.cols / 32, bpad = a.bpad;
  const std::byte* row = w.data.data() + n * w.row_bytes();
  const float* dx = a.dpad.data() + m0 * bpad;
  if constexpr (F == weight_format::q4_k) {
    __m256 o8[MR];
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) o8[m] = _mm256_setzero_ps();
    const float* sums = a.sums.data() + m0 * a.blocks * 2;
    for (std::size_t j = 0; j < pieces; j += 8) {
      const std::byte* b = row + 144 * (j / 8);
      std::uint64_t sc, mn;
      q4_k_unpack_scales(b + 4, sc, mn);
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int*>(b)));
      const __m256 ws = _mm256_mul_ps(u8x8_to_ps(sc), _mm256_broadcastss_ps(dd));
      const __m256 wm = _mm256_mul_ps(u8x8_to_ps(mn), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        _mm256_store_ps(s + m * ns + j, _mm256_mul_ps(ws, _mm256_loadu_ps(dx + m * bpad + j)));
        // dx Σ codes per piece: the two halves' sums, added pairwise.
        const float* sm = sums + m * a.blocks * 2 + 2 * j;
        const __m256 h0 = _mm256_loadu_ps(sm), h1 = _mm256_loadu_ps(sm + 8);
        // (hadd within 128-bit lanes gives pieces 0 1 4 5 | 2 3 6 7: reorder the pairs)
        const __m256 xs =
            _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(h0, h1)), 0xD8));
        o8[m] = _mm256_fmadd_ps(wm, xs, o8[m]);
      }
    }
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = hsum(o8[m]);
  } else if constexpr (F == weight_format::q6_k) {
    __m256 o8[MR];
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) o8[m] = _mm256_setzero_ps();
    for (std::size_t j = 0; j < pieces; j += 8) {
      const auto* b = reinterpret_cast<const std::uint8_t*>(row + 210 * (j / 8));
      const __m256 d = _mm256_set1_ps(load_f16(reinterpret_cast<const std::byte*>(b + 208)));
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
      const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
      const __m256 s1 =
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d);
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        if constexpr (!dot_corr(F)) {  // o · s per half times dx Σ codes of the half
          const float* sm = a.sums.data() + (m0 + m) * a.blocks * 2 + 2 * j;
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
    if constexpr (!dot_corr(F)) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) off[m] = 32.0f * hsum(o8[m]);
    }
  } else {
    __m256 o8[MR];
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) o8[m] = _mm256_setzero_ps();
    for (std::size_t j = 0; j < pieces; j += 8) {
      const __m256 s8 = gemv_scales8<F>(w, g, row, n, j, pieces);  // 0 past the row's pieces
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        _mm256_store_ps(s + m * ns + j, _mm256_mul_ps(s8, _mm256_loadu_ps(dx + m * bpad + j)));
        if constexpr (!dot_corr(F) && gemv_int_offset(F) != 0.0f) {
          // dx Σ codes per piece (the halves' sums added pairwise; sums has 16 floats of
          // finite slack at its end for the last chunk, times s8's zero lanes)
          const float* sm = a.sums.data() + (m0 + m) * a.blocks * 2 + 2 * j;
          const __m256 xs = _mm256_castpd_ps(_mm256_permute4x64_pd(
              _mm256_castps_pd(_mm256_hadd_ps(_mm256_loadu_ps(sm), _mm256_loadu_ps(sm + 8))),
              0xD8));
          o8[m] = _mm256_fmadd_ps(s8, xs, o8[m]);
        }
      }
    }
    if constexpr (!dot_corr(F) && gemv_int_offset(F) != 0.0f) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        off[m] = gemv_int_offset(F) * hsum(o8[m]);
      }
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
    const __m512i z = _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1),
                                        _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    if constexpr (F == weight_format::q4_0) {
      return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    } else {  // (z & 0x0F) ^ 0x08: the two's complement nibble + 8
      return _mm512_ternarylogic_epi32(z, _mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x08), 0x6A);
    }
  } else {
    __m512i z;
    if constexpr (F == weight_format::q8_0) {
      z = _mm512_inserti64x4(
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
  constexpr bool halves = F == weight_format::q6_k;  // a scale per half piece
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
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, u, xv));
          const __m512 sc = _mm512_permutexvar_ps(
              sel, _mm512_castps128_ps512(_mm_castpd_ps(
                       _mm_load_sd(reinterpret_cast<const double*>(s + m * ns + j)))));
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
        acc[m][0] = _mm256_add_ps(_mm512_castps512_ps256(t2), _mm512_extractf32x8_ps(t2, 1));
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

#else
// ---- portable GEMV: pieces decoded one by one, integer dot products ------------------------
struct gemv_scratch {};

template <weight_format F, std::size_t MR>
void gemv_rows(const quantized_view& w, const quantized_activations& a, std::size_t m0,
               std::size_t n0, std::size_t n1, const float* bias, float* y, std::size_t ldy,
               gemv_scratch&) {
  const std::size_t k = a.k, blocks = a.blocks;
  piece p;
  for (std::size_t n = n0; n < n1; ++n) {
    float acc[MR] = {};
    for (std::size_t j = 0; j < blocks; ++j) {
      decode_piece(w, n, j, p);
      for (std::size_t m = 0; m < MR; ++m) {
        const std::int8_t* xq = a.codes.data() + (m0 + m) * k + 32 * j;
        std::int32_t d0 = 0, d1 = 0;
        for (int i = 0; i < 16; ++i) d0 += static_cast<std::int32_t>(p.q[i]) * xq[i];
        for (int i = 16; i < 32; ++i) d1 += static_cast<std::int32_t>(p.q[i]) * xq[i];
        const float dx = a.d[(m0 + m) * blocks + j];
        acc[m] += dx * (p.scale[0] * static_cast<float>(d0) + p.scale[1] * static_cast<float>(d1));
        if constexpr (F == weight_format::q4_k) {
          const float* s = a.sums.data() + ((m0 + m) * blocks + j) * 2;
          acc[m] -= p.offset * (s[0] + s[1]);
        }
      }
    }
    for (std::size_t m = 0; m < MR; ++m) y[m * ldy + n] = acc[m] + (bias ? bias[n] : 0.0f);
  }
}
#endif

template <weight_format F>
void gemv(const quantized_view& w, const quantized_activations& a, std::size_t n0, std::size_t n1,
          const float* bias, float* y, std::size_t ldy) {
  thread_local gemv_scratch scales;
  std::size_t m = 0;
  for (; m + 4 <= a.m; m += 4) gemv_rows<F, 4>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
  switch (a.m - m) {
    case 1: return gemv_rows<F, 1>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    case 2: return gemv_rows<F, 2>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    case 3: return gemv_rows<F, 3>(w, a, m, n0, n1, bias, y + m * ldy, ldy, scales);
    default: return;
  }
}

// ---- GEMM: interleaved int8 panels, one dot product per chunk for all P columns -----------

#if defined(NPULLM_QUANT_VNNI512)
struct qvec {  // 16 int32 / f32 lanes
  using i = __m512i;
  using f = __m512;
  static constexpr std::size_t lanes = 16;
  static i load(const void* p) noexcept { return _mm512_loadu_si512(p); }
  static i bcast4(const std::int8_t* p) noexcept {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static i dot(i acc, i u, i s) noexcept { return _mm512_dpbusd_epi32(acc, u, s); }
  static f loadf(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static f set1(float v) noexcept { return _mm512_set1_ps(v); }
  // (maskz: GCC 12 warns about the unmasked form's undefined pass-through operand)
  static f cvt(i v) noexcept { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }
  static f fmadd(f a, f b, f c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static f fnmadd(f a, f b, f c) noexcept { return _mm512_fnmadd_ps(a, b, c); }
  static f add(f a, f b) noexcept { return _mm512_add_ps(a, b); }
  static f mul(f a, f b) noexcept { return _mm512_mul_ps(a, b); }
  static f zerof() noexcept { return _mm512_setzero_ps(); }
  static void storef(float* p, f v) noexcept { _mm512_storeu_ps(p, v); }
};
inline constexpr std::size_t gemm_vectors = 2;  // P = 32 columns
inline constexpr std::size_t gemm_rows = 6;     // MR: 12 int + 12 f32 accumulators
#elif defined(__AVX2__)
struct qvec {  // 8 int32 / f32 lanes
  using i = __m256i;
  using f = __m256;
  static constexpr std::size_t lanes = 8;
  static i load(const void* p) noexcept { return _mm256_loadu_si256(static_cast<const i*>(p)); }
  static i bcast4(const std::int8_t* p) noexcept {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
#if defined(NPULLM_QUANT_VNNI256)
  static i dot(i acc, i u, i s) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
  }
#endif
  static f loadf(const float* p) noexcept {
    return _mm256_loadu_ps(p);
  }
  static f set1(float v) noexcept {
    return _mm256_set1_ps(v);
  }
  static f cvt(i v) noexcept {
    return _mm256_cvtepi32_ps(v);
  }
  static f fmadd(f a, f b, f c) noexcept {
    return _mm256_fmadd_ps(a, b, c);
  }
  static f fnmadd(f a, f b, f c) noexcept {
    return _mm256_fnmadd_ps(a, b, c);
  }
  static f mul(f a, f b) noexcept {
    return _mm256_mul_ps(a, b);
  }
  static f add(f a, f b) noexcept {
    return _mm256_add_ps(a, b);
  }
  static f zerof() noexcept {
    return _mm256_setzero_ps();
  }
  static void storef(float* p, f v) noexcept {
    _mm256_storeu_ps(p, v);
  }
};
inline constexpr std::size_t gemm_vectors = 1;  // P = 8 columns
inline constexpr std::size_t gemm_rows = 4;
#endif

#if defined(__AVX2__)
inline constexpr std::size_t panel_cols = gemm_vectors * qvec::lanes;

// Whether the GEMM multiplies int8 codes through the sign trick (AVX2 without VNNI: x as u8
// code + 128 times w up to ±128 would saturate maddubs's i16 pair sums).
constexpr bool gemm_sign_trick(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QUANT_VNNI512)
  (void)f;
  return false;
#else
  return f == weight_format::q8_0 || f == weight_format::int8_sym;
#endif
}

// W rows [n0, n0 + cols) decoded as interleaved codes: for piece j, chunk t (values 4t..4t+3),
// column c: codes[((j · 8 + t) · P + c) · 4 + 0..3]; start[(j · 2 + h) · P + c]: the int32
// accumulator's start for half h (−128 · Σ codes of the half with biased x, 0 with the sign
// trick; formats with one scale per piece keep the piece's total in h = 0), scale[(j · 2 + h) ·
// P + c], offset[j · P + c] (q4_k's min, subtracted per unit of x). Columns past cols are zero.
// Per call (linear over a quantized_view) each panel is decoded into a thread's buffer; pack()
// decodes them all once (packed_quantized below).
struct panel_ref {
  const std::int8_t* codes;
  const std::int32_t* start;
  const float* scale;
  const float* offset;
};

inline constexpr std::size_t panel_code_count(std::size_t pieces) noexcept {
  return pieces * 32 * panel_cols;
}

// Plain AVX2 q4_k: codes stored as nibble − 8 (−8..7, with offset o − 8 s), so that 8 chunks
// of maddubs pair sums fit one i16 accumulator (see chunks_per_i16).
constexpr bool shifted_q4_k(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QUANT_VNNI512)
  (void)f;
  return false;
#else
  return f == weight_format::q4_k;
#endif
}

inline void pack_panel(const quantized_view& w, std::size_t n0, std::size_t cols, bool biased_x,
                       std::int8_t* codes, std::int32_t* start, float* scale, float* offset) {
  constexpr std::size_t P = panel_cols;
  const std::size_t pieces = w.cols / 32;
  const bool split = w.format == weight_format::q6_k;
  const bool shift = shifted_q4_k(w.format);
  if (cols < P) {
    std::fill_n(codes, pieces * 32 * P, std::int8_t{0});
    std::fill_n(start, pieces * 2 * P, 0);
    std::fill_n(scale, pieces * 2 * P, 0.0f);
    std::fill_n(offset, pieces * P, 0.0f);
  }
  piece pc;
  for (std::size_t c = 0; c < cols; ++c) {
    for (std::size_t j = 0; j < pieces; ++j) {
      decode_piece(w, n0 + c, j, pc);
      if (shift) {
        for (auto& q : pc.q) q = static_cast<std::int8_t>(q - 8);
        pc.offset -= 8.0f * pc.scale[0];
      }
      std::int32_t s0 = 0, s1 = 0;
      std::int8_t* dst = codes + j * 32 * P + c * 4;
      for (std::size_t t = 0; t < 8; ++t) {
        std::memcpy(dst + t * P * 4, pc.q + 4 * t, 4);
      }
      for (std::size_t i = 0; i < 32; ++i) (i < 16 ? s0 : s1) += pc.q[i];
      if (!split) {
        s0 += s1;
        s1 = 0;
      }
      start[(j * 2) * P + c] = biased_x ? -128 * s0 : 0;
      start[(j * 2 + 1) * P + c] = biased_x ? -128 * s1 : 0;
      scale[(j * 2) * P + c] = pc.scale[0];
      scale[(j * 2 + 1) * P + c] = pc.scale[1];
      offset[j * P + c] = pc.offset;
    }
  }
}

// Plain AVX2: chunks whose maddubs pair sums (x as u8 <= 255) one i16 lane can add before its
// one madd: |pair| <= 2 · 255 · max|w|, so 8 chunks for codes in −8..8 (q4_0, int4_sym, shifted
// q4_k: 8 · 4080 <= 32767), 2 for q6_k (−32..31), 1 with the sign trick (|x|, |w| <= 127).
constexpr std::size_t chunks_per_i16(weight_format f) noexcept {
  switch (f) {
    case weight_format::q4_0:
    case weight_format::int4_sym: return 8;
    case weight_format::q4_k: return shifted_q4_k(f) ? 8 : 4;
    case weight_format::q6_k: return 2;
    default: return 1;
  }
}

// y[MR rows, P columns] = x rows · panel (+ bias); cols <= P are stored.
template <weight_format F, std::size_t MR>
void gemm_micro(const quantized_activations& a, std::size_t m0, const panel_ref& p,
                std::size_t cols, const float* bias, float* y, std::size_t ldy) {
  constexpr std::size_t V = gemm_vectors, L = qvec::lanes, P = panel_cols;
  constexpr bool split = F == weight_format::q6_k;  // two scales per piece
  constexpr bool mins = F == weight_format::q4_k;   // an offset per piece
  const std::size_t k = a.k, blocks = a.blocks;
  const std::int8_t* xq = a.codes.data() + m0 * k;
  qvec::f acc[MR][V];
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
    NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) acc[m][v] = qvec::zerof();
  }
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::int8_t* wc = p.codes + j * 8 * P * 4;
    NPULLM_UNROLL for (std::size_t h = 0; h < (split ? 2 : 1); ++h) {
      qvec::i iacc[MR][V];
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) iacc[m][v] =
            qvec::load(p.start + (j * 2 + h) * P + v * L);
      }
      const std::size_t t0 = split ? 4 * h : 0, t1 = split ? t0 + 4 : 8;
#if defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QUANT_VNNI512)
      NPULLM_UNROLL for (std::size_t t = t0; t < t1; ++t) {
        qvec::i wv[V];
        NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) wv[v] =
            qvec::load(wc + (t * P + v * L) * 4);
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          const qvec::i x4 = qvec::bcast4(xq + m * k + 32 * j + 4 * t);
          NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
            iacc[m][v] = qvec::dot(iacc[m][v], x4, wv[v]);
          }
        }
      }
#else
      constexpr std::size_t G = chunks_per_i16(F);
      constexpr bool st = gemm_sign_trick(F);
      const __m256i ones = _mm256_set1_epi16(1);
      NPULLM_UNROLL for (std::size_t t = t0; t < t1; t += G) {
        __m256i s16[MR][V];
        NPULLM_UNROLL for (std::size_t g = 0; g < G; ++g) {
          qvec::i wv[V];
          NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) wv[v] =
              qvec::load(wc + ((t + g) * P + v * L) * 4);
          NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
            const qvec::i x4 = qvec::bcast4(xq + m * k + 32 * j + 4 * (t + g));
            NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
              __m256i prod;
              if constexpr (st) {
                prod = _mm256_maddubs_epi16(_mm256_abs_epi8(wv[v]), _mm256_sign_epi8(x4, wv[v]));
              } else {
                prod = _mm256_maddubs_epi16(x4, wv[v]);
              }
              if (g == 0) {
                s16[m][v] = prod;
              } else {
                s16[m][v] = _mm256_add_epi16(s16[m][v], prod);
              }
              // Keeps the adds a chain: GCC otherwise rebalances them into a tree that holds
              // every product of the group at once (measured: spilled, 2x slower).
              asm("" : "+x"(s16[m][v]));
            }
          }
        }
        NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
          NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
            iacc[m][v] = _mm256_add_epi32(iacc[m][v], _mm256_madd_epi16(s16[m][v], ones));
            asm("" : "+x"(iacc[m][v]));  // the same for the int32 chain
          }
        }
      }
#endif
      qvec::f sc[V];
      NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) sc[v] =
          qvec::loadf(p.scale + (j * 2 + h) * P + v * L);
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const qvec::f dx = qvec::set1(a.d[(m0 + m) * blocks + j]);
        NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
          acc[m][v] = qvec::fmadd(qvec::cvt(iacc[m][v]), qvec::mul(sc[v], dx), acc[m][v]);
        }
      }
    }
    if constexpr (mins) {
      NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
        const qvec::f xs = qvec::set1(a.tot[(m0 + m) * blocks + j]);
        NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
          acc[m][v] = qvec::fnmadd(qvec::loadf(p.offset + j * P + v * L), xs, acc[m][v]);
        }
      }
    }
  }
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
    float* ym = y + m * ldy;
    if (cols == P) {
      NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
        qvec::f r = acc[m][v];
        if (bias) r = qvec::add(r, qvec::loadf(bias + v * L));
        qvec::storef(ym + v * L, r);
      }
      continue;
    }
    alignas(64) float out[P];
    NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) qvec::storef(out + v * L, acc[m][v]);
    for (std::size_t c = 0; c < cols; ++c) ym[c] = out[c] + (bias ? bias[c] : 0.0f);
  }
}

template <weight_format F, std::size_t MR = gemm_rows - 1>
inline void gemm_rest(std::size_t rest, const quantized_activations& a, std::size_t m0,
                      const panel_ref& p, std::size_t cols, const float* bias, float* y,
                      std::size_t ldy) {
  if constexpr (MR > 0) {
    if (rest == MR) return gemm_micro<F, MR>(a, m0, p, cols, bias, y, ldy);
    gemm_rest<F, MR - 1>(rest, a, m0, p, cols, bias, y, ldy);
  }
}

// All rows of x times one panel (columns c0 .. c0 + cols).
template <weight_format F>
void gemm_panel_rows(const quantized_activations& a, const panel_ref& p, std::size_t c0,
                     std::size_t cols, const float* bias, float* y, std::size_t ldy) {
  const float* b = bias ? bias + c0 : nullptr;
  std::size_t m = 0;
  for (; m + gemm_rows <= a.m; m += gemm_rows) {
    gemm_micro<F, gemm_rows>(a, m, p, cols, b, y + m * ldy + c0, ldy);
  }
  gemm_rest<F>(a.m - m, a, m, p, cols, b, y + m * ldy + c0, ldy);
}

// Per call: each panel decoded into this thread's buffer, then multiplied.
template <weight_format F>
void gemm(const quantized_view& w, const quantized_activations& a, std::size_t n0, std::size_t n1,
          const float* bias, float* y, std::size_t ldy) {
  struct buffers {
    std::vector<std::int8_t, aligned_allocator<std::int8_t>> codes;
    std::vector<std::int32_t, aligned_allocator<std::int32_t>> start;
    std::vector<float, aligned_allocator<float>> scale, offset;
  };
  thread_local buffers buf;
  const std::size_t pieces = w.cols / 32, P = panel_cols;
  buf.codes.resize(pieces * 32 * P);
  buf.start.resize(pieces * 2 * P);
  buf.scale.resize(pieces * 2 * P);
  buf.offset.resize(pieces * P);
  const panel_ref ref{buf.codes.data(), buf.start.data(), buf.scale.data(), buf.offset.data()};
  for (std::size_t c0 = n0; c0 < n1; c0 += panel_cols) {
    const std::size_t cols = std::min(panel_cols, n1 - c0);
    pack_panel(w, c0, cols, !gemm_sign_trick(F), buf.codes.data(), buf.start.data(),
               buf.scale.data(), buf.offset.data());
    gemm_panel_rows<F>(a, ref, c0, cols, bias, y, ldy);
  }
}
#else
template <weight_format F>
void gemm(const quantized_view& w, const quantized_activations& a, std::size_t n0, std::size_t n1,
          const float* bias, float* y, std::size_t ldy) {
  gemv<F>(w, a, n0, n1, bias, y, ldy);  // the portable shape is the same loop
}
#endif

// Which form of x each path multiplies: (pair_split, biased).
constexpr std::pair<bool, bool> activation_form(weight_format f, bool gemm_path) noexcept {
#if defined(__AVX2__)
  if (gemm_path) return {false, !gemm_sign_trick(f)};
  return {f == weight_format::int4_sym, false};
#else
  (void)f;
  (void)gemm_path;
  return {false, false};
#endif
}

template <weight_format F, threading_policy Policy>
void run_quant_linear(const quantized_view& w, const float* x, std::size_t ldx, std::size_t m,
                      const float* bias, float* y, std::size_t ldy, const Policy& policy) {
  const std::size_t n = w.rows, k = w.cols;
  const bool gemm_path = m > quant_gemv_max_m;
  thread_local quantized_activations act;
  const auto [split, biased] = activation_form(F, gemm_path);
#if defined(__AVX2__)
  const int gemv_offset = gemm_path ? -1 : dot_corr(F) ? static_cast<int>(gemv_int_offset(F)) : 0;
#else
  const int gemv_offset = -1;
#endif
  quantize_activations(x, ldx, m, k, split, biased, act, gemv_offset, policy);
#if defined(__AVX2__)
  const std::size_t unit = gemm_path ? panel_cols : 16;
#else
  const std::size_t unit = 16;
#endif
  const std::size_t units = (n + unit - 1) / unit;
  const std::size_t parts = std::min(units, policy.concurrency() * 4);
  const quantized_activations& a = act;  // the caller's thread's buffer, read by all
  policy.parallel_for(parts, [&](std::size_t p) {
    const std::size_t n0 = std::min(n, chunk_begin(units, parts, p) * unit);
    const std::size_t n1 = std::min(n, chunk_begin(units, parts, p + 1) * unit);
    if (gemm_path) {
      gemm<F>(w, a, n0, n1, bias, y, ldy);
    } else {
      gemv<F>(w, a, n0, n1, bias, y, ldy);
    }
  });
}

}  // namespace detail

// W decoded once (at load) into the GEMM's interleaved int8 panels, so that a call with M > 16
// rows runs only the micro-kernel: no per-call decode of W. Made by pack(); read by the
// linear(x, const packed_quantized&, y, ...) overload below, which gives the same results as
// linear over the source view (bit for bit: the same panels, the same micro-kernel).
//   Layout (per panel of P = 32 columns with AVX-512 VNNI, else 8; the build's ISA decides it,
//   so a packed_quantized is only meaningful in the ISA namespace that made it): per 32-value
//   piece, 8 chunks of P × 4 int8 codes, P int32 accumulator starts and P f32 scales per half
//   piece, P f32 offsets (q4_k); see detail::pack_panel.
//   Memory: 1 byte per weight plus 20 bytes per 32 weights per column (about 1.6 bytes per weight
//   against q4_0's 0.56 and q8_0's 1.06), on top of the source, which must outlive it: M <= 16
//   (GEMV, bandwidth-bound, where the compact source reads fastest) reads the source view.
//   The portable build keeps no panels (its GEMM is the GEMV loop) and reads the source.
class packed_quantized {
 public:
  packed_quantized() = default;
  packed_quantized(const packed_quantized&) = delete;
  packed_quantized& operator=(const packed_quantized&) = delete;
  packed_quantized(packed_quantized&&) noexcept = default;
  packed_quantized& operator=(packed_quantized&&) noexcept = default;

  [[nodiscard]] const quantized_view& source() const noexcept { return source_; }
  [[nodiscard]] weight_format format() const noexcept { return source_.format; }
  [[nodiscard]] std::size_t rows() const noexcept { return source_.rows; }
  [[nodiscard]] std::size_t cols() const noexcept { return source_.cols; }
  // Bytes of the panels (the source's bytes not included).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return codes_.size() + 4 * (start_.size() + scale_.size() + offset_.size());
  }

 private:
  friend struct detail::packed_access;
  quantized_view source_;
  std::size_t panels_ = 0;
  std::vector<std::int8_t, aligned_allocator<std::int8_t>> codes_;
  std::vector<std::int32_t, aligned_allocator<std::int32_t>> start_;
  std::vector<float, aligned_allocator<float>> scale_, offset_;
};

namespace detail {

inline void check_kernel_shape(const quantized_view& w, const char* what) {
  if (w.cols % 32 != 0 || (w.group != 0 && w.group % 32 != 0)) {
    raise(error_code::invalid_shape, what, ": ", to_string(w.format), " K = ", w.cols, " group ",
          w.group, ": the quantized kernels need K and the group to be multiples of 32");
  }
}

struct packed_access {
  template <threading_policy Policy>
  static packed_quantized pack(const quantized_view& w, const Policy& policy) {
    check_kernel_shape(w, "pack");
    packed_quantized out;
    out.source_ = w;
#if defined(__AVX2__)
    constexpr std::size_t P = panel_cols;
    const std::size_t pieces = w.cols / 32;
    out.panels_ = (w.rows + P - 1) / P;
    out.codes_.resize(out.panels_ * pieces * 32 * P);
    out.start_.resize(out.panels_ * pieces * 2 * P);
    out.scale_.resize(out.panels_ * pieces * 2 * P);
    out.offset_.resize(out.panels_ * pieces * P);
    const bool biased = !gemm_sign_trick(w.format);
    const std::size_t parts = std::min(out.panels_, policy.concurrency() * 4);
    policy.parallel_for(parts, [&](std::size_t part) {
      for (std::size_t i = chunk_begin(out.panels_, parts, part);
           i < chunk_begin(out.panels_, parts, part + 1); ++i) {
        pack_panel(w, i * P, std::min(P, w.rows - i * P), biased,
                   out.codes_.data() + i * pieces * 32 * P, out.start_.data() + i * pieces * 2 * P,
                   out.scale_.data() + i * pieces * 2 * P, out.offset_.data() + i * pieces * P);
      }
    });
#else
    (void)policy;
#endif
    return out;
  }

#if defined(__AVX2__)
  static panel_ref panel(const packed_quantized& w, std::size_t i) noexcept {
    constexpr std::size_t P = panel_cols;
    const std::size_t pieces = w.cols() / 32;
    return {w.codes_.data() + i * pieces * 32 * P, w.start_.data() + i * pieces * 2 * P,
            w.scale_.data() + i * pieces * 2 * P, w.offset_.data() + i * pieces * P};
  }
  static std::size_t panels(const packed_quantized& w) noexcept {
    return w.panels_;
  }
#endif
};

#if defined(__AVX2__)
template <weight_format F, threading_policy Policy>
void run_packed_gemm(const packed_quantized& w, const float* x, std::size_t ldx, std::size_t m,
                     const float* bias, float* y, std::size_t ldy, const Policy& policy) {
  constexpr std::size_t P = panel_cols;
  const std::size_t n = w.rows(), k = w.cols();
  thread_local quantized_activations act;
  const auto [split, biased] = activation_form(F, true);
  quantize_activations(x, ldx, m, k, split, biased, act, -1, policy);
  const std::size_t units = packed_access::panels(w);
  const std::size_t parts = std::min(units, policy.concurrency() * 4);
  const quantized_activations& a = act;
  policy.parallel_for(parts, [&](std::size_t part) {
    for (std::size_t i = chunk_begin(units, parts, part); i < chunk_begin(units, parts, part + 1);
         ++i) {
      gemm_panel_rows<F>(a, packed_access::panel(w, i), i * P, std::min(P, n - i * P), bias, y,
                         ldy);
    }
  });
}
#endif

// linear over w (its view, or its packed panels when `packed` is given and M > 16).
template <threading_policy Policy, class XL, class YL>
void quant_linear(const tensor_view<const float, dextents<2>, XL>& x, const quantized_view& w,
                  const packed_quantized* packed, const tensor_view<float, dextents<2>, YL>& y,
                  std::span<const float> bias, const Policy& policy) {
  const float* b = bias.empty() ? nullptr : bias.data();
  const std::size_t m = x.extent(0), k = x.extent(1), n = w.rows;
  if (k != w.cols || y.extent(0) != m || y.extent(1) != n || (b != nullptr && bias.size() != n)) {
    raise(error_code::invalid_shape, "linear: x ", npullm::detail::format_extents(x.extents()),
          ", ", to_string(w.format), " W [", n, ", ", w.cols, "], y ",
          npullm::detail::format_extents(y.extents()), b ? ", bias [" : "",
          b ? std::to_string(bias.size()) + "]" : "", " (want x [M, K], W [N, K], y [M, N])");
  }
  check_kernel_shape(w, "linear");
  if (m > 0 && x.stride(1) != 1) raise(error_code::unsupported, "linear: rows of x must be dense");
  if (m > 0 && y.stride(1) != 1) raise(error_code::unsupported, "linear: rows of y must be dense");
  if (m == 0 || n == 0) return;
  const float* xp = x.data_handle();
  float* yp = y.data_handle();
  const auto ldx = static_cast<std::size_t>(x.stride(0));
  const auto ldy = static_cast<std::size_t>(y.stride(0));
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) yp[i * ldy + j] = b ? b[j] : 0.0f;
    }
    return;
  }
  using F = weight_format;
  (void)packed;  // (read only where there are panels: AVX2 and up)
  auto run = [&]<F f>() {
#if defined(__AVX2__)
    if (packed != nullptr && m > quant_gemv_max_m) {
      return run_packed_gemm<f>(*packed, xp, ldx, m, b, yp, ldy, policy);
    }
#endif
    run_quant_linear<f>(w, xp, ldx, m, b, yp, ldy, policy);
  };
  switch (w.format) {
    case F::q8_0: return run.template operator()<F::q8_0>();
    case F::q4_0: return run.template operator()<F::q4_0>();
    case F::q4_k: return run.template operator()<F::q4_k>();
    case F::q6_k: return run.template operator()<F::q6_k>();
    case F::int8_sym: return run.template operator()<F::int8_sym>();
    case F::int4_sym: return run.template operator()<F::int4_sym>();
  }
}

}  // namespace detail

// W's panels, decoded once (see packed_quantized). Raises invalid_shape where linear would (K or
// the group not a multiple of 32). Threads split the panels.
template <threading_policy Policy = serial>
[[nodiscard]] packed_quantized pack(const quantized_view& w, const Policy& policy = {}) {
  return detail::packed_access::pack(w, policy);
}

// y = x W^T (+ bias). x: (M, K) f32 rows (any row stride); w: (N, K) quantized; y: (M, N).
// Checks everything before writing y: shapes (invalid_shape), K % 32 (invalid_shape), dense
// rows of x and y (unsupported). A call that throws leaves y as it was.
// (Policy comes first so that linear<W>(...) calls meant for ops/linear.hpp's overloads fail
// this one's constraint instead of instantiating it with a weight type as a layout.)
template <threading_policy Policy = serial, class XL, class YL>
void linear(const tensor_view<const float, dextents<2>, XL>& x, const quantized_view& w,
            const tensor_view<float, dextents<2>, YL>& y, std::span<const float> bias = {},
            const Policy& policy = {}) {
  detail::quant_linear(x, w, nullptr, y, bias, policy);
}

// The same over packed panels: M > 16 runs the micro-kernel on them, M <= 16 the GEMV on
// w.source(). Results equal linear(x, w.source(), y, bias, policy)'s.
template <threading_policy Policy = serial, class XL, class YL>
void linear(const tensor_view<const float, dextents<2>, XL>& x, const packed_quantized& w,
            const tensor_view<float, dextents<2>, YL>& y, std::span<const float> bias = {},
            const Policy& policy = {}) {
  detail::quant_linear(x, w.source(), &w, y, bias, policy);
}

template <threading_policy Policy = serial>
void linear(dense_view<const float, 2> x, const packed_quantized& w, dense_view<float, 2> y,
            std::span<const float> bias = {}, const Policy& policy = {}) {
  linear<Policy, layout_right, layout_right>(x, w, y, bias, policy);
}

template <threading_policy Policy = serial>
void linear(dense_view<const float, 2> x, const quantized_view& w, dense_view<float, 2> y,
            std::span<const float> bias = {}, const Policy& policy = {}) {
  linear<Policy, layout_right, layout_right>(x, w, y, bias, policy);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
