// Quantized weight formats (ops/quant.hpp) and the fused kernels (ops/quant_linear.hpp).
//
//  - Bit layouts: one hand-built block per format, expected values computed here from the
//    layout documented in ops/formats/<name>.hpp (never by calling the dequantizer twice).
//  - Quantize -> dequantize: every element within the RTN bound scale / 2 (q4_0's clamped
//    positive extreme: within |d|), at odd K where the format allows it.
//  - linear against a double GEMM over the dequantized W at M = 1, 3, 17, 37 (GEMV: M <= 16,
//    GEMM: M > 16), N = 1, 17, 37, K = 32 · odd and 256 · odd. The kernels quantize each block
//    of 32 activations to int8 with scale dx = absmax / 127 (error <= dx / 2 per element), so
//      |y - ref| <= Σ_k |w_k| · dx(block of k) / 2  +  1e-5 · Σ_k |w_k x_k|  +  1e-5
//    (the first term: activation rounding; the second: f32 accumulation).
//  - Bad input: the right error code, and y untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"

namespace {

using namespace npullm;
using ops::weight_format;

template <class Fn>
void expect_code(Fn&& fn, error_code code, const std::string& fragment) {
  try {
    fn();
    FAIL() << "expected npullm::error containing: " << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

void put_f16(std::vector<std::byte>& b, std::size_t at, float v) {
  const std::uint16_t h = float16(v).bits();
  std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> dequantized(const ops::quantized_view& w) {
  std::vector<float> out(w.rows * w.cols);
  ops::dequantize(w, dense_view<float, 2>(out.data(), w.rows, w.cols));
  return out;
}

// ---- bit layouts ----------------------------------------------------------------------------

TEST(QuantLayout, Q8_0) {
  std::vector<std::byte> b(34);
  put_f16(b, 0, 0.5f);
  for (int i = 0; i < 32; ++i)
    b[2 + i] = static_cast<std::byte>(static_cast<std::int8_t>(i * 8 - 128));
  const auto v = dequantized(ops::quantized_view(weight_format::q8_0, 1, 32, b));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(v[i], 0.5f * static_cast<float>(i * 8 - 128)) << i;
}

TEST(QuantLayout, Q4_0) {
  std::vector<std::byte> b(2 * 18);  // two rows of one block
  for (int r = 0; r < 2; ++r) {
    put_f16(b, 18 * r, r == 0 ? 0.25f : -2.0f);
    for (int i = 0; i < 16; ++i) b[18 * r + 2 + i] = static_cast<std::byte>(i | ((15 - i) << 4));
  }
  const auto v = dequantized(ops::quantized_view(weight_format::q4_0, 2, 32, b));
  for (int r = 0; r < 2; ++r) {
    const float d = r == 0 ? 0.25f : -2.0f;
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(v[32 * r + i], static_cast<float>(i - 8) * d) << i;            // low nibbles
      EXPECT_EQ(v[32 * r + i + 16], static_cast<float>(7 - i) * d) << i + 16;  // high nibbles
    }
  }
}

TEST(QuantLayout, Q4_K) {
  // Scales and mins up to 63, so that sub-blocks 4..7 need the two high bits kept in s[0..7].
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = j < 4 ? j + 1 : 40 + j;
    mn[j] = j < 4 ? 2 * j : 50 + j;
  }
  std::vector<std::byte> b(144);
  put_f16(b, 0, 1.0f);  // d
  put_f16(b, 2, 0.5f);  // dmin
  std::uint8_t s[12];
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  std::memcpy(b.data() + 4, s, 12);
  for (int t = 0; t < 128; ++t) b[16 + t] = static_cast<std::byte>((t * 37 + 11) & 0xFF);
  const auto v = dequantized(ops::quantized_view(weight_format::q4_k, 1, 256, b));
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 32; ++i) {
      const int byte = (32 * (j / 2) + i) * 37 + 11;
      const int q = j % 2 == 0 ? byte & 0xF : (byte & 0xFF) >> 4;
      const float want =
          static_cast<float>(sc[j]) * static_cast<float>(q) - 0.5f * static_cast<float>(mn[j]);
      EXPECT_EQ(v[32 * j + i], want) << j << " " << i;
    }
  }
}

