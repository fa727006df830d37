// Quantized weight formats: a runtime description of a quantized (N, K) matrix W (rows = output
// channels, the Hugging Face / GGUF layout), its dequantize-to-f32 reference, and round-to-
// nearest (or least-squares) quantizers. The fused kernels that read these blocks are in
// ops/quant_linear.hpp.
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
// Quantizers (round to nearest):
//   int8_sym        scale = absmax / 127, q = round(x / scale)
//   int4_sym        scale = absmax / 7,   q = round(x / scale)          (in [-7, 7])
//                   (the f16 scale is rounded up to the next f16 where rounding to nearest would
//                   make |x| / scale exceed the largest code: every element within scale / 2)
//   q8_0, q4_0, q4_1, q5_0, q5_1: llama.cpp's reference quantizers, the same blocks bit for bit
//                   (quant_detail::quantize_block32): q8_0 d = absmax / 127; q4_0 / q5_0
//                   d = -(the value of largest magnitude) / 8 or / 16 (it maps to the lowest
//                   code; a value of the other sign clamps to the top code, error up to |d|);
//                   q4_1 / q5_1 d = (max - min) / 15 or / 31, m = min. The codes use the f32 d,
//                   the block stores it as f16 (one more |code| · 2^-11 · d of error).
//   q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs: per sub-block (32 values; q2_k, q3_k, q6_k: 16) a
//                   least-squares fit of scale (and min) over 21 candidate roundings
//                   (quant_detail::fit_sub_block, fit_iq4), the sub-blocks' factors rounded to
//                   the super-block's grid (6 bits; q2_k 4; q6_k int8) against its f16 factors,
//                   then every value rounded to the nearest code under the stored factors;
//   iq4_nl          the same least-squares scale over the table, per block of 32.
//                   On llama.cpp's test model their squared error is 0.83-1.0 of
//                   llama-quantize's (no importance matrix).
#pragma once

#include <algorithm>
#include <cmath>
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

// The quantizers, the dequantizers and the block decoding the kernels share: numeric loops the
// compiler vectorizes (and contracts into FMAs) per ISA, so they are the ISA's (core/isa.hpp).
inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

inline float load_f16(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(float16::from_bits(h));
}

inline void store_f16(std::byte* p, float16 v) noexcept {
  const std::uint16_t h = v.bits();
  std::memcpy(p, &h, 2);
}

