// linear over quantized weights: y (M, N) = x (M, K) f32 · W^T (+ bias), W a quantized_view
// (ops/quant_format.hpp) read block by block, never through a dequantized copy.
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
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/huge_page_allocator.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_linear/activations.hpp"
#include "npullm/ops/quant_linear/gemm.hpp"
#include "npullm/ops/quant_linear/gemv.hpp"
#include "npullm/ops/quant_linear/packed.hpp"
#include "npullm/ops/quant_linear/tiles.hpp"
#include "npullm/ops/quant_linear/tiles_kernel.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

inline constexpr std::size_t quant_gemv_max_m = 16;

struct repack_access;  // repack() and the tiles of a repacked_quantized

// Which form of x each path multiplies: (pair_split, biased).
constexpr std::pair<bool, bool> activation_form(weight_format f, bool gemm_path) noexcept {
#if defined(__AVX2__)
  if (gemm_path) return {false, !gemm_sign_trick(f)};
  if (!has_kernels(f)) return {false, false};  // the decode-based GEMV
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
  const int gemv_offset = gemm_path || !has_kernels(F) ? -1
                          : dot_corr(F)                ? static_cast<int>(gemv_int_offset(F))
                                                       : 0;
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

// Whether repack() has a tiled layout for this format (has_kernels: every format npullm ships).
constexpr bool has_repacked_layout(weight_format f) noexcept {
  return detail::has_tiles(f);
}

// W repacked once (at load) into tiles of R rows (tile_height_of: 16 or 8 with AVX-512 VNNI, else
// 8; layout in quant_linear/tiles.hpp), read by linear(x, const repacked_quantized&, ...) for every
// M: the piece loop is load, unpack, one integer dot product per 4 codes for all R rows at once,
// and one FMA per piece, with no per-row prologue (decode reads W at the memory's pace), and
// prefill reads the same tiles MR rows of x at a time, so the source's pages are not touched after
// repack (a file mapping can drop them). Memory: the file's bytes (q4_k: + 2.8%, q5_k:
// + 2.3%, iq4_xs: + 1.5%, q3_k: + 3.6%, their 6-bit scales stored as bytes; int8_sym / int4_sym:
// codes and scales, the source's), plus at most R − 1 zero rows. Only meaningful in the ISA
// namespace that made it. Results equal linear over the source within f32
// reassociation: the same integer dot products and the same products s · dx per piece, summed in
// another order.
class repacked_quantized {
 public:
  repacked_quantized() = default;
  repacked_quantized(const repacked_quantized&) = delete;
  repacked_quantized& operator=(const repacked_quantized&) = delete;
  repacked_quantized(repacked_quantized&&) noexcept = default;
  repacked_quantized& operator=(repacked_quantized&&) noexcept = default;

  [[nodiscard]] const quantized_view& source() const noexcept { return source_; }
  [[nodiscard]] weight_format format() const noexcept { return source_.format; }
  [[nodiscard]] std::size_t rows() const noexcept { return source_.rows; }
  [[nodiscard]] std::size_t cols() const noexcept { return source_.cols; }
  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size(); }

 private:
  friend struct detail::repack_access;
  quantized_view source_;
  std::size_t tiles_ = 0, tile_bytes_ = 0;
  std::vector<std::byte, huge_page_allocator<std::byte>> data_;  // (large ones in 2 MiB pages)
};