TEST(QuantLayout, Q6_K) {
  std::vector<std::byte> b(210);
  std::mt19937 rng(3);
  for (int t = 0; t < 192; ++t) b[t] = static_cast<std::byte>(rng() & 0xFF);
  for (int i = 0; i < 16; ++i)
    b[192 + i] = static_cast<std::byte>(static_cast<std::int8_t>(3 * i - 20));
  put_f16(b, 208, 0.5f);
  const auto v = dequantized(ops::quantized_view(weight_format::q6_k, 1, 256, b));
  auto u8 = [&](int i) { return static_cast<int>(b[i]); };
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int ql0 = u8(64 * h + l), ql1 = u8(64 * h + l + 32), qh = u8(128 + 32 * h + l);
      const int q[4] = {(ql0 & 0xF) | ((qh & 3) << 4), (ql1 & 0xF) | (((qh >> 2) & 3) << 4),
                        (ql0 >> 4) | (((qh >> 4) & 3) << 4), (ql1 >> 4) | (((qh >> 6) & 3) << 4)};
      for (int t = 0; t < 4; ++t) {
        const int e = 128 * h + 32 * t + l;
        const float want =
            0.5f * static_cast<float>(3 * (e / 16) - 20) * static_cast<float>(q[t] - 32);
        EXPECT_EQ(v[e], want) << e;
      }
    }
  }
}

TEST(QuantLayout, SymmetricInt8AndInt4) {
  // int8, group 32, f32 scales: 2 rows x 64.
  std::vector<std::byte> d8(2 * 64), s8(2 * 2 * 4);
  for (int i = 0; i < 128; ++i) d8[i] = static_cast<std::byte>(static_cast<std::int8_t>(i - 64));
  const float scales[4] = {0.5f, 2.0f, -1.0f, 0.125f};
  std::memcpy(s8.data(), scales, sizeof scales);
  const auto v8 =
      dequantized(ops::quantized_view(weight_format::int8_sym, 2, 64, d8, s8, 32, dtype::f32));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(v8[i], static_cast<float>(i - 64) * scales[i / 32]) << i;
  // int4, one group per row (K = 5, odd), f16 scales: element 2i is byte i's low nibble.
  std::vector<std::byte> d4 = {std::byte{0x9F}, std::byte{0x70}, std::byte{0x08}};  // one row
  std::vector<std::byte> s4(2);
  put_f16(s4, 0, 0.25f);
  const auto v4 =
      dequantized(ops::quantized_view(weight_format::int4_sym, 1, 5, d4, s4, 5, dtype::f16));
  const float want[5] = {-1 * 0.25f, -7 * 0.25f, 0.0f, 7 * 0.25f, -8 * 0.25f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v4[i], want[i]) << i;
}

// ---- quantize round trip ----------------------------------------------------------------------

struct sym_case {
  weight_format format;
  std::size_t k, group;
  dtype scale_type;
};

TEST(QuantRoundTrip, WithinHalfAScale) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const sym_case cases[] = {
      {weight_format::q8_0, 96, 0, dtype::f16},
      {weight_format::q4_0, 160, 0, dtype::f16},
      {weight_format::q5_0, 96, 0, dtype::f16},
      {weight_format::q4_1, 96, 0, dtype::f16},
      {weight_format::q5_1, 160, 0, dtype::f16},
      {weight_format::int8_sym, 37, 37, dtype::f32},
      {weight_format::int8_sym, 384, 128, dtype::f16},
      {weight_format::int4_sym, 37, 37, dtype::f16},
      {weight_format::int4_sym, 192, 64, dtype::f32},
      {weight_format::int4_sym, 96, 32, dtype::f16},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(ops::to_string(c.format)) + " k " + std::to_string(c.k));
    const std::size_t n = 5;
    std::vector<float> w(n * c.k);
    for (float& v : w) v = g(rng) + (c.format == weight_format::q5_1 ? 1.5f : 0.0f);
    w[3] = 0.0f;  // some zeros
    const auto q = ops::quantize(dense_view<const float, 2>(w.data(), n, c.k), c.format, c.group,
                                 c.scale_type);
    const auto back = dequantized(q.view());
    const std::size_t group = c.group ? c.group : 32;
    const bool with_min = c.format == weight_format::q4_1 || c.format == weight_format::q5_1;
    // The scale the format stores (absmax / top code; q4_0 / q5_0: absmax / 8 or 16; with a
    // min: (max - min) / top code) and the largest code.
    const float top = c.format == weight_format::q4_0       ? 8.0f
                      : c.format == weight_format::q5_0     ? 16.0f
                      : c.format == weight_format::q4_1     ? 15.0f
                      : c.format == weight_format::q5_1     ? 31.0f
                      : c.format == weight_format::int4_sym ? 7.0f
                                                            : 127.0f;
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t g0 = 0; g0 < c.k; g0 += group) {
        float amax = 0.0f, lo = w[r * c.k + g0], hi = lo;
        for (std::size_t i = g0; i < g0 + group; ++i) {
          amax = std::max(amax, std::fabs(w[r * c.k + i]));
          lo = std::min(lo, w[r * c.k + i]);
          hi = std::max(hi, w[r * c.k + i]);
        }
        // (the symmetric formats round an f16 scale up: up to 2^-10 above)
        const float slack = ops::is_block_format(c.format) ? 1e-6f : 1e-3f;
        const float scale = (with_min ? hi - lo : amax) / top * (1.0f + slack);
        // Half a scale; the GGUF formats (llama.cpp's quantizers) compute codes with the f32
        // scale but store it as f16 (relative error <= 2^-11): + top code x that error, and the
        // min's f16 rounding; q4_0 / q5_0: a value of the other sign than the extreme may clamp
        // at the top code (within a whole scale).
        float bound = scale / 2;
        if (ops::is_block_format(c.format)) bound += top * scale * 0x1p-11f;
        if (with_min) bound += std::fabs(lo) * 0x1p-11f;
        if (c.format == weight_format::q4_0 || c.format == weight_format::q5_0) bound += scale / 2;
        for (std::size_t i = g0; i < g0 + group; ++i) {
          const float err = std::fabs(w[r * c.k + i] - back[r * c.k + i]);
          ASSERT_LE(err, bound * (1.0f + 1e-5f) + 1e-7f) << r << ", " << i;
        }
      }
    }
  }
}

