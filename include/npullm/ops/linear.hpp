// linear: y[M, N] = x[M, K] * W^T (+ bias[N]), W stored [N, K] (the Hugging Face layout) as
// f32, bf16 or f16. x, y and bias are f32.
//
// Paths, chosen by M and the weight type:
//   M <= 8 (GEMV)  every type: W streamed once, converted to f32 on the fly; M = 1 reads W row
//                  after row (one sequential stream), M = 2..8 keeps M x R accumulators (R
//                  rows of W at a time); memory-bound, so it runs at the speed W can be read.
//   M > 8, f32     the packed f32 micro-kernel below (it measured ~89% of the FMA peak where
//                  Eigen's GEMM, the benchmarks' baseline, measured ~70%).
//   M > 8, bf16    with AVX-512 BF16: x rounded to bf16 once; M <= 16 (K even) reads W in place
//                  as bf16 pairs with one vdpbf16ps accumulator per row (no packing: small
//                  batches stream W once); larger M packs W panels as (K/2, 32, 2) pairs for a
//                  vdpbf16ps micro-kernel of 8 rows x 32 columns; f32 accumulation.
//                  NOTE: this path multiplies bf16-rounded activations (as bf16 GEMMs do);
//                  `rounds_activations<bfloat16>()` says whether this build does.
//   M > 8, f32, f16 (and bf16 without AVX-512 BF16)  W converted to f32 while packing blocks of
//                  (kc keys, NR columns) that stay in L1; an f32 FMA micro-kernel of MR rows x NR
//                  columns (AVX-512 8 x 32, AVX2 6 x 16, portable 4 x 8: see simd::native).
// Threads split N (output columns) into contiguous parts; results do not depend on the count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/huge_page_allocator.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/linear_bf16.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {

// Whether linear with these weights rounds x to bf16 before multiplying (M > 8 only).
template <storage_type W>
constexpr bool rounds_activations() noexcept {
#if defined(__AVX512BF16__)
  return std::is_same_v<W, bfloat16>;
#else
  return false;
#endif
}

// Whether packing W ahead (packed_weights) pays for these weights: everywhere except bf16 with
// AVX-512 BF16, whose dot-product path reads W in place at twice the f32 FMA rate.
template <storage_type W>
constexpr bool packing_pays() noexcept {
  return !rounds_activations<W>();
}

