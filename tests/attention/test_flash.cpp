// Flash attention against the double-precision reference: every q_len and kv_len of the issue,
// head dims 64 and 128, 14/2 and 8/8 heads, every mask, every KV source (contiguous, block
// tables with blocks of 1, 16 and 256, a split-into-blocks view; with and without a present
// tile), every KV dtype. Tolerances:
//   f32 KV       max |flash - reference| <= 1e-5
//   f16 / bf16   max |flash - reference over the stored values| <= 1e-5 (the kernel itself),
//                and max |flash - reference over the unrounded values| <= 2x the error of the
//                same attention computed naively in that dtype (every product, sum, exp and
//                division rounded to it). The figures are printed.
// Logit soft-capping (attention_io::softcap, Gemma 2) is checked the same way against a double
// reference that caps the scaled scores before the mask (softcapped_reference), with the
// f32 tolerance widened by the cap (flash_case::tolerance).
#include <gtest/gtest.h>

#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "npullm/attention/flash.hpp"
#include "npullm/attention/reference.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"

namespace {

using namespace npullm;
using namespace npullm::attention;
using npullm::kv::kv_part;
using npullm::kv::kv_shape;
using npullm::kv::kv_tile;

enum class source_kind { contiguous, block1, block16, block256, split16 };
enum class mask_kind {
  none,
  causal,
  padding_left,
  padding_right,
  window,
  explicit_bias,
  causal_padding
};
enum class dtype_kind { f32, f16, bf16 };

const char* name(source_kind s) {
  constexpr const char* n[] = {"contiguous", "block1", "block16", "block256", "split16"};
  return n[static_cast<int>(s)];
}
const char* name(mask_kind m) {
  constexpr const char* n[] = {"none",   "causal",   "padding_left",  "padding_right",
                               "window", "explicit", "causal_padding"};
  return n[static_cast<int>(m)];
}
const char* name(dtype_kind d) {
  constexpr const char* n[] = {"f32", "f16", "bf16"};
  return n[static_cast<int>(d)];
}

struct flash_case {
  std::size_t q_len, past_len, dim, q_heads, kv_heads;
  mask_kind mask;
  source_kind source;
  dtype_kind dtype;
  bool present;
  float softcap = 0.0f;  // attention_io::softcap: > 0 caps the scaled scores at +-softcap
  float q_gain = 1.0f;   // queries drawn from [-q_gain, q_gain] (large scores for the cap)
  std::string label() const {
    char cap[48] = "";
    if (softcap > 0) std::snprintf(cap, sizeof cap, " cap%g gain%g", softcap, q_gain);
    // (A stream: GCC 12 warns, wrongly, -Wrestrict on "literal" + std::string.)
    std::ostringstream out;
    out << "q" << q_len << " past" << past_len << " d" << dim << " h" << q_heads << "/" << kv_heads
        << " " << name(mask) << " " << name(source) << " " << name(dtype)
        << (present ? " +present" : "") << cap;
    return out.str();
  }
  std::size_t total() const { return past_len + (present ? q_len : 0); }
  // Largest max |flash - reference over the stored values| allowed: 1e-5, or 8 eps cap with a cap
  // (eps = 2^-23; 4.8e-5 at cap 50). The cap test draws queries in proportion to the cap, so the
  // scores, and the f32 dot products' error with them, grow with it (the tanh, of slope <= 1,
  // passes that error on); the kernel's tanh, 1 - 2 / (exp(2s / cap) + 1) in f32, adds an
  // absolute error of a few ulp of 1 times the cap. A score error e moves the output (values in
  // [-1, 1]) by at most about 2e. Measured: at most 1.4 eps cap (native, avx2, x86-64), about the
  // same with std::tanh in the kernel (the dot products dominate).
  double tolerance() const {
    constexpr double eps = std::numeric_limits<float>::epsilon();
    return softcap > 0 ? std::max(1e-5, 8 * eps * static_cast<double>(softcap)) : 1e-5;
  }
};

// Random inputs, and the KV as the kernel sees it (past rounded to the storage type).
struct inputs {
  tensor<float, 3> q;               // (q_heads, q_len, D)
  tensor<float, 3> k, v;            // (kv_heads, total, D) unrounded
  tensor<float, 3> k_seen, v_seen;  // (kv_heads, total, D) as stored (past rounded)
  tensor<float, 2> bias;            // (q_len, total) for the explicit mask
};

template <class T>
inputs make_inputs(const flash_case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const std::size_t total = c.total();
  inputs in{tensor<float, 3>(c.q_heads, c.q_len, c.dim), tensor<float, 3>(c.kv_heads, total, c.dim),
            tensor<float, 3>(c.kv_heads, total, c.dim),  tensor<float, 3>(c.kv_heads, total, c.dim),
            tensor<float, 3>(c.kv_heads, total, c.dim),  tensor<float, 2>(c.q_len, total)};
  for (std::size_t i = 0; i < in.q.size(); ++i) in.q.data()[i] = c.q_gain * u(rng);
  for (std::size_t h = 0; h < c.kv_heads; ++h) {
    for (std::size_t j = 0; j < total; ++j) {
      for (std::size_t d = 0; d < c.dim; ++d) {
        const float kv_k = u(rng), kv_v = u(rng);
        in.k.view()(h, j, d) = kv_k;
        in.v.view()(h, j, d) = kv_v;
        const bool stored = j < c.past_len;  // the present tile stays f32
        in.k_seen.view()(h, j, d) = stored ? to_float(from_float<T>(kv_k)) : kv_k;
        in.v_seen.view()(h, j, d) = stored ? to_float(from_float<T>(kv_v)) : kv_v;
      }
    }
  }
  for (std::size_t i = 0; i < c.q_len; ++i) {
    for (std::size_t j = 0; j < total; ++j) {
      in.bias.view()(i, j) = (rng() % 10 < 3) ? -INFINITY : 0.0f;
    }
  }
  return in;
}

// Calls fn(mask) with the case's mask.
template <class Fn>
void with_mask(const flash_case& c, const inputs& in, Fn&& fn) {
  const std::size_t total = c.total();
  const std::size_t q_offset = total >= c.q_len ? total - c.q_len : 0;
  switch (c.mask) {
    case mask_kind::none: return fn(no_mask{});
    case mask_kind::causal: return fn(causal{q_offset});
    case mask_kind::padding_left: return fn(padding::left(total / 3, total));
    case mask_kind::padding_right: return fn(padding::right(total - total / 4));
    case mask_kind::window: return fn(sliding_window{17, q_offset});
    case mask_kind::explicit_bias: return fn(explicit_mask{in.bias.view()});
    case mask_kind::causal_padding:
      return fn(all_of<causal, padding>{causal{q_offset}, padding::left(total / 5, total)});
  }
}

// Runs flash attention for the case over the requested source; returns out (and lse).
template <class T, class Policy = serial>
void run_flash(const flash_case& c, const inputs& in, tensor<float, 3>& out, tensor<float, 2>& lse,
               const Policy& policy = {}) {
  const kv_shape shape{1, c.kv_heads, c.dim};
  const std::size_t total = c.total();
  // Present tile: (kv_heads, q_len, D) views of the last q_len keys of the unrounded KV.
  std::optional<kv_tile<float>> present;
  if (c.present) {
    const std::size_t stride = total * c.dim;
    present = kv_tile<float>{kv::make_kv_view<const float>(in.k.data() + c.past_len * c.dim,
                                                           c.kv_heads, c.q_len, c.dim, stride),
                             kv::make_kv_view<const float>(in.v.data() + c.past_len * c.dim,
                                                           c.kv_heads, c.q_len, c.dim, stride),
                             c.past_len};
  }
  auto write = [&](auto& dst) {
    for (std::size_t j = 0; j < c.past_len; ++j) {
      auto kk = dst.token_kv(j, 0, kv_part::k);
      auto vv = dst.token_kv(j, 0, kv_part::v);
      for (std::size_t h = 0; h < c.kv_heads; ++h) {
        for (std::size_t d = 0; d < c.dim; ++d) {
          kk(h, d) = from_float<T>(in.k.view()(h, j, d));
          vv(h, d) = from_float<T>(in.v.view()(h, j, d));
        }
      }
    }
  };
  const attention_io io{.q = in.q.view(),
                        .out = out.view(),
                        .lse = lse.view(),
                        .scale = 1.0f / std::sqrt(static_cast<float>(c.dim)),
                        .softcap = c.softcap};
  const kv_tile<float>* pres = present ? &*present : nullptr;
  with_mask(c, in, [&](const auto& mask) {
    if (c.source == source_kind::contiguous || c.source == source_kind::split16) {
      kv::contiguous_cache<T> cache(shape, std::max<std::size_t>(c.past_len, 1));
      cache.append(c.past_len);
      write(cache);
      if (c.source == source_kind::contiguous) {
        flash_attention(io, cache, 0, pres, mask, policy);
      } else {
        flash_attention(io, cache.split_into_blocks(16), 0, pres, mask, policy);
      }
    } else {
      const std::size_t bs = c.source == source_kind::block1    ? 1
                             : c.source == source_kind::block16 ? 16
                                                                : 256;
      kv::block_pool<T> pool(shape, bs, c.past_len / bs + 2);
      kv::block_table<T> table(pool);
      table.append(c.past_len);
      write(table);
      flash_attention(io, table, 0, pres, mask, policy);
    }
  });
  (void)total;
}

double max_abs_diff(const tensor<float, 3>& a, const tensor<double, 3>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a.data()[i] - b.data()[i]));
  return m;
}