TEST(QuantRoundTrip, Q4_0UsesCodeMinus8ForTheExtreme) {
  std::vector<float> w(32, 0.1f);
  w[5] = 1.6f;  // d = -0.2: 1.6 -> -8, 0.1 -> round(-0.5) -> 0 or -1
  const auto q = ops::quantize(dense_view<const float, 2>(w.data(), 1, 32), weight_format::q4_0);
  const auto back = dequantized(q.view());
  EXPECT_NEAR(back[5], 1.6f, 1.6f * 1e-3f);
  EXPECT_EQ(static_cast<int>(q.data()[2 + 5]) & 0xF, 0);  // code -8 + 8
}

// ---- kernels against the dequantize reference ----------------------------------------------

// A random W of the format, N x K: quantized from f32 where there is a quantizer, else random
// bytes with sane f16 scales (which also exercises every bit of the dequantizer).
// A block format's f16 fields (byte offset in the block, and the largest magnitude a random one
// gets: weights of order 0.1 .. 1); `signed_field`: a field that may be negative (a min).
struct f16_field {
  std::size_t at;
  float top;
  bool signed_field = false;
};
std::vector<f16_field> f16_fields(weight_format f) {
  switch (f) {
    case weight_format::q4_k: return {{0, 0.012f}, {2, 0.012f}};
    case weight_format::q5_k: return {{0, 0.006f}, {2, 0.012f}};
    case weight_format::q6_k: return {{208, 0.0025f}};
    case weight_format::q3_k: return {{108, 0.004f}};
    case weight_format::q2_k: return {{80, 0.03f}, {82, 0.02f}};
    case weight_format::q4_1: return {{0, 0.06f}, {2, 0.5f, true}};
    case weight_format::q5_1: return {{0, 0.03f}, {2, 0.5f, true}};
    case weight_format::q5_0: return {{0, 0.06f, true}};
    case weight_format::iq4_nl: return {{0, 0.008f, true}};
    case weight_format::iq4_xs: return {{0, 0.0003f, true}};
    default: return {};
  }
}

// A random W of the format, N x K: the 32-value formats with a quantizer that llama.cpp's files
// also hold (q8_0, q4_0) and the symmetric ones quantized from f32; every other GGUF format as
// random bytes with f16 fields of sane size (which also exercises every bit of the dequantizer).
ops::quantized_matrix random_matrix(weight_format f, std::size_t n, std::size_t k,
                                    std::mt19937& rng, std::vector<std::byte>& raw) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  raw.clear();
  if (!f16_fields(f).empty()) {
    raw.resize(n * ops::row_bytes(f, k));
    for (auto& b : raw) b = static_cast<std::byte>(rng() & 0xFF);
    const std::size_t bb = ops::block_bytes(f);
    for (std::size_t blk = 0; blk < raw.size() / bb; ++blk) {
      for (const f16_field& field : f16_fields(f)) {
        const float v = field.top * (0.15f + 0.85f * std::fabs(u(rng)));
        put_f16(raw, blk * bb + field.at, field.signed_field && u(rng) < 0 ? -v : v);
      }
    }
    return {};
  }
  std::vector<float> w(n * k);
  for (float& v : w) v = u(rng);
  const std::size_t group = f == weight_format::int4_sym   ? (k % 128 == 0 ? 128 : 32)
                            : f == weight_format::int8_sym ? k
                                                           : 0;
  return ops::quantize(dense_view<const float, 2>(w.data(), n, k), f, group,
                       f == weight_format::int8_sym ? dtype::f32 : dtype::f16);
}