namespace detail {

inline constexpr std::size_t gemv_max_m = 8;

template <class T>
inline simd::f32x16 load16(const T* p, std::size_t n) noexcept {
  return n >= simd::lanes ? simd::load(p) : simd::load_partial(p, n);
}

// v kept in a register for all its uses: GCC folds each use of a loaded vector into its FMA as
// a memory operand, one load of x per row of W (Zen 4, bf16 W, M = 8: 855 -> 706 us per
// 896 x 4864 product at 1 thread with x kept).
inline void in_register(simd::f32x16& v) noexcept {
#if defined(NPULLM_ISA_AVX512) && defined(__GNUC__)
  asm("" : "+v"(v.v));
#else
  (void)v;
#endif
}

// y[m, n] for n in [n0, n1): M <= 8 rows, R rows of W per step.
template <std::size_t M, class W>
void gemv_rows(const float* x, std::size_t ldx, const W* w, std::size_t k_len, std::size_t n0,
               std::size_t n1, const float* bias, float* y, std::size_t ldy) {
  // M x R accumulators + R rows of W + one x vector in registers (32 with AVX-512: R = 10, 7,
  // 6, 5, 4, 3, 3 for M = 2..8, each load of x feeding R FMAs: a speculative verification pass
  // of 5 rows, bf16 0.5B, 2 threads, measured 58-62 -> 73-79 tokens/s against R = 2; AVX2's 16
  // ymm hold 8 f32x16: R = 2 for M = 2, else 1, and M = 7, 8 spill a little).
  constexpr std::size_t R = simd::f32x16_registers >= 32
                                ? (M == 1 ? 16 : (simd::f32x16_registers - 1) / (M + 1))
                                : std::max<std::size_t>(1, (simd::f32x16_registers - 1) / (M + 1));
  std::size_t n = n0;
  for (; n + R <= n1; n += R) {
    simd::f32x16 acc[M][R];
    for (auto& row : acc) {
      for (auto& a : row) a = simd::zero();
    }
    // Whole vectors, then the last partial one (one loop body without a branch: with the
    // partial loads inside, GCC kept the accumulators on the stack, stored every step; Zen 4,
    // bf16 W, M = 8: 1850 -> 855 us per 896 x 4864 product at 1 thread).
    const auto step = [&](std::size_t k, auto load) {
      simd::f32x16 wv[R];
      for (std::size_t r = 0; r < R; ++r) wv[r] = load(w + (n + r) * k_len + k);
      for (std::size_t m = 0; m < M; ++m) {
        simd::f32x16 xv = load(x + m * ldx + k);
        in_register(xv);
        for (std::size_t r = 0; r < R; ++r) acc[m][r] = simd::fmadd(xv, wv[r], acc[m][r]);
      }
    };
    std::size_t k = 0;
    for (; k + simd::lanes <= k_len; k += simd::lanes) {
      step(k, [](const auto* p) { return simd::load(p); });
    }
    if (k < k_len) {
      step(k, [nk = k_len - k](const auto* p) { return simd::load_partial(p, nk); });
    }
    for (std::size_t m = 0; m < M; ++m) {
      if constexpr (R == simd::lanes) {
        alignas(64) float out[simd::lanes];
        simd::store(out, simd::reduce_add16(acc[m]));
        for (std::size_t r = 0; r < R; ++r)
          y[m * ldy + n + r] = out[r] + (bias ? bias[n + r] : 0.0f);
      } else {
        for (std::size_t r = 0; r < R; ++r) {
          y[m * ldy + n + r] = simd::reduce_add(acc[m][r]) + (bias ? bias[n + r] : 0.0f);
        }
      }
    }
  }
  for (; n < n1; ++n) {  // the last rows, one at a time
    simd::f32x16 acc[M];
    for (auto& a : acc) a = simd::zero();
    for (std::size_t k = 0; k < k_len; k += simd::lanes) {
      const std::size_t nk = std::min(simd::lanes, k_len - k);
      const simd::f32x16 wv = load16(w + n * k_len + k, nk);
      for (std::size_t m = 0; m < M; ++m)
        acc[m] = simd::fmadd(load16(x + m * ldx + k, nk), wv, acc[m]);
    }
    for (std::size_t m = 0; m < M; ++m)
      y[m * ldy + n] = simd::reduce_add(acc[m]) + (bias ? bias[n] : 0.0f);
  }
}

// M = 1: W read strictly front to back (row after row) so the hardware prefetchers see one
// sequential stream; four partial sums per row, one reduction tree per 16 rows.
template <class W>
void gemv_one(const float* x, const W* w, std::size_t k_len, std::size_t n0, std::size_t n1,
              const float* bias, float* y) {
  constexpr std::size_t L = simd::lanes;
  std::size_t n = n0;
  for (; n + L <= n1; n += L) {
    simd::f32x16 row_sum[L];
    for (std::size_t r = 0; r < L; ++r) {
      const W* wr = w + (n + r) * k_len;
      simd::f32x16 a0 = simd::zero(), a1 = simd::zero(), a2 = simd::zero(), a3 = simd::zero();
      std::size_t k = 0;
      for (; k + 4 * L <= k_len; k += 4 * L) {
        a0 = simd::fmadd(simd::load(x + k), simd::load(wr + k), a0);
        a1 = simd::fmadd(simd::load(x + k + L), simd::load(wr + k + L), a1);
        a2 = simd::fmadd(simd::load(x + k + 2 * L), simd::load(wr + k + 2 * L), a2);
        a3 = simd::fmadd(simd::load(x + k + 3 * L), simd::load(wr + k + 3 * L), a3);
      }
      for (; k < k_len; k += L) {
        const std::size_t nk = std::min(L, k_len - k);
        a0 = simd::fmadd(load16(x + k, nk), load16(wr + k, nk), a0);
      }
      row_sum[r] = simd::add(simd::add(a0, a1), simd::add(a2, a3));
    }
    alignas(64) float out[L];
    simd::store(out, simd::reduce_add16(row_sum));
    for (std::size_t r = 0; r < L; ++r) y[n + r] = out[r] + (bias ? bias[n + r] : 0.0f);
  }
  if (n < n1) gemv_rows<1>(x, 0, w, k_len, n, n1, bias, y, 0);
}

template <class W>
void gemv(std::size_t m, const float* x, std::size_t ldx, const W* w, std::size_t k, std::size_t n0,
          std::size_t n1, const float* bias, float* y, std::size_t ldy) {
  switch (m) {
    case 1: return gemv_one(x, w, k, n0, n1, bias, y);
    case 2: return gemv_rows<2>(x, ldx, w, k, n0, n1, bias, y, ldy);
    case 3: return gemv_rows<3>(x, ldx, w, k, n0, n1, bias, y, ldy);
    case 4: return gemv_rows<4>(x, ldx, w, k, n0, n1, bias, y, ldy);
    case 5: return gemv_rows<5>(x, ldx, w, k, n0, n1, bias, y, ldy);
    case 6: return gemv_rows<6>(x, ldx, w, k, n0, n1, bias, y, ldy);
    case 7: return gemv_rows<7>(x, ldx, w, k, n0, n1, bias, y, ldy);
    default: return gemv_rows<8>(x, ldx, w, k, n0, n1, bias, y, ldy);
  }
}

// ---- f32 micro-kernel over packed panels (any weight type) -----------------------------------
//
// The register block is MR rows of x by NR = 2 native vectors of columns: MR x 2 accumulators,
// two panel vectors and one broadcast stay in registers (AVX-512: 8 x 32 of 32 zmm; AVX2 and
// portable: 6 x 16 / 6 x 8 of 16 registers, the shape of BLIS's Haswell kernel). W is packed
// per (NR columns, kc keys) block as (kc, NR) f32, sized to stay in L1 while every row block of
// x runs over it; each micro-kernel call adds a kc-long slice of the dot products into y.

using vec = simd::native;
inline constexpr std::size_t nr = 2 * vec::lanes;                       // columns per panel
// Rows per block: 8 with 32 registers; 6 with 16 and FMA; 4 where a multiply and an add need
// a temporary register each (portable SSE2: 6 rows spilled an accumulator).
inline constexpr std::size_t mr =
    vec::registers >= 32 ? 8 : (vec::fused ? 6 : 4);
inline constexpr std::size_t kc = 16 * 1024 / (nr * sizeof(float));      // keys per block

// y[MR, cols] = acc (+ bias) when `first`, else y += acc; cols <= NR.
template <std::size_t MR>
inline void store_block(typename vec::type (&acc)[MR][2], std::size_t cols, bool first,
                        const float* bias, float* y, std::size_t ldy) {
  if (cols == nr) {  // whole panel: vector stores
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
      float* ym = y + m * ldy;
      const float* base = first ? bias : ym;
      if (base != nullptr) {
        acc[m][0] = vec::add(acc[m][0], vec::load(base));
        acc[m][1] = vec::add(acc[m][1], vec::load(base + vec::lanes));
      }
      vec::store(ym, acc[m][0]);
      vec::store(ym + vec::lanes, acc[m][1]);
    }
    return;
  }
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
    alignas(64) float out[nr];
    vec::store(out, acc[m][0]);
    vec::store(out + vec::lanes, acc[m][1]);
    float* ym = y + m * ldy;
    if (first) {
      for (std::size_t c = 0; c < cols; ++c) ym[c] = out[c] + (bias ? bias[c] : 0.0f);
    } else {
      for (std::size_t c = 0; c < cols; ++c) ym[c] += out[c];
    }
  }
}

