// rope_table's variants against double-precision references written here from the published
// definitions (HF transformers' modeling_rope_utils: default, linear, dynamic NTK, llama3, yarn,
// longrope), at positions 0, 1, 17, 37 and 8191; apply_rope with a partial rotary dim and a
// magnitude factor; bad parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "npullm/core/tensor.hpp"
#include "npullm/ops/rope.hpp"

namespace {

using namespace npullm;
using ops::rope_kind;
using ops::rope_scaling;
using ops::rope_table;

constexpr double pi = std::numbers::pi;
const std::vector<std::size_t> positions = {0, 1, 17, 37, 8191};
constexpr std::size_t table_len = 8192;

// theta^(-2i/d) for i < d/2, written as exp(-(2i/d) ln theta).
std::vector<double> plain(double theta, std::size_t d) {
  std::vector<double> f;
  for (std::size_t i = 0; 2 * i < d; ++i)
    f.push_back(std::exp(-static_cast<double>(2 * i) / static_cast<double>(d) * std::log(theta)));
  return f;
}

// The table's f_i, a cos(p f_i) and a sin(p f_i) against the expected frequencies and magnitude.
void expect_table(const rope_table& t, const std::vector<double>& f, double a,
                  const std::string& what) {
  ASSERT_EQ(t.inv_freq().size(), f.size()) << what;
  EXPECT_NEAR(t.attention_factor(), a, 1e-12 * a) << what;
  for (std::size_t i = 0; i < f.size(); ++i)
    ASSERT_NEAR(t.inv_freq()[i], f[i], 1e-12 * f[i]) << what << " i " << i;
  for (std::size_t p : positions) {
    if (p >= t.max_positions()) continue;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const double angle = static_cast<double>(p) * f[i];
      ASSERT_NEAR(t.cos(p)[i], a * std::cos(angle), 2e-7 * a) << what << " p " << p << " i " << i;
      ASSERT_NEAR(t.sin(p)[i], a * std::sin(angle), 2e-7 * a) << what << " p " << p << " i " << i;
    }
  }
}

