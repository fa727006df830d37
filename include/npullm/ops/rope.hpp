// Rotary position embedding, rotate-half ("neox") style as Qwen2, Llama, Mistral, Phi-3 and
// Gemma 2 use, with the frequency scalings of Hugging Face's rope_type variants.
//
// For a head vector x of head_dim d, the first rotary_dim r dims rotate (r even, r <= d; the
// other d - r dims pass through unchanged: Phi-3's partial_rotary_factor), half = r / 2, position
// p, inverse frequency f_i and magnitude factor a:
//   y[i]        = a (x[i] cos(p f_i) - x[i + half] sin(p f_i))
//   y[i + half] = a (x[i + half] cos(p f_i) + x[i] sin(p f_i))      for i < half
// Plain RoPE: f_i = theta^(-2i / r), a = 1. The variants (rope_kind) change f_i and a once, when
// the table is built; the table stores a cos(p f_i) and a sin(p f_i) for p in [0, max_positions)
// (computed in double, stored f32). apply_rope rotates x (M, heads, head_dim) in place with one
// position per row. Applied to both q and k, a scales every attention logit by a^2, as in HF
// (which multiplies cos and sin by its "attention_factor").
//
// Variants whose frequencies depend on the current sequence length are resolved once, by the
// table's capacity max_positions (the longest sequence the pipeline will hold), as vLLM does
// per batch:
//   dynamic   HF recomputes the NTK base for every forward pass from seq_len = max(current
//             length, original_max_position_embeddings). Here seq_len = max(max_positions,
//             original_max_position_embeddings) for every position: identical to HF whenever
//             max_positions <= original_max_position_embeddings (then it is plain RoPE), and for
//             a longer table equal to HF's frequencies at the table's full length. HF's own
//             results differ with the current length (and keys cached at a shorter length keep
//             their old rotation), so a static table cannot follow it step by step.
//   longrope  HF uses long_factor when the current length (max position + 1) exceeds
//             original_max_position_embeddings, short_factor otherwise. Here: long_factor iff
//             max_positions > original_max_position_embeddings, for every position. A pipeline
//             sized within the original context matches HF exactly; one sized beyond it applies
//             the long factors to short sequences too (what HF does once a sequence grows past
//             the original context, and what vLLM does for a batch holding a long sequence).
//             The magnitude factor applies with either list, as in HF.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::ops {

// The rope_type values of Hugging Face's config.json ("default" reads as none, "su" as longrope).
enum class rope_kind { none, linear, dynamic, llama3, yarn, longrope };

constexpr std::string_view to_string(rope_kind k) noexcept {
  switch (k) {
    case rope_kind::none: return "default";
    case rope_kind::linear: return "linear";
    case rope_kind::dynamic: return "dynamic";
    case rope_kind::llama3: return "llama3";
    case rope_kind::yarn: return "yarn";
    case rope_kind::longrope: return "longrope";
  }
  return "unknown";
}

// What config.json's rope_scaling says, with every default resolved (model::parse_config fills
// it; a caller building one by hand sets what its kind reads). Each field lists its readers.
struct rope_scaling {
  rope_kind kind = rope_kind::none;
  // linear, dynamic, llama3, yarn: the context extension ratio. longrope: only to derive the
  // default attention_factor (parse_config sets it to max_position_embeddings /
  // original_max_position_embeddings when the file gives none).
  double factor = 1.0;
  // dynamic, llama3, yarn, longrope: the context length the model was pretrained with.
  std::size_t original_max_position_embeddings = 0;
  // llama3: wavelengths below original / high_freq_factor keep their frequency, those above
  // original / low_freq_factor are divided by factor, those in between are interpolated.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn: the rotation counts bounding the interpolation ramp; truncate rounds the ramp's ends
  // to whole dims (floor / ceil) as HF does unless the file says "truncate": false.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // yarn (DeepSeek style): attention_factor = m(factor, mscale) / m(factor, mscale_all_dim)
  // when both are non-zero, with m(s, k) = 1 + 0.1 k ln s (1 when s <= 1).
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  // yarn, longrope: the magnitude factor a on cos and sin; derived when absent (see rope_table).
  std::optional<double> attention_factor;
  // longrope: per-frequency divisors, rotary_dim / 2 each.
  std::vector<double> short_factor;
  std::vector<double> long_factor;
};