// y[MR, cols] (+)= x[MR, k_len] * panel[k_len, NR]: the first block of K writes (plus bias),
// later blocks add. The panel holds f32, or 16-bit values converted in registers (small M over
// packed weights: W is read once, so converting it ahead would only add traffic). Every output
// sums its K terms in the same order whatever MR is, so a row's result does not depend on how
// many rows share the call (a decode step of 3 tokens equals 3 steps of one, bit for bit).
template <std::size_t MR, class P>
inline void micro(const float* x, std::size_t ldx, const P* panel, std::size_t k_len,
                  std::size_t cols, bool first, const float* bias, float* y, std::size_t ldy) {
  typename vec::type acc[MR][2];
  NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = vec::zero();
  // (No software prefetch: the panel is one sequential stream, which the hardware prefetchers
  // follow; prefetchnta hints here measured 2.6x slower on hot weights.)
  for (std::size_t k = 0; k < k_len; ++k) {
    const auto b0 = vec::load(panel + k * nr);
    const auto b1 = vec::load(panel + k * nr + vec::lanes);
    NPULLM_UNROLL for (std::size_t m = 0; m < MR; ++m) {
      const auto a = vec::broadcast(x + m * ldx + k);
      acc[m][0] = vec::fmadd(a, b0, acc[m][0]);
      acc[m][1] = vec::fmadd(a, b1, acc[m][1]);
    }
  }
  store_block<MR>(acc, cols, first, bias, y, ldy);
}