template <class Policy>
void check_kernel(weight_format f, std::size_t m, std::size_t n, std::size_t k, bool with_bias,
                  bool strided, const Policy& policy, bool repacked = false) {
  SCOPED_TRACE(std::string(ops::to_string(f)) + " m " + std::to_string(m) + " n " +
               std::to_string(n) + " k " + std::to_string(k) + (with_bias ? " bias" : "") +
               (strided ? " strided" : "") + (repacked ? " repacked" : ""));
  std::mt19937 rng(static_cast<unsigned>(m * 7919 + n * 104729 + k));
  std::vector<std::byte> raw;
  const auto owned = random_matrix(f, n, k, rng, raw);
  const ops::quantized_view w = raw.empty() ? owned.view() : ops::quantized_view(f, n, k, raw);
  const auto wd = dequantized(w);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  tensor<float, 2> xbuf(m, k + (strided ? 3 : 0));
  for (std::size_t i = 0; i < xbuf.size(); ++i)
    xbuf.data()[i] = u(rng) * (i % 7 == 0 ? 4.0f : 1.0f);
  const auto x = subview(xbuf.view(), all, range{0, k});
  std::vector<float> bias(with_bias ? n : 0);
  for (float& b : bias) b = u(rng);
  tensor<float, 2> y(m, n);
  if (repacked) {
    const auto tiles = ops::repack(w, policy);
    ops::linear(strided_view<const float, 2>(x), tiles, strided_view<float, 2>(y.view()), bias,
                policy);
  } else {
    ops::linear(strided_view<const float, 2>(x), w, strided_view<float, 2>(y.view()), bias, policy);
  }
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double ref = with_bias ? bias[j] : 0.0, mag = 0.0, act = 0.0;
      for (std::size_t b0 = 0; b0 < k; b0 += 32) {
        float amax = 0.0f;
        for (std::size_t t = b0; t < b0 + 32; ++t) amax = std::max(amax, std::fabs(x(i, t)));
        const double dx = amax / 127.0;
        for (std::size_t t = b0; t < b0 + 32; ++t) {
          const double wv = wd[j * k + t];
          ref += wv * x(i, t);
          mag += std::fabs(wv * x(i, t));
          act += std::fabs(wv) * dx / 2;
        }
      }
      ASSERT_NEAR(y.view()(i, j), ref, act + 1e-5 * mag + 1e-5) << i << ", " << j;
    }
  }
}

const auto& all_formats = ops::all_weight_formats;

