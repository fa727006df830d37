// Quantized KV formats (kv::q8_0, kv::q4_0) in every KV storage, read by flash attention.
//
// - The formats: llama.cpp's block bytes (ops::quant_detail::quantize_block, itself checked against
//   llama.cpp's files), kv::load16 (the fused read, on this build's ISA) == dequantize_row,
//   quantizing a round-tripped row stores the same values, head_dim not a multiple of 32 refused.
// - Flash over a quantized source == flash over an f32 source holding the dequantized values
//   with the query quantized as the integer kernels quantize it (attention::query_round_trip),
//   within 2e-6 (f32 rounding of the score sums; measured 3.3e-7, printed), and blocks / split /
//   forked storages give the contiguous cache's bits: contiguous, blocks of 16, a
//   split-into-blocks view, a ring, a forked table after a copy-on-write, a prefix-cache hit;
//   GQA 14/2 (d64), MHA 8/8 (d128); causal, window, padding, explicit (pyramid) masks;
//   soft-capping; decode splits (past > 512); a present tile (read in the past's format).
// - Against the double reference over the unquantized values at odd sizes (q 1, 17, 37): max
//   |error| <= 0.02 (q8_0: measured 0.0077) and 0.3 (q4_0: measured 0.14; its step is 1/8 of a
//   group's largest magnitude, and an output row is a weighted mean of V rows off by up to a
//   step each) for values in [-1, 1], printed; and the storage operations: fork / truncate /
//   release_before / prefix reuse keep their meaning, and a failed append leaves a quantized table
//   unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "npullm/attention/flash.hpp"
#include "npullm/attention/pyramid.hpp"
#include "npullm/attention/quantized_keys.hpp"
#include "npullm/attention/reference.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"
#include "npullm/kv/kv_format.hpp"
#include "npullm/kv/laddered_cache.hpp"
#include "npullm/kv/prefix_cache.hpp"
#include "npullm/kv/ring_cache.hpp"
#include "npullm/ops/quant.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::attention;
using kv::kv_part;
using kv::kv_shape;
using kv::kv_tile;

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float gain = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-gain, gain);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

// Rows that exercise the quantizers' edges: random, zeros, one outlier, a negative extreme,
// a positive extreme, tiny values (f16 scale underflow).
std::vector<std::vector<float>> edge_rows() {
  std::vector<std::vector<float>> rows;
  for (std::uint64_t s = 1; s <= 8; ++s) rows.push_back(random_values(32, s, 0.1f * s));
  rows.emplace_back(32, 0.0f);
  auto outlier = random_values(32, 9, 0.01f);
  outlier[7] = 40.0f;
  rows.push_back(outlier);
  auto negative = random_values(32, 10);
  negative[20] = -3.0f;
  rows.push_back(negative);
  auto positive = random_values(32, 11);
  positive[31] = 3.0f;
  rows.push_back(positive);
  rows.push_back(random_values(32, 12, 1e-9f));
  return rows;
}

template <class T>
ops::weight_format llama_format() {
  return std::same_as<T, kv::q8_0> ? ops::weight_format::q8_0 : ops::weight_format::q4_0;
}

template <class T>
class KvFormat : public ::testing::Test {};
using formats = ::testing::Types<kv::q8_0, kv::q4_0>;
TYPED_TEST_SUITE(KvFormat, formats);

TYPED_TEST(KvFormat, BlocksAreLlamaCppBytes) {
  using T = TypeParam;
  for (const auto& x : edge_rows()) {
    T unit;
    kv::quantize_row(x.data(), 32, &unit);
    std::byte expected[sizeof(T)];
    ops::quant_detail::quantize_block(llama_format<T>(), x.data(), expected);
    EXPECT_EQ(0, std::memcmp(&unit, expected, sizeof(T))) << kv::kv_element_name<T>();
  }
}

