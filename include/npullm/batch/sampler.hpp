// Token samplers: greedy, temperature, top-k, top-p, each request with its own seeded
// generator, so the same request and seed give the same tokens whatever else is batched.
//
//   sampler_config{}                        greedy (temperature 0): ops::argmax, the first
//                                           largest logit (NaN never, unless all are NaN)
//   sampler_config{.temperature = 0.8f}     softmax(logits / T), sampled
//   .top_k = k                              only the k largest logits compete
//   .top_p = p                              only the smallest set of tokens whose probability
//                                           reaches p (after top-k) competes
// Ties are broken by token id, so a result never depends on a sort's whims.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/ops/argmax.hpp"

namespace npullm::batch {

struct sampler_config {
  float temperature = 0.0f;  // 0: greedy
  std::size_t top_k = 0;     // 0: all tokens
  float top_p = 1.0f;        // 1: all tokens

  void validate() const {
    if (!(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f)) {
      raise(error_code::invalid_argument, "sampler: temperature ", temperature,
            " must be >= 0 and top_p ", top_p, " in (0, 1]");
    }
  }
};

class sampler {
 public:
  sampler(sampler_config config, std::uint64_t seed) : config_(config), state_(seed) {
    config.validate();
  }

  std::int32_t sample(std::span<const float> logits) {
    if (logits.empty()) raise(error_code::invalid_argument, "sampler: no logits");
    if (config_.temperature == 0.0f) {
      return ops::argmax(logits);
    }
    const std::vector<double> p = distribution(logits);
    return sample_from(p);
  }

  // The distribution sample() draws from: probabilities over every token (0 outside top-k /
  // top-p). Greedy gives probability 1 to the first largest logit.
  [[nodiscard]] std::vector<double> distribution(std::span<const float> logits) const {
    std::vector<double> p(logits.size(), 0.0);
    if (logits.empty()) return p;
    if (config_.temperature == 0.0f) {
      p[static_cast<std::size_t>(ops::argmax(logits))] = 1.0;
      return p;
    }
    std::vector<std::int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto better = [&](std::int32_t a, std::int32_t b) {
      return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
             (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
    };
    const std::size_t k = config_.top_k == 0 ? ids.size() : std::min(config_.top_k, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), better);
    const double top = logits[static_cast<std::size_t>(ids[0])];
    std::vector<double> w(k);
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i) {
      sum += (w[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - top) /
                              static_cast<double>(config_.temperature)));
    }
    std::size_t keep = k;
    if (config_.top_p < 1.0f) {
      double acc = 0;
      for (std::size_t i = 0; i < k; ++i) {
        acc += w[i] / sum;
        if (acc >= static_cast<double>(config_.top_p)) {
          keep = i + 1;
          break;
        }
      }
    }
    double total = 0;
    for (std::size_t i = 0; i < keep; ++i) total += w[i];
    for (std::size_t i = 0; i < keep; ++i) p[static_cast<std::size_t>(ids[i])] = w[i] / total;
    return p;
  }

  // A token drawn from explicit probabilities (they need not sum to 1; all zero: token 0).
  std::int32_t sample_from(std::span<const double> p) {
    double total = 0;
    for (double v : p) total += v;
    const double u = uniform() * total;
    double acc = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (u < acc) return static_cast<std::int32_t>(i);
    }
    for (std::size_t i = p.size(); i > 0; --i) {
      if (p[i - 1] > 0) return static_cast<std::int32_t>(i - 1);
    }
    return 0;
  }

  // A uniform draw in [0, 1) from this sampler's stream.
  double uniform() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

 private:
  sampler_config config_;
  std::uint64_t state_;
};

}  // namespace npullm::batch