// The same attention computed naively in T: every intermediate rounded to T.
template <class T>
tensor<double, 3> naive_in_dtype(const flash_case& c, const inputs& in) {
  auto r = [](double x) {
    return static_cast<double>(to_float(from_float<T>(static_cast<float>(x))));
  };
  // q, k, v rounded to T once (flat, their tensors' layouts), then every operation rounded.
  auto rounded = [&](const tensor<float, 3>& t) {
    std::vector<double> x(t.size());
    for (std::size_t e = 0; e < x.size(); ++e) x[e] = r(t.data()[e]);
    return x;
  };
  const std::vector<double> q = rounded(in.q), k = rounded(in.k), v = rounded(in.v);
  const std::size_t total = c.total(), group = c.q_heads / c.kv_heads, dim = c.dim;
  tensor<double, 3> out(c.q_heads, c.q_len, c.dim);
  const double scale = r(1.0 / std::sqrt(static_cast<double>(c.dim)));
  with_mask(c, in, [&](const auto& mask) {
    std::vector<double> s(total), o(dim);
    for (std::size_t h = 0; h < c.q_heads; ++h) {
      const std::size_t hk = h / group;
      for (std::size_t i = 0; i < c.q_len; ++i) {
        const double* qi = q.data() + (h * c.q_len + i) * dim;
        double m = -INFINITY;
        for (std::size_t j = 0; j < total; ++j) {
          if (!mask.visible(i, j)) {
            s[j] = -INFINITY;
            continue;
          }
          const double* kj = k.data() + (hk * total + j) * dim;
          double acc = 0;
          for (std::size_t d = 0; d < dim; ++d) acc = r(acc + r(qi[d] * kj[d]));
          s[j] = r(acc * scale);
          if (c.softcap > 0) s[j] = r(c.softcap * r(std::tanh(s[j] / c.softcap)));
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (std::size_t j = 0; j < total; ++j) {
          if (s[j] == -INFINITY) continue;
          const double p = r(std::exp(s[j] - m));
          l = r(l + p);
          const double* vj = v.data() + (hk * total + j) * dim;
          for (std::size_t d = 0; d < dim; ++d) o[d] = r(o[d] + r(p * vj[d]));
        }
        for (std::size_t d = 0; d < dim; ++d) out.view()(h, i, d) = r(o[d] / l);
      }
    }
  });
  return out;
}

// reference_attention (attention/reference.hpp) with logit soft-capping, as
// attention_io::softcap specifies it: each scaled score s becomes cap tanh(s / cap), then the
// mask hides keys (-inf). cap 0 leaves the scores alone: then it is the header's loop, which
// Flash.SoftcapReferenceWithoutCapIsTheReference checks.
//   q, out (q_heads, q_len, D); k, v (kv_heads, kv_len, D); lse (q_heads, q_len)
template <class Q, class K, class V, class Mask>
void softcapped_reference(const Q& q, const K& k, const V& v, const Mask& mask, double scale,
                          double cap, dense_view<double, 3> out, dense_view<double, 2> lse) {
  const std::size_t q_heads = q.extent(0), q_len = q.extent(1), dim = q.extent(2);
  const std::size_t kv_len = k.extent(1), group = q_heads / k.extent(0);
  std::vector<double> s(kv_len);
  for (std::size_t h = 0; h < q_heads; ++h) {
    const std::size_t hk = h / group;
    for (std::size_t i = 0; i < q_len; ++i) {
      double m = -INFINITY;
      for (std::size_t j = 0; j < kv_len; ++j) {
        double dot = 0;
        for (std::size_t d = 0; d < dim; ++d) {
          dot += static_cast<double>(q(h, i, d)) * static_cast<double>(k(hk, j, d));
        }
        s[j] = dot * scale;
        if (cap > 0) s[j] = cap * std::tanh(s[j] / cap);
        if (!mask.visible(i, j)) s[j] = -INFINITY;
        m = std::max(m, s[j]);
      }
      for (std::size_t d = 0; d < dim; ++d) out(h, i, d) = 0.0;
      if (m == -INFINITY) {
        lse(h, i) = m;
        continue;
      }
      double l = 0;
      for (std::size_t j = 0; j < kv_len; ++j) {
        if (s[j] == -INFINITY) continue;
        const double p = std::exp(s[j] - m);
        l += p;
        for (std::size_t d = 0; d < dim; ++d) out(h, i, d) += p * static_cast<double>(v(hk, j, d));
      }
      for (std::size_t d = 0; d < dim; ++d) out(h, i, d) /= l;
      lse(h, i) = m + std::log(l);
    }
  }
}

tensor<double, 3> reference(const flash_case& c, const inputs& in, bool seen,
                            tensor<double, 2>* lse = nullptr) {
  tensor<double, 3> out(c.q_heads, c.q_len, c.dim);
  tensor<double, 2> l(c.q_heads, c.q_len);
  with_mask(c, in, [&](const auto& mask) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
    if (c.softcap > 0) {
      softcapped_reference(in.q.view(), seen ? in.k_seen.view() : in.k.view(),
                           seen ? in.v_seen.view() : in.v.view(), mask, scale, c.softcap,
                           out.view(), l.view());
    } else {
      reference_attention(in.q.view(), seen ? in.k_seen.view() : in.k.view(),
                          seen ? in.v_seen.view() : in.v.view(), mask, scale, out.view(), l.view());
    }
  });
  if (lse) *lse = std::move(l);
  return out;
}