TYPED_TEST(KvFormat, Load16IsTheDequantizedValues) {
  using T = TypeParam;
  const auto x = random_values(128, 3);
  T units[4];
  kv::quantize_row(x.data(), 128, units);
  std::vector<float> deq(128);
  kv::dequantize_row(units, 128, deq.data());
  for (std::size_t c = 0; c < 128; c += 16) {
    alignas(64) float got[16];
    simd::store(got, kv::load16(units, c));
    for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(got[i], deq[c + i]) << c + i;
  }
  // Every value is within d / 2 (q8_0, d = max / 127) or d (q4_0, d = max / 8) of the input,
  // plus the f16 rounding of d.
  for (std::size_t u = 0; u < 4; ++u) {
    float amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[u * 32 + i]));
    // (q4_0 clamps a value of the other sign than the extreme to code 15: off by up to d.)
    const float bound = std::same_as<T, kv::q8_0> ? amax / 127.0f * 0.5f : amax / 8.0f;
    for (std::size_t i = 0; i < 32; ++i)
      EXPECT_LE(std::fabs(deq[u * 32 + i] - x[u * 32 + i]), bound * 1.01f + amax * 1e-3f);
  }
}

TYPED_TEST(KvFormat, RoundTripStoresTheSameValues) {
  using T = TypeParam;
  for (auto x : edge_rows()) {
    kv::round_trip<T>(x.data(), 32);  // what a step attends to
    T unit;
    kv::quantize_row(x.data(), 32, &unit);  // what the cache then stores
    float back[32];
    kv::dequantize_row(&unit, 32, back);
    for (std::size_t i = 0; i < 32; ++i) ASSERT_EQ(back[i], x[i]) << i;
  }
}

TYPED_TEST(KvFormat, HeadDimMustBeAMultipleOf32) {
  using T = TypeParam;
  const kv_shape bad{2, 2, 48};
  npullm::testing::expect_error([&] { kv::contiguous_cache<T> c(bad, 64); },
                                error_code::unsupported, "head_dim 48 is not a multiple of 32");
  npullm::testing::expect_error([&] { kv::block_pool<T> p(bad, 16, 4); }, error_code::unsupported,
                                "block_pool: head_dim 48");
  npullm::testing::expect_error([&] { kv::ring_cache<T> r(bad, 32, 8); }, error_code::unsupported,
                                "ring_cache: head_dim 48");
  kv::contiguous_cache<T> ok({2, 2, 64}, 64);
  EXPECT_EQ(ok.storage_bytes(), 2 * 2 * 2 * 64 * 2 * sizeof(T));  // 2 units per row
}

// ---- flash over quantized sources -----------------------------------------------------------

// The K/V of a test: (layers = 1) values per position, kv_heads x D each.
struct kv_values {
  std::size_t kv_heads, dim;
  std::vector<float> k, v;  // (positions, kv_heads, D)
  const float* at(kv_part part, std::size_t pos, std::size_t h) const {
    return (part == kv_part::k ? k : v).data() + (pos * kv_heads + h) * dim;
  }
};

kv_values make_values(std::size_t len, std::size_t kv_heads, std::size_t dim, std::uint64_t seed) {
  return {kv_heads, dim, random_values(len * kv_heads * dim, seed),
          random_values(len * kv_heads * dim, seed + 100)};
}

// Writes positions [begin, end) of vals into a source with token_kv (quantized or not).
// (K and V each in its part's format: a mixed source's parts differ.)
template <class Source>
void write(Source& s, const kv_values& vals, std::size_t begin, std::size_t end) {
  for (std::size_t pos = begin; pos < end; ++pos) {
    auto ks = s.token_kv(pos, 0, kv::k_part);  // (kv_heads, units)
    auto vs = s.token_kv(pos, 0, kv::v_part);
    for (std::size_t h = 0; h < vals.kv_heads; ++h) {
      kv::quantize_row(vals.at(kv_part::k, pos, h), vals.dim, &ks(h, 0));
      kv::quantize_row(vals.at(kv_part::v, pos, h), vals.dim, &vs(h, 0));
    }
  }
}