// Packs W rows [n0, n0 + cols) (cols <= NR), keys [k0, k0 + k_len), as (k_len, NR) f32,
// zero-padded. Row by row: each W row is read front to back.
template <class W>
void pack_f32(const W* w, std::size_t ld, std::size_t n0, std::size_t cols, std::size_t k0,
              std::size_t k_len, float* panel) {
  for (std::size_t c = 0; c < nr; ++c) {
    if (c < cols) {
      const W* row = w + (n0 + c) * ld + k0;
      for (std::size_t k = 0; k < k_len; ++k) panel[k * nr + c] = to_float(row[k]);
    } else {
      for (std::size_t k = 0; k < k_len; ++k) panel[k * nr + c] = 0.0f;
    }
  }
}

// Calls fn.template operator()<MR>(m) over rows [0, m_len) in blocks of mr, then the rest.
template <std::size_t MR = mr - 1, class Fn>
inline void row_rest(std::size_t rest, std::size_t m, Fn& fn) {
  if constexpr (MR > 0) {
    if (rest == MR) return fn.template operator()<MR>(m);
    row_rest<MR - 1>(rest, m, fn);
  }
}
template <class Fn>
inline void for_micro_rows(std::size_t m_len, Fn&& fn) {
  std::size_t m = 0;
  for (; m + mr <= m_len; m += mr) fn.template operator()<mr>(m);
  row_rest(m_len - m, m, fn);
}

// Every row of x against one packed (k_len, NR) block.
template <class P>
inline void gemm_block(std::size_t m_len, const float* x, std::size_t ldx, const P* panel,
                       std::size_t k_len, std::size_t cols, bool first, const float* bias,
                       float* y, std::size_t ldy) {
  for_micro_rows(m_len, [&]<std::size_t MR>(std::size_t m) {
    micro<MR>(x + m * ldx, ldx, panel, k_len, cols, first, bias, y + m * ldy, ldy);
  });
}

template <class W>
void gemm_f32_panel(std::size_t m_len, const float* x, std::size_t ldx, const W* w,
                    std::size_t k_len, std::size_t n0, std::size_t n1, const float* bias, float* y,
                    std::size_t ldy, std::vector<float>& panel) {
  panel.resize(kc * nr);
  for (std::size_t c0 = n0; c0 < n1; c0 += nr) {
    const std::size_t cols = std::min(nr, n1 - c0);
    const float* b = bias ? bias + c0 : nullptr;
    for (std::size_t k0 = 0; k0 < k_len; k0 += kc) {
      const std::size_t kl = std::min(kc, k_len - k0);
      pack_f32(w, k_len, c0, cols, k0, kl, panel.data());
      gemm_block(m_len, x + k0, ldx, panel.data(), kl, cols, k0 == 0, b, y + c0, ldy);
    }
  }
}

// ---- weights packed once: (panels, K, NR) in their storage type ------------------------------

// Rows of x at most this many read packed 16-bit panels converted in registers (W streamed
// once); more convert each L1 block to f32 once per call.
inline constexpr std::size_t packed_small_m = 16;

}  // namespace detail

// W [N, K] (the Hugging Face layout) repacked once into the layout this ISA's micro-kernel
// reads: ceil(N / NR) panels of (K, NR) values in W's own storage type (portable: f32),
// zero-padded past N (NR = 2 native vectors: 32 columns with AVX-512, 16 with AVX2, 8
// portable). linear() then
// never repacks per call, and small M (decode batches, a speculative verify pass, short
// prefill chunks) reads W exactly once, front to back. Same size as W, up to the padding.
// The layout belongs to the ISA the translation unit is compiled for (see core/isa.hpp).
// The panels live in huge pages (core/huge_page_allocator.hpp: a decode step streams them
// without a page-table walk per 4 KiB): in `arena` when given (a pipeline's matrices share its
// 2 MiB pages), else in a block of their own (advised from 2 MiB).
template <storage_type W>
class packed_weights {
 public:
  static constexpr std::size_t panel_columns = detail::nr;
  // The stored values: W's own type with AVX2 or AVX-512, which convert 16-bit values in
  // registers as they stream; f32 on the portable path, where converting in software (or a
  // 4-lane shift) per use measured slower than reading twice the bytes.
#if defined(NPULLM_ISA_PORTABLE)
  using value_type = float;
#else
  using value_type = W;
#endif