template <class T>
void check_case(const flash_case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.label());
  const inputs in = make_inputs<T>(c, seed);
  tensor<float, 3> out(c.q_heads, c.q_len, c.dim);
  tensor<float, 2> lse(c.q_heads, c.q_len);
  run_flash<T>(c, in, out, lse);
  tensor<double, 2> ref_lse;
  const auto ref = reference(c, in, true, &ref_lse);
  const double err = max_abs_diff(out, ref);
  EXPECT_LE(err, c.tolerance()) << "flash vs reference over the stored values";
  if (c.softcap > 0) {
    std::printf("  %-70s flash err %.2e (tolerance %.1e)\n", c.label().c_str(), err, c.tolerance());
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double want = ref_lse.data()[i];
    if (std::isinf(want)) {
      ASSERT_EQ(lse.data()[i], -INFINITY);
    } else {
      ASSERT_NEAR(lse.data()[i], want, c.tolerance() * std::max(1.0, std::fabs(want)));
    }
  }
  if constexpr (!std::is_same_v<T, float>) {
    const auto exact = reference(c, in, false);
    const double flash_err = max_abs_diff(out, exact);
    const double naive_err = max_abs_diff(
        [&] {
          tensor<float, 3> f(c.q_heads, c.q_len, c.dim);
          const auto n = naive_in_dtype<T>(c, in);
          for (std::size_t i = 0; i < f.size(); ++i) f.data()[i] = static_cast<float>(n.data()[i]);
          return f;
        }(),
        exact);
    EXPECT_LE(flash_err, 2 * naive_err + 1e-7);
    std::printf("  %-60s flash err %.2e, naive %s err %.2e\n", c.label().c_str(), flash_err,
                name(c.dtype), naive_err);
  }
}