// The values a source of format T stores for vals (each head row round-tripped).
template <class T>
kv_values stored(kv_values vals) {
  for (std::size_t r = 0; r < vals.k.size() / vals.dim; ++r) {
    kv::round_trip<kv::key_format_t<T>>(vals.k.data() + r * vals.dim, vals.dim);
    kv::round_trip<kv::value_format_t<T>>(vals.v.data() + r * vals.dim, vals.dim);
  }
  return vals;
}

struct run_case {
  std::size_t q_heads, kv_heads, dim, q_len, past;
  enum { causal, window, padding } mask;
  float softcap;
  bool present;
  std::string label() const {
    // (A stream: GCC 12 warns, wrongly, -Wrestrict on "literal" + std::string.)
    std::ostringstream out;
    out << "h" << q_heads << "/" << kv_heads << " d" << dim << " q" << q_len << " past" << past
        << (mask == causal   ? " causal"
            : mask == window ? " window"
                             : " padding")
        << (softcap > 0 ? " softcap" : "") << (present ? " +present" : "");
    return out.str();
  }
};

// The attention scale of a run_case.
float scale_of(const run_case& rc) {
  return 1.0f / std::sqrt(static_cast<float>(rc.dim));
}

// What scores against quantized keys correspond to (quantized_keys.hpp): each query row times
// the scale, quantized to int8 per 32 elements; run with scale 1, flash over keys holding the
// dequantized values reads the same numbers up to f32 rounding.
// (Keys in a storage type are scored in f32: the query is only scaled.)
template <class T>
std::vector<float> quantized_query(std::vector<float> q, std::size_t dim, float scale) {
  for (float& x : q) x *= scale;
  if constexpr (kv::quantized_kv_element<kv::key_format_t<T>>) {
    for (std::size_t r = 0; r < q.size() / dim; ++r)
      npullm::attention::query_round_trip(q.data() + r * dim, dim);
  }
  return q;
}

// Outputs of flash over quantized keys against flash over their values with the quantized query:
// the same arithmetic but for the order and rounding of the score sums (exact integer sums
// times the two scales, against f32 products summed in f32); measured: 3.2e-7 (figure).
constexpr float query_rounding_bound = 2e-6f;

template <class Tile, class P>
std::vector<float> run(const run_case& rc, std::span<const Tile> past, const kv_tile<P>* present,
                       const std::vector<float>& q, float scale) {
  std::vector<float> out(q.size());
  attention_io io{dense_view<const float, 3>(q.data(), rc.q_heads, rc.q_len, rc.dim),
                  dense_view<float, 3>(out.data(), rc.q_heads, rc.q_len, rc.dim),
                  {},
                  scale};
  io.softcap = rc.softcap;
  const std::size_t total = rc.past + (present ? rc.q_len : 0);
  const std::size_t q0 = total - rc.q_len;  // queries are the last q_len positions
  static thread_pool pool(2);               // decode splits and query tiles run on two threads
  switch (rc.mask) {
    case run_case::causal: flash_attention(io, past, present, causal{q0}, pool); break;
    case run_case::window: flash_attention(io, past, present, sliding_window{40, q0}, pool); break;
    case run_case::padding:
      flash_attention(io, past, present,
                      all_of<causal, padding>{causal{q0}, padding::left(5, total)}, pool);
      break;
  }
  return out;
}

std::vector<run_case> run_cases() {
  std::vector<run_case> cases;
  for (auto [qh, kh, d] : {std::tuple{14u, 2u, 64u}, std::tuple{8u, 8u, 128u}}) {
    for (std::size_t q_len : {1u, 17u}) {
      for (std::size_t past : {37u, 1100u}) {
        if (q_len > 1 && past > 100) continue;  // prefill over a long past: covered by decode
        for (auto mask : {run_case::causal, run_case::window, run_case::padding})
          cases.push_back({qh, kh, d, q_len, past, mask, 0.0f, q_len > 1});
      }
    }
    cases.push_back({qh, kh, d, 1, 600, run_case::causal, 0.5f, false});
  }
  return cases;
}

// The sources the test builds over the same values: each hands over tiles of one layer.
enum class storage { contiguous, blocks, split, ring, forked, prefix };
const char* name(storage s) {
  constexpr const char* n[] = {"contiguous", "blocks16", "split16", "ring", "forked", "prefix"};
  return n[static_cast<int>(s)];
}