  packed_weights() = default;
  // Packs w (N, K), row-major dense.
  template <threading_policy Policy = serial>
  explicit packed_weights(dense_view<const W, 2> w, const Policy& policy = {},
                          std::shared_ptr<huge_page_arena> arena = nullptr)
      : n_(w.extent(0)),
        k_(w.extent(1)),
        data_({panels() * k_ * panel_columns}, huge_page_allocator<value_type>(std::move(arena))) {
    const W* src = w.data_handle();
    value_type* dst = data_.data();
    const std::size_t k_len = k_;
    policy.parallel_for(panels(), [&](std::size_t p) {
      value_type* panel = dst + p * k_len * panel_columns;
      for (std::size_t c = 0; c < panel_columns; ++c) {
        const std::size_t row = p * panel_columns + c;
        for (std::size_t k = 0; k < k_len; ++k) {
          value_type& out = panel[k * panel_columns + c];
          if (row >= n_) {
            out = from_float<value_type>(0.0f);
          } else if constexpr (std::is_same_v<value_type, W>) {
            out = src[row * k_len + k];
          } else {
            out = to_float(src[row * k_len + k]);
          }
        }
      }
    });
  }

  [[nodiscard]] std::size_t rows() const noexcept { return n_; }     // N
  [[nodiscard]] std::size_t columns() const noexcept { return k_; }  // K
  [[nodiscard]] std::size_t panels() const noexcept {
    return (n_ + panel_columns - 1) / panel_columns;
  }
  // Panel p: (K, NR) values, row-major.
  [[nodiscard]] const value_type* panel(std::size_t p) const noexcept {
    return data_.data() + p * k_ * panel_columns;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size() * sizeof(value_type); }

 private:
  std::size_t n_ = 0, k_ = 0;
  tensor<value_type, 1, huge_page_allocator<value_type>> data_{std::size_t{0}};
};

namespace detail {

// K = 0: y is the bias (or zero).
inline void bias_only(std::size_t m, std::size_t n, const float* bias, float* y, std::size_t ldy) {
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) y[i * ldy + j] = bias ? bias[j] : 0.0f;
  }
}

template <class X, class W, class Y>
void check_linear(const X& x, const W& w, const Y& y, const float* bias, std::size_t bias_len) {
  if (x.extent(1) != w.extent(1) || y.extent(0) != x.extent(0) || y.extent(1) != w.extent(0) ||
      (bias != nullptr && bias_len != w.extent(0))) {
    raise(error_code::invalid_shape, "linear: x ", npullm::detail::format_extents(x.extents()),
          ", W ", npullm::detail::format_extents(w.extents()), ", y ",
          npullm::detail::format_extents(y.extents()), bias ? ", bias [" : "",
          bias ? std::to_string(bias_len) + "]" : "", " (want x [M, K], W [N, K], y [M, N])");
  }
  if (x.stride(1) != 1 || y.stride(1) != 1 || w.stride(1) != 1 ||
      static_cast<std::size_t>(w.stride(0)) != w.extent(1)) {
    raise(error_code::unsupported, "linear: rows of x, y must be dense and W row-major dense");
  }
}

}  // namespace detail

