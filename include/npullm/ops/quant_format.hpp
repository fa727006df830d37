// Quantized weight formats: a runtime description of a quantized (N, K) matrix W (rows = output
// channels, the Hugging Face / GGUF layout): the table of the formats (format_table, from each
// format's traits), a checked view of a matrix's bytes (quantized_view) and an owning matrix
// (quantized_matrix). Each format's bit layout, decoding, quantizer and tile layout are in its
// own header, ops/formats/<name>.hpp (ops/formats/format_base.hpp says what one defines);
// decoding is run through ops/dequantize.hpp, the quantizers through ops/quantize.hpp
// (ops/quant.hpp includes all three); the fused kernels that read these blocks are in
// ops/quant_linear.hpp.
//
// All formats are little-endian; "f16" is IEEE binary16; rows are stored one after another and
// a row is a whole number of blocks, so row n starts at byte n * row_bytes. The GGUF formats have
// no separate scales (scales is empty); their K must be a multiple of the block (32 or 256). The
// symmetric formats (int8_sym, int4_sym: npullm's NPU layout) take any K divisible by their
// group G (G = K for any K). Dequantization gives ggml's floats bit for bit (the same products,
// never fused into an FMA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/formats/format_base.hpp"
// Every format's home (one line per entry of NPULLM_BUILTIN_WEIGHT_FORMATS).
#include "npullm/ops/formats/int4_sym.hpp"
#include "npullm/ops/formats/int8_sym.hpp"
#include "npullm/ops/formats/iq4_nl.hpp"
#include "npullm/ops/formats/iq4_xs.hpp"
#include "npullm/ops/formats/q2_k.hpp"
#include "npullm/ops/formats/q3_k.hpp"
#include "npullm/ops/formats/q4_0.hpp"
#include "npullm/ops/formats/q4_1.hpp"
#include "npullm/ops/formats/q4_k.hpp"
#include "npullm/ops/formats/q5_0.hpp"
#include "npullm/ops/formats/q5_1.hpp"
#include "npullm/ops/formats/q5_k.hpp"
#include "npullm/ops/formats/q6_k.hpp"
#include "npullm/ops/formats/q8_0.hpp"
#if defined(NPULLM_EXTRA_WEIGHT_FORMAT_HEADER)
#include NPULLM_EXTRA_WEIGHT_FORMAT_HEADER  // a program's own formats (formats/format_base.hpp)
#endif