// Flash over storage s of format T holding vals' first rc.past positions.
template <class T>
std::vector<float> flash_over(storage s, const run_case& rc, const kv_values& vals,
                              const kv_tile<float>* present, const std::vector<float>& q,
                              float scale) {
  const kv_shape shape{1, rc.kv_heads, rc.dim};
  const std::size_t n = rc.past;
  switch (s) {
    case storage::contiguous:
    case storage::split: {
      kv::contiguous_cache<T> c(shape, n);
      c.append(n);
      write(c, vals, 0, n);
      if (s == storage::split) {
        const auto split = c.split_into_blocks(16);
        std::vector<kv::format_tile<T>> tiles;
        for (std::size_t i = 0; i < split.tile_count(); ++i) tiles.push_back(split.tile(0, i));
        return run(rc, std::span<const kv::format_tile<T>>(tiles), present, q, scale);
      }
      const auto t = c.tile(0, 0);
      return run(rc, std::span<const kv::format_tile<T>>(&t, 1), present, q, scale);
    }
    case storage::ring: {
      // Window 40 needs only the last 40 + q_len positions; the ring is filled step by step.
      kv::ring_cache<T> r(shape, 64, 17);
      for (std::size_t p = 0; p < n; p += 17) {
        const std::size_t m = std::min<std::size_t>(17, n - p);
        r.append(m);
        write(r, vals, p, p + m);
      }
      const auto tiles = r.range_tiles(0, r.first_position(), n);
      return run(rc, tiles.span(), present, q, scale);
    }
    case storage::blocks:
    case storage::forked:
    case storage::prefix: {
      kv::block_pool<T> pool(shape, 16, (n + 15) / 16 * 3 + 4);
      kv::block_table<T> table(pool);
      table.append(n);
      write(table, vals, 0, n);
      auto tiles_of = [](const kv::block_table<T>& t) {
        std::vector<kv::format_tile<T>> tiles;
        for (std::size_t i = 0; i < t.tile_count(); ++i) tiles.push_back(t.tile(0, i));
        return tiles;
      };
      if (s == storage::blocks)
        return run(rc, std::span<const kv::format_tile<T>>(tiles_of(table)), present, q, scale);
      if (s == storage::forked) {
        // A fork truncated into its last block, then rewritten (copy-on-write): the fork holds
        // the same values; the original's blocks are untouched by the fork's writes.
        auto fork = table.fork();
        const std::size_t cut = n > 3 ? n - 3 : 0;
        fork.truncate(cut);
        fork.append(n - cut);
        write(fork, vals, cut, n);
        if (n > 3) {
          kv_values other = make_values(n, rc.kv_heads, rc.dim, 999);
          auto scratch = table.fork();
          scratch.truncate(cut);
          scratch.append(n - cut);
          write(scratch, other, cut, n);  // copies, never writes into table's blocks
        }
        return run(rc, std::span<const kv::format_tile<T>>(tiles_of(fork)), present, q, scale);
      }
      // prefix: register the full blocks, attach a new table to them, append the rest.
      std::vector<kv::token_id> tokens(n);
      for (std::size_t i = 0; i < n; ++i) tokens[i] = static_cast<kv::token_id>(i * 7 % 101);
      kv::prefix_cache<T> cache(pool);
      cache.insert(table, tokens);
      kv::block_table<T> reuse(pool);
      const std::size_t hit = cache.attach(reuse, tokens);
      EXPECT_EQ(hit, (n - 1) / 16 * 16);
      reuse.append(n - hit);
      write(reuse, vals, hit, n);
      return run(rc, std::span<const kv::format_tile<T>>(tiles_of(reuse)), present, q, scale);
    }
  }
  return {};
}

// Caches of one quantized format, and of K and V in different formats (kv::mixed): quantized
// K with quantized or bf16 V, bf16 K (f32 scores) with quantized V.
using cache_formats =
    ::testing::Types<kv::q8_0, kv::q4_0, kv::mixed<kv::q8_0, kv::q4_0>,
                     kv::mixed<kv::q8_0, bfloat16>, kv::mixed<bfloat16, kv::q4_0>>;

