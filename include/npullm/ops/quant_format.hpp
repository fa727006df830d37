// Quantized weight formats: a runtime description of a quantized (N, K) matrix W (rows = output
// channels, the Hugging Face / GGUF layout): the formats' bit layouts, sizes and piece layouts,
// a checked view of a matrix's bytes (quantized_view) and an owning matrix (quantized_matrix).
// Decoding is in ops/dequantize.hpp, the quantizers in ops/quantize.hpp (ops/quant.hpp includes
// all three); the fused kernels that read these blocks are in ops/quant_linear.hpp.
//
// Bit layouts (all little-endian; "f16" is IEEE binary16; rows are stored one after another and
// a row is a whole number of blocks, so row n starts at byte n * row_bytes):
//
//   q8_0   blocks of 32 values, 34 bytes:  [0..1] f16 d | [2..33] int8 q[32]
//          value[i] = q[i] * d
//   q4_0   blocks of 32 values, 18 bytes:  [0..1] f16 d | [2..17] uint8 b[16]
//          value[i]      = ((b[i] & 0xF) - 8) * d     i = 0..15  (low nibbles: first half)
//          value[i + 16] = ((b[i] >> 4) - 8) * d                 (high nibbles: second half)
//   q4_k   super-blocks of 256 values (8 sub-blocks of 32), 144 bytes:
//          [0..1] f16 d | [2..3] f16 dmin | [4..15] s[12]: 8 six-bit scales sc[j], 8 six-bit mins
//          m[j] | [16..143] uint8 b[128]
//          j < 4:  sc[j] = s[j] & 63,                          m[j] = s[j + 4] & 63
//          j >= 4: sc[j] = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4,
//                  m[j]  = (s[j + 4] >> 4)  | (s[j]     >> 6) << 4
//          (the top two bits of s[0..7] carry the high bits of sub-blocks 4..7's scale / min)
//          sub-blocks 2c and 2c + 1 (c = 0..3) share the 32 bytes b[32c .. 32c + 31]: low
//          nibbles are sub-block 2c, high nibbles sub-block 2c + 1, element order within each.
//          value[32j + i] = (d * sc[j]) * q - (dmin * m[j]),  q = the nibble (0..15)
//   q6_k   super-blocks of 256 values (16 sub-blocks of 16), 210 bytes:
//          [0..127] uint8 ql[128] | [128..191] uint8 qh[64] | [192..207] int8 sc[16] |
//          [208..209] f16 d
//          two halves h = 0, 1 of 128 values, each using ql[64h ..], qh[32h ..]; for l = 0..31:
//            value 128h + l      low nibble of ql[64h + l],      bits 0-1 of qh[32h + l]
//            value 128h + l + 32 low nibble of ql[64h + l + 32], bits 2-3 of qh[32h + l]
//            value 128h + l + 64 high nibble of ql[64h + l],     bits 4-5 of qh[32h + l]
//            value 128h + l + 96 high nibble of ql[64h + l + 32], bits 6-7 of qh[32h + l]
//          (the nibble is the 6-bit q's low 4 bits, the two qh bits its high 2 bits)
//          value[e] = (d * sc[e / 16]) * (q - 32),  q = 0..63
//   q4_1   blocks of 32 values, 20 bytes:  [0..1] f16 d | [2..3] f16 m | [4..19] uint8 b[16]
//          value[i] = (b[i] & 0xF) * d + m, value[i + 16] = (b[i] >> 4) * d + m
//   q5_0   blocks of 32 values, 22 bytes:  [0..1] f16 d | [2..5] u32 qh | [6..21] uint8 b[16]
//          q[i] = (b[i] & 0xF) | bit i of qh << 4, q[i + 16] = (b[i] >> 4) | bit i + 16 << 4,
//          value = (q - 16) * d
//   q5_1   blocks of 32 values, 24 bytes:  [0..1] f16 d | [2..3] f16 m | [4..7] u32 qh |
//          [8..23] b[16]; q as q5_0's, value = q * d + m
//   q5_k   super-blocks of 256 values, 176 bytes: [0..1] f16 d | [2..3] f16 dmin | [4..15]
//          scales and mins packed as q4_k's | [16..47] uint8 qh[32] | [48..175] b[128] as q4_k's
//          nibbles; value i of sub-block j: q = nibble | (bit j of qh[i]) << 4 (0..31),
//          value = (d * sc[j]) * q - (dmin * m[j])
//   q3_k   super-blocks of 256 values (16 sub-blocks of 16), 110 bytes: [0..31] uint8 hm[32] |
//          [32..95] uint8 qs[64] | [96..107] s[12]: 16 six-bit scales | [108..109] f16 d
//          value i of 32-value piece p = 4t + u (t = 0, 1; u = 0..3): q = (qs[32t + i] >> 2u) & 3,
//          minus 4 where bit p of hm[i] is clear (q in -4..3); value = d * (sc[e / 16] - 32) * q
//          with sc[i] = (i < 8 ? s[i] & 0xF : s[i - 8] >> 4) | ((s[8 + i % 4] >> 2 (i / 4)) & 3) <<
//          4
//   q2_k   super-blocks of 256 values (16 sub-blocks of 16), 84 bytes: [0..15] uint8 s[16]
//          (low nibble: scale, high nibble: min of sub-block e / 16) | [16..79] uint8 qs[64] |
//          [80..81] f16 d | [82..83] f16 dmin; q as q3_k's low two bits (0..3),
//          value = (d * (s & 0xF)) * q - (dmin * (s >> 4))
//   iq4_nl blocks of 32 values, 18 bytes as q4_0's, the nibble an index into a fixed table of 16
//          int8 values (iq4_values): value[i] = d * iq4_values[nibble]
//   iq4_xs super-blocks of 256 values, 136 bytes: [0..1] f16 d | [2..3] u16 sh | [4..7] sl[4] |
//          [8..135] 8 pieces of 16 bytes as iq4_nl's; piece p's scale is d * (ls - 32) with
//          ls = nibble p of sl (little-endian) | ((sh >> 2p) & 3) << 4
//   int8_sym  npullm's NPU layout: data (N, K) int8 row-major; scales (N, K / G) row-major,
//          f16 or f32; value[n][k] = q[n][k] * scale[n][k / G]. G = 32, 64, 128, or K (one
//          group per output channel).
//   int4_sym  as int8_sym with 4-bit two's-complement q in [-8, 7], two per byte: row n is
//          ceil(K / 2) bytes, element 2i in the LOW nibble of byte i, element 2i + 1 in the
//          high nibble (an odd K leaves the last high nibble 0). The order OpenVINO's i4 uses.
//
// The GGUF formats have no separate scales (scales is empty); their K must be a multiple of the
// block (32 or 256). The symmetric formats take any K divisible by G (G = K for any K).
// Dequantization gives ggml's floats bit for bit (the same products, never fused into an FMA).
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