// Q4_K's six-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void q4_k_scale_min(const std::uint8_t* s, std::size_t j, int& sc, int& m) noexcept {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// a · b rounded to f32 on its own, never fused with a following add or subtract into one FMA
// (GCC contracts across statements where the target has FMA, even with -std=c++20): the
// dequantizers and the reference quantizers round as ggml's (built without FMA) do, bit for bit.
inline float product(float a, float b) noexcept {
  float p = a * b;
#if defined(__GNUC__) && defined(__x86_64__)
  asm("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(p));
#else
  volatile float v = p;
  p = v;
#endif
  return p;
}

// The 16 values of IQ4_NL / IQ4_XS's 4-bit codes (a non-uniform grid, denser near zero).
inline constexpr std::int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

// Q3_K's six-bit scale i (0..15) from the 12 packed bytes, as stored (0..63; the scale is
// d · (that − 32)): low four bits in byte i (i < 8) or the high nibble of byte i − 8, high two
// bits in byte 8 + i % 4 at bit 2 · (i / 4).
inline int q3_k_scale(const std::uint8_t* s, std::size_t i) noexcept {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  return lo | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
}

// IQ4_XS's six-bit scale of piece ib (0..7), as stored (the scale is d · (that − 32)): nibble ib
// of scales_l (4 bytes, little-endian) and bits 2 · ib .. 2 · ib + 1 of scales_h (u16).
inline int iq4_xs_scale(const std::uint8_t* b, std::size_t ib) noexcept {
  const int sh = b[2] | (b[3] << 8);
  return ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
}

// One 32-value piece of row n, piece j (values 32j .. 32j + 31), as signed integer codes q and
// float factors with value[i] = scale[i / 16] * q[i] - offset[i / 16] (offset: q4_k's min,
// else 0; the layout of each format in piece_layout_of).
// The kernels' panel packing and the dequantize reference both read the formats through this.
// Symmetric formats need K % 32 == 0 and G % 32 == 0 here (the piece lies in one group).
struct piece {
  std::int8_t q[32];
  float scale[2];   // scale of values 0..15, 16..31 (equal except q6_k)
  float offset[2];  // subtracted from values 0..15, 16..31 (q4_k: dmin * m for both)
};

inline void decode_piece(const quantized_view& w, std::size_t n, std::size_t j,
                         piece& out) noexcept {
  const std::byte* row = w.data.data() + n * w.row_bytes();
  const auto* u8 = reinterpret_cast<const std::uint8_t*>(row);
  out.offset[0] = out.offset[1] = 0.0f;
  switch (w.format) {
    case weight_format::q8_0: {
      const std::byte* b = row + j * 34;
      out.scale[0] = out.scale[1] = load_f16(b);
      std::memcpy(out.q, b + 2, 32);
      return;
    }
    case weight_format::q4_0: {
      const std::byte* b = row + j * 18;
      out.scale[0] = out.scale[1] = load_f16(b);
      const auto* nib = reinterpret_cast<const std::uint8_t*>(b + 2);
      for (int i = 0; i < 16; ++i) {
        out.q[i] = static_cast<std::int8_t>((nib[i] & 0xF) - 8);
        out.q[i + 16] = static_cast<std::int8_t>((nib[i] >> 4) - 8);
      }
      return;
    }
    case weight_format::q4_k: {
      const std::size_t sb = j / 8, sub = j % 8;
      const std::byte* b = row + sb * 144;
      const float d = load_f16(b), dmin = load_f16(b + 2);
      const auto* s = reinterpret_cast<const std::uint8_t*>(b + 4);
      int sc, m;
      q4_k_scale_min(s, sub, sc, m);
      out.scale[0] = out.scale[1] = d * static_cast<float>(sc);
      out.offset[0] = out.offset[1] = product(dmin, static_cast<float>(m));
      const auto* nib = reinterpret_cast<const std::uint8_t*>(b + 16) + 32 * (sub / 2);
      const int shift = (sub % 2) * 4;
      for (int i = 0; i < 32; ++i) out.q[i] = static_cast<std::int8_t>((nib[i] >> shift) & 0xF);
      return;
    }
    case weight_format::q6_k: {
      const std::size_t sb = j / 8, e0 = (j % 8) * 32;  // first value within the super-block
      const auto* b = u8 + sb * 210;
      const std::size_t h = e0 / 128, quarter = (e0 % 128) / 32;  // half, 32-value quarter
      const std::uint8_t* ql = b + 64 * h + (quarter % 2) * 32;
      const std::uint8_t* qh = b + 128 + 32 * h;
      const int lo_shift = static_cast<int>(quarter / 2) * 4;
      const int hi_shift = static_cast<int>(quarter) * 2;
      for (int l = 0; l < 32; ++l) {
        const int q = ((ql[l] >> lo_shift) & 0xF) | (((qh[l] >> hi_shift) & 3) << 4);
        out.q[l] = static_cast<std::int8_t>(q - 32);
      }
      const float d = load_f16(reinterpret_cast<const std::byte*>(b + 208));
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
      out.scale[0] = d * static_cast<float>(sc[e0 / 16]);
      out.scale[1] = d * static_cast<float>(sc[e0 / 16 + 1]);
      return;
    }
    case weight_format::q4_1:
    case weight_format::q5_1: {  // value = d · u + m: offset −m
      const bool five = w.format == weight_format::q5_1;
      const auto* b = u8 + j * (five ? 24 : 20);
      out.scale[0] = out.scale[1] = load_f16(reinterpret_cast<const std::byte*>(b));
      out.offset[0] = out.offset[1] = -load_f16(reinterpret_cast<const std::byte*>(b + 2));
      std::uint32_t qh = 0;
      if (five) std::memcpy(&qh, b + 4, 4);
      const std::uint8_t* nib = b + (five ? 8 : 4);
      for (int i = 0; i < 16; ++i) {
        out.q[i] = static_cast<std::int8_t>((nib[i] & 0xF) | (((qh >> i) & 1) << 4));
        out.q[i + 16] = static_cast<std::int8_t>((nib[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
      }
      return;
    }
    case weight_format::q5_0: {
      const auto* b = u8 + j * 22;
      out.scale[0] = out.scale[1] = load_f16(reinterpret_cast<const std::byte*>(b));
      std::uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      const std::uint8_t* nib = b + 6;
      for (int i = 0; i < 16; ++i) {
        out.q[i] = static_cast<std::int8_t>(((nib[i] & 0xF) | (((qh >> i) & 1) << 4)) - 16);
        out.q[i + 16] =
            static_cast<std::int8_t>(((nib[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
      }
      return;
    }
    case weight_format::q5_k: {
      const std::size_t sb = j / 8, sub = j % 8;
      const std::byte* b = row + sb * 176;
      const float d = load_f16(b), dmin = load_f16(b + 2);
      int sc, m;
      q4_k_scale_min(reinterpret_cast<const std::uint8_t*>(b + 4), sub, sc, m);
      out.scale[0] = out.scale[1] = d * static_cast<float>(sc);
      out.offset[0] = out.offset[1] = product(dmin, static_cast<float>(m));
      const auto* qh = reinterpret_cast<const std::uint8_t*>(b + 16);
      const auto* nib = reinterpret_cast<const std::uint8_t*>(b + 48) + 32 * (sub / 2);
      const int shift = static_cast<int>(sub % 2) * 4;
      for (int i = 0; i < 32; ++i) {
        out.q[i] =
            static_cast<std::int8_t>(((nib[i] >> shift) & 0xF) | (((qh[i] >> sub) & 1) << 4));
      }
      return;
    }
    case weight_format::q3_k: {
      const std::size_t sb = j / 8, sub = j % 8;
      const auto* b = u8 + sb * 110;
      const float d = load_f16(reinterpret_cast<const std::byte*>(b + 108));
      out.scale[0] = d * static_cast<float>(q3_k_scale(b + 96, 2 * sub) - 32);
      out.scale[1] = d * static_cast<float>(q3_k_scale(b + 96, 2 * sub + 1) - 32);
      const std::uint8_t* q = b + 32 + 32 * (sub / 4);
      const int shift = 2 * static_cast<int>(sub % 4);
      for (int i = 0; i < 32; ++i) {  // high bit clear: code − 4
        out.q[i] = static_cast<std::int8_t>(((q[i] >> shift) & 3) - (((b[i] >> sub) & 1) ? 0 : 4));
      }
      return;
    }
    case weight_format::q2_k: {
      const std::size_t sb = j / 8, sub = j % 8;
      const auto* b = u8 + sb * 84;
      const float d = load_f16(reinterpret_cast<const std::byte*>(b + 80));
      const float dmin = load_f16(reinterpret_cast<const std::byte*>(b + 82));
      for (std::size_t h = 0; h < 2; ++h) {
        const std::uint8_t sc = b[2 * sub + h];
        out.scale[h] = d * static_cast<float>(sc & 0xF);
        out.offset[h] = product(dmin, static_cast<float>(sc >> 4));
      }
      const std::uint8_t* q = b + 16 + 32 * (sub / 4);
      const int shift = 2 * static_cast<int>(sub % 4);
      for (int i = 0; i < 32; ++i) out.q[i] = static_cast<std::int8_t>((q[i] >> shift) & 3);
      return;
    }
    case weight_format::iq4_nl:
    case weight_format::iq4_xs: {
      const std::uint8_t* nib;
      if (w.format == weight_format::iq4_nl) {
        const auto* b = u8 + j * 18;
        out.scale[0] = out.scale[1] = load_f16(reinterpret_cast<const std::byte*>(b));
        nib = b + 2;
      } else {
        const auto* b = u8 + (j / 8) * 136;
        const float d = load_f16(reinterpret_cast<const std::byte*>(b));
        out.scale[0] = out.scale[1] = d * static_cast<float>(iq4_xs_scale(b, j % 8) - 32);
        nib = b + 8 + 16 * (j % 8);
      }
      for (int i = 0; i < 16; ++i) {
        out.q[i] = iq4_values[nib[i] & 0xF];
        out.q[i + 16] = iq4_values[nib[i] >> 4];
      }
      return;
    }
    case weight_format::int8_sym: {
      out.scale[0] = out.scale[1] = w.scale(n, j * 32 / w.group);
      std::memcpy(out.q, row + j * 32, 32);
      return;
    }
    case weight_format::int4_sym: {
      out.scale[0] = out.scale[1] = w.scale(n, j * 32 / w.group);
      const std::uint8_t* p = u8 + j * 16;
      for (int i = 0; i < 16; ++i) {
        out.q[2 * i] = static_cast<std::int8_t>(static_cast<std::int8_t>(p[i] << 4) >> 4);
        out.q[2 * i + 1] = static_cast<std::int8_t>(static_cast<std::int8_t>(p[i]) >> 4);
      }
      return;
    }
  }
}

}  // namespace quant_detail

// Row n of W as f32 (out: K values), exactly as the format defines each value.
inline void dequantize_row(const quantized_view& w, std::size_t n, std::span<float> out) {
  if (n >= w.rows || out.size() != w.cols) {
    raise(error_code::invalid_shape, "dequantize_row: row ", n, " of ", w.rows, " into ",
          out.size(), " values (want ", w.cols, ")");
  }
  if (!is_block_format(w.format)) {  // any K, any group: element by element
    const auto* u8 = reinterpret_cast<const std::uint8_t*>(w.data.data() + n * w.row_bytes());
    for (std::size_t k = 0; k < w.cols; ++k) {
      int q;
      if (w.format == weight_format::int8_sym) {
        q = static_cast<std::int8_t>(u8[k]);
      } else {
        const std::uint8_t b = u8[k / 2];
        q = k % 2 == 0 ? static_cast<std::int8_t>(b << 4) >> 4 : static_cast<std::int8_t>(b) >> 4;
      }
      out[k] = static_cast<float>(q) * w.scale(n, k / w.group);
    }
    return;
  }
  quant_detail::piece p;
  for (std::size_t j = 0; j < w.cols / 32; ++j) {
    quant_detail::decode_piece(w, n, j, p);
    for (std::size_t i = 0; i < 32; ++i) {
      const float v = quant_detail::product(p.scale[i / 16], static_cast<float>(p.q[i]));
      out[32 * j + i] = piece_layout_of(w.format).offset ? v - p.offset[i / 16] : v;
    }
  }
}

// W as f32: out (N, K).
inline void dequantize(const quantized_view& w, dense_view<float, 2> out) {
  if (out.extent(0) != w.rows || out.extent(1) != w.cols) {
    raise(error_code::invalid_shape, "dequantize: ", to_string(w.format), " [", w.rows, ", ",
          w.cols, "] into ", npullm::detail::format_extents(out.extents()));
  }
  for (std::size_t n = 0; n < w.rows; ++n)
    dequantize_row(w, n, std::span<float>(out.data_handle() + n * w.cols, w.cols));
}

}  // namespace NPULLM_ISA_NAMESPACE

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

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// An f16 scale >= s / 1 (rounded to nearest, then up one step if that fell below s), so that
// codes computed against it stay within range.
inline float16 f16_scale_at_least(float s) noexcept {
  float16 h(s);
  if (static_cast<float>(h) < s) h = float16::from_bits(static_cast<std::uint16_t>(h.bits() + 1));
  return h;
}

inline int round_code(float x, float inv, int lo, int hi) noexcept {
  const int q = static_cast<int>(std::nearbyint(x * inv));
  return std::clamp(q, lo, hi);
}

// The nearest of IQ4's 16 values times d to each of 32 values x, as the block's 16 bytes of
// nibbles (value i: low nibble of byte i, value i + 16: high nibble).
inline void iq4_codes(const float* x, float d, std::uint8_t* out) noexcept {
  for (int i = 0; i < 16; ++i) out[i] = 0;
  for (int i = 0; i < 32; ++i) {
    int best = 0;
    float err = INFINITY;
    for (int c = 0; c < 16; ++c) {
      const float e = std::fabs(x[i] - d * static_cast<float>(iq4_values[c]));
      if (e < err) {
        err = e;
        best = c;
      }
    }
    out[i % 16] = static_cast<std::uint8_t>(out[i % 16] | (best << (i < 16 ? 0 : 4)));
  }
}

// IQ4's scale for 32 values x (least squares): 21 candidates that map the extreme near the
// table's ends, each value to its nearest table value, d refit to those values; the best fit.
inline float fit_iq4(const float* x) noexcept {
  float extreme = 0.0f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  if (extreme == 0.0f) return 0.0f;
  double best = INFINITY;
  float out = extreme / -127.0f;
  for (int step = -10; step <= 10; ++step) {
    const float d0 = extreme / (-127.0f + 2.0f * static_cast<float>(step));
    double svx = 0, svv = 0;
    int v[32];
    for (int i = 0; i < 32; ++i) {
      float err = INFINITY;
      for (int c = 0; c < 16; ++c) {
        const float e = std::fabs(x[i] - d0 * static_cast<float>(iq4_values[c]));
        if (e < err) {
          err = e;
          v[i] = iq4_values[c];
        }
      }
      svx += static_cast<double>(v[i]) * x[i];
      svv += static_cast<double>(v[i]) * v[i];
    }
    if (svv <= 0) continue;
    const double d = svx / svv;
    double err = 0;
    for (int i = 0; i < 32; ++i) err += (d * v[i] - x[i]) * (d * v[i] - x[i]);
    if (err < best) {
      best = err;
      out = static_cast<float>(d);
    }
  }
  return out;
}

// One block of 32 values x of a 32-value GGUF format into its bytes b, rounding to nearest as
// llama.cpp's reference quantizers do (the same float operations, so the same blocks):
//   symmetric (q8_0, q4_0, q5_0): d from the block's extreme (q8_0: absmax / 127; q4_0 / q5_0:
//     −(the value of largest magnitude) / 8 or / 16, so that it maps to the lowest code), the
//     codes x · (1 / d) rounded half up (q8_0: half away from zero), clamped to the top code;
//   with a min (q4_1, q5_1): d = (max − min) / 15 or / 31, m = min, codes (x − min) / d rounded
//     half up.
// d and m are stored as f16 (rounded to nearest) but the codes use the f32 d: an element may be
// off its value by d / 2 plus |code| times d's f16 rounding (and q4_0 / q5_0 clamp a value of
// the other sign than the extreme to the top code, off by up to |d|).
inline void quantize_block32(weight_format f, const float* x, std::byte* b) noexcept {
  auto* u8 = reinterpret_cast<std::uint8_t*>(b);
  if (f == weight_format::iq4_nl) {  // a least-squares scale over the table (fit_iq4)
    const float16 d16(fit_iq4(x));
    store_f16(b, d16);
    iq4_codes(x, static_cast<float>(d16), u8 + 2);
    return;
  }
  if (f == weight_format::q8_0) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, float16(d));
    for (int i = 0; i < 32; ++i) u8[2 + i] = static_cast<std::uint8_t>(std::lround(x[i] * id));
    return;
  }
  if (f == weight_format::q4_0 || f == weight_format::q5_0) {
    const bool five = f == weight_format::q5_0;
    float amax = 0.0f, extreme = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (amax < std::fabs(x[i])) {
        amax = std::fabs(x[i]);
        extreme = x[i];
      }
    }
    const float d = extreme / (five ? -16.0f : -8.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
    const float half = five ? 16.5f : 8.5f;
    const int top = five ? 31 : 15;
    store_f16(b, float16(d));
    std::uint32_t qh = 0;
    for (int i = 0; i < 16; ++i) {
      // x · id >= −top − 1 - rounding: the sum is positive, truncation rounds it down
      const int lo = std::min(top, static_cast<int>(product(x[i], id) + half));
      const int hi = std::min(top, static_cast<int>(product(x[i + 16], id) + half));
      u8[(five ? 6 : 2) + i] = static_cast<std::uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<std::uint32_t>((lo >> 4) & 1) << i;
      qh |= static_cast<std::uint32_t>((hi >> 4) & 1) << (i + 16);
    }
    if (five) std::memcpy(b + 2, &qh, 4);
    return;
  }
  // q4_1, q5_1
  const bool five = f == weight_format::q5_1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const int top = five ? 31 : 15;
  const float d = (hi - lo) / static_cast<float>(top), id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, float16(d));
  store_f16(b + 2, float16(lo));
  std::uint32_t qh = 0;
  for (int i = 0; i < 16; ++i) {
    const int c0 = std::min(top, static_cast<int>(product(x[i] - lo, id) + 0.5f));
    const int c1 = std::min(top, static_cast<int>(product(x[i + 16] - lo, id) + 0.5f));
    u8[(five ? 8 : 4) + i] = static_cast<std::uint8_t>((c0 & 0xF) | ((c1 & 0xF) << 4));
    qh |= static_cast<std::uint32_t>((c0 >> 4) & 1) << i;
    qh |= static_cast<std::uint32_t>((c1 >> 4) & 1) << (i + 16);
  }
  if (five) std::memcpy(b + 4, &qh, 4);
}

// The K-quants' search for one sub-block's factors (least squares, not a weighted error):
// n values x onto codes 0..top as value = s · q + b with b <= 0 (with_min: q4_k, q5_k; s >= 0),
// or onto codes −(top + 1)..top as value = s · q (q6_k). Tries 21 scales around the one that
// maps the range onto the codes, rounds x with each, fits s (and b) to those codes by least
// squares and keeps the fit of least squared error.
inline void fit_sub_block(const float* x, int n, int top, bool with_min, float& s,
                          float& b) noexcept {
  float lo = x[0], hi = x[0], extreme = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  }
  s = 0.0f;
  b = 0.0f;
  if (with_min) lo = std::min(lo, 0.0f);
  if (with_min ? hi <= lo : extreme == 0.0f) {
    b = with_min ? lo : 0.0f;
    return;
  }
  double best = INFINITY;
  for (int step = -10; step <= 10; ++step) {
    const float levels = static_cast<float>(top) + 0.1f * static_cast<float>(step);
    // symmetric: the extreme maps to the lowest code −(top + 1) (one more level that side)
    const float inv = with_min ? levels / (hi - lo) : -(levels + 1.0f) / extreme;
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[256];
    for (int i = 0; i < n; ++i) {
      const float t = with_min ? (x[i] - lo) * inv : x[i] * inv;
      q[i] = std::clamp(static_cast<int>(std::nearbyint(t)), with_min ? 0 : -top - 1, top);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sqx += static_cast<double>(q[i]) * x[i];
    }
    double fs, fb = 0.0;
    if (with_min) {
      const double det = n * sqq - sq * sq;
      if (det <= 0) continue;
      fs = (n * sqx - sq * sx) / det;
      fb = (sx - fs * sq) / n;
      if (fb > 0) {  // the min must be <= 0 (stored as a non-negative m)
        fb = 0;
        fs = sqq > 0 ? sqx / sqq : 0;
      }
      if (fs < 0) continue;
    } else {
      if (sqq <= 0) continue;
      fs = sqx / sqq;
    }
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = fs * q[i] + fb - x[i];
      err += e * e;
    }
    if (err < best) {
      best = err;
      s = static_cast<float>(fs);
      b = static_cast<float>(fb);
    }
  }
}

// One super-block of 256 values x of q4_k / q5_k / q6_k into its bytes b: per sub-block the
// least-squares factors (fit_sub_block), the sub-blocks' scales (and mins) rounded to the
// format's integer grid against the super-block's f16 factors (q4_k / q5_k: 6 bits, d = the
// largest scale / 63; q6_k: int8, d = −(the scale of largest magnitude) / 128, as llama.cpp's
// quantizers do), then every value rounded to the nearest code under the stored factors.
inline void quantize_super_block(weight_format f, const float* x, std::byte* b) noexcept {
  auto* u8 = reinterpret_cast<std::uint8_t*>(b);
  if (f == weight_format::q6_k) {
    float sc[16], unused;
    float extreme = 0.0f;
    for (int j = 0; j < 16; ++j) {
      fit_sub_block(x + 16 * j, 16, 31, false, sc[j], unused);
      if (std::fabs(sc[j]) > std::fabs(extreme)) extreme = sc[j];
    }
    const float16 d16(extreme / -128.0f);
    const float d = static_cast<float>(d16);
    store_f16(b + 208, d16);
    std::uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const int is =
          d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -128, 127) : 0;
      u8[192 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(is));
      const float step = d * static_cast<float>(is);
      for (int i = 0; i < 16; ++i) {
        const int c = step != 0.0f ? static_cast<int>(std::nearbyint(x[16 * j + i] / step)) : 0;
        q[16 * j + i] = static_cast<std::uint8_t>(std::clamp(c, -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const std::uint8_t* v = q + 128 * h + l;
        u8[64 * h + l] = static_cast<std::uint8_t>((v[0] & 0xF) | ((v[64] & 0xF) << 4));
        u8[64 * h + l + 32] = static_cast<std::uint8_t>((v[32] & 0xF) | ((v[96] & 0xF) << 4));
        u8[128 + 32 * h + l] = static_cast<std::uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) |
                                                         ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
      }
    }
    return;
  }
  if (f == weight_format::q3_k || f == weight_format::q2_k) {
    const bool three = f == weight_format::q3_k;
    float sc[16], mn[16], extreme = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float bj;
      fit_sub_block(x + 16 * j, 16, 3, !three, sc[j], bj);
      mn[j] = -bj;
      if (three ? std::fabs(sc[j]) > std::fabs(extreme) : sc[j] > extreme) extreme = sc[j];
      max_mn = std::max(max_mn, mn[j]);
    }
    // q3_k: signed 6-bit scales (−32..31; the extreme maps to −32); q2_k: 4-bit scales and mins
    const float16 d16(three ? extreme / -32.0f : extreme / 15.0f), m16(max_mn / 15.0f);
    const float d = static_cast<float>(d16), dm = three ? 0.0f : static_cast<float>(m16);
    std::uint8_t* qs = u8 + (three ? 32 : 16);
    std::fill_n(u8, block_bytes(f), std::uint8_t{0});
    if (three) {
      store_f16(b + 108, d16);
    } else {
      store_f16(b + 80, d16);
      store_f16(b + 82, m16);
    }
    for (int j = 0; j < 16; ++j) {
      int is, im = 0;
      if (three) {
        is = d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -32, 31) : 0;
        const int v = is + 32;  // q3_k_scale's inverse
        std::uint8_t* s = u8 + 96;
        s[j % 8] = static_cast<std::uint8_t>(s[j % 8] | ((v & 0xF) << (j < 8 ? 0 : 4)));
        s[8 + j % 4] = static_cast<std::uint8_t>(s[8 + j % 4] | ((v >> 4) << (2 * (j / 4))));
      } else {
        is = d > 0.0f ? std::min(15, static_cast<int>(std::nearbyint(sc[j] / d))) : 0;
        im = dm > 0.0f ? std::min(15, static_cast<int>(std::nearbyint(mn[j] / dm))) : 0;
        u8[j] = static_cast<std::uint8_t>(is | (im << 4));
      }
      const float step = d * static_cast<float>(is), off = dm * static_cast<float>(im);
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i, p = e / 32, at = e % 32;  // piece p = 4t + u, value at
        const int c = step != 0.0f ? static_cast<int>(std::nearbyint((x[e] + off) / step)) : 0;
        const int u = three ? std::clamp(c, -4, 3) + 4 : std::clamp(c, 0, 3);
        qs[32 * (p / 4) + at] =
            static_cast<std::uint8_t>(qs[32 * (p / 4) + at] | ((u & 3) << (2 * (p % 4))));
        if (three && u >= 4) u8[at] = static_cast<std::uint8_t>(u8[at] | (1 << p));
      }
    }
    return;
  }
  if (f == weight_format::iq4_xs) {
    float sc[8], extreme = 0.0f;
    for (int j = 0; j < 8; ++j) {
      sc[j] = fit_iq4(x + 32 * j);
      if (std::fabs(sc[j]) > std::fabs(extreme)) extreme = sc[j];
    }
    const float16 d16(extreme / -32.0f);
    const float d = static_cast<float>(d16);
    std::fill_n(u8, 136, std::uint8_t{0});
    store_f16(b, d16);
    std::uint16_t sh = 0;
    for (int j = 0; j < 8; ++j) {
      const int is =
          d != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(sc[j] / d)), -32, 31) : 0;
      const int v = is + 32;
      u8[4 + j / 2] = static_cast<std::uint8_t>(u8[4 + j / 2] | ((v & 0xF) << (4 * (j % 2))));
      sh = static_cast<std::uint16_t>(sh | ((v >> 4) << (2 * j)));
      iq4_codes(x + 32 * j, d * static_cast<float>(is), u8 + 8 + 16 * j);
    }
    std::memcpy(b + 2, &sh, 2);
    return;
  }
  // q4_k, q5_k
  const bool five = f == weight_format::q5_k;
  const int top = five ? 31 : 15;
  float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float bj;
    fit_sub_block(x + 32 * j, 32, top, true, sc[j], bj);
    mn[j] = -bj;
    max_sc = std::max(max_sc, sc[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  const float16 d16(max_sc / 63.0f), m16(max_mn / 63.0f);
  const float d = static_cast<float>(d16), dm = static_cast<float>(m16);
  store_f16(b, d16);
  store_f16(b + 2, m16);
  std::uint8_t* s = u8 + 4;
  std::fill_n(s, 12, std::uint8_t{0});
  std::uint8_t* qh = u8 + 16;
  std::uint8_t* nib = u8 + (five ? 48 : 16);
  if (five) std::fill_n(qh, 32, std::uint8_t{0});
  for (int j = 0; j < 8; ++j) {
    const int is = d > 0.0f ? std::min(63, static_cast<int>(std::nearbyint(sc[j] / d))) : 0;
    const int im = dm > 0.0f ? std::min(63, static_cast<int>(std::nearbyint(mn[j] / dm))) : 0;
    if (j < 4) {
      s[j] = static_cast<std::uint8_t>(s[j] | is);
      s[j + 4] = static_cast<std::uint8_t>(s[j + 4] | im);
    } else {
      s[j + 4] = static_cast<std::uint8_t>((is & 0xF) | ((im & 0xF) << 4));
      s[j - 4] = static_cast<std::uint8_t>(s[j - 4] | ((is >> 4) << 6));
      s[j] = static_cast<std::uint8_t>(s[j] | ((im >> 4) << 6));
    }
    const float step = d * static_cast<float>(is), off = dm * static_cast<float>(im);
    for (int i = 0; i < 32; ++i) {
      const int c =
          step > 0.0f ? static_cast<int>(std::nearbyint((x[32 * j + i] + off) / step)) : 0;
      const int q = std::clamp(c, 0, top);
      std::uint8_t& byte = nib[32 * (j / 2) + i];
      byte = static_cast<std::uint8_t>(j % 2 == 0 ? (byte & 0xF0) | (q & 0xF)
                                                  : (byte & 0x0F) | ((q & 0xF) << 4));
      if (five) qh[i] = static_cast<std::uint8_t>(qh[i] | ((q >> 4) << j));
    }
  }
}

}  // namespace quant_detail