template <class T>
class KvQuantFlash : public ::testing::Test {};
TYPED_TEST_SUITE(KvQuantFlash, cache_formats);

TYPED_TEST(KvQuantFlash, EqualsFlashOverTheDequantizedValuesWithTheQuantizedQuery) {
  using T = TypeParam;
  float worst = 0.0f;
  for (const run_case& rc : run_cases()) {
    const auto vals = make_values(rc.past + rc.q_len, rc.kv_heads, rc.dim, rc.past + rc.dim);
    const auto deq = stored<T>(vals);
    const auto q = random_values(rc.q_heads * rc.q_len * rc.dim, 5, 3.0f);
    // The present tile: the step's own K/V (f32, already rounded to T as the pipeline does).
    std::vector<float> pk(rc.kv_heads * rc.q_len * rc.dim), pv(pk.size());
    for (std::size_t h = 0; h < rc.kv_heads; ++h) {
      for (std::size_t i = 0; i < rc.q_len; ++i) {
        std::copy_n(deq.at(kv_part::k, rc.past + i, h), rc.dim, &pk[(h * rc.q_len + i) * rc.dim]);
        std::copy_n(deq.at(kv_part::v, rc.past + i, h), rc.dim, &pv[(h * rc.q_len + i) * rc.dim]);
      }
    }
    const kv_tile<float> present_tile{
        kv::make_kv_view<const float>(pk.data(), rc.kv_heads, rc.q_len, rc.dim, rc.q_len * rc.dim),
        kv::make_kv_view<const float>(pv.data(), rc.kv_heads, rc.q_len, rc.dim, rc.q_len * rc.dim),
        rc.past};
    const kv_tile<float>* present = rc.present ? &present_tile : nullptr;
    for (storage s : {storage::contiguous, storage::blocks, storage::split, storage::ring,
                      storage::forked, storage::prefix}) {
      if (s == storage::ring && rc.mask != run_case::window) continue;  // a ring holds a window
      SCOPED_TRACE(rc.label() + " " + name(s) + " " + kv::kv_format_name<T>());
      const auto expected =
          flash_over<float>(s, rc, deq, present, quantized_query<T>(q, rc.dim, scale_of(rc)), 1.0f);
      const auto got = flash_over<T>(s, rc, vals, present, q, scale_of(rc));
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], query_rounding_bound) << i;
        worst = std::max(worst, std::fabs(got[i] - expected[i]));
      }
      // Any storage of the same keys and tiling gives the same bits (the integer sums are exact).
      if (s == storage::blocks || s == storage::split || s == storage::forked) {
        const auto contiguous =
            flash_over<T>(storage::contiguous, rc, vals, present, q, scale_of(rc));
        for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], contiguous[i]) << i;
      }
    }
  }
  std::printf(
      "[ figure ] %s KV: max |flash - flash over the values with the quantized query| = %.3g\n",
      kv::kv_format_name<T>().c_str(), static_cast<double>(worst));
  EXPECT_GT(worst, 0.0f);  // different arithmetic: a zero would mean the f32 path ran
}

