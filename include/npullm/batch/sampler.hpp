// Token samplers: a chain of logit processors, then greedy or a draw from the truncated
// softmax, each request with its own seeded generator, so the same request and seed give the
// same tokens whatever else is batched.
//
// A logits row must hold numbers or -inf (a masked token) and at least one number: NaN, +inf
// or a row of nothing but -inf is refused (invalid_argument, naming the token) on every path,
// greedy included, before anything is drawn (check_logits). Such a row is a model or kernel
// fault; sampling from it would pick an arbitrary token.
//
// The chain, for one logits row (vocab) and the context it continues (prompt + tokens so far),
// in llama.cpp's default order (its common_params_sampling::samplers: logit bias, penalties,
// top-k, top-p, min-p, temperature, then the draw; npullm has no DRY, typical-p, XTC or
// top-n-sigma):
//   1. logit_bias          row[t] += bias for every {t, bias} (entries for one token add up;
//                          -inf bans the token)
//   2. penalties           over the last penalty_last_n tokens of the context, for each token
//                          t that occurs there c > 0 times (llama.cpp's rule):
//                            row[t] > 0 ? row[t] / repeat_penalty : row[t] * repeat_penalty
//                            row[t] -= c * frequency_penalty + presence_penalty
//   3. processor           a user callable (context, row) that may change or mask (-inf) any
//                          entry: constrained decoding (grammars, JSON schemas) hooks in here
//   then the row is checked again: NaN, +inf or no entry above -inf is refused.
//   greedy (temperature 0) the first largest entry (ops::argmax)
//   sampled, with p = softmax(row) (temperature 1) over the row's tokens:
//     top_k = k            only the k largest entries compete (0: all)
//     top_p = p            only the smallest set of the most probable tokens whose probability
//                          (renormalized over the top k) reaches p (1: all)
//     min_p = m            only tokens with p_t >= m * p_max (0: all); p_max is the most
//                          probable token's (p_t / p_max = exp(row[t] - row_max))
//     temperature T        the survivors are drawn with probabilities softmax(row / T)
//                          renormalized over them.
//   With order = sampling_order::temperature_first (npullm's order before it followed
//   llama.cpp's) p is softmax(row / T) instead, so top-p and min-p cut the sharpened (T < 1) or
//   flattened (T > 1) distribution: at T != 1 the two orders can keep different tokens; top-k
//   keeps the same ones either way.
// Without bias, penalties or processor the row is read in place (no copy). Ties are broken
// by token id, so a result never depends on a sort's whims.
//
// The processor must depend only on its arguments (context, row): speculative decoding calls
// it for rows it then discards, and for the same context more than once.
//
// logprobs_of: the log-probabilities of a chosen token and the n most likely tokens, from the
// raw logits row (log_softmax of the model's logits in double, before bias, penalties,
// processor, temperature and truncation): what the model thinks, whatever the settings, and
// defined for greedy decoding too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/ops/argmax.hpp"

namespace npullm::batch {

// One logit_bias entry: bias added to the token's logit (-inf bans it).
struct token_bias {
  std::int32_t token = 0;
  float bias = 0.0f;
};

// Where the temperature acts in the sampled chain (see the top of the file).
enum class sampling_order {
  temperature_last,   // llama.cpp's: top-k, top-p and min-p cut softmax(row), then temperature
  temperature_first,  // npullm's former order: the cuts act on softmax(row / temperature)
};

// Refuses (invalid_argument) a logits row that no sampler can draw from: empty, a NaN or +inf
// entry, or no entry above -inf; `who` names the caller in the message. A model's row with
// such entries is a fault upstream: argmax would skip NaN, a sort over NaN is undefined.
inline void check_logits(std::span<const float> row, std::string_view who) {
  if (row.empty()) raise(error_code::invalid_argument, who, ": no logits");
  bool any = false;
  for (std::size_t i = 0; i < row.size(); ++i) {
    const float v = row[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      raise(error_code::invalid_argument, who, ": logit of token ", i, " is ",
            std::isnan(v) ? "NaN" : "+inf", " in a row of ", row.size(),
            " (only numbers, or -inf for a masked token, can be sampled)");
    }
    any = any || v > -std::numeric_limits<float>::infinity();
  }
  if (!any) {
    raise(error_code::invalid_argument, who, ": every logit of a row of ", row.size(),
          " is -inf: no token to choose");
  }
}

// The logits-processor hook: may change any entry of row (vocab), e.g. set -inf to forbid
// tokens; context is the prompt and the tokens chosen before this row.
using logits_processor =
    std::function<void(std::span<const std::int32_t> context, std::span<float> row)>;

// The prefetch hook: called with the context of the row the processor will be asked about
// next, before the model computes that row, so that a processor can start its work on another
// thread while the forward pass runs (grammar_processor::prefetcher: the grammar's mask). It
// must not change what the processor does, only how soon it is ready.
using logits_prefetch = std::function<void(std::span<const std::int32_t> context)>;

struct sampler_config {
  float temperature = 0.0f;  // 0: greedy
  std::size_t top_k = 0;     // 0: all tokens
  float top_p = 1.0f;        // 1: all tokens
  float min_p = 0.0f;        // 0: all tokens; in [0, 1]
  // Whether top-p / min-p cut before the temperature (llama.cpp's order) or after it.
  sampling_order order = sampling_order::temperature_last;
  float repeat_penalty = 1.0f;       // 1: off; > 0
  float frequency_penalty = 0.0f;    // 0: off; any finite value (negative favours repeats)
  float presence_penalty = 0.0f;     // 0: off; any finite value
  std::int64_t penalty_last_n = 64;  // the penalties' window of context tokens; 0: off; >= 0
  std::vector<token_bias> logit_bias{};
  logits_processor processor{};
  logits_prefetch prefetch{};  // see logits_prefetch; the generators call it before each step