void expect_invalid(const rope_scaling& s, std::size_t head_dim, std::size_t rotary_dim,
                    const std::string& fragment) {
  try {
    rope_table t(head_dim, 10000.0, 16, s, rotary_dim);
    FAIL() << "expected invalid_argument: " << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(RopeTable, DefaultAndLinear) {
  for (std::size_t d : {64u, 128u, 96u}) {
    expect_table(rope_table(d, 1e6, table_len), plain(1e6, d), 1.0, "default");
    rope_scaling s;
    s.kind = rope_kind::linear;
    s.factor = 4.0;
    auto f = plain(1e4, d);
    for (double& v : f) v *= 0.25;  // positions divided by 4 = frequencies divided by 4
    expect_table(rope_table(d, 1e4, table_len, s, d), f, 1.0, "linear");
  }
}

TEST(RopeTable, DynamicNtkUsesTheTableLength) {
  rope_scaling s;
  s.kind = rope_kind::dynamic;
  s.factor = 2.0;
  s.original_max_position_embeddings = 2048;
  for (std::size_t d : {64u, 128u}) {
    // Within the original context HF's base is unchanged at every length.
    expect_table(rope_table(d, 1e4, 2048, s, d), plain(1e4, d), 1.0, "dynamic short");
    // Beyond it: base' = base (factor L / original - (factor - 1))^(d / (d - 2)), L = 8192.
    const double dd = static_cast<double>(d);
    const double scaled = 1e4 * std::pow(2.0 * 8192.0 / 2048.0 - 1.0, dd / (dd - 2.0));
    expect_table(rope_table(d, 1e4, table_len, s, d), plain(scaled, d), 1.0, "dynamic long");
  }
}

rope_scaling llama3() {
  rope_scaling s;
  s.kind = rope_kind::llama3;
  s.factor = 32.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  return s;
}

TEST(RopeTable, Llama3Regimes) {
  const auto s = llama3();
  for (std::size_t d : {64u, 128u}) {
    const auto base = plain(500000.0, d);
    std::vector<double> f;
    int kept = 0, divided = 0, blended = 0;
    for (double v : base) {
      const double wavelen = 2 * pi / v;
      if (wavelen < 8192.0 / 4.0) {  // high frequencies: unchanged
        f.push_back(v);
        ++kept;
      } else if (wavelen > 8192.0 / 1.0) {  // low frequencies: interpolated by the factor
        f.push_back(v / 32.0);
        ++divided;
      } else {  // in between: weight s on v, 1 - s on v / factor, s linear in 1 / wavelen
        const double w = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
        f.push_back(v * (w + (1.0 - w) / 32.0));
        ++blended;
      }
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(blended, 0);
    const rope_table t(d, 500000.0, table_len, s, d);
    expect_table(t, f, 1.0, "llama3 d " + std::to_string(d));
    for (std::size_t i = 0; i < base.size(); ++i) {
      const double wavelen = 2 * pi / base[i];
      if (wavelen >= 2048.0 && wavelen <= 8192.0) {
        EXPECT_LE(t.inv_freq()[i], base[i]);
        EXPECT_GE(t.inv_freq()[i], base[i] / 32.0);
      }
    }
  }
}

TEST(RopeTable, Llama3BoundariesAreContinuous) {
  // theta chosen so that frequency 1 of d = 4 has wavelength exactly 2048 (= original /
  // high_freq_factor): kept unchanged (smooth weight 1); with the wavelength exactly 8192 (=
  // original / low_freq_factor) it is divided by the factor (smooth weight 0).
  auto s = llama3();
  const double f_high = 2 * pi / 2048.0;  // theta^(-1/2) = f  =>  theta = f^-2
  rope_table hi(4, 1.0 / (f_high * f_high), 8, s, 4);
  EXPECT_NEAR(hi.inv_freq()[1], f_high, 1e-15);
  const double f_low = 2 * pi / 8192.0;
  rope_table lo(4, 1.0 / (f_low * f_low), 8, s, 4);
  EXPECT_NEAR(lo.inv_freq()[1], f_low / 32.0, 1e-15);
  EXPECT_EQ(lo.inv_freq()[0], 1.0);  // wavelength 2 pi: far below 2048, unchanged
}

// yarn's reference: the dims whose wavelength turns fewer than beta_slow times in the original
// context are interpolated, more than beta_fast times kept, a linear ramp in dim index between.
std::vector<double> yarn_reference(double theta, std::size_t d, double factor, double original,
                                   double fast, double slow, bool truncate) {
  const double dd = static_cast<double>(d);
  // Dim index at which a frequency turns r times over `original` positions:
  // original f_i / (2 pi) = r with f_i = theta^(-2i/d)  =>  i = d ln(original / (2 pi r)) / (2 ln
  // theta).
  auto dim_at = [&](double r) {
    return dd * std::log(original / (2 * pi * r)) / (2 * std::log(theta));
  };
  double lo = dim_at(fast), hi = dim_at(slow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, dd - 1);
  if (lo == hi) hi += 0.001;
  auto f = plain(theta, d);
  for (std::size_t i = 0; i < f.size(); ++i) {
    double ramp = (static_cast<double>(i) - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    f[i] = ramp * (f[i] / factor) + (1 - ramp) * f[i];
  }
  return f;
}

TEST(RopeTable, Yarn) {
  rope_scaling s;
  s.kind = rope_kind::yarn;
  s.factor = 4.0;
  s.original_max_position_embeddings = 32768;
  for (std::size_t d : {64u, 128u}) {
    for (bool truncate : {true, false}) {
      s.truncate = truncate;
      s.attention_factor.reset();
      const auto f = yarn_reference(1e6, d, 4.0, 32768, 32, 1, truncate);
      expect_table(rope_table(d, 1e6, table_len, s, d), f, 1.0 + 0.1 * std::log(4.0), "yarn");
      s.attention_factor = 0.75;
      expect_table(rope_table(d, 1e6, table_len, s, d), f, 0.75, "yarn explicit factor");
    }
  }
  // DeepSeek's mscale pair, other betas.
  s.attention_factor.reset();
  s.truncate = true;
  s.factor = 40.0;
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 16;
  s.beta_slow = 2;
  s.mscale = 0.707;
  s.mscale_all_dim = 1.0;
  const double m = (1 + 0.1 * 0.707 * std::log(40.0)) / (1 + 0.1 * std::log(40.0));
  expect_table(rope_table(64, 1e4, table_len, s, 64),
               yarn_reference(1e4, 64, 40, 4096, 16, 2, true), m, "yarn mscale");
}

TEST(RopeTable, LongRopeChoosesByTableLength) {
  const std::size_t d = 96;  // Phi-3-mini's head
  rope_scaling s;
  s.kind = rope_kind::longrope;
  s.original_max_position_embeddings = 4096;
  s.factor = 131072.0 / 4096.0;
  for (std::size_t i = 0; i < d / 2; ++i) {
    s.short_factor.push_back(1.0 + 0.05 * static_cast<double>(i));
    s.long_factor.push_back(1.0 + 1.3 * static_cast<double>(i));
  }
  const double a = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
  for (bool is_long : {false, true}) {
    const auto& ext = is_long ? s.long_factor : s.short_factor;
    auto f = plain(1e4, d);
    for (std::size_t i = 0; i < f.size(); ++i)
      f[i] = 1.0 / (ext[i] * std::pow(1e4, 2.0 * i / 96.0));
    const rope_table t(d, 1e4, is_long ? table_len : 4096, s, d);
    EXPECT_EQ(t.uses_long_factor(), is_long);
    expect_table(t, f, a, is_long ? "longrope long" : "longrope short");
  }
  s.factor = 1.0;  // no extension: no magnitude
  EXPECT_EQ(rope_table(d, 1e4, 16, s, d).attention_factor(), 1.0);
}

TEST(ApplyRope, PartialRotaryAndMagnitude) {
  const std::size_t head = 64, rot = 32, m = 5, heads = 3;
  rope_scaling s;
  s.kind = rope_kind::yarn;
  s.factor = 8.0;
  s.original_max_position_embeddings = 4096;
  const rope_table t(head, 1e4, table_len, s, rot);
  const double a = 1.0 + 0.1 * std::log(8.0);
  const auto f = yarn_reference(1e4, rot, 8.0, 4096, 32, 1, true);
  tensor<float, 3> x(m, heads, head);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.37 * static_cast<double>(i));
  const auto before = x.clone();
  std::vector<std::int64_t> pos(positions.begin(), positions.end());
  ops::apply_rope(x.view(), pos, t);
  for (std::size_t r = 0; r < m; ++r) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t i = 0; i < rot / 2; ++i) {
        const double c = std::cos(static_cast<double>(pos[r]) * f[i]),
                     sn = std::sin(static_cast<double>(pos[r]) * f[i]);
        const double x0 = before.view()(r, h, i), x1 = before.view()(r, h, i + rot / 2);
        ASSERT_NEAR(x.view()(r, h, i), a * (x0 * c - x1 * sn), 1e-6);
        ASSERT_NEAR(x.view()(r, h, i + rot / 2), a * (x1 * c + x0 * sn), 1e-6);
      }
      for (std::size_t i = rot; i < head; ++i) ASSERT_EQ(x.view()(r, h, i), before.view()(r, h, i));
    }
  }
}