// y = x W^T (+ bias). x: (M, K) f32 rows (any row stride); w: (N, K) row-major; y: (M, N).
template <storage_type W, class XL, class WL, class YL, threading_policy Policy = serial>
void linear(const tensor_view<const float, dextents<2>, XL>& x,
            const tensor_view<const W, dextents<2>, WL>& w,
            const tensor_view<float, dextents<2>, YL>& y, std::span<const float> bias = {},
            const Policy& policy = {}) {
  const float* b = bias.empty() ? nullptr : bias.data();
  detail::check_linear(x, w, y, b, bias.size());
  const std::size_t m = x.extent(0), k = x.extent(1), n = w.extent(0);
  if (m == 0 || n == 0) return;
  const float* xp = x.data_handle();
  const W* wp = w.data_handle();
  float* yp = y.data_handle();
  const std::size_t ldx = static_cast<std::size_t>(x.stride(0));
  const std::size_t ldy = static_cast<std::size_t>(y.stride(0));
  if (k == 0) return detail::bias_only(m, n, b, yp, ldy);
  // Parts of N: whole micro-panels, at most one per thread (more for dynamic balance).
  const std::size_t unit = m <= detail::gemv_max_m ? 16 : 32;
  const std::size_t units = (n + unit - 1) / unit;
  const std::size_t parts = std::min(units, policy.concurrency() * 4);
  auto part_range = [&](std::size_t p) {
    return std::pair{std::min(n, chunk_begin(units, parts, p) * unit),
                     std::min(n, chunk_begin(units, parts, p + 1) * unit)};
  };

  if (m <= detail::gemv_max_m) {
    policy.parallel_for(parts, [&](std::size_t p) {
      const auto [n0, n1] = part_range(p);
      detail::gemv(m, xp, ldx, wp, k, n0, n1, b, yp, ldy);
    });
    return;
  }
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<W, bfloat16>) {
    // x rounded to bf16 once, as 32-bit pairs (K odd: the last pair's high half is zero).
    const std::size_t pairs = (k + 1) / 2;
    std::vector<std::uint32_t> x2(m * pairs);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t p = 0; p < pairs; ++p) {
        const std::uint32_t lo = bfloat16(xp[i * ldx + 2 * p]).bits();
        const std::uint32_t hi = 2 * p + 1 < k ? bfloat16(xp[i * ldx + 2 * p + 1]).bits() : 0u;
        x2[i * pairs + p] = lo | (hi << 16);
      }
    }
    if (m <= 16 && k % 2 == 0) {  // a few rows: no packing, W streamed in place
      policy.parallel_for(parts, [&](std::size_t p) {
        const auto [n0, n1] = part_range(p);
        detail::gemv_bf16_dot(m, x2.data(), pairs, wp, n0, n1, b, yp, ldy);
      });
      return;
    }
    policy.parallel_for(parts, [&](std::size_t p) {
      thread_local std::vector<std::uint32_t> panel;
      const auto [n0, n1] = part_range(p);
      detail::gemm_bf16_panel(m, x2.data(), pairs, wp, k, n0, n1, b, yp, ldy, panel);
    });
    return;
  }
#endif
  policy.parallel_for(parts, [&](std::size_t p) {
    thread_local std::vector<float> panel;
    const auto [n0, n1] = part_range(p);
    detail::gemm_f32_panel(m, xp, ldx, wp, k, n0, n1, b, yp, ldy, panel);
  });
}

// Convenience: deduce the layouts from dense views.
template <storage_type W, threading_policy Policy = serial>
void linear(dense_view<const float, 2> x, dense_view<const W, 2> w, dense_view<float, 2> y,
            std::span<const float> bias = {}, const Policy& policy = {}) {
  linear<W, layout_right, layout_right, layout_right, Policy>(x, w, y, bias, policy);
}