// The table and the rotation are the ISA's (core/isa.hpp): the table's frequencies are double
// arithmetic the compiler contracts into FMAs per ISA, the rotation a loop it vectorizes per ISA.
// (rope_scaling, the configuration, is the same type for every ISA.)
inline namespace NPULLM_ISA_NAMESPACE {
namespace detail {

inline bool positive_finite(double v) noexcept {
  return std::isfinite(v) && v > 0;
}

// yarn's magnitude: 1 + 0.1 k ln s for s > 1.
inline double yarn_mscale(double s, double k) noexcept {
  return s <= 1.0 ? 1.0 : 0.1 * k * std::log(s) + 1.0;
}

}  // namespace detail

// Raises invalid_argument naming the first value that the kind cannot use.
inline void validate_rope_scaling(const rope_scaling& s, std::size_t rotary_dim) {
  const auto kind = to_string(s.kind);
  auto bad = [&](const char* what, auto value) {
    raise(error_code::invalid_argument, "rope_scaling ", kind, ": ", what, " ", value);
  };
  if (s.kind == rope_kind::none) return;
  if (!detail::positive_finite(s.factor)) bad("factor must be > 0, got", s.factor);
  if (s.kind != rope_kind::linear && s.original_max_position_embeddings == 0)
    bad("original_max_position_embeddings must be > 0, got", 0);
  if (s.attention_factor && !detail::positive_finite(*s.attention_factor))
    bad("attention_factor must be > 0, got", *s.attention_factor);
  switch (s.kind) {
    case rope_kind::dynamic:
      if (rotary_dim <= 2)
        bad("needs a rotary dim > 2 (its exponent is d / (d - 2)), got", rotary_dim);
      break;
    case rope_kind::llama3:
      if (!detail::positive_finite(s.low_freq_factor))
        bad("low_freq_factor must be > 0, got", s.low_freq_factor);
      if (!(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor))
        bad("high_freq_factor must be > low_freq_factor, got", s.high_freq_factor);
      break;
    case rope_kind::yarn:
      if (!detail::positive_finite(s.beta_slow)) bad("beta_slow must be > 0, got", s.beta_slow);
      if (!(std::isfinite(s.beta_fast) && s.beta_fast >= s.beta_slow))
        bad("beta_fast must be >= beta_slow, got", s.beta_fast);
      if (!(std::isfinite(s.mscale) && s.mscale >= 0)) bad("mscale must be >= 0, got", s.mscale);
      if (!(std::isfinite(s.mscale_all_dim) && s.mscale_all_dim >= 0))
        bad("mscale_all_dim must be >= 0, got", s.mscale_all_dim);
      break;
    case rope_kind::longrope:
      for (const auto* list : {&s.short_factor, &s.long_factor}) {
        const char* name = list == &s.short_factor ? "short_factor" : "long_factor";
        if (list->size() != rotary_dim / 2) {
          raise(error_code::invalid_argument, "rope_scaling longrope: ", name, " has ",
                list->size(), " values, rotary_dim ", rotary_dim, " needs ", rotary_dim / 2);
        }
        for (std::size_t i = 0; i < list->size(); ++i) {
          if (!detail::positive_finite((*list)[i])) {
            raise(error_code::invalid_argument, "rope_scaling longrope: ", name, "[", i,
                  "] must be > 0, got ", (*list)[i]);
          }
        }
      }
      break;
    default: break;
  }
}

class rope_table {
 public:
  // Plain RoPE over the whole head.
  rope_table(std::size_t head_dim, double theta, std::size_t max_positions)
      : rope_table(head_dim, theta, max_positions, rope_scaling{}, head_dim) {}

  // A scaled variant; rotary_dim (even, <= head_dim) dims rotate, the rest pass through.
  rope_table(std::size_t head_dim, double theta, std::size_t max_positions,
             const rope_scaling& scaling, std::size_t rotary_dim)
      : head_dim_(head_dim), rotary_dim_(rotary_dim), max_positions_(max_positions) {
    if (head_dim == 0 || head_dim % 2 != 0 || !(theta > 1.0) || !std::isfinite(theta) ||
        max_positions == 0) {
      raise(error_code::invalid_argument, "rope_table: head_dim ", head_dim,
            " must be even and > 0, theta ", theta, " > 1, max_positions ", max_positions, " > 0");
    }
    if (rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
      raise(error_code::invalid_argument, "rope_table: rotary_dim ", rotary_dim,
            " must be even, > 0 and <= head_dim ", head_dim);
    }
    validate_rope_scaling(scaling, rotary_dim);
    inv_freq_ = frequencies(theta, scaling);
    const std::size_t half = rotary_dim / 2;
    cos_.resize(max_positions * half);
    sin_.resize(max_positions * half);
    for (std::size_t p = 0; p < max_positions; ++p) {
      for (std::size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * inv_freq_[i];
        cos_[p * half + i] = static_cast<float>(attention_factor_ * std::cos(angle));
        sin_[p * half + i] = static_cast<float>(attention_factor_ * std::sin(angle));
      }
    }
  }

  // Overload kept for callers that pass the scaling and rotate the whole head.
  rope_table(std::size_t head_dim, double theta, std::size_t max_positions,
             const rope_scaling& scaling)
      : rope_table(head_dim, theta, max_positions, scaling, head_dim) {}

  [[nodiscard]] std::size_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::size_t rotary_dim() const noexcept { return rotary_dim_; }
  [[nodiscard]] std::size_t max_positions() const noexcept { return max_positions_; }
  // [rotary_dim / 2]: the inverse frequencies f_i, in double as computed.
  [[nodiscard]] std::span<const double> inv_freq() const noexcept { return inv_freq_; }
  // The magnitude a on cos and sin (1 except yarn and longrope).
  [[nodiscard]] double attention_factor() const noexcept { return attention_factor_; }
  // longrope: whether the long factors were chosen (max_positions > original context).
  [[nodiscard]] bool uses_long_factor() const noexcept { return long_factor_; }
  // [rotary_dim / 2] each: a cos(p f_i), a sin(p f_i).
  [[nodiscard]] const float* cos(std::size_t p) const noexcept {
    return cos_.data() + p * (rotary_dim_ / 2);
  }
  [[nodiscard]] const float* sin(std::size_t p) const noexcept {
    return sin_.data() + p * (rotary_dim_ / 2);
  }

 private:
  // [rotary_dim / 2] inverse frequencies of the variant; sets attention_factor_ and long_factor_.
  std::vector<double> frequencies(double theta, const rope_scaling& s) {
    const std::size_t half = rotary_dim_ / 2;
    const double d = static_cast<double>(rotary_dim_);
    auto exponent = [&](std::size_t i) { return 2.0 * static_cast<double>(i) / d; };
    std::vector<double> f(half);
    double base = theta;
    if (s.kind == rope_kind::dynamic) {
      // NTK-aware base at the table's length (see the header comment).
      const double original = static_cast<double>(s.original_max_position_embeddings);
      const double seq = std::max(static_cast<double>(max_positions_), original);
      base = theta * std::pow(s.factor * seq / original - (s.factor - 1.0), d / (d - 2.0));
    }
    for (std::size_t i = 0; i < half; ++i) f[i] = std::pow(base, -exponent(i));
    switch (s.kind) {
      case rope_kind::none:
      case rope_kind::dynamic: break;
      case rope_kind::linear:
        for (double& v : f) v /= s.factor;
        break;
      case rope_kind::llama3: {
        const double original = static_cast<double>(s.original_max_position_embeddings);
        const double low_wavelen = original / s.low_freq_factor;    // longer: divided by factor
        const double high_wavelen = original / s.high_freq_factor;  // shorter: unchanged
        for (double& v : f) {
          const double wavelen = 2.0 * std::numbers::pi / v;
          if (wavelen < high_wavelen) continue;
          if (wavelen > low_wavelen) {
            v /= s.factor;
          } else {
            const double smooth =
                (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            v = (1.0 - smooth) * v / s.factor + smooth * v;
          }
        }
        break;
      }
      case rope_kind::yarn: {
        // Dims that turn fewer than beta_slow times over the original context are interpolated
        // (divided by factor), those turning more than beta_fast times keep their frequency,
        // and a linear ramp over dim index blends the two in between.
        const double original = static_cast<double>(s.original_max_position_embeddings);
        auto correction_dim = [&](double rotations) {
          return d * std::log(original / (rotations * 2.0 * std::numbers::pi)) /
                 (2.0 * std::log(theta));
        };
        double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
        if (s.truncate) {
          low = std::floor(low);
          high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, d - 1.0);
        if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
        for (std::size_t i = 0; i < half; ++i) {
          const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
          const double keep = 1.0 - ramp;  // weight of the unscaled (extrapolated) frequency
          f[i] = f[i] / s.factor * (1.0 - keep) + f[i] * keep;
        }
        attention_factor_ =
            s.attention_factor.value_or(s.mscale != 0 && s.mscale_all_dim != 0
                                            ? detail::yarn_mscale(s.factor, s.mscale) /
                                                  detail::yarn_mscale(s.factor, s.mscale_all_dim)
                                            : detail::yarn_mscale(s.factor, 1.0));
        break;
      }
      case rope_kind::longrope: {
        long_factor_ = max_positions_ > s.original_max_position_embeddings;
        const auto& divisors = long_factor_ ? s.long_factor : s.short_factor;
        for (std::size_t i = 0; i < half; ++i) f[i] /= divisors[i];
        const double original = static_cast<double>(s.original_max_position_embeddings);
        attention_factor_ = s.attention_factor.value_or(
            s.factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s.factor) / std::log(original)));
        break;
      }
    }
    return f;
  }

  std::size_t head_dim_;
  std::size_t rotary_dim_;
  std::size_t max_positions_;
  double attention_factor_ = 1.0;
  bool long_factor_ = false;
  std::vector<double> inv_freq_;  // (rotary_dim / 2)
  std::vector<float> cos_, sin_;  // (max_positions, rotary_dim / 2)
};