namespace detail {

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

struct repack_access {
  template <threading_policy Policy>
  static repacked_quantized repack(const quantized_view& w, const Policy& policy,
                                   std::shared_ptr<huge_page_arena> arena) {
    check_kernel_shape(w, "repack");
    if (!has_tiles(w.format)) {
      raise(error_code::unsupported, "repack: no tiled layout for ", to_string(w.format),
            " (a format without kernels of its own: linear reads its view)");
    }
    repacked_quantized out;
    out.source_ = w;
    out.data_ = decltype(out.data_)(huge_page_allocator<std::byte>(std::move(arena)));
    const std::size_t R = tile_height_of(w.format);
    out.tiles_ = (w.rows + R - 1) / R;
    out.tile_bytes_ = tile_scale_bytes(w.format, w.cols / 32, tile_scales_of(w)) +
                      w.cols / 32 / tile_unit_pieces(w.format) * tile_unit_bytes(w.format);
    out.data_.resize(out.tiles_ * out.tile_bytes_);
    const std::size_t parts = std::min(out.tiles_, policy.concurrency() * 4);
    policy.parallel_for(parts, [&](std::size_t part) {
      for (std::size_t i = chunk_begin(out.tiles_, parts, part);
           i < chunk_begin(out.tiles_, parts, part + 1); ++i) {
        pack_tile(w, i * R, std::min(R, w.rows - i * R), out.data_.data() + i * out.tile_bytes_);
      }
    });
    return out;
  }
  static const std::byte* tile(const repacked_quantized& w, std::size_t i) noexcept {
    return w.data_.data() + i * w.tile_bytes_;
  }
  static std::size_t tiles(const repacked_quantized& w) noexcept { return w.tiles_; }
  static std::size_t tile_bytes(const repacked_quantized& w) noexcept { return w.tile_bytes_; }
};

// MR = rest rows of x (1 .. tile_max_mr) over one tile.
template <weight_format F, std::size_t MR = tile_max_mr>
inline void tile_rest(std::size_t rest, const std::byte* tile, std::size_t units,
                      const quantized_activations& a, std::size_t m0, std::size_t rows,
                      const float* bias, float* y, std::size_t ldy, const std::byte* stream_end,
                      tile_scales ts) {
  if constexpr (MR > 0) {
    if (rest == MR) {
      return tile_rows<F, MR>(tile, units, a, m0, rows, bias, y, ldy, stream_end, ts);
    }
    tile_rest<F, MR - 1>(rest, tile, units, a, m0, rows, bias, y, ldy, stream_end, ts);
  }
}

// Tiles [t0, t1) of w (output columns t0 R .. min(t1 R, N)) times rows [m0, m0 + m) of a
// (quantized for tiles: quantize_activations(..., false, false, ..., -1)) into y's rows 0 .. m
// (row i of y: row m0 + i of a). Each output is one tile_rows call's, whatever the range: the
// same bits however a product is split into ranges.
template <weight_format F>
void tile_span(const repacked_quantized& w, const quantized_activations& a, std::size_t m0,
               std::size_t m, std::size_t t0, std::size_t t1, const float* bias, float* y,
               std::size_t ldy) {
  constexpr std::size_t R = tile_height_of(F);
  const std::size_t n = w.rows(), units = w.cols() / 32 / tile_unit_pieces(F);
  const tile_scales ts = tile_scales_of(w.source());
  // (a tile's rows of x past the first tile_max_mr read it again: from cache, no prefetch)
  const std::byte* end =
      t1 > t0 ? repack_access::tile(w, t1 - 1) + repack_access::tile_bytes(w) : nullptr;
  for (std::size_t i = t0; i < t1; ++i) {
    const std::size_t n0 = i * R, rows = std::min(R, n - n0);
    const float* b = bias ? bias + n0 : nullptr;
    for (std::size_t r = 0; r < m; r += tile_max_mr) {
      tile_rest<F>(std::min(tile_max_mr, m - r), repack_access::tile(w, i), units, a, m0 + r, rows,
                   b, y + r * ldy + n0, ldy, r == 0 ? end : nullptr, ts);
    }
  }
}

using tile_span_fn = void (*)(const repacked_quantized&, const quantized_activations&, std::size_t,
                              std::size_t, std::size_t, std::size_t, const float*, float*,
                              std::size_t);

template <threading_policy Policy>
void run_tiles_with(tile_span_fn span, const repacked_quantized& w, const float* x, std::size_t ldx,
                    std::size_t m, const float* bias, float* y, std::size_t ldy,
                    const Policy& policy) {
  thread_local quantized_activations act;
  quantize_activations(x, ldx, m, w.cols(), false, false, act, -1, policy);
  const std::size_t tiles = repack_access::tiles(w);
  // Parts of contiguous tiles (one stream each), several per thread so that a thread slowed by
  // other work does not hold the step (Q8_0 Qwen2-0.5B decode at 2 threads, Zen 4: 8 parts
  // per thread 52-54 tokens/s, 1 part 45-46).
  const std::size_t per = m <= quant_gemv_max_m ? 8 : 4;
  const std::size_t parts = std::min(tiles, policy.concurrency() * per);
  const quantized_activations& a = act;
  policy.parallel_for(parts, [&](std::size_t part) {
    span(w, a, 0, m, chunk_begin(tiles, parts, part), chunk_begin(tiles, parts, part + 1), bias, y,
         ldy);
  });
}

template <weight_format F, threading_policy Policy>
void run_tiles(const repacked_quantized& w, const float* x, std::size_t ldx, std::size_t m,
               const float* bias, float* y, std::size_t ldy, const Policy& policy) {
  run_tiles_with(&tile_span<F>, w, x, ldx, m, bias, y, ldy, policy);
}

// The per-format kernels instantiated once for a whole program (a build-time saving, not a
// run-time one: every translation unit that calls linear over a quantized view otherwise compiles
// every built-in format's GEMV, GEMM and tile kernels). One translation unit defines
// NPULLM_QUANT_KERNELS_INSTANTIATE before including this header; the others define
// NPULLM_QUANT_KERNELS_EXTERN and use its instantiations (serial and pool_policy). All of them
// must be compiled with the same flags (the same -march: the same NPULLM_ISA_NAMESPACE). npullm's
// own tests and examples do so (npullm_kernels in CMakeLists.txt).
#if defined(NPULLM_QUANT_KERNELS_INSTANTIATE) || defined(NPULLM_QUANT_KERNELS_EXTERN)
#if defined(NPULLM_QUANT_KERNELS_INSTANTIATE)
#define NPULLM_QK_EXTERN_
#else
#define NPULLM_QK_EXTERN_ extern
#endif
#define NPULLM_QK_VIEW_(F, P)                                                              \
  NPULLM_QK_EXTERN_ template void run_quant_linear<weight_format::F, P>(                   \
      const quantized_view&, const float*, std::size_t, std::size_t, const float*, float*, \
      std::size_t, const P&);
#if defined(__AVX2__)
#define NPULLM_QK_PACKED_(F, P)                                                              \
  NPULLM_QK_EXTERN_ template void run_packed_gemm<weight_format::F, P>(                      \
      const packed_quantized&, const float*, std::size_t, std::size_t, const float*, float*, \
      std::size_t, const P&);
#else
#define NPULLM_QK_PACKED_(F, P)
#endif
#define NPULLM_QK_TILES_(F, P)                                                                 \
  NPULLM_QK_EXTERN_ template void run_tiles<weight_format::F, P>(                              \
      const repacked_quantized&, const float*, std::size_t, std::size_t, const float*, float*, \
      std::size_t, const P&);
#define NPULLM_QK_SPAN_(F)                                                               \
  NPULLM_QK_EXTERN_ template void tile_span<weight_format::F>(                           \
      const repacked_quantized&, const quantized_activations&, std::size_t, std::size_t, \
      std::size_t, std::size_t, const float*, float*, std::size_t);
// clang-format off
#define NPULLM_QK_FORMAT_(F)                                     \
  NPULLM_QK_VIEW_(F, serial) NPULLM_QK_VIEW_(F, pool_policy)     \
  NPULLM_QK_PACKED_(F, serial) NPULLM_QK_PACKED_(F, pool_policy)
#define NPULLM_QK_TILED_(F) NPULLM_QK_TILES_(F, serial) NPULLM_QK_TILES_(F, pool_policy) \
  NPULLM_QK_SPAN_(F)
NPULLM_BUILTIN_WEIGHT_FORMATS(NPULLM_QK_FORMAT_)
// (every format has tiles: has_tiles)
NPULLM_BUILTIN_WEIGHT_FORMATS(NPULLM_QK_TILED_)
// clang-format on
#undef NPULLM_QK_TILED_
#undef NPULLM_QK_FORMAT_
#undef NPULLM_QK_SPAN_
#undef NPULLM_QK_TILES_
#undef NPULLM_QK_PACKED_
#undef NPULLM_QK_VIEW_
#undef NPULLM_QK_EXTERN_
#endif

// tile_span of a repacked matrix's format (nullptr: a format without tiles in this build).
constexpr tile_span_fn tile_span_for(weight_format f) noexcept {
  return visit_format(f, []<weight_format g>(format_constant<g>) -> tile_span_fn {
    if constexpr (has_tiles(g)) {
      return &tile_span<g>;
    } else {
      return nullptr;
    }
  });
}

// linear over w (its view, its packed panels when `packed` is given and M > 16, its tiles when
// `repacked` is given).
template <threading_policy Policy, class XL, class YL>
void quant_linear(const tensor_view<const float, dextents<2>, XL>& x, const quantized_view& w,
                  const packed_quantized* packed, const tensor_view<float, dextents<2>, YL>& y,
                  std::span<const float> bias, const Policy& policy,
                  const repacked_quantized* repacked = nullptr) {
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
  (void)packed;  // (read only where there are panels: AVX2 and up)
  visit_format(w.format, [&]<weight_format f>(format_constant<f>) {
    if constexpr (has_tiles(f)) {
      if (repacked != nullptr) return run_tiles<f>(*repacked, xp, ldx, m, b, yp, ldy, policy);
    }
#if defined(__AVX2__)
    if (packed != nullptr && m > quant_gemv_max_m) {
      return run_packed_gemm<f>(*packed, xp, ldx, m, b, yp, ldy, policy);
    }
#endif
    run_quant_linear<f>(w, xp, ldx, m, b, yp, ldy, policy);
  });
}

}  // namespace detail

