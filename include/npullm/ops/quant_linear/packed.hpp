// The GEMM's panels decoded once, at load: packed_quantized (see below) and what makes and reads
// them (detail::packed_access); pack() and the linear overload that runs on them are in
// ops/quant_linear.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/quant_format.hpp"
#include "npullm/ops/quant_linear/gemm.hpp"

namespace npullm::ops {
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {
struct packed_access;  // pack() and the panels of a packed_quantized
}  // namespace detail

// W decoded once (at load) into the GEMM's interleaved int8 panels, so that a call with M > 16
// rows runs only the micro-kernel: no per-call decode of W. Made by pack(); read by the
// linear(x, const packed_quantized&, y, ...) overload below, which gives the same results as
// linear over the source view (bit for bit: the same panels, the same micro-kernel).
//   Layout (per panel of P = 32 columns with AVX-512 VNNI, else 8; the build's ISA decides it,
//   so a packed_quantized is only meaningful in the ISA namespace that made it): per 32-value
//   piece, 8 chunks of P × 4 int8 codes, P int32 accumulator starts, P f32 scales and P f32
//   offsets (the mins of the formats that have them) per half piece; see detail::pack_panel.
//   Memory: 1 byte per weight plus 24 bytes per 32 weights per column (about 1.75 bytes per weight
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

// The quantized kernels' shape rule (pack, repack).
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
    out.offset_.resize(out.panels_ * pieces * 2 * P);
    const bool biased = !gemm_sign_trick(w.format);
    const std::size_t parts = std::min(out.panels_, policy.concurrency() * 4);
    policy.parallel_for(parts, [&](std::size_t part) {
      for (std::size_t i = chunk_begin(out.panels_, parts, part);
           i < chunk_begin(out.panels_, parts, part + 1); ++i) {
        pack_panel(w, i * P, std::min(P, w.rows - i * P), biased,
                   out.codes_.data() + i * pieces * 32 * P, out.start_.data() + i * pieces * 2 * P,
                   out.scale_.data() + i * pieces * 2 * P, out.offset_.data() + i * pieces * 2 * P);
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
            w.scale_.data() + i * pieces * 2 * P, w.offset_.data() + i * pieces * 2 * P};
  }
  static std::size_t panels(const packed_quantized& w) noexcept {
    return w.panels_;
  }
#endif
};

}  // namespace detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