  // Refuses (invalid_argument) what no vocabulary makes right; bias token ids are checked
  // against the row (sampler) or the vocabulary (generator::submit).
  void validate() const {
    if (!(temperature >= 0.0f) || !std::isfinite(temperature) || !(top_p > 0.0f && top_p <= 1.0f)) {
      raise(error_code::invalid_argument, "sampler: temperature ", temperature,
            " must be finite and >= 0 and top_p ", top_p, " in (0, 1]");
    }
    if (!(min_p >= 0.0f && min_p <= 1.0f)) {
      raise(error_code::invalid_argument, "sampler: min_p ", min_p, " outside [0, 1]");
    }
    if (order != sampling_order::temperature_last && order != sampling_order::temperature_first) {
      raise(error_code::invalid_argument, "sampler: order ", static_cast<int>(order),
            " is not a sampling_order");
    }
    if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
      raise(error_code::invalid_argument, "sampler: repeat_penalty ", repeat_penalty,
            " must be finite and > 0 (1: off)");
    }
    if (!std::isfinite(frequency_penalty) || !std::isfinite(presence_penalty)) {
      raise(error_code::invalid_argument, "sampler: frequency_penalty ", frequency_penalty,
            " and presence_penalty ", presence_penalty, " must be finite");
    }
    if (penalty_last_n < 0) {
      raise(error_code::invalid_argument, "sampler: penalty_last_n ", penalty_last_n,
            " must be >= 0 (0: off)");
    }
    for (std::size_t i = 0; i < logit_bias.size(); ++i) {
      const token_bias& b = logit_bias[i];
      if (b.token < 0 || std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity()) {
        raise(error_code::invalid_argument, "sampler: logit_bias ", i, " (token ", b.token,
              ", bias ", b.bias, "): the token must be >= 0 and the bias a number or -inf");
      }
    }
  }