// W's panels, decoded once (see packed_quantized). Raises invalid_shape where linear would (K or
// the group not a multiple of 32). Threads split the panels.
template <threading_policy Policy = serial>
[[nodiscard]] packed_quantized pack(const quantized_view& w, const Policy& policy = {}) {
  return detail::packed_access::pack(w, policy);
}

// W's tiles, repacked once (see repacked_quantized). Raises invalid_shape where linear would,
// unsupported for a format without a tiled layout (has_repacked_layout). Threads split the tiles.
// `arena`: where the tiles go (null: a block of their own, in huge pages from 2 MiB); the
// matrices of a model repacked into one arena share its huge pages (a matrix under 2 MiB alone
// would have none).
template <threading_policy Policy = serial>
[[nodiscard]] repacked_quantized repack(const quantized_view& w, const Policy& policy = {},
                                        std::shared_ptr<huge_page_arena> arena = nullptr) {
  return detail::repack_access::repack(w, policy, std::move(arena));
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

// The same over repacked tiles (every M). Results equal linear(x, w.source(), y, bias,
// policy)'s within f32 reassociation (see repacked_quantized).
template <threading_policy Policy = serial, class XL, class YL>
void linear(const tensor_view<const float, dextents<2>, XL>& x, const repacked_quantized& w,
            const tensor_view<float, dextents<2>, YL>& y, std::span<const float> bias = {},
            const Policy& policy = {}) {
  detail::quant_linear(x, w.source(), nullptr, y, bias, policy, &w);
}

template <threading_policy Policy = serial>
void linear(dense_view<const float, 2> x, const repacked_quantized& w, dense_view<float, 2> y,
            std::span<const float> bias = {}, const Policy& policy = {}) {
  linear<Policy, layout_right, layout_right>(x, w, y, bias, policy);
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