TEST(RopeTable, BadParameters) {
  rope_scaling s;
  s.kind = rope_kind::linear;
  s.factor = 0.0;
  expect_invalid(s, 64, 64, "factor must be > 0, got 0");
  s = llama3();
  s.high_freq_factor = 1.0;
  expect_invalid(s, 64, 64, "high_freq_factor must be > low_freq_factor, got 1");
  s = llama3();
  s.original_max_position_embeddings = 0;
  expect_invalid(s, 64, 64, "original_max_position_embeddings must be > 0, got 0");
  s = rope_scaling{};
  s.kind = rope_kind::yarn;
  s.factor = 4;
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 0.5;
  expect_invalid(s, 64, 64, "beta_fast must be >= beta_slow, got 0.5");
  s.beta_fast = 32;
  s.attention_factor = -1.0;
  expect_invalid(s, 64, 64, "attention_factor must be > 0, got -1");
  s = rope_scaling{};
  s.kind = rope_kind::longrope;
  s.original_max_position_embeddings = 4096;
  s.short_factor.assign(3, 1.0);
  s.long_factor.assign(16, 1.0);
  expect_invalid(s, 64, 32, "short_factor has 3 values, rotary_dim 32 needs 16");
  s.short_factor.assign(16, 1.0);
  s.long_factor[5] = 0.0;
  expect_invalid(s, 64, 32, "long_factor[5] must be > 0, got 0");
  s = rope_scaling{};
  s.kind = rope_kind::dynamic;
  s.factor = 2;
  s.original_max_position_embeddings = 16;
  expect_invalid(s, 2, 2, "rotary dim > 2");
  expect_invalid(rope_scaling{}, 64, 30 + 1, "rotary_dim 31");
  expect_invalid(rope_scaling{}, 64, 66, "rotary_dim 66");
  EXPECT_THROW(rope_table(64, 1.0, 8), error);  // theta must be > 1
}

}  // namespace
