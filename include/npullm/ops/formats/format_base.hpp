// What every quantized weight format shares: the list of formats, the traits each format's
// header (ops/formats/<name>.hpp) defines, and the small helpers those headers use.
//
// A format lives in one header, its home: its bit layout, its constants (format_layout<F>), and
// its code (quant_detail::format_codec<F>: a 32-value piece decoded, a block quantized, a piece
// written into the kernels' tiles). Adding a format is that header, one entry in
// NPULLM_BUILTIN_WEIGHT_FORMATS below and one #include in ops/quant_format.hpp; the sizes, names,
// GGUF type numbers, decoding, dequantization, quantization and repacking then follow from its
// traits everywhere (ops/quant_format.hpp's format_table, ops/dequantize.hpp, ops/quantize.hpp,
// ops/quant_linear/tiles.hpp), and linear runs it through the decode-based GEMV and GEMM
// (correct, not fast). Speed is the fused kernels': they unpack each format's codes with SIMD
// instructions of their own (quant_linear/tiles_kernel.hpp, tiles_portable.hpp, gemv_avx2.hpp,
// gemv_prologue.hpp); a format that declares a tile layout (tile_row_bytes != 0) without its
// branches there is a compile error naming the kernel, not a silent wrong result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

// Every weight format npullm ships, in the enum's order (the numbering is npullm's, not GGUF's:
// GGUF's is format_layout<F>::gguf_type). X(name) once per format.
#define NPULLM_BUILTIN_WEIGHT_FORMATS(X) \
  X(q8_0)                                \
  X(q4_0)                                \
  X(q4_k)                                \
  X(q6_k)                                \
  X(int8_sym)                            \
  X(int4_sym)                            \
  X(q4_1)                                \
  X(q5_0)                                \
  X(q5_1)                                \
  X(q5_k)                                \
  X(q3_k)                                \
  X(q2_k)                                \
  X(iq4_nl)                              \
  X(iq4_xs)

// Formats a program adds of its own, after npullm's (as Eigen's plugin macros extend its
// classes): NPULLM_EXTRA_WEIGHT_FORMATS(X) lists them, NPULLM_EXTRA_WEIGHT_FORMAT_HEADER names
// the header that defines their traits (included by ops/quant_format.hpp after npullm's). Every
// translation unit of that program must define both alike, and none may link npullm's
// precompiled kernels (their enum has npullm's formats only). Such a format has no kernels of
// its own (format_layout<F>::tile_row_bytes = 0): linear reads it through the decode-based
// GEMV / GEMM. tests/ops/test_format_extension.cpp adds one.
#if !defined(NPULLM_EXTRA_WEIGHT_FORMATS)
#define NPULLM_EXTRA_WEIGHT_FORMATS(X)
#endif

// Every weight format, in the enum's order.
#define NPULLM_WEIGHT_FORMATS(X) NPULLM_BUILTIN_WEIGHT_FORMATS(X) NPULLM_EXTRA_WEIGHT_FORMATS(X)