TYPED_TEST(KvQuantFlash, NearTheDoubleReferenceAtOddSizes) {
  using T = TypeParam;
  // The coarser part sets the bound (q4_0 keys or values: 0.3).
  const bool four_bit =
      std::same_as<kv::key_format_t<T>, kv::q4_0> || std::same_as<kv::value_format_t<T>, kv::q4_0>;
  const double tolerance = four_bit ? 0.3 : 0.02;
  double worst = 0;
  for (std::size_t q_len : {1u, 17u, 37u}) {
    for (std::size_t past : {1u, 17u, 37u, 600u}) {
      const std::size_t qh = 14, kh = 2, d = 64, total = past + q_len;
      const auto vals = make_values(total, kh, d, 31 * past + q_len);
      const auto q = random_values(qh * q_len * d, 6, 3.0f);
      kv::contiguous_cache<T> c({1, kh, d}, total);
      c.append(total);
      write(c, vals, 0, total);
      const auto t = c.tile(0, 0);
      std::vector<float> out(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      const attention_io io{dense_view<const float, 3>(q.data(), qh, q_len, d),
                            dense_view<float, 3>(out.data(), qh, q_len, d),
                            {},
                            scale};
      flash_attention(io, std::span<const kv::format_tile<T>>(&t, 1),
                      static_cast<const kv_tile<float>*>(nullptr), causal{past});
      std::vector<double> ref(out.size());
      const dense_view<const float, 3> kview(vals.k.data(), total, kh, d);
      const dense_view<const float, 3> vview(vals.v.data(), total, kh, d);
      // Reference over the unquantized values: (heads, len, D) views of the (len, heads, D) data.
      std::vector<float> kt(vals.k.size()), vt(vals.v.size());
      for (std::size_t p = 0; p < total; ++p)
        for (std::size_t h = 0; h < kh; ++h)
          for (std::size_t i = 0; i < d; ++i) {
            kt[(h * total + p) * d + i] = kview(p, h, i);
            vt[(h * total + p) * d + i] = vview(p, h, i);
          }
      reference_attention(dense_view<const float, 3>(q.data(), qh, q_len, d),
                          dense_view<const float, 3>(kt.data(), kh, total, d),
                          dense_view<const float, 3>(vt.data(), kh, total, d), causal{past}, scale,
                          dense_view<double, 3>(ref.data(), qh, q_len, d));
      for (std::size_t i = 0; i < out.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(out[i]) - ref[i]));
    }
  }
  std::printf("[ figure ] %s KV: max |flash - double reference over unquantized values| = %.4g\n",
              kv::kv_format_name<T>().c_str(), worst);
  EXPECT_LE(worst, tolerance);
  EXPECT_GT(worst, 0.0);  // quantized: not the exact values
}

TYPED_TEST(KvQuantFlash, PyramidOverQuantizedKv) {
  using T = TypeParam;
  // The pyramid variant's explicit mask over a quantized contiguous cache == over its values
  // (with the quantized query, up to rounding).
  const std::size_t kh = 2, qh = 4, d = 64, chunk = 16, past = 37;
  const auto vals = make_values(64, kh, d, 8);
  const auto deq = stored<T>(vals);
  const pyramid_plan plan(chunk, 64);
  const auto q = random_values(qh * chunk * d, 9);
  std::vector<float> pk(kh * chunk * d), pv(pk.size());
  for (std::size_t h = 0; h < kh; ++h)
    for (std::size_t i = 0; i < chunk; ++i) {
      std::copy_n(deq.at(kv_part::k, past + i, h), d, &pk[(h * chunk + i) * d]);
      std::copy_n(deq.at(kv_part::v, past + i, h), d, &pv[(h * chunk + i) * d]);
    }
  const kv_tile<float> present{kv::make_kv_view<const float>(pk.data(), kh, chunk, d, chunk * d),
                               kv::make_kv_view<const float>(pv.data(), kh, chunk, d, chunk * d),
                               past};
  // Full mask (chunk, max_past + chunk): the first `past` positions visible, the present causal.
  tensor<float, 2> full(chunk, plan.max_past() + chunk);
  for (std::size_t r = 0; r < chunk; ++r)
    for (std::size_t j = 0; j < plan.max_past() + chunk; ++j) {
      const bool visible = j < plan.max_past() ? j < past : j - plan.max_past() <= r;
      full.view()(r, j) = visible ? 0.0f : -INFINITY;
    }
  const pyramid_step step(plan, full.view(), past, chunk);
  auto run_pyramid = [&](auto& cache, const std::vector<float>& q, float scale) {
    cache.append(past);
    write(cache, deq, 0, past);
    const auto t = pyramid_past(cache, 0, step);
    std::vector<float> out(q.size());
    const attention_io io{dense_view<const float, 3>(q.data(), qh, chunk, d),
                          dense_view<float, 3>(out.data(), qh, chunk, d),
                          {},
                          scale};
    using tile_type = std::remove_cvref_t<decltype(t)>;
    pyramid_attention(io, std::span<const tile_type>(&t, 1), present, step);
    return out;
  };
  kv::contiguous_cache<T> quantized({1, kh, d}, 64);
  kv::contiguous_cache<float> plain({1, kh, d}, 64);
  const auto got = run_pyramid(quantized, q, 0.125f);
  const auto expected = run_pyramid(plain, quantized_query<T>(q, d, 0.125f), 1.0f);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], expected[i], query_rounding_bound) << i;
}