void check(const flash_case& c, std::uint64_t seed = 1) {
  switch (c.dtype) {
    case dtype_kind::f32: return check_case<float>(c, seed);
    case dtype_kind::f16: return check_case<float16>(c, seed);
    case dtype_kind::bf16: return check_case<bfloat16>(c, seed);
  }
}

// Every q_len with every kv_len; head dims, head shapes, dtypes, masks and sources rotate so
// each value meets many others. The two largest pairs (64 and 300 queries over 4097 keys) are
// left out to keep the double-precision reference fast; 4097 keys are covered with 1, 7, 17.
TEST(Flash, MatchesReferenceAcrossSizes) {
  const std::size_t q_lens[] = {1, 7, 17, 64, 300};
  const std::size_t kv_lens[] = {1, 17, 37, 256, 4097};
  std::size_t idx = 0;
  for (std::size_t q_len : q_lens) {
    for (std::size_t kv_len : kv_lens) {
      if (q_len >= 64 && kv_len == 4097) continue;
      flash_case c{q_len,
                   kv_len,
                   idx % 2 ? 128u : 64u,
                   (idx / 2) % 2 ? 8u : 14u,
                   (idx / 2) % 2 ? 8u : 2u,
                   static_cast<mask_kind>(idx % 7),
                   static_cast<source_kind>(idx % 5),
                   static_cast<dtype_kind>(idx % 3),
                   idx % 4 != 0};
      // Causal-style masks need every query's own position among the keys.
      const bool causal_like = c.mask == mask_kind::causal || c.mask == mask_kind::window ||
                               c.mask == mask_kind::causal_padding;
      if (causal_like && kv_len < q_len) c.present = true;
      if (q_len * (c.total()) * c.dim * c.q_heads > 150'000'000) c.dim = 64;
      check(c, idx + 100);
      ++idx;
    }
  }
}

