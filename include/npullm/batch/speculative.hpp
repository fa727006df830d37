// Speculative decoding (greedy verification) for one sequence.
//
// A draft proposes k tokens after the last accepted one; the target verifies them in one
// decode pass of k + 1 rows (output-row selection: logits for exactly those rows); the longest
// prefix on which the target's own greedy choice agrees is accepted, plus the target's next
// token. The KV of rejected tokens is rolled back (truncate), so the target's KV is what plain
// decoding would have. The output is exactly plain greedy decoding's, whatever the draft.
//
//   draft_source    what a draft is: start(prompt), propose(last, k), rollback(length),
//                   feed(tokens)
//   model_draft<LM> a smaller causal_lm (or the target's twin) as the draft
//
// verify_sampled is the rejection-sampling rule for sampled decoding, on explicit
// distributions; speculative_generate_sampled runs it over two pipelines. Still to come
// (issue 11): self-speculation from the target's first layers, a draft head fed by pre-norm
// hidden rows, and use inside the batched generator.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npullm/batch/output_rows.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/core/error.hpp"

namespace npullm::batch {

template <class D>
concept draft_source = requires(D& d, std::span<const std::int32_t> prompt, std::int32_t last,
                                std::size_t n) {
  d.start(prompt);                                                    // the context so far
  { d.propose(last, n) } -> std::same_as<std::vector<std::int32_t>>;  // n tokens after `last`
  d.rollback(n);                                                      // keep the first n tokens
  d.feed(prompt);                                                     // append without proposing
  { d.length() } -> std::convertible_to<std::size_t>;
};

// Greedy token of a logits row (first largest).
inline std::int32_t greedy_token(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// A causal_lm as the draft: greedy proposals, KV kept in step with the accepted tokens.
template <class LM>
class model_draft {
 public:
  explicit model_draft(LM& lm) noexcept : lm_(&lm) {}
  void start(std::span<const std::int32_t> prompt) {
    lm_->reset();
    lm_->prefill(prompt, output_selection::none());
  }
  std::vector<std::int32_t> propose(std::int32_t last, std::size_t n) {
    std::vector<std::int32_t> out;
    std::int32_t x = last;
    for (std::size_t i = 0; i < n; ++i) {
      const std::array<std::int32_t, 1> one{x};
      x = greedy_token(lm_->decode(one).logits_of(0));
      out.push_back(x);
    }
    return out;
  }
  void rollback(std::size_t n) { lm_->truncate(n); }
  [[nodiscard]] std::size_t length() const { return lm_->length(); }
  // Feeds tokens without proposing (to catch up after all proposals were accepted).
  void feed(std::span<const std::int32_t> ids) { lm_->decode(ids, output_selection::none()); }

 private:
  LM* lm_;
};

struct speculative_stats {
  std::size_t rounds = 0;
  std::size_t proposed = 0;
  std::size_t accepted = 0;
  [[nodiscard]] double acceptance() const noexcept {
    return proposed == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(proposed);
  }
};

// The rejection-sampling rule of sampled speculative decoding, on explicit distributions:
// draft token i (drawn from q[i]) is accepted with probability min(1, p[i](x) / q[i](x)); at
// the first rejection a token is drawn from normalize(max(0, p[i] - q[i])) and the round ends;
// when every draft token is accepted one more is drawn from p[k]. The tokens it returns are
// distributed exactly as the target's p (the classic result; tested by chi-squared).
//   p: k + 1 target distributions, q: k draft distributions, draft: the k draft tokens.
inline std::vector<std::int32_t> verify_sampled(std::span<const std::vector<double>> p,
                                                std::span<const std::vector<double>> q,
                                                std::span<const std::int32_t> draft, sampler& rng,
                                                std::size_t* accepted = nullptr) {
  if (p.size() != draft.size() + 1 || q.size() != draft.size()) {
    raise(error_code::invalid_shape, "verify_sampled: ", p.size(), " target and ", q.size(),
          " draft distributions for ", draft.size(), " draft tokens");
  }
  std::vector<std::int32_t> out;
  for (std::size_t i = 0; i < draft.size(); ++i) {
    const auto x = static_cast<std::size_t>(draft[i]);
    const double px = p[i][x], qx = q[i][x];
    if (qx > 0 && rng.uniform() < std::min(1.0, px / qx)) {
      out.push_back(draft[i]);
      continue;
    }
    std::vector<double> residual(p[i].size());
    for (std::size_t t = 0; t < residual.size(); ++t)
      residual[t] = std::max(0.0, p[i][t] - q[i][t]);
    out.push_back(rng.sample_from(residual));
    if (accepted) *accepted = i;
    return out;
  }
  out.push_back(rng.sample_from(p[draft.size()]));
  if (accepted) *accepted = draft.size();
  return out;
}

// Greedy speculative decoding of max_new_tokens after prompt with k proposals per round.
// The target's decode shape must hold k + 1 rows.
template <class Target, draft_source Draft>
std::vector<std::int32_t> speculative_generate(Target& target, Draft& draft,
                                               std::span<const std::int32_t> prompt,
                                               std::size_t max_new_tokens, std::size_t k,
                                               speculative_stats* stats = nullptr) {
  if (k == 0 || max_new_tokens == 0) {
    raise(error_code::invalid_argument, "speculative_generate: k ", k, " and max_new_tokens ",
          max_new_tokens, " must be > 0");
  }
  target.reset();
  std::vector<std::int32_t> out;
  out.push_back(greedy_token(target.prefill(prompt).logits_of(prompt.size() - 1)));
  draft.start(prompt);
  speculative_stats local;
  while (out.size() < max_new_tokens) {
    const std::size_t base = target.length();  // KV holds prompt + out[0 .. end-1)
    const std::int32_t last = out.back();
    const std::vector<std::int32_t> proposal =
        draft.propose(last, k);  // draft fed last, p0..p(k-2)
    std::vector<std::int32_t> verify{last};
    verify.insert(verify.end(), proposal.begin(), proposal.end());
    const step_output v = target.decode(verify, output_selection::all_rows());
    std::size_t accepted = 0;
    while (accepted < k && greedy_token(v.logits_of(accepted)) == proposal[accepted]) ++accepted;
    // The target keeps last + the accepted proposals; its own next token follows them.
    target.truncate(base + 1 + accepted);
    for (std::size_t i = 0; i < accepted && out.size() < max_new_tokens; ++i)
      out.push_back(proposal[i]);
    if (out.size() < max_new_tokens) out.push_back(greedy_token(v.logits_of(accepted)));
    // The draft keeps the same tokens: it has last, p0..p(k-2); all accepted -> feed p(k-1).
    if (accepted == k) {
      draft.feed(std::span<const std::int32_t>(&proposal[k - 1], 1));
    } else {
      draft.rollback(base + 1 + accepted);
    }
    ++local.rounds;
    local.proposed += k;
    local.accepted += accepted;
  }
  // Both hold the KV of everything but the last output token, as after plain decoding.
  target.truncate(prompt.size() + out.size() - 1);
  if (stats) *stats = local;
  return out;
}

// Sampled speculative decoding over two pipelines: the draft samples k tokens with its own
// sampler (keeping their distributions q), the target's distributions p for the k + 1 rows come
// from one decode pass, and verify_sampled accepts or resamples; rejected KV is rolled back on
// both sides. Each output token is distributed as the target's sampler would draw it.
template <class Target, class DraftLM>
std::vector<std::int32_t> speculative_generate_sampled(Target& target, DraftLM& draft,
                                                       std::span<const std::int32_t> prompt,
                                                       std::size_t max_new_tokens, std::size_t k,
                                                       const sampler_config& config,
                                                       std::uint64_t seed,
                                                       speculative_stats* stats = nullptr) {
  if (k == 0 || max_new_tokens == 0) {
    raise(error_code::invalid_argument, "speculative_generate_sampled: k ", k,
          " and max_new_tokens ", max_new_tokens, " must be > 0");
  }
  sampler target_rng(config, seed), draft_rng(config, seed ^ 0x9e3779b97f4a7c15ull);
  target.reset();
  std::vector<std::int32_t> out{
      target_rng.sample(target.prefill(prompt).logits_of(prompt.size() - 1))};
  draft.reset();
  draft.prefill(prompt, output_selection::none());
  speculative_stats local;
  while (out.size() < max_new_tokens) {
    const std::size_t base = target.length();
    std::vector<std::int32_t> proposal;
    std::vector<std::vector<double>> q, p;
    std::int32_t x = out.back();
    for (std::size_t i = 0; i < k; ++i) {
      const std::array<std::int32_t, 1> one{x};
      q.push_back(draft_rng.distribution(draft.decode(one).logits_of(0)));
      x = draft_rng.sample_from(q.back());
      proposal.push_back(x);
    }
    std::vector<std::int32_t> verify{out.back()};
    verify.insert(verify.end(), proposal.begin(), proposal.end());
    const step_output v = target.decode(verify, output_selection::all_rows());
    for (std::size_t i = 0; i <= k; ++i) p.push_back(target_rng.distribution(v.logits_of(i)));
    std::size_t accepted = 0;
    const std::vector<std::int32_t> tokens = verify_sampled(p, q, proposal, target_rng, &accepted);
    target.truncate(base + 1 + accepted);
    if (accepted == k) {
      draft.decode(std::span<const std::int32_t>(&proposal[k - 1], 1), output_selection::none());
    } else {
      draft.truncate(base + 1 + accepted);
    }
    for (std::int32_t t : tokens) {
      if (out.size() < max_new_tokens) out.push_back(t);
    }
    ++local.rounds;
    local.proposed += k;
    local.accepted += accepted;
  }
  target.truncate(prompt.size() + out.size() - 1);
  if (stats) *stats = local;
  return out;
}

}  // namespace npullm::batch