// ---- storage operations keep their meaning --------------------------------------------------

template <class T>
class KvQuantStorage : public ::testing::Test {};
using storage_formats = ::testing::Types<kv::q8_0, kv::q4_0, kv::mixed<kv::q8_0, kv::q4_0>>;
TYPED_TEST_SUITE(KvQuantStorage, storage_formats);

template <class T>
std::vector<std::byte> bytes_of(const kv::block_table<T>& t) {
  std::vector<std::byte> out;
  auto append = [&](const auto& view) {  // (heads, len, units) of K's or V's format
    const std::size_t unit_bytes = sizeof(*view.data_handle());
    for (std::size_t h = 0; h < view.extent(0); ++h) {
      const auto* p = reinterpret_cast<const std::byte*>(&view(h, 0, 0));
      out.insert(out.end(), p, p + view.extent(1) * view.extent(2) * unit_bytes);
    }
  };
  for (std::size_t i = 0; i < t.tile_count(); ++i) {
    const auto tile = t.tile(0, i);
    append(tile.k);
    append(tile.v);
  }
  return out;
}
TYPED_TEST(KvQuantStorage, ForkTruncateReleaseAndFailedAppend) {
  using T = TypeParam;
  const kv_shape shape{1, 2, 64};
  kv::block_pool<T> pool(shape, 16, 6);
  kv::block_table<T> table(pool);
  const auto vals = make_values(80, 2, 64, 4);
  table.append(40);
  write(table, vals, 0, 40);
  const auto before = bytes_of(table);
  {
    auto fork = table.fork();
    fork.truncate(35);  // into the shared last block: the next write copies it
    fork.append(5);
    write(fork, make_values(80, 2, 64, 77), 35, 40);
    EXPECT_EQ(bytes_of(table), before);  // the original's values are untouched
    EXPECT_NE(bytes_of(fork), before);
  }
  // A failed append (the pool has 6 blocks of 16: 3 used) changes nothing.
  npullm::testing::expect_error([&] { table.append(100); }, error_code::capacity_exhausted,
                                "block_pool");
  EXPECT_EQ(table.length(), 40u);
  EXPECT_EQ(bytes_of(table), before);
  // Truncate then rewrite the same values: the same bytes.
  table.truncate(20);
  table.append(20);
  write(table, vals, 20, 40);
  EXPECT_EQ(bytes_of(table), before);
  // release_before: the released block's tokens are gone, the rest keep their positions.
  table.release_before(16);
  EXPECT_EQ(table.first_position(), 16u);
  EXPECT_EQ(table.tile(0, 0).position, 16u);
  float row[64];
  kv::dequantize_row(&table.tile(0, 0).k(1, 0, 0), 64, row);
  auto expect = stored<T>(vals);
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(row[i], expect.at(kv_part::k, 16, 1)[i]);
}

TYPED_TEST(KvQuantStorage, ContiguousKeepsItsValuesAfterAFailedAppend) {
  using T = TypeParam;
  kv::contiguous_cache<T> c({2, 2, 64}, 32);
  c.append(20);
  const auto vals = make_values(20, 2, 64, 12);
  for (std::size_t pos = 0; pos < 20; ++pos)
    for (std::size_t h = 0; h < 2; ++h)
      kv::quantize_row(vals.at(kv_part::v, pos, h), 64, &c.token_kv(pos, 1, kv::v_part)(h, 0));
  npullm::testing::expect_error([&] { c.append(13); }, error_code::capacity_exhausted,
                                "KV cache is full");
  EXPECT_EQ(c.length(), 20u);
  const auto expect = stored<T>(vals);
  float row[64];
  kv::dequantize_row(&c.range_tile(1, 19, 1).v(1, 0, 0), 64, row);
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(row[i], expect.at(kv_part::v, 19, 1)[i]);
}