namespace npullm::ops {

enum class weight_format : std::uint8_t {
#define NPULLM_WF_ENUMERATOR_(f) f,
  NPULLM_WEIGHT_FORMATS(NPULLM_WF_ENUMERATOR_)
#undef NPULLM_WF_ENUMERATOR_
};

#define NPULLM_WF_ONE_(f) +1
inline constexpr std::size_t weight_format_count = 0 NPULLM_WEIGHT_FORMATS(NPULLM_WF_ONE_);
#undef NPULLM_WF_ONE_

template <weight_format F>
using format_constant = std::integral_constant<weight_format, F>;

// fn(format_constant<f>{}): a run-time format to the compile-time one (a switch over the list).
template <class Fn>
[[gnu::always_inline]] constexpr decltype(auto) visit_format(weight_format f, Fn&& fn) {
  switch (f) {
#define NPULLM_WF_CASE_(x) \
  case weight_format::x: return fn(format_constant<weight_format::x>{});
    NPULLM_WEIGHT_FORMATS(NPULLM_WF_CASE_)
#undef NPULLM_WF_CASE_
  }
  __builtin_unreachable();  // every enumerator has its case
}

// How decode_piece gives a format's 32-value pieces: whether the two halves (values 0..15,
// 16..31) have scales of their own, whether values carry an offset (a min), and whether the
// halves have offsets of their own, and the largest |code| (which i16 sums of code products
// the AVX2 kernels may take). The kernels read a format's factors through this, so a format's
// pieces run in every generic path.
struct piece_layout {
  bool half_scales = false;
  bool offset = false;
  bool half_offsets = false;
  int max_code = 127;
};

// A format's constants, the same for every ISA. Each format's header specializes it with:
//   name              the format's name ("q4_k")
//   gguf_type         GGUF's tensor type number (ggml_type), or -1 (npullm's own formats)
//   block_values      values per block (GGUF formats; 1 for the symmetric ones, whose scales
//   block_bytes         are a separate tensor: block_bytes 0)
//   pieces            piece_layout (above)
//   code_offset       o of u = q + o, the unsigned code the fused kernels multiply (0 for the
//                     formats with a min: their codes start at 0; 128 for 8-bit codes)
//   tile_unit_pieces  32-value pieces per unit of the kernels' tiles (quant_linear/tiles.hpp)
//   tile_row_bytes    bytes of a tile unit per row of W (0: no tiled layout)
//   tile_head_bytes   of those, the bytes ahead of the codes (factors, per row)
template <weight_format F>
struct format_layout;

inline namespace NPULLM_ISA_NAMESPACE {
namespace quant_detail {

// A format's code, compiled per ISA (the compiler vectorizes these loops for its target: they
// are the ISA's, core/isa.hpp). Each format's header specializes it with:
//   static void decode(const std::uint8_t* row, std::size_t j, piece& out) noexcept
//       piece j (values 32j .. 32j + 31) of a row as codes and factors (offsets preset to 0;
//       the symmetric formats give the codes only: their scales are outside the row)
//   static void quantize(const float* x, std::uint8_t* b) noexcept      (GGUF formats)
//       one block of block_values values, rounding as llama.cpp's reference quantizers do
//   static constexpr int max_code; static int code(row, k); static void store_code(row, k, q)
//       (symmetric formats: element k's code, any K)
//   static void pack(const tile_writer& t) noexcept
//       one piece into its tile unit (quant_linear/tiles.hpp)
template <weight_format F>
struct format_codec;

inline float load_f16(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(float16::from_bits(h));
}
inline float load_f16(const std::uint8_t* p) noexcept {
  return load_f16(reinterpret_cast<const std::byte*>(p));
}

inline void store_f16(std::byte* p, float16 v) noexcept {
  const std::uint16_t h = v.bits();
  std::memcpy(p, &h, 2);
}
inline void store_f16(std::uint8_t* p, float16 v) noexcept {
  store_f16(reinterpret_cast<std::byte*>(p), v);
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

// One 32-value piece of a row as signed integer codes q and float factors with
// value[i] = scale[i / 16] * q[i] - offset[i / 16] (the layout of each format in its pieces).
// The kernels' panel packing and the dequantize reference both read the formats through this.
struct piece {
  std::int8_t q[32];
  float scale[2];   // scale of values 0..15, 16..31 (equal except q6_k, q3_k, q2_k)
  float offset[2];  // subtracted from values 0..15, 16..31 (q4_k: dmin * m for both)
};

// Where a format's pack() writes one piece of row r into a tile unit of R rows
// (quant_linear/tiles.hpp gives the layout of a tile; each format's header its unit).
struct tile_writer {
  std::uint8_t* unit;         // the unit's first byte (zero filled before the first piece)
  std::size_t R;              // rows per tile
  std::size_t r;              // this row's index in the tile
  std::size_t p;              // the piece's index in its unit (0 .. tile_unit_pieces − 1)
  const std::uint8_t* block;  // the source block holding the piece (GGUF formats)
  const piece& pc;            // the piece, decoded
  bool q8_biased;             // whether 8-bit codes are stored + 128 (u8 dot products)

  void put_f16(std::uint8_t* at, float v) const noexcept { store_f16(at, float16(v)); }
  // q4_0's nibbles: lo = code(4t + i) & 15, hi = code(16 + 4t + i) & 15 for chunks t = 0..3
  template <class Code>
  void put_nibbles(std::uint8_t* at, const Code& code) const noexcept {
    for (std::size_t t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < 4; ++i) {
        const int lo = code(4 * t + i) & 0xF, hi = code(16 + 4 * t + i) & 0xF;
        at[(t * R + r) * 4 + i] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
    }
  }
  // q8_0's codes (+ 128 where the tiles are biased) of chunks t = 0..7
  void put_bytes(std::uint8_t* at) const noexcept {
    for (std::size_t t = 0; t < 8; ++t) {
      for (std::size_t i = 0; i < 4; ++i) {
        const int q = pc.q[4 * t + i];
        at[(t * R + r) * 4 + i] = static_cast<std::uint8_t>(q8_biased ? q + 128 : q);
      }
    }
  }
  // the high bits of a 5-bit code (q5_0, q5_1, q5_k): bit v / 4 of row r's byte v % 4
  template <class Code>
  void put_high_bits(std::uint8_t* at, const Code& code) const noexcept {
    for (std::size_t v = 0; v < 32; ++v) {
      at[r * 4 + v % 4] |= static_cast<std::uint8_t>(((code(v) >> 4) & 1) << (v / 4));
    }
  }
};

}  // namespace quant_detail
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