  // Whether the penalties change anything.
  [[nodiscard]] bool penalizes() const noexcept {
    return penalty_last_n > 0 &&
           (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
  // Whether steps 1-3 of the chain change anything (otherwise the row is read in place).
  [[nodiscard]] bool processes() const noexcept {
    return !logit_bias.empty() || penalizes() || static_cast<bool>(processor);
  }
  // Whether the chain reads the context (penalties or a processor).
  [[nodiscard]] bool uses_context() const noexcept {
    return penalizes() || static_cast<bool>(processor);
  }
};

// The log-probability of one token.
struct token_logprob {
  std::int32_t token = 0;
  double logprob = 0.0;
};

// A chosen token's log-probability and the top_n most likely tokens (most likely first, ties
// by id), all from the same row.
struct token_logprobs {
  token_logprob chosen;
  std::vector<token_logprob> top;
};

// log_softmax of the raw logits row in double (NaN counts as -inf), for chosen and the
// min(top_n, vocab) most likely tokens.
inline token_logprobs logprobs_of(std::span<const float> logits, std::int32_t chosen,
                                  std::size_t top_n = 0) {
  if (chosen < 0 || static_cast<std::size_t>(chosen) >= logits.size()) {
    raise(error_code::out_of_range, "logprobs_of: token ", chosen, " outside a row of ",
          logits.size());
  }
  constexpr double ninf = -std::numeric_limits<double>::infinity();
  auto value = [&](std::size_t i) {
    const double v = logits[i];
    return std::isnan(v) ? ninf : v;
  };
  double top = ninf;
  for (std::size_t i = 0; i < logits.size(); ++i) top = std::max(top, value(i));
  double lse = ninf;  // log(sum(exp(logits)))
  if (top == std::numeric_limits<double>::infinity()) {
    lse = top;
  } else if (top > ninf) {
    double sum = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) sum += std::exp(value(i) - top);
    lse = top + std::log(sum);
  }
  auto logprob = [&](std::size_t i) { return value(i) == ninf ? ninf : value(i) - lse; };
  token_logprobs out;
  out.chosen = {chosen, logprob(static_cast<std::size_t>(chosen))};
  const std::size_t n = std::min(top_n, logits.size());
  if (n > 0) {
    std::vector<std::int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](std::int32_t a, std::int32_t b) {
                        const double va = value(static_cast<std::size_t>(a));
                        const double vb = value(static_cast<std::size_t>(b));
                        return va > vb || (va == vb && a < b);
                      });
    for (std::size_t i = 0; i < n; ++i)
      out.top.push_back({ids[i], logprob(static_cast<std::size_t>(ids[i]))});
  }
  return out;
}

class sampler {
 public:
  // Refuses a bad config (sampler_config::validate).
  sampler(sampler_config config, std::uint64_t seed) : config_(std::move(config)), state_(seed) {
    config_.validate();
  }

  [[nodiscard]] const sampler_config& config() const noexcept { return config_; }
  [[nodiscard]] bool greedy() const noexcept { return config_.temperature == 0.0f; }

  // Tells the processor which context comes next (sampler_config::prefetch), if it listens.
  void prefetch(std::span<const std::int32_t> context) const {
    if (config_.prefetch) config_.prefetch(context);
  }

  // A token for a logits row (vocab) after context. Throws, with the stream unchanged, for a
  // row check_logits refuses, a bias or context token outside it, or a row the chain leaves
  // without a token.
  std::int32_t sample(std::span<const float> logits, std::span<const std::int32_t> context = {}) {
    if (!config_.processes()) {
      check_logits(logits, "sampler");  // process() checks the row itself
      if (greedy()) return ops::argmax(logits);
      return sample_from(truncated(logits));
    }
    const std::vector<float> row = process(logits, context);
    if (greedy()) return ops::argmax(row);
    return sample_from(truncated(row));
  }

  // The greedy choice of the chain: the first largest entry of the processed row.
  [[nodiscard]] std::int32_t argmax(std::span<const float> logits,
                                    std::span<const std::int32_t> context = {}) const {
    if (!config_.processes()) {
      check_logits(logits, "sampler");
      return ops::argmax(logits);
    }
    return ops::argmax(process(logits, context));
  }

  // The distribution sample() draws from: probabilities over every token (0 outside top-k /
  // top-p / min-p and for masked tokens). Greedy gives probability 1 to the first largest
  // entry of the processed row. Refuses what sample() refuses.
  [[nodiscard]] std::vector<double> distribution(std::span<const float> logits,
                                                 std::span<const std::int32_t> context = {}) const {
    std::vector<float> row;
    if (config_.processes()) {
      row = process(logits, context);
    } else {
      check_logits(logits, "sampler");
    }
    const std::span<const float> r = config_.processes() ? std::span<const float>(row) : logits;
    if (greedy()) {
      std::vector<double> p(r.size(), 0.0);
      p[static_cast<std::size_t>(ops::argmax(r))] = 1.0;
      return p;
    }
    return truncated(r);
  }