TEST(KvMixed, EachPartInItsOwnUnits) {
  // K at 8 bits and V at 4: 34 + 18 bytes per 32 elements of a head row, laid out
  // [layers][K|V][kv_heads, capacity, units] in every cache.
  using F = kv::mixed<kv::q8_0, kv::q4_0>;
  const kv_shape shape{3, 2, 64};
  kv::contiguous_cache<F> c(shape, 20);
  EXPECT_EQ(c.storage_bytes(), 3u * 2u * 20u * (2u * 34u + 2u * 18u));
  kv::ring_cache<F> r(shape, 16, 4);
  EXPECT_EQ(r.storage_bytes(), 3u * 2u * r.capacity() * (2u * 34u + 2u * 18u));
  kv::block_pool<F> pool(shape, 16, 5);
  EXPECT_EQ(pool.storage_bytes(), 3u * 2u * 16u * 5u * (2u * 34u + 2u * 18u));
  // Layer 1's V starts after layer 0's K and V and layer 1's K.
  c.append(1);
  const auto* base = reinterpret_cast<const std::byte*>(c.data());
  EXPECT_EQ(reinterpret_cast<const std::byte*>(&c.token_kv(0, 1, kv::v_part)(0, 0)) - base,
            static_cast<std::ptrdiff_t>(2 * 20 * (2 * 34 + 2 * 18) + 2 * 20 * 2 * 34));
  // head_dim must suit both parts: 48 is no multiple of q4_0's group (V), and the error says so.
  npullm::testing::expect_error(
      [] {
        kv::contiguous_cache<kv::mixed<bfloat16, kv::q4_0>>({1, 2, 48}, 8);
      },
      error_code::unsupported, "q4_0");
  npullm::testing::expect_error(
      [] {
        kv::block_pool<kv::mixed<kv::q8_0, float>>({1, 2, 48}, 16, 2);
      },
      error_code::unsupported, "q8_0");
}

TEST(KvMixed, LadderedCacheCarriesEachPartUp) {
  // Growing to the next rung copies every valid unit of K and V in its own format: the values
  // read back equal those written, and the tile has the larger cache's layout.
  using F = kv::mixed<kv::q8_0, kv::q4_0>;
  kv::laddered_cache<F> c({2, 2, 64}, {16, 48}, 10);
  EXPECT_EQ(c.capacity(), 16u);
  const auto vals = make_values(30, 2, 64, 21);
  c.append(10);
  for (std::size_t pos = 0; pos < 10; ++pos) {
    for (std::size_t layer = 0; layer < 2; ++layer) {
      auto ks = c.cache().token_kv(pos, layer, kv::k_part);
      auto vs = c.cache().token_kv(pos, layer, kv::v_part);
      for (std::size_t h = 0; h < 2; ++h) {
        kv::quantize_row(vals.at(kv_part::k, pos, h), 64, &ks(h, 0));
        kv::quantize_row(vals.at(kv_part::v, pos, h), 64, &vs(h, 0));
      }
    }
  }
  c.append(20);  // 30 > 16: the next rung
  EXPECT_EQ(c.capacity(), 48u);
  const auto expect = stored<F>(vals);
  float row[64];
  for (std::size_t layer = 0; layer < 2; ++layer) {
    const auto t = c.cache().range_tile(layer, 0, 10);
    for (std::size_t pos = 0; pos < 10; ++pos) {
      for (std::size_t h = 0; h < 2; ++h) {
        kv::dequantize_row(&t.k(h, pos, 0), 64, row);
        for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(row[i], expect.at(kv_part::k, pos, h)[i]);
        kv::dequantize_row(&t.v(h, pos, 0), 64, row);
        for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(row[i], expect.at(kv_part::v, pos, h)[i]);
      }
    }
  }
}

}  // namespace
