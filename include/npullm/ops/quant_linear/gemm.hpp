// The quantized GEMM (M > 16 rows of x; ops/quant_linear.hpp explains it): W's rows decoded into
// interleaved int8 panels of P columns and a micro-kernel of MR rows x P columns with one dot
// product per 4-value chunk for all P columns. Portable builds run the GEMV loop instead.
#pragma once

#include "npullm/ops/quant_linear/gemv.hpp"

#include "npullm/ops/quant_linear/vnni_macros.hpp"  // (ended at the bottom)

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

using namespace ::npullm::ops::quant_detail;  // decode_piece, piece, load_f16, q4_k_scale_min

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
// code + 128 times |w| > 64 could saturate maddubs's i16 pair sums: 2 · 255 · 65 > 32767).
constexpr bool gemm_sign_trick(weight_format f) noexcept {
#if defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QUANT_VNNI512)
  (void)f;
  return false;
#else
  return piece_layout_of(f).max_code > 64;
#endif
}

// W rows [n0, n0 + cols) decoded as interleaved codes: for piece j, chunk t (values 4t..4t+3),
// column c: codes[((j · 8 + t) · P + c) · 4 + 0..3]; start[(j · 2 + h) · P + c]: the int32
// accumulator's start for half h (−128 · Σ codes of the half with biased x, 0 with the sign
// trick; formats with one scale per piece keep the piece's total in h = 0), scale[(j · 2 + h) ·
// P + c], offset[(j · 2 + h) · P + c] (the min, subtracted per unit of x: the piece's in h = 0
// unless the halves have their own, piece_layout::half_offsets). Columns past cols are zero.
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
  const bool split = piece_layout_of(w.format).half_scales;
  const bool split_offsets = piece_layout_of(w.format).half_offsets;
  const bool shift = shifted_q4_k(w.format);
  if (cols < P) {
    std::fill_n(codes, pieces * 32 * P, std::int8_t{0});
    std::fill_n(start, pieces * 2 * P, 0);
    std::fill_n(scale, pieces * 2 * P, 0.0f);
    std::fill_n(offset, pieces * 2 * P, 0.0f);
  }
  piece pc;
  for (std::size_t c = 0; c < cols; ++c) {
    for (std::size_t j = 0; j < pieces; ++j) {
      decode_piece(w, n0 + c, j, pc);
      if (shift) {
        for (auto& q : pc.q) q = static_cast<std::int8_t>(q - 8);
        pc.offset[0] -= 8.0f * pc.scale[0];
        pc.offset[1] -= 8.0f * pc.scale[1];
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
      offset[(j * 2) * P + c] = pc.offset[0];
      offset[(j * 2 + 1) * P + c] = split_offsets ? pc.offset[1] : 0.0f;
    }
  }
}

// Plain AVX2: chunks whose maddubs pair sums (x as u8 <= 255) one i16 lane can add before its
// one madd: |pair| <= 2 · 255 · max|w|, so 8 chunks for codes in −8..8 (q4_0, int4_sym, shifted
// q4_k: 8 · 4080 <= 32767), 2 for q6_k (−32..31), 1 with the sign trick (|x|, |w| <= 127); a
// power of two that divides the chunks of one scale (8, or 4 with half scales).
constexpr std::size_t chunks_per_i16(weight_format f) noexcept {
  if (gemm_sign_trick(f)) return 1;
  const int max_code = shifted_q4_k(f) ? 8 : piece_layout_of(f).max_code;
  const std::size_t fit = static_cast<std::size_t>(32767 / (2 * 255 * max_code));
  std::size_t g = piece_layout_of(f).half_scales ? 4 : 8;
  while (g > 1 && g > fit) g /= 2;
  return g;
}

// y[MR rows, P columns] = x rows · panel (+ bias); cols <= P are stored.
template <weight_format F, std::size_t MR>
void gemm_micro(const quantized_activations& a, std::size_t m0, const panel_ref& p,
                std::size_t cols, const float* bias, float* y, std::size_t ldy) {
  constexpr std::size_t V = gemm_vectors, L = qvec::lanes, P = panel_cols;
  constexpr bool split = piece_layout_of(F).half_scales;       // two scales per piece
  constexpr bool mins = piece_layout_of(F).offset;             // an offset per piece
  constexpr bool half_mins = piece_layout_of(F).half_offsets;  // or per half
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
        if constexpr (half_mins) {
          const float* sm = a.sums.data() + ((m0 + m) * blocks + j) * 2;
          NPULLM_UNROLL for (std::size_t h = 0; h < 2; ++h) {
            const qvec::f xs = qvec::set1(sm[h]);
            NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
              acc[m][v] =
                  qvec::fnmadd(qvec::loadf(p.offset + (j * 2 + h) * P + v * L), xs, acc[m][v]);
            }
          }
        } else {
          const qvec::f xs = qvec::set1(a.tot[(m0 + m) * blocks + j]);
          NPULLM_UNROLL for (std::size_t v = 0; v < V; ++v) {
            acc[m][v] = qvec::fnmadd(qvec::loadf(p.offset + j * 2 * P + v * L), xs, acc[m][v]);
          }
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
  buf.offset.resize(pieces * 2 * P);
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

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops

#include "npullm/ops/quant_linear/vnni_macros_end.hpp"
