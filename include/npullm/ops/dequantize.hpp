// Decoding the quantized weight formats (ops/quant_format.hpp): a 32-value piece of a row as
// integer codes and float factors (decode_piece, what the kernels' packing and the reference
// share) and the dequantize-to-f32 reference, which gives ggml's floats bit for bit (the same
// products, never fused into an FMA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::ops {

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

}  // namespace npullm::ops