namespace npullm::ops {

// One format's constants (format_layout<F>, gathered for lookups by a run-time format).
struct format_info {
  std::string_view name;
  int gguf_type = -1;            // GGUF's tensor type number; -1: not a GGUF format
  std::size_t block_values = 1;  // values per block (GGUF formats; 1 for the symmetric ones)
  std::size_t block_bytes = 0;   // bytes per block (GGUF formats; 0 for the symmetric ones)
  std::size_t code_bits = 0;     // bits per code (symmetric formats; 0 for the GGUF ones)
  piece_layout pieces;           // how its 32-value pieces decode
  int code_offset = 0;           // u = q + code_offset: the fused kernels' unsigned codes
  std::size_t tile_unit_pieces = 1, tile_row_bytes = 0, tile_head_bytes = 0;  // its tiles
};

template <weight_format F>
constexpr format_info format_info_for() noexcept {
  using L = format_layout<F>;
  std::size_t bits = 0;
  if constexpr (requires { L::code_bits; }) bits = L::code_bits;
  return {L::name,   L::gguf_type,   L::block_values,     L::block_bytes,    bits,
          L::pieces, L::code_offset, L::tile_unit_pieces, L::tile_row_bytes, L::tile_head_bytes};
}

// Every format's constants, in the enum's order.
inline constexpr format_info format_table[] = {
#define NPULLM_WF_INFO_(f) format_info_for<weight_format::f>(),
    NPULLM_WEIGHT_FORMATS(NPULLM_WF_INFO_)
#undef NPULLM_WF_INFO_
};

constexpr const format_info& info_of(weight_format f) noexcept {
  return format_table[static_cast<std::size_t>(f)];
}

// Every format, in the enum's order.
inline constexpr weight_format all_weight_formats[] = {
#define NPULLM_WF_VALUE_(f) weight_format::f,
    NPULLM_WEIGHT_FORMATS(NPULLM_WF_VALUE_)
#undef NPULLM_WF_VALUE_
};

constexpr std::string_view to_string(weight_format f) noexcept {
  return static_cast<std::size_t>(f) < weight_format_count ? info_of(f).name : "unknown";
}

// The format named by to_string (nothing for another name).
constexpr std::optional<weight_format> weight_format_from_string(std::string_view s) noexcept {
  for (auto f : all_weight_formats) {
    if (to_string(f) == s) return f;
  }
  return std::nullopt;
}

// The format of a GGUF tensor type number (nothing for a type npullm does not read quantized).
constexpr std::optional<weight_format> weight_format_of_gguf_type(int type) noexcept {
  for (auto f : all_weight_formats) {
    if (type >= 0 && info_of(f).gguf_type == type) return f;
  }
  return std::nullopt;
}

constexpr piece_layout piece_layout_of(weight_format f) noexcept {
  return info_of(f).pieces;
}

// Whether a format has kernels of its own (its tile layout, and its unpacking branches in the
// fused kernels, ops/quant_linear/): one without runs through the decode-based generic GEMV and
// GEMM (every piece through decode_piece: correct, not fast) and has no repack().
constexpr bool has_kernels(weight_format f) noexcept {
  return info_of(f).tile_row_bytes != 0;
}

// The GGUF block formats (self-contained blocks, no separate scales tensor).
constexpr bool is_block_format(weight_format f) noexcept {
  return info_of(f).block_bytes != 0;
}

// Values per block (GGUF formats; 1 for the symmetric ones, whose group is separate).
constexpr std::size_t block_values(weight_format f) noexcept {
  return info_of(f).block_values;
}

// Bytes per block (GGUF formats; 0 for the symmetric ones).
constexpr std::size_t block_bytes(weight_format f) noexcept {
  return info_of(f).block_bytes;
}

// Bytes of one row of `cols` values in data (scales excluded).
constexpr std::size_t row_bytes(weight_format f, std::size_t cols) noexcept {
  if (!is_block_format(f)) return (cols * info_of(f).code_bits + 7) / 8;
  return cols / block_values(f) * block_bytes(f);
}

// A quantized (rows = N, cols = K) matrix: a zero-copy view of its bytes, checked at
// construction (from a GGUF tensor: format, shape, data; from a safetensors pair: the int8 /
// packed int4 tensor and its scales tensor). The type is the same for every ISA (an engine
// loads its weights once for all of its ISAs' kernels); its constructors and scale() are
// always inlined, since their code is the ISA's (the checks raise through core/error.hpp's
// per-ISA code, f16 scales convert with F16C where the ISA has it): no copy of them is emitted
// that the linker could keep for a translation unit of another ISA (core/isa.hpp).
struct quantized_view {
  weight_format format = weight_format::q8_0;
  std::size_t rows = 0, cols = 0;     // N, K
  std::size_t group = 0;              // *_sym: values per scale along K (32, 64, 128 or K)
  dtype scale_type = dtype::f32;      // *_sym: f16 or f32
  std::span<const std::byte> data;    // rows * row_bytes(format, cols)
  std::span<const std::byte> scales;  // *_sym: (rows, cols / group) of scale_type; else empty

  quantized_view() = default;
  // GGUF block formats: K a multiple of the block (invalid_shape), data of exactly the size the
  // shape implies (corrupt_data).
  [[gnu::always_inline]] quantized_view(weight_format f, std::size_t n, std::size_t k,
                                        std::span<const std::byte> bytes)
      : format(f), rows(n), cols(k), data(bytes) {
    if (!is_block_format(f)) {
      raise(error_code::invalid_argument, "quantized_view: ", to_string(f),
            " needs a scales tensor, a group size and a scale type");
    }
    check();
  }
  // Symmetric formats: group 32, 64, 128 or K (invalid_argument), K divisible by the group
  // (invalid_shape), scale type f16 or f32 (unsupported), data and scales of exactly the sizes
  // the shape implies (corrupt_data).
  [[gnu::always_inline]] quantized_view(weight_format f, std::size_t n, std::size_t k,
                                        std::span<const std::byte> bytes,
                                        std::span<const std::byte> scale_bytes, std::size_t g,
                                        dtype st)
      : format(f), rows(n), cols(k), group(g), scale_type(st), data(bytes), scales(scale_bytes) {
    if (is_block_format(f)) {
      raise(error_code::invalid_argument, "quantized_view: ", to_string(f),
            " has its scales inside its blocks (no scales tensor, group or scale type)");
    }
    check();
  }