// Every mask x every source x every dtype, with and without the present tile.
TEST(Flash, EveryMaskSourceAndDtype) {
  for (int m = 0; m < 7; ++m) {
    for (int s = 0; s < 5; ++s) {
      for (int d = 0; d < 3; ++d) {
        for (bool present : {false, true}) {
          check({17, 37, 64, 14, 2, static_cast<mask_kind>(m), static_cast<source_kind>(s),
                 static_cast<dtype_kind>(d), present});
        }
      }
    }
  }
}

TEST(Flash, HeadDim128EveryDtype) {
  for (int d = 0; d < 3; ++d) {
    check({7, 256, 128, 8, 8, mask_kind::causal, source_kind::block16, static_cast<dtype_kind>(d),
           true});
    check({1, 4097, 128, 32, 8, mask_kind::none, source_kind::block256, static_cast<dtype_kind>(d),
           false});
  }
}

template <class Policy>
tensor<float, 3> run_with(const flash_case& c, const inputs& in, const Policy& p) {
  tensor<float, 3> out(c.q_heads, c.q_len, c.dim);
  tensor<float, 2> lse(c.q_heads, c.q_len);
  run_flash<float16>(c, in, out, lse, p);
  return out;
}

bool same_bits(const tensor<float, 3>& a, const tensor<float, 3>& b) {
  return std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Item boundaries do not depend on the thread count: results are identical, bit for bit.
TEST(Flash, SameResultForAnyThreadCountAndRun) {
  const flash_case decode{
      1, 4097, 64, 14, 2, mask_kind::causal, source_kind::block16, dtype_kind::f16, true};
  const flash_case prefill{
      64, 256, 64, 14, 2, mask_kind::causal, source_kind::contiguous, dtype_kind::f16, true};
  for (const auto& c : {decode, prefill}) {
    const inputs in = make_inputs<float16>(c, 5);
    const auto serial_out = run_with(c, in, serial{});
    thread_pool two(2), three(3);
    EXPECT_TRUE(same_bits(serial_out, run_with(c, in, two))) << c.label();
    EXPECT_TRUE(same_bits(serial_out, run_with(c, in, three))) << c.label();
    EXPECT_TRUE(same_bits(run_with(c, in, two), run_with(c, in, two))) << c.label();
  }
}

// Contiguous, block and split sources agree (f32).
TEST(Flash, SourcesAgree) {
  for (std::size_t q_len : {1u, 17u}) {
    flash_case c{q_len,           700, 64, 14, 2, mask_kind::causal, source_kind::contiguous,
                 dtype_kind::f32, true};
    const inputs in = make_inputs<float>(c, 9);
    tensor<float, 3> base(c.q_heads, c.q_len, c.dim), other(c.q_heads, c.q_len, c.dim);
    tensor<float, 2> lse(c.q_heads, c.q_len);
    run_flash<float>(c, in, base, lse);
    for (source_kind s :
         {source_kind::block1, source_kind::block16, source_kind::block256, source_kind::split16}) {
      c.source = s;
      run_flash<float>(c, in, other, lse);
      double diff = 0;
      for (std::size_t i = 0; i < base.size(); ++i)
        diff = std::max<double>(diff, std::fabs(base.data()[i] - other.data()[i]));
      EXPECT_LE(diff, 1e-6) << name(s);
    }
  }
}

TEST(Flash, FullyMaskedRowsGiveZeros) {
  const flash_case c{
      5, 40, 64, 4, 2, mask_kind::explicit_bias, source_kind::block16, dtype_kind::f32, false};
  inputs in = make_inputs<float>(c, 3);
  for (std::size_t j = 0; j < 40; ++j) in.bias.view()(2, j) = -INFINITY;  // row 2 sees nothing
  tensor<float, 3> out(4, 5, 64);
  tensor<float, 2> lse(4, 5);
  run_flash<float>(c, in, out, lse);
  for (std::size_t h = 0; h < 4; ++h) {
    EXPECT_EQ(lse.view()(h, 2), -INFINITY);
    for (std::size_t d = 0; d < 64; ++d) ASSERT_EQ(out.view()(h, 2, d), 0.0f);
    EXPECT_TRUE(std::isfinite(lse.view()(h, 1)));
  }
  // No key visible to anyone (empty padding): all zeros, no NaN.
  kv::contiguous_cache<float> cache(kv_shape{1, 2, 64}, 8);
  cache.append(8);
  flash_attention(attention_io{in.q.view(), out.view(), lse.view(), 1.0f}, cache, 0,
                  static_cast<const kv_tile<float>*>(nullptr), padding{3, 3});
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.data()[i], 0.0f);
}