// Quantizes w (N, K) f32 to `format` (see the top of this file). group and scale_type apply to
// *_sym only (group 32, 64, 128 or K; scale f16 or f32); K a multiple of the block
// (invalid_shape).
inline quantized_matrix quantize(dense_view<const float, 2> w, weight_format format,
                                 std::size_t group = 0, dtype scale_type = dtype::f16) {
  const std::size_t n = w.extent(0), k = w.extent(1);
  if (is_block_format(format) && k % block_values(format) != 0) {
    raise(error_code::invalid_shape, "quantize: ", to_string(format), " K = ", k,
          " is not a multiple of its block of ", block_values(format));
  }
  if (!is_block_format(format)) {
    if (group != 32 && group != 64 && group != 128 && group != k) {
      raise(error_code::invalid_argument, "quantize: ", to_string(format), " group ", group,
            " (want 32, 64, 128 or K = ", k, ")");
    }
    if (group == 0 || k % group != 0) {
      raise(error_code::invalid_shape, "quantize: ", to_string(format), " K = ", k,
            " is not a multiple of the group ", group);
    }
    if (scale_type != dtype::f16 && scale_type != dtype::f32) {
      raise(error_code::unsupported, "quantize: scale type ", to_string(scale_type),
            " (want f16 or f32)");
    }
  }
  const std::size_t rb = row_bytes(format, k);
  std::vector<std::byte> data(n * rb, std::byte{0});
  const float* src = w.data_handle();
  const auto ld = static_cast<std::size_t>(w.stride(0));
  if (w.stride(1) != 1) raise(error_code::unsupported, "quantize: rows of w must be dense");
  if (is_block_format(format)) {
    const std::size_t bb = block_bytes(format), bv = block_values(format);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < k / bv; ++j) {
        const float* x = src + r * ld + bv * j;
        std::byte* b = data.data() + r * rb + j * bb;
        if (bv == 32) {
          quant_detail::quantize_block32(format, x, b);
        } else {
          quant_detail::quantize_super_block(format, x, b);
        }
      }
    }
    return quantized_matrix(format, n, k, std::move(data));
  }
  const std::size_t groups = k / group, ss = size_of(scale_type);
  std::vector<std::byte> scales(n * groups * ss, std::byte{0});
  const int qmax = format == weight_format::int8_sym ? 127 : 7;
  for (std::size_t r = 0; r < n; ++r) {
    auto* row = reinterpret_cast<std::uint8_t*>(data.data() + r * rb);
    for (std::size_t g = 0; g < groups; ++g) {
      const float* x = src + r * ld + g * group;
      float amax = 0.0f;
      for (std::size_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
      float s = amax / static_cast<float>(qmax);
      std::byte* sp = scales.data() + (r * groups + g) * ss;
      if (scale_type == dtype::f16) {
        const float16 h = quant_detail::f16_scale_at_least(s);
        quant_detail::store_f16(sp, h);
        s = static_cast<float>(h);
      } else {
        std::memcpy(sp, &s, 4);
      }
      const float inv = s != 0.0f ? 1.0f / s : 0.0f;
      for (std::size_t i = 0; i < group; ++i) {
        const int q = quant_detail::round_code(x[i], inv, -qmax, qmax);
        const std::size_t kk = g * group + i;
        if (format == weight_format::int8_sym) {
          row[kk] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
        } else {
          const auto nib = static_cast<std::uint8_t>(q & 0xF);
          row[kk / 2] = static_cast<std::uint8_t>(row[kk / 2] | (kk % 2 == 0 ? nib : nib << 4));
        }
      }
    }
  }
  return quantized_matrix(format, n, k, std::move(data), std::move(scales), group, scale_type);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
