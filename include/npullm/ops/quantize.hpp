// Quantizers of the weight formats (ops/quant_format.hpp): quantize(w, format) turns an f32
// (N, K) matrix into an owning quantized_matrix.
//
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
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::ops {

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