TEST(Flash, ExtremeLogitsStayFinite) {
  const flash_case c{7,   300, 64, 8, 8, mask_kind::causal, source_kind::block16, dtype_kind::f32,
                     true};
  inputs in = make_inputs<float>(c, 11);
  // Scores up to about +-1e4 (|q . k| <= D and scale below).
  tensor<float, 3> out(8, 7, 64);
  tensor<float, 2> lse(8, 7);
  kv::contiguous_cache<float> cache(kv_shape{1, 8, 64}, 300);
  cache.append(300);
  for (std::size_t j = 0; j < 300; ++j) {
    for (std::size_t h = 0; h < 8; ++h) {
      for (std::size_t d = 0; d < 64; ++d) {
        cache.token_kv(j, 0, kv_part::k)(h, d) = in.k.view()(h, j, d);
        cache.token_kv(j, 0, kv_part::v)(h, d) = in.v.view()(h, j, d);
      }
    }
  }
  const float scale = 1e4f / 16.0f;
  flash_attention(attention_io{in.q.view(), out.view(), lse.view(), scale}, cache, 0,
                  static_cast<const kv_tile<float>*>(nullptr), causal{293});
  tensor<double, 3> ref(8, 7, 64);
  reference_attention(in.q.view(), in.k.view(), in.v.view(), causal{293}, scale, ref.view());
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out.data()[i]));
    ASSERT_NEAR(out.data()[i], ref.data()[i], 2e-3);
  }
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_TRUE(std::isfinite(lse.data()[i]));
}