namespace npullm::ops {

enum class weight_format : std::uint8_t {
  q8_0,
  q4_0,
  q4_k,
  q6_k,
  int8_sym,
  int4_sym,
  q4_1,
  q5_0,
  q5_1,
  q5_k,
  q3_k,
  q2_k,
  iq4_nl,
  iq4_xs,
};

// Every format, in the enum's order.
inline constexpr weight_format all_weight_formats[] = {
    weight_format::q8_0,     weight_format::q4_0,     weight_format::q4_k, weight_format::q6_k,
    weight_format::int8_sym, weight_format::int4_sym, weight_format::q4_1, weight_format::q5_0,
    weight_format::q5_1,     weight_format::q5_k,     weight_format::q3_k, weight_format::q2_k,
    weight_format::iq4_nl,   weight_format::iq4_xs};

constexpr std::string_view to_string(weight_format f) noexcept {
  switch (f) {
    case weight_format::q8_0: return "q8_0";
    case weight_format::q4_0: return "q4_0";
    case weight_format::q4_k: return "q4_k";
    case weight_format::q6_k: return "q6_k";
    case weight_format::int8_sym: return "int8_sym";
    case weight_format::int4_sym: return "int4_sym";
    case weight_format::q4_1: return "q4_1";
    case weight_format::q5_0: return "q5_0";
    case weight_format::q5_1: return "q5_1";
    case weight_format::q5_k: return "q5_k";
    case weight_format::q3_k: return "q3_k";
    case weight_format::q2_k: return "q2_k";
    case weight_format::iq4_nl: return "iq4_nl";
    case weight_format::iq4_xs: return "iq4_xs";
  }
  return "unknown";
}

// The format named by to_string (nothing for another name).
constexpr std::optional<weight_format> weight_format_from_string(std::string_view s) noexcept {
  for (auto f : all_weight_formats) {
    if (to_string(f) == s) return f;
  }
  return std::nullopt;
}

// How decode_piece gives a format's 32-value pieces: whether the two halves (values 0..15,
// 16..31) have scales of their own, whether values carry an offset (a min), and whether the
// halves have offsets of their own, and the largest |code| (which i16 sums of code products
// the AVX2 kernels may take). The kernels read a format's factors through this table, so a
// format added to decode_piece runs in every generic path.
struct piece_layout {
  bool half_scales = false;
  bool offset = false;
  bool half_offsets = false;
  int max_code = 127;
};

constexpr piece_layout piece_layout_of(weight_format f) noexcept {
  switch (f) {
    case weight_format::q8_0:
    case weight_format::int8_sym: return {false, false, false, 127};
    case weight_format::q4_0:
    case weight_format::int4_sym: return {false, false, false, 8};
    case weight_format::q4_k:
    case weight_format::q4_1: return {false, true, false, 15};
    case weight_format::q5_k:
    case weight_format::q5_1: return {false, true, false, 31};
    case weight_format::q5_0: return {false, false, false, 16};
    case weight_format::q6_k: return {true, false, false, 32};
    case weight_format::q3_k: return {true, false, false, 4};
    case weight_format::q2_k: return {true, true, true, 3};
    case weight_format::iq4_nl:
    case weight_format::iq4_xs: return {false, false, false, 127};
  }
  return {};
}

// The GGUF block formats (self-contained blocks, no separate scales tensor).
constexpr bool is_block_format(weight_format f) noexcept {
  return f != weight_format::int8_sym && f != weight_format::int4_sym;
}

// Values per block (GGUF formats; 1 for the symmetric ones, whose group is separate).
constexpr std::size_t block_values(weight_format f) noexcept {
  switch (f) {
    case weight_format::q8_0:
    case weight_format::q4_0:
    case weight_format::q4_1:
    case weight_format::q5_0:
    case weight_format::q5_1:
    case weight_format::iq4_nl: return 32;
    case weight_format::q4_k:
    case weight_format::q6_k:
    case weight_format::q5_k:
    case weight_format::q3_k:
    case weight_format::q2_k:
    case weight_format::iq4_xs: return 256;
    case weight_format::int8_sym:
    case weight_format::int4_sym: return 1;
  }
  return 1;
}

// Bytes per block (GGUF formats).
constexpr std::size_t block_bytes(weight_format f) noexcept {
  switch (f) {
    case weight_format::q8_0: return 34;
    case weight_format::q4_0: return 18;
    case weight_format::q4_k: return 144;
    case weight_format::q6_k: return 210;
    case weight_format::q4_1: return 20;
    case weight_format::q5_0: return 22;
    case weight_format::q5_1: return 24;
    case weight_format::q5_k: return 176;
    case weight_format::q3_k: return 110;
    case weight_format::q2_k: return 84;
    case weight_format::iq4_nl: return 18;
    case weight_format::iq4_xs: return 136;
    case weight_format::int8_sym:
    case weight_format::int4_sym: return 0;
  }
  return 0;
}

// Bytes of one row of `cols` values in data (scales excluded).
constexpr std::size_t row_bytes(weight_format f, std::size_t cols) noexcept {
  if (f == weight_format::int8_sym) return cols;
  if (f == weight_format::int4_sym) return (cols + 1) / 2;
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