  // Steps 1-3 of the chain on a copy of the row: logit bias, penalties over the last
  // penalty_last_n tokens of context, the processor. Refuses (invalid_argument) a row
  // check_logits refuses, bias or window tokens outside the row, and a result with NaN, +inf
  // or no entry above -inf.
  [[nodiscard]] std::vector<float> process(std::span<const float> logits,
                                           std::span<const std::int32_t> context = {}) const {
    check_logits(logits, "sampler");
    const std::size_t vocab = logits.size();
    for (const token_bias& b : config_.logit_bias) {
      if (static_cast<std::size_t>(b.token) >= vocab) {
        raise(error_code::invalid_argument, "sampler: logit_bias token ", b.token,
              " outside a row of ", vocab);
      }
    }
    std::vector<std::int32_t> window;
    if (config_.penalizes()) {
      const std::size_t n =
          std::min(context.size(), static_cast<std::size_t>(config_.penalty_last_n));
      window.assign(context.end() - static_cast<std::ptrdiff_t>(n), context.end());
      for (std::int32_t t : window) {
        if (t < 0 || static_cast<std::size_t>(t) >= vocab) {
          raise(error_code::invalid_argument, "sampler: context token ", t, " outside a row of ",
                vocab);
        }
      }
      std::sort(window.begin(), window.end());
    }
    std::vector<float> row(logits.begin(), logits.end());
    for (const token_bias& b : config_.logit_bias) row[static_cast<std::size_t>(b.token)] += b.bias;
    for (std::size_t i = 0; i < window.size();) {  // each distinct token once, with its count
      std::size_t j = i;
      while (j < window.size() && window[j] == window[i]) ++j;
      float& v = row[static_cast<std::size_t>(window[i])];
      v = v > 0.0f ? v / config_.repeat_penalty : v * config_.repeat_penalty;
      v -= static_cast<float>(j - i) * config_.frequency_penalty + config_.presence_penalty;
      i = j;
    }
    if (config_.processor) config_.processor(context, row);
    bool any = false;
    for (std::size_t i = 0; i < vocab; ++i) {
      const float v = row[i];
      if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
        raise(error_code::invalid_argument, "sampler: logit of token ", i, " is ",
              std::isnan(v) ? "NaN" : "+inf",
              " after bias, penalties and processor (mask with -inf instead)");
      }
      any = any || v > -std::numeric_limits<float>::infinity();
    }
    if (!any) {
      raise(error_code::invalid_argument,
            "sampler: bias, penalties and processor left no token (every logit -inf)");
    }
    return row;
  }

  // A token drawn from explicit probabilities (they need not sum to 1; all zero: token 0).
  // Refuses (invalid_argument, the stream unchanged) an empty list and a NaN, infinite or
  // negative entry: no draw means anything then.
  std::int32_t sample_from(std::span<const double> p) {
    if (p.empty()) raise(error_code::invalid_argument, "sampler: no probabilities");
    double total = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!(p[i] >= 0.0) || !std::isfinite(p[i])) {
        raise(error_code::invalid_argument, "sampler: probability of token ", i, " is ", p[i],
              " (want a finite number >= 0)");
      }
      total += p[i];
    }
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
  // Top-k, top-p and min-p on softmax(row) (temperature_first: softmax(row / T)), then
  // softmax(row / T) over the survivors, renormalized (sampled configs).
  [[nodiscard]] std::vector<double> truncated(std::span<const float> logits) const {
    std::vector<double> p(logits.size(), 0.0);
    std::vector<std::int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto better = [&](std::int32_t a, std::int32_t b) {
      return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
             (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
    };
    const std::size_t k = config_.top_k == 0 ? ids.size() : std::min(config_.top_k, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), better);
    const double top = logits[static_cast<std::size_t>(ids[0])];
    const auto temperature = static_cast<double>(config_.temperature);
    // The cuts' temperature: 1 in llama.cpp's order (temperature after the cuts).
    const double cut_t = config_.order == sampling_order::temperature_first ? temperature : 1.0;
    auto weight = [&](std::size_t i, double t) {  // p_t / p_max at temperature t
      return std::exp((logits[static_cast<std::size_t>(ids[i])] - top) / t);
    };
    std::vector<double> w(k);  // w[0] = 1: p_t / p_max at the cuts' temperature
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i) sum += (w[i] = weight(i, cut_t));
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
    if (config_.min_p > 0.0f) {
      const auto m = static_cast<double>(config_.min_p);
      keep = static_cast<std::size_t>(std::find_if(w.begin(),
                                                   w.begin() + static_cast<std::ptrdiff_t>(keep),
                                                   [&](double x) { return x < m; }) -
                                      w.begin());
    }
    if (cut_t != temperature) {
      for (std::size_t i = 0; i < keep; ++i) w[i] = weight(i, temperature);
    }
    double total = 0;
    for (std::size_t i = 0; i < keep; ++i) total += w[i];
    for (std::size_t i = 0; i < keep; ++i) p[static_cast<std::size_t>(ids[i])] = w[i] / total;
    return p;
  }

  sampler_config config_;
  std::uint64_t state_;
};

}  // namespace npullm::batch