// Gemma 2's attention logit soft-capping: flash with attention_io::softcap against the double
// reference that caps the scaled scores before the mask, caps 2 (strong) and 50 (Gemma 2's),
// causal and sliding-window masks, query lengths 1 (decode; 700 past keys: split into parts),
// 17 and 37 (prefill) after past keys, with the present tile. Head shapes rotate over 8/4 with
// D 256 (Gemma 2 2B), 14/2 and 16/8 (GQA: K transposed, rows in blocks) and 8/8 (MHA: one row
// per KV head in decode, the dot-product path); sources and dtypes rotate too. Queries are drawn
// from [-1.5 cap, 1.5 cap], so the scaled scores have a spread of about cap / 2 and reach ~3 cap:
// the cap bends or saturates many of them. The result without the cap must differ by far more
// than the tolerance (a kernel ignoring the cap fails).
TEST(Flash, SoftcapMatchesReference) {
  struct heads {
    std::size_t dim, q_heads, kv_heads;
  };
  const heads shapes[] = {{256, 8, 4}, {64, 14, 2}, {64, 8, 8}, {128, 16, 8}};
  const source_kind sources[] = {source_kind::contiguous, source_kind::block16,
                                 source_kind::split16, source_kind::block1};
  std::size_t idx = 0;
  for (float cap : {2.0f, 50.0f}) {
    for (mask_kind mask : {mask_kind::causal, mask_kind::window}) {
      for (std::size_t q_len : {1u, 17u, 37u}) {
        const heads h = shapes[idx % std::size(shapes)];
        const std::size_t past = q_len == 1 ? 700 : (q_len == 17 ? 37 : 300);
        const flash_case c{q_len,
                           past,
                           h.dim,
                           h.q_heads,
                           h.kv_heads,
                           mask,
                           sources[idx % std::size(sources)],
                           static_cast<dtype_kind>(idx % 3),
                           true,
                           cap,
                           1.5f * cap};
        check(c, idx + 200);
        // Without the cap, the same inputs (f32 KV): far from the capped result.
        const inputs in = make_inputs<float>(c, idx + 200);
        tensor<float, 3> capped(c.q_heads, c.q_len, c.dim), plain(c.q_heads, c.q_len, c.dim);
        tensor<float, 2> lse(c.q_heads, c.q_len);
        run_flash<float>(c, in, capped, lse);
        flash_case uncapped = c;
        uncapped.softcap = 0;
        run_flash<float>(uncapped, in, plain, lse);
        double diff = 0;
        for (std::size_t i = 0; i < capped.size(); ++i)
          diff = std::max<double>(diff, std::fabs(capped.data()[i] - plain.data()[i]));
        EXPECT_GT(diff, 100 * c.tolerance()) << c.label() << ": the cap changed nothing";
        std::printf("  %-70s without the cap: max |diff| %.2e\n", c.label().c_str(), diff);
        ++idx;
      }
    }
  }
}