  [[nodiscard]] std::size_t row_bytes() const noexcept { return ops::row_bytes(format, cols); }
  // Scales per row (*_sym): K / G.
  [[nodiscard]] std::size_t groups() const noexcept { return group ? cols / group : 0; }

  // The scale of row n, group g (*_sym).
  [[nodiscard, gnu::always_inline]] float scale(std::size_t n, std::size_t g) const noexcept {
    const std::byte* p = scales.data() + (n * groups() + g) * size_of(scale_type);
    if (scale_type == dtype::f16) {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(float16::from_bits(h));
    }
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }

 private:
  [[gnu::always_inline]] void check() const {
    if (is_block_format(format)) {
      if (cols % block_values(format) != 0) {
        raise(error_code::invalid_shape, "quantized_view: ", to_string(format), " K = ", cols,
              " is not a multiple of its block of ", block_values(format));
      }
    } else {
      if (group != 32 && group != 64 && group != 128 && group != cols) {
        raise(error_code::invalid_argument, "quantized_view: ", to_string(format), " group ", group,
              " (want 32, 64, 128 or K = ", cols, ")");
      }
      if (group == 0 || cols % group != 0) {
        raise(error_code::invalid_shape, "quantized_view: ", to_string(format), " K = ", cols,
              " is not a multiple of the group ", group);
      }
      if (scale_type != dtype::f16 && scale_type != dtype::f32) {
        raise(error_code::unsupported, "quantized_view: scale type ", to_string(scale_type),
              " (want f16 or f32)");
      }
      const std::size_t want = rows * (cols / group) * size_of(scale_type);
      if (scales.size() != want) {
        raise(error_code::corrupt_data, "quantized_view: ", to_string(format), " [", rows, ", ",
              cols, "] group ", group, " has ", scales.size(), " bytes of ", to_string(scale_type),
              " scales, want ", want);
      }
    }
    const std::size_t want = rows * row_bytes();
    if (data.size() != want) {
      raise(error_code::corrupt_data, "quantized_view: ", to_string(format), " [", rows, ", ", cols,
            "] has ", data.size(), " bytes, want ", want);
    }
  }
};

// An owning quantized matrix: its bytes and the view over them. Move-only (the view points
// into the owned vectors, which moving keeps in place). The same type for every ISA, as
// quantized_view is; its constructors are always inlined for the same reason.
class quantized_matrix {
 public:
  quantized_matrix() = default;
  // Owns the rows of a GGUF block format, checked as quantized_view's constructor checks them.
  [[gnu::always_inline]] quantized_matrix(weight_format f, std::size_t n, std::size_t k,
                                          std::vector<std::byte> data)
      : data_(std::move(data)), view_(f, n, k, data_) {}
  // Owns the rows and the scales of a symmetric format, checked as quantized_view's
  // constructor checks them.
  [[gnu::always_inline]] quantized_matrix(weight_format f, std::size_t n, std::size_t k,
                                          std::vector<std::byte> data,
                                          std::vector<std::byte> scales, std::size_t g, dtype st)
      : data_(std::move(data)), scales_(std::move(scales)), view_(f, n, k, data_, scales_, g, st) {}
  quantized_matrix(const quantized_matrix&) = delete;
  quantized_matrix& operator=(const quantized_matrix&) = delete;
  quantized_matrix(quantized_matrix&&) noexcept = default;
  quantized_matrix& operator=(quantized_matrix&&) noexcept = default;

  [[nodiscard]] const quantized_view& view() const noexcept { return view_; }
  [[nodiscard]] std::span<const std::byte> data() const noexcept { return data_; }
  [[nodiscard]] std::span<const std::byte> scales() const noexcept { return scales_; }
  // Bytes a kernel reads: data and scales.
  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size() + scales_.size(); }

 private:
  std::vector<std::byte> data_, scales_;
  quantized_view view_;
};

}  // namespace npullm::ops