// y = x W^T (+ bias) with W packed ahead (packed_weights): the same results as linear() over
// W for any thread count, up to the summation order of the K blocks (M > 16: f32 micro-kernel
// over L1 blocks of the panels, converted once per call; M <= 16: one pass over W, converted in
// registers). Never rounds x.
template <storage_type W, class XL, class YL, threading_policy Policy = serial>
void linear(const tensor_view<const float, dextents<2>, XL>& x, const packed_weights<W>& w,
            const tensor_view<float, dextents<2>, YL>& y, std::span<const float> bias = {},
            const Policy& policy = {}) {
  const float* b = bias.empty() ? nullptr : bias.data();
  const std::size_t m = x.extent(0), k = x.extent(1), n = w.rows();
  if (k != w.columns() || y.extent(0) != m || y.extent(1) != n ||
      (b != nullptr && bias.size() != n)) {
    raise(error_code::invalid_shape, "linear: x ", npullm::detail::format_extents(x.extents()),
          ", packed W [", n, ", ", w.columns(), "], y ",
          npullm::detail::format_extents(y.extents()), b ? ", bias [" : "",
          b ? std::to_string(bias.size()) + "]" : "", " (want x [M, K], W [N, K], y [M, N])");
  }
  if (x.stride(1) != 1 || y.stride(1) != 1) {
    raise(error_code::unsupported, "linear: rows of x, y must be dense");
  }
  if (m == 0 || n == 0) return;
  const float* xp = x.data_handle();
  float* yp = y.data_handle();
  const std::size_t ldx = static_cast<std::size_t>(x.stride(0));
  const std::size_t ldy = static_cast<std::size_t>(y.stride(0));
  if (k == 0) return detail::bias_only(m, n, b, yp, ldy);
  constexpr std::size_t nr = detail::nr;
  const std::size_t panels = w.panels();
  const std::size_t parts = std::min(panels, policy.concurrency() * 4);
  policy.parallel_for(parts, [&](std::size_t part) {
    const std::size_t p0 = chunk_begin(panels, parts, part);
    const std::size_t p1 = chunk_begin(panels, parts, part + 1);
    thread_local std::vector<float> block;
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t c0 = p * nr, cols = std::min(nr, n - c0);
      const auto* panel = w.panel(p);
      using V = typename packed_weights<W>::value_type;
      const float* bp = b ? b + c0 : nullptr;
      for (std::size_t k0 = 0; k0 < k; k0 += detail::kc) {
        const std::size_t kl = std::min(detail::kc, k - k0);
        const float* fb = nullptr;
        if constexpr (std::is_same_v<V, float>) {
          fb = panel + k0 * nr;
        } else if (m <= detail::packed_small_m) {
          detail::gemm_block(m, xp + k0, ldx, panel + k0 * nr, kl, cols, k0 == 0, bp, yp + c0, ldy);
          continue;
        } else {
          block.resize(detail::kc * nr);
          const V* src = panel + k0 * nr;
          for (std::size_t i = 0; i < kl * nr; i += detail::vec::lanes) {
            detail::vec::store(block.data() + i, detail::vec::load(src + i));
          }
          fb = block.data();
        }
        detail::gemm_block(m, xp + k0, ldx, fb, kl, cols, k0 == 0, bp, yp + c0, ldy);
      }
    }
  });
}

template <storage_type W, threading_policy Policy = serial>
void linear(dense_view<const float, 2> x, const packed_weights<W>& w, dense_view<float, 2> y,
            std::span<const float> bias = {}, const Policy& policy = {}) {
  linear<W, layout_right, layout_right, Policy>(x, w, y, bias, policy);
}

// The dense kernels instantiated once for a whole program, as ops/quant_linear.hpp does for the
// quantized ones (a build-time saving: every translation unit that runs a model otherwise
// compiles the f32 / f16 / bf16 GEMM and GEMV for each weight type). One translation unit
// defines NPULLM_LINEAR_KERNELS_INSTANTIATE before including this header; the others define
// NPULLM_LINEAR_KERNELS_EXTERN. All of them must be built with the same -march (the same
// NPULLM_ISA_NAMESPACE): npullm's own programs do (npullm_kernels in CMakeLists.txt). Calls with
// other layouts or policies instantiate in the caller as usual.
#if defined(NPULLM_LINEAR_KERNELS_INSTANTIATE) || defined(NPULLM_LINEAR_KERNELS_EXTERN)
#if defined(NPULLM_LINEAR_KERNELS_INSTANTIATE)
#define NPULLM_LK_EXTERN_
#else
#define NPULLM_LK_EXTERN_ extern
#endif
#define NPULLM_LK_(W, P)                                                                       \
  NPULLM_LK_EXTERN_ template void linear<W, layout_right, layout_right, layout_right, P>(      \
      const tensor_view<const float, dextents<2>, layout_right>&,                              \
      const tensor_view<const W, dextents<2>, layout_right>&,                                  \
      const tensor_view<float, dextents<2>, layout_right>&, std::span<const float>, const P&); \
  NPULLM_LK_EXTERN_ template void linear<W, layout_right, layout_right, P>(                    \
      const tensor_view<const float, dextents<2>, layout_right>&, const packed_weights<W>&,    \
      const tensor_view<float, dextents<2>, layout_right>&, std::span<const float>, const P&);
NPULLM_LK_(float, serial)
NPULLM_LK_(float, pool_policy)
NPULLM_LK_(float16, serial)
NPULLM_LK_(float16, pool_policy)
NPULLM_LK_(bfloat16, serial)
NPULLM_LK_(bfloat16, pool_policy)
#undef NPULLM_LK_
#undef NPULLM_LK_EXTERN_
#endif

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