// x: (M, heads, head_dim), rotated in place; positions: [M].
template <class Layout>
void apply_rope(const tensor_view<float, dextents<3>, Layout>& x,
                std::span<const std::int64_t> positions, const rope_table& table) {
  if (x.extent(2) != table.head_dim() || positions.size() != x.extent(0)) {
    raise(error_code::invalid_shape, "apply_rope: x ", npullm::detail::format_extents(x.extents()),
          " with ", positions.size(), " positions and head_dim ", table.head_dim());
  }
  if (x.stride(2) != 1) raise(error_code::unsupported, "apply_rope: head_dim must be dense");
  const std::size_t half = table.rotary_dim() / 2;
  for (std::size_t m = 0; m < x.extent(0); ++m) {
    const std::int64_t p = positions[m];
    if (p < 0 || static_cast<std::size_t>(p) >= table.max_positions()) {
      raise(error_code::out_of_range, "apply_rope: position ", p, " of row ", m, " outside [0, ",
            table.max_positions(), ")");
    }
    const float* c = table.cos(static_cast<std::size_t>(p));
    const float* s = table.sin(static_cast<std::size_t>(p));
    for (std::size_t h = 0; h < x.extent(1); ++h) {
      float* v = &x(m, h, 0);  // dims [rotary_dim, head_dim) pass through
      for (std::size_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

inline void apply_rope(dense_view<float, 3> x, std::span<const std::int64_t> positions,
                       const rope_table& table) {
  apply_rope<layout_right>(x, positions, table);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::ops