TEST(QuantLinear, AgainstDequantizedReference) {
  for (const auto f : all_formats) {
    const bool super = ops::block_values(f) == 256;
    for (const std::size_t k : {super ? std::size_t{256} : std::size_t{96},
                                super ? std::size_t{768} : std::size_t{800}}) {
      for (const std::size_t m : {1u, 3u, 17u, 37u}) {
        for (const std::size_t n : {1u, 17u, 37u}) {
          check_kernel(f, m, n, k, n == 17, m == 3, serial{});
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The repacked tiles (ops::repack) against the same reference: every M (decode and prefill
// shapes), N not a multiple of the tile's rows, K of one and of several units.
TEST(QuantLinear, RepackedAgainstDequantizedReference) {
  const thread_pool pool(3);
  for (const auto f : all_formats) {
    if (!ops::has_repacked_layout(f)) continue;
    const bool super = ops::block_values(f) == 256;
    for (const std::size_t k : {super ? std::size_t{256} : std::size_t{32},
                                super ? std::size_t{768} : std::size_t{800}}) {
      for (const std::size_t m : {1u, 3u, 9u, 17u, 37u}) {
        for (const std::size_t n : {1u, 17u, 37u}) {
          check_kernel(f, m, n, k, n == 17, m == 3, serial{}, true);
          if (HasFatalFailure()) return;
        }
      }
      check_kernel(f, 5, 70, k, true, false, pool, true);
      if (HasFatalFailure()) return;
    }
  }
}

// Repacked == the view path within f32 reassociation: both add the same exact integer dot
// products times the same f32 products s · dx per piece (the integer offsets ride in the dot
// products in both), in another order; each of the K / 32 (K / 16: q6_k) additions rounds once,
// so |difference| <= 2 · (K / 16) · 2^-24 · Σ |terms| (<= Σ_k |w_k x_k| plus x's rounding).
// The plain AVX2 GEMV adds its offsets in f32 instead (one more rounding per 8 pieces), which
// the same bound covers. Results do not depend on the thread count (bit for bit).
TEST(QuantLinear, RepackedEqualsTheViewPathWithinReassociation) {
  const thread_pool pool(2);
  for (const auto f : all_formats) {
    if (!ops::has_repacked_layout(f)) continue;
    const std::size_t k = ops::block_values(f) == 256 ? 1024 : 896, n = 45;
    std::mt19937 rng(5);
    std::vector<std::byte> raw;
    const auto owned = random_matrix(f, n, k, rng, raw);
    const ops::quantized_view w = raw.empty() ? owned.view() : ops::quantized_view(f, n, k, raw);
    const auto tiles = ops::repack(w, pool);
    EXPECT_EQ(tiles.rows(), n);
    EXPECT_EQ(tiles.cols(), k);
    EXPECT_EQ(tiles.format(), f);
    EXPECT_GE(tiles.bytes(), w.data.size());
    // (the layouts' overheads: q3_k + 3.6 %, q4_k + 2.8 %, the others less; tiles.hpp)
    EXPECT_LE(tiles.bytes(), w.data.size() * (f == weight_format::q3_k ? 1.037 : 1.03) +
                                 16 * ops::row_bytes(f, k));
    const auto wd = dequantized(w);
    for (const std::size_t m : {1u, 2u, 4u, 16u, 40u}) {
      SCOPED_TRACE(std::string(ops::to_string(f)) + " m " + std::to_string(m));
      tensor<float, 2> x(m, k), y_view(m, n), y_tiles(m, n), y_threads(m, n);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
      ops::linear(x.view(), w, y_view.view());
      ops::linear(x.view(), tiles, y_tiles.view());
      ops::linear(x.view(), tiles, y_threads.view(), {}, pool);
      ASSERT_EQ(std::memcmp(y_tiles.data(), y_threads.data(), y_tiles.size() * sizeof(float)), 0);
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
          double mag = 0.0;
          for (std::size_t t = 0; t < k; ++t) mag += std::fabs(wd[j * k + t] * x.view()(i, t));
          const double bound = 2.0 * (k / 16.0) * std::ldexp(1.0, -24) * mag * 1.1;
          ASSERT_NEAR(y_tiles.view()(i, j), y_view.view()(i, j), bound) << i << ", " << j;
        }
      }
    }
  }
  // every format has tiles; a shape the kernels refuse is refused by repack too
  for (const auto f : all_formats) EXPECT_TRUE(ops::has_repacked_layout(f)) << ops::to_string(f);
  expect_code(
      [&] {
        (void)ops::repack(
            ops::quantize(dense_view<const float, 2>(std::vector<float>(48, 1.0f).data(), 2, 24),
                          weight_format::int8_sym, 24, dtype::f32)
                .view());
      },
      error_code::invalid_shape, "multiples of 32");
}

TEST(QuantLinear, EveryGemvRowCountAndThreads) {
  const thread_pool pool(3);
  for (const auto f : all_formats) {
    const std::size_t k = ops::block_values(f) == 256 ? 512 : 128;
    for (std::size_t m = 1; m <= 20; ++m) {
      check_kernel(f, m, 40, k, true, false, pool);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(QuantLinear, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(11);
  std::vector<std::byte> raw;
  for (const auto f : all_formats) {
    for (const std::size_t m : {1u, 5u, 40u, 100u}) {  // 100: activations quantized by 3 threads
      const std::size_t n = 101, k = 512;
      const auto owned = random_matrix(f, n, k, rng, raw);
      const ops::quantized_view w = raw.empty() ? owned.view() : ops::quantized_view(f, n, k, raw);
      tensor<float, 2> x(m, k), y1(m, n), y3(m, n);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
      ops::linear(x.view(), w, y1.view());
      ops::linear(x.view(), w, y3.view(), {}, thread_pool(3));
      EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0)
          << ops::to_string(f) << " m " << m;
    }
  }
}

// The activations' int8 codes (the one rounding the kernels add to the reference): per block of
// 32, c = x · 127 / absmax rounded half away from zero, d = absmax / 127, the sums of codes 0..15
// and 16..31 times d; as stored for the kernels: natural order, pairs split (even values then
// odd ones), biased (c + 128 as u8). Blocks with absmax 127 (scale 1: exact halves such as 2.5
// and -3.5), an all-zero block, -0, random blocks; rows split over 3 threads give the same.
TEST(QuantActivations, CodesAreRoundHalfAwayFromZeroInEveryForm) {
  const std::size_t m = 70, k = 96;  // 70 >= 64 rows: the threaded split runs too
  std::vector<float> x(m * k);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (float& v : x) v = u(rng);
  const float halves[] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, -0.0f, 126.5f, -126.5f, 1.5f, 63.5f};
  for (std::size_t i = 0; i < 32; ++i) x[i] = i < 10 ? halves[i] : static_cast<float>(i) - 16.0f;
  for (std::size_t i = 32; i < 64; ++i) x[i] = 0.0f;
  x[k + 5] = -1e-30f;  // a tiny value in a random block
  struct form {
    bool split, biased;
  };
  for (const form f :
       {form{false, false}, form{true, false}, form{false, true}, form{true, true}}) {
    ops::detail::quantized_activations a1, a3;
    ops::detail::quantize_activations(x.data(), k, m, k, f.split, f.biased, a1);
    ops::detail::quantize_activations(x.data(), k, m, k, f.split, f.biased, a3, -1, thread_pool(3));
    ASSERT_EQ(a1.codes, a3.codes);
    ASSERT_EQ(a1.d, a3.d);
    ASSERT_EQ(a1.sums, a3.sums);
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t b = 0; b < k / 32; ++b) {
        const float* xb = x.data() + r * k + 32 * b;
        double amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(xb[i])));
        const float d = static_cast<float>(amax) / 127.0f;
        ASSERT_EQ(a1.d[r * (k / 32) + b], d);
        int want[32], s0 = 0, s1 = 0;
        for (int i = 0; i < 32; ++i) {
          const double t = amax > 0 ? double(xb[i] * (127.0f / static_cast<float>(amax))) : 0.0;
          want[i] =
              static_cast<int>(std::clamp(std::trunc(t + (t < 0 ? -0.5 : 0.5)), -127.0, 127.0));
          (i < 16 ? s0 : s1) += want[i];
        }
        if (r == 0 && b == 0) {  // the exact halves, spelled out
          EXPECT_EQ(want[1], 3);
          EXPECT_EQ(want[2], -4);
          EXPECT_EQ(want[3], 1);
          EXPECT_EQ(want[4], -1);
          EXPECT_EQ(want[5], 0);
          EXPECT_EQ(want[6], 127);
          EXPECT_EQ(want[7], -127);
        }
        for (int i = 0; i < 32; ++i) {
          const int src = f.split ? (i < 16 ? 2 * i : 2 * (i - 16) + 1) : i;
          const int got =
              f.biased
                  ? static_cast<int>(static_cast<std::uint8_t>(a1.codes[r * k + 32 * b + i])) - 128
                  : a1.codes[r * k + 32 * b + i];
          ASSERT_EQ(got, want[src]) << "row " << r << " block " << b << " value " << i;
        }
        EXPECT_EQ(a1.sums[(r * (k / 32) + b) * 2], d * static_cast<float>(s0));
        EXPECT_EQ(a1.sums[(r * (k / 32) + b) * 2 + 1], d * static_cast<float>(s1));
      }
    }
  }
}

// pack(): the packed panels give what linear over the view gives, bit for bit (the view path is
// checked against the reference above), at GEMV and GEMM row counts, odd N and K, with bias and
// a thread pool; and the packed object reports the source's shape.
TEST(QuantLinear, PackedEqualsTheViewPath) {
  const thread_pool pool(3);
  for (const auto f : all_formats) {
    const bool super = ops::block_values(f) == 256;
    for (const std::size_t k : {super ? std::size_t{256} : std::size_t{96},
                                super ? std::size_t{768} : std::size_t{800}}) {
      for (const std::size_t n : {1u, 17u, 37u, 70u}) {
        std::mt19937 rng(static_cast<unsigned>(n * 31 + k));
        std::vector<std::byte> raw;
        const auto owned = random_matrix(f, n, k, rng, raw);
        const ops::quantized_view w =
            raw.empty() ? owned.view() : ops::quantized_view(f, n, k, raw);
        const auto packed = ops::pack(w, pool);
        ASSERT_EQ(packed.rows(), n);
        ASSERT_EQ(packed.cols(), k);
        ASSERT_EQ(packed.format(), f);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> bias(n);
        for (float& b : bias) b = u(rng);
        for (const std::size_t m : {1u, 5u, 17u, 23u, 37u}) {
          SCOPED_TRACE(std::string(ops::to_string(f)) + " m " + std::to_string(m) + " n " +
                       std::to_string(n) + " k " + std::to_string(k));
          tensor<float, 2> x(m, k), y_view(m, n), y_packed(m, n), y_threads(m, n);
          for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
          ops::linear(x.view(), w, y_view.view(), bias);
          ops::linear(x.view(), packed, y_packed.view(), bias);
          ops::linear(x.view(), packed, y_threads.view(), bias, pool);
          ASSERT_EQ(std::memcmp(y_view.data(), y_packed.data(), y_view.size() * sizeof(float)), 0);
          ASSERT_EQ(std::memcmp(y_view.data(), y_threads.data(), y_view.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(QuantErrors, ViewChecksShapesAndSizes) {
  std::vector<std::byte> b(10 * 34);
  expect_code([&] { ops::quantized_view(weight_format::q8_0, 10, 48, b); },
              error_code::invalid_shape, "K = 48");
  expect_code([&] { ops::quantized_view(weight_format::q8_0, 10, 32, std::span(b).first(339)); },
              error_code::corrupt_data, "339 bytes, want 340");
  expect_code([&] { ops::quantized_view(weight_format::q4_k, 1, 256, std::span(b).first(143)); },
              error_code::corrupt_data, "143 bytes, want 144");
  std::vector<std::byte> d(4 * 64), s(4 * 2 * 2);
  expect_code([&] { ops::quantized_view(weight_format::int8_sym, 4, 64, d, s, 48, dtype::f16); },
              error_code::invalid_argument, "group 48");
  expect_code([&] { ops::quantized_view(weight_format::int8_sym, 4, 64, d, s, 32, dtype::bf16); },
              error_code::unsupported, "bf16");
  expect_code(
      [&] {
        ops::quantized_view(weight_format::int8_sym, 4, 64, d, std::span(s).first(15), 32,
                            dtype::f16);
      },
      error_code::corrupt_data, "15 bytes of f16 scales, want 16");
  expect_code([&] { ops::quantized_view(weight_format::int4_sym, 4, 64, d, s, 32, dtype::f16); },
              error_code::corrupt_data, "256 bytes, want 128");
  expect_code([&] { ops::quantized_view(weight_format::int8_sym, 4, 64, d); },
              error_code::invalid_argument, "needs a scales tensor");
  std::vector<float> w(64);
  expect_code(
      [&] {
        (void)ops::quantize(dense_view<const float, 2>(w.data(), 1, 64), weight_format::q4_k);
      },
      error_code::invalid_shape, "block of 256");
  expect_code(
      [&] {
        (void)ops::quantize(dense_view<const float, 2>(w.data(), 2, 32), weight_format::int4_sym,
                            48);
      },
      error_code::invalid_argument, "group 48");
  expect_code(
      [&] {
        (void)ops::quantize(dense_view<const float, 2>(w.data(), 1, 48), weight_format::q8_0);
      },
      error_code::invalid_shape, "K = 48");
}

TEST(QuantErrors, LinearRefusesAndLeavesYAsItWas) {
  std::vector<float> wf(8 * 64, 0.5f);
  const auto q = ops::quantize(dense_view<const float, 2>(wf.data(), 8, 64), weight_format::q8_0);
  tensor<float, 2> x(3, 64), y(3, 8), x_bad(3, 32), y_bad(3, 7);
  for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = 42.0f;
  auto untouched = [&] {
    for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y.data()[i], 42.0f);
  };
  expect_code([&] { ops::linear(x_bad.view(), q.view(), y.view()); }, error_code::invalid_shape,
              "want x [M, K]");
  untouched();
  expect_code([&] { ops::linear(x.view(), q.view(), y_bad.view()); }, error_code::invalid_shape,
              "y [3, 7]");
  const std::vector<float> bias(5);
  expect_code([&] { ops::linear(x.view(), q.view(), y.view(), bias); }, error_code::invalid_shape,
              "bias [5]");
  untouched();
  // A per-channel group that is not a multiple of 32: dequantizes, but no kernel reads it.
  std::vector<float> w40(8 * 40, 0.25f);
  const auto q40 = ops::quantize(dense_view<const float, 2>(w40.data(), 8, 40),
                                 weight_format::int8_sym, 40, dtype::f32);
  tensor<float, 2> x40(3, 40);
  expect_code([&] { ops::linear(x40.view(), q40.view(), y.view()); }, error_code::invalid_shape,
              "multiples of 32");
  untouched();
  expect_code([&] { (void)ops::pack(q40.view()); }, error_code::invalid_shape, "multiples of 32");
  const auto packed = ops::pack(q.view());
  expect_code([&] { ops::linear(x_bad.view(), packed, y.view()); }, error_code::invalid_shape,
              "want x [M, K]");
  untouched();
}

// ---- llama.cpp's own files ---------------------------------------------------------------------
// ../shared/vectors/gguf-types (its README): tiny-T.gguf, one model with every 2-D weight in type
// T by llama-quantize --pure from tiny-f32.gguf, and tiny-T.deq.gguf, two of its tensors as ggml's
// own dequantizer gives them. Skipped, saying so, where the folder is absent.

struct ggml_case {
  const char* type;  // llama.cpp's name, as in the file names
  weight_format format;
};
const ggml_case ggml_cases[] = {
    {"Q8_0", weight_format::q8_0},     {"Q4_0", weight_format::q4_0},
    {"Q4_1", weight_format::q4_1},     {"Q5_0", weight_format::q5_0},
    {"Q5_1", weight_format::q5_1},     {"Q2_K", weight_format::q2_k},
    {"Q3_K", weight_format::q3_k},     {"Q4_K", weight_format::q4_k},
    {"Q5_K", weight_format::q5_k},     {"Q6_K", weight_format::q6_k},
    {"IQ4_NL", weight_format::iq4_nl}, {"IQ4_XS", weight_format::iq4_xs},
};

const std::filesystem::path& gguf_types_dir() {
  static const std::filesystem::path dir = NPULLM_GGUF_TYPES_DIR;
  return dir;
}

#define SKIP_WITHOUT_GGUF_TYPES()                                   \
  if (!std::filesystem::exists(gguf_types_dir() / "tiny-f32.gguf")) \
  GTEST_SKIP() << "no llama.cpp test files in " << gguf_types_dir() \
               << " (../shared/vectors/gguf-types beside the checkout)"

std::unique_ptr<io::gguf_file> open_tiny(const std::string& suffix) {
  return io::gguf_file::open(gguf_types_dir() / ("tiny-" + suffix + ".gguf"));
}

// The quantized tensor `name` of a tiny-T file as a view (its type checked against the case).
ops::quantized_view tiny_view(const io::gguf_file& f, const std::string& name, const ggml_case& c) {
  const io::gguf_tensor_info& t = f.info(name);
  EXPECT_EQ(io::ggml_type_name(t.type), c.type) << name;
  return ops::quantized_view(c.format, t.rows(), static_cast<std::size_t>(t.ne[0]), f.bytes(t));
}

TEST(GgmlFiles, DequantizeGivesGgmlsFloatsBitForBit) {
  SKIP_WITHOUT_GGUF_TYPES();
  for (const ggml_case& c : ggml_cases) {
    const auto q = open_tiny(c.type), deq = open_tiny(std::string(c.type) + ".deq");
    for (const char* name : {"blk.0.attn_k.weight", "blk.0.ffn_down.weight"}) {
      SCOPED_TRACE(std::string(c.type) + " " + name);
      const ops::quantized_view w = tiny_view(*q, name, c);
      const auto ref = deq->view<float, 2>(name);
      ASSERT_EQ(ref.extent(0), w.rows);
      ASSERT_EQ(ref.extent(1), w.cols);
      const auto got = dequantized(w);
      std::size_t differ = 0, first = got.size();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], ref.data_handle() + i, 4) != 0 && differ++ == 0) first = i;
      }
      EXPECT_EQ(differ, 0u) << "of " << got.size() << "; first at " << first << ": "
                            << (first < got.size() ? got[first] : 0.0f) << " vs "
                            << (first < got.size() ? ref.data_handle()[first] : 0.0f);
    }
  }
}

// The types whose llama.cpp quantizer rounds to nearest with no search.
bool round_to_nearest(weight_format f) {
  return f == weight_format::q8_0 || f == weight_format::q4_0 || f == weight_format::q4_1 ||
         f == weight_format::q5_0 || f == weight_format::q5_1;
}

// llama.cpp's reference quantizers of the 32-value types round to nearest with no search:
// quantize() must write the same blocks from the same floats (every 2-D weight of the model).
TEST(GgmlFiles, QuantizeWritesLlamaCppsBlocks) {
  SKIP_WITHOUT_GGUF_TYPES();
  const auto f32 = open_tiny("f32");
  for (const ggml_case& c : ggml_cases) {
    if (!round_to_nearest(c.format)) continue;
    const auto q = open_tiny(c.type);
    std::size_t checked = 0;
    for (const io::gguf_tensor_info& t : q->tensors()) {
      if (t.n_dims != 2 || io::ggml_type_name(t.type) != c.type) continue;
      SCOPED_TRACE(std::string(c.type) + " " + std::string(t.name));
      const auto x = f32->view<float, 2>(t.name);
      const auto mine = ops::quantize(x, c.format);
      const auto theirs = q->bytes(t);
      ASSERT_EQ(mine.data().size(), theirs.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < theirs.size(); ++i) differ += mine.data()[i] != theirs[i];
      EXPECT_EQ(differ, 0u) << "bytes of " << theirs.size();
      ++checked;
    }
    EXPECT_EQ(checked, 9u) << c.type;
  }
}

// The K-quants' and IQ4's quantizers search each sub-block's factors: their squared error
// against the float weights, over every 2-D weight of the model, must be no worse than
// llama.cpp's file of that type (llama-quantize without an importance matrix).
TEST(GgmlFiles, KQuantsErrorNoWorseThanLlamaCpps) {
  SKIP_WITHOUT_GGUF_TYPES();
  const auto f32 = open_tiny("f32");
  for (const ggml_case& c : ggml_cases) {
    if (round_to_nearest(c.format)) continue;
    const auto q = open_tiny(c.type);
    double mine = 0, theirs = 0;
    std::size_t checked = 0;
    for (const io::gguf_tensor_info& t : q->tensors()) {
      if (t.n_dims != 2 || io::ggml_type_name(t.type) != c.type) continue;
      const auto x = f32->view<float, 2>(t.name);
      const auto back = dequantized(ops::quantize(x, c.format).view());
      const auto ref = dequantized(tiny_view(*q, std::string(t.name), c));
      for (std::size_t i = 0; i < back.size(); ++i) {
        const double v = x.data_handle()[i];
        mine += (back[i] - v) * (back[i] - v);
        theirs += (ref[i] - v) * (ref[i] - v);
      }
      ++checked;
    }
    EXPECT_EQ(checked, 9u) << c.type;
    std::printf("  %-5s squared error npullm / llama.cpp: %.4f\n", c.type, mine / theirs);
    EXPECT_LE(mine, theirs) << c.type;
  }
}

}  // namespace