// The soft-capping reference without a cap is reference_attention's loop (same results), so
// the cap is the only thing it adds.
TEST(Flash, SoftcapReferenceWithoutCapIsTheReference) {
  for (mask_kind mask : {mask_kind::causal, mask_kind::window, mask_kind::explicit_bias}) {
    const flash_case c{17,   37, 64, 14, 2, mask, source_kind::contiguous, dtype_kind::f32,
                       true, 0,  3};
    const inputs in = make_inputs<float>(c, 7);
    const auto want = reference(c, in, false);
    tensor<double, 3> got(c.q_heads, c.q_len, c.dim);
    tensor<double, 2> lse(c.q_heads, c.q_len);
    with_mask(c, in, [&](const auto& m) {
      softcapped_reference(in.q.view(), in.k.view(), in.v.view(), m,
                           1.0 / std::sqrt(static_cast<double>(c.dim)), 0.0, got.view(),
                           lse.view());
    });
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got.data()[i], want.data()[i], 1e-12) << name(mask) << " at " << i;
    }
  }
}

TEST(Flash, LongDecodeMatchesReference) {
  check({1, 65535, 64, 14, 2, mask_kind::causal, source_kind::contiguous, dtype_kind::f16, true});
}

using npullm::testing::expect_error;

TEST(Flash, BadInputNamesTheShapes) {
  tensor<float, 3> q(6, 2, 64), out(6, 2, 64), q_odd(6, 2, 40), out_odd(6, 2, 40);
  kv::contiguous_cache<float> four_heads(kv_shape{1, 4, 64}, 8), dim32(kv_shape{1, 2, 32}, 8),
      ok(kv_shape{1, 2, 64}, 8);
  four_heads.append(8);
  dim32.append(8);
  ok.append(3);
  const kv_tile<float>* none = nullptr;
  expect_error(
      [&] {
        flash_attention(attention_io{q.view(), out.view()}, four_heads, 0, none, no_mask{});
      },
      error_code::invalid_shape, "6 query heads are not a multiple of 4 KV heads");
  expect_error(
      [&] {
        flash_attention(attention_io{q.view(), out.view()}, dim32, 0, none, no_mask{});
      },
      error_code::invalid_shape, "head_dim 64");
  expect_error(
      [&] {
        flash_attention(attention_io{q.view(), out.view()}, ok, 0, none, causal{5});
      },
      error_code::invalid_shape, "KV has 3 keys, the mask needs 7");
  expect_error(
      [&] {
        flash_attention(attention_io{q_odd.view(), out_odd.view()}, ok, 0, none, no_mask{});
      },
      error_code::unsupported, "head_dim 40");
  tensor<float, 3> wrong_out(6, 3, 64);
  expect_error(
      [&] {
        flash_attention(attention_io{q.view(), wrong_out.view()}, ok, 0, none, no_mask{});
      },
      error_code::invalid_shape, "out [6, 3, 64] differs from q [6, 2, 64]");
  tensor<float, 3> pk(2, 1, 64), pv(2, 1, 64);  // present tile of 1 key for 2 queries
  const kv_tile<float> short_present{kv::make_kv_view<const float>(pk.data(), 2, 1, 64, 64),
                                     kv::make_kv_view<const float>(pv.data(), 2, 1, 64, 64), 3};
  expect_error(
      [&] {
        flash_attention(attention_io{q.view(), out.view()}, ok, 0, &short_present, no_mask{});
      },
      error_code::invalid_shape, "present tile has 1 keys for 2 queries");
  // softcap: 0 is off; otherwise finite and > 0 (out untouched when refused).
  ok.append(5);
  for (float cap :
       {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] = 7.0f;
    attention_io io{q.view(), out.view()};
    io.softcap = cap;
    expect_error([&] { flash_attention(io, ok, 0, none, no_mask{}); }, error_code::invalid_argument,
                 "must be 0 (off) or finite and > 0");
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.data()[i], 7.0f);
  }
}

}  // namespace
