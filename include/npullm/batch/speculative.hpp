// Speculative decoding: a draft proposes tokens, the target verifies them in one pass.
//
// A round, for a context c (prompt + tokens so far; the target's KV holds all of c but its last
// token):
//   1. the draft proposes m <= k tokens after c;
//   2. the target decodes [c.back(), p0 .. p(m-1)] in one pass of m + 1 rows, with logits for
//      exactly those rows (and their pre-norm hidden rows when the draft is a head);
//   3. the longest prefix of the proposals the target agrees with is accepted, plus the target's
//      own token after it: greedy, its argmax; sampled, the rejection rule of verify_sampled;
//   4. the KV of the rejected tokens is rolled back (truncate), so the target's KV holds what
//      plain decoding's would, and only verified tokens ever reach a prefix cache.
// Greedy output is exactly plain greedy decoding's whatever the draft proposes; sampled output
// is distributed as the target's sampler draws.
//
// The drafts (draft_source: propose(context, hidden, n, rng) -> draft_proposal; model_draft,
// self_draft, head_draft) are in drafts.hpp; this header is the verification (verify_sampled,
// verify_round) and the rounds of one sequence.
//
// speculative_generate (greedy) and speculative_generate_sampled run one sequence through a
// batch-1 pipeline (causal_lm's prefill / decode / truncate).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "npullm/batch/drafts.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tokens.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/step/pipeline.hpp"

namespace npullm::batch {

struct speculative_stats {
  std::size_t rounds = 0;    // verify passes
  std::size_t proposed = 0;  // draft tokens verified
  std::size_t accepted = 0;  // draft tokens accepted
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

// One sequence's verdict on a round.
struct round_verdict {
  std::size_t accepted = 0;          // proposals accepted
  std::vector<std::int32_t> tokens;  // the accepted proposals, then the target's own next token
};

// Judges a round: logits_of(i) is the target's logits row after the round's token i (i = 0:
// the context's last token, i = 1..m: proposal i - 1), so row i checks proposal i; context is
// the sequence's tokens up to the round (row i continues context + the first i proposals).
// rng null: greedy on the raw rows (the argmax must agree); a greedy rng: the same on the rows
// through its chain (bias, penalties, processor); otherwise verify_sampled with the target's
// distributions (a deterministic proposal's q is a point mass).
template <class Rows>
round_verdict verify_round(const Rows& logits_of, const draft_proposal& d, sampler* rng,
                           std::span<const std::int32_t> context = {}) {
  const std::size_t m = d.tokens.size();
  round_verdict v;
  const std::vector<std::int32_t> all =
      rng == nullptr ? std::vector<std::int32_t>{} : joined_context(*rng, context, d.tokens);
  auto context_of = [&](std::size_t i) {
    return all.empty() ? std::span<const std::int32_t>{}
                       : std::span<const std::int32_t>(all).first(context.size() + i);
  };
  if (rng == nullptr || rng->greedy()) {
    auto pick = [&](std::size_t i) {
      return rng == nullptr ? greedy_token(logits_of(i)) : rng->argmax(logits_of(i), context_of(i));
    };
    while (v.accepted < m && pick(v.accepted) == d.tokens[v.accepted]) ++v.accepted;
    v.tokens.assign(d.tokens.begin(), d.tokens.begin() + static_cast<std::ptrdiff_t>(v.accepted));
    v.tokens.push_back(pick(v.accepted));
    return v;
  }
  std::vector<std::vector<double>> p;
  for (std::size_t i = 0; i <= m; ++i) p.push_back(rng->distribution(logits_of(i), context_of(i)));
  std::vector<std::vector<double>> point;
  if (d.q.empty()) {
    for (std::int32_t t : d.tokens) {
      point.emplace_back(p[0].size(), 0.0);
      point.back()[static_cast<std::size_t>(t)] = 1.0;
    }
  }
  v.tokens = verify_sampled(p, d.q.empty() ? point : d.q, d.tokens, *rng, &v.accepted);
  return v;
}

// Refuses a proposal that does not fit the round: more tokens than asked, tokens outside the
// vocabulary, or distributions that do not match the tokens.
inline void check_proposal(const draft_proposal& d, std::size_t asked, std::size_t vocab) {
  if (d.tokens.size() > asked) {
    raise(error_code::invalid_argument, "speculative: the draft proposed ", d.tokens.size(),
          " tokens; ", asked, " were asked for");
  }
  check_token_ids(d.tokens, vocab, "speculative: draft");
  if (!d.q.empty() && d.q.size() != d.tokens.size()) {
    raise(error_code::invalid_argument, "speculative: the draft gave ", d.q.size(),
          " distributions for ", d.tokens.size(), " tokens");
  }
  for (std::size_t i = 0; i < d.q.size(); ++i) {
    if (d.q[i].size() != vocab) {
      raise(error_code::invalid_argument, "speculative: draft distribution ", i, " has ",
            d.q[i].size(), " entries for a vocabulary of ", vocab);
    }
  }
}

// ---- one sequence ---------------------------------------------------------------------------

namespace detail {

template <class Target, class Draft>
void check_speculation(const char* who, const Target& target, const Draft& draft,
                       std::span<const std::int32_t> prompt, std::size_t max_new_tokens,
                       std::size_t k) {
  if (k == 0 || max_new_tokens == 0) {
    raise(error_code::invalid_argument, who, ": k ", k, " and max_new_tokens ", max_new_tokens,
          " must be > 0");
  }
  if (prompt.empty()) raise(error_code::invalid_argument, who, ": empty prompt");
  const std::size_t vocab = target.config().vocab_size;
  check_token_ids(prompt, vocab, who, ": prompt");
  if (k + 1 > target.decode_rows()) {
    raise(error_code::invalid_argument, who, ": k ", k, " needs a decode shape of ", k + 1,
          " rows; the target's has ", target.decode_rows());
  }
  // The KV holds the prompt and every new token but the last.
  const std::size_t context = prompt.size() + max_new_tokens - 1;
  if (context > target.capacity()) {
    raise(error_code::capacity_exhausted, who, ": prompt of ", prompt.size(), " + ", max_new_tokens,
          " new tokens exceeds the target's capacity of ", target.capacity());
  }
  if constexpr (requires { draft.check(vocab, context); }) draft.check(vocab, context);
}

// The rounds of speculative decoding for one sequence (see the top of the file). target_rng /
// draft_rng null: greedy. Returns the max_new_tokens new tokens; the target's KV then holds the
// prompt and every new token but the last, as after plain decoding.
template <class Target, draft_source Draft>
std::vector<std::int32_t> speculate(const char* who, Target& target, Draft& draft,
                                    std::span<const std::int32_t> prompt,
                                    std::size_t max_new_tokens, std::size_t k, sampler* target_rng,
                                    sampler* draft_rng, speculative_stats* stats) {
  static_assert(decoding_pipeline<Target>,
                "speculative_generate: the target must be a decoding pipeline (step/pipeline.hpp: "
                "prefill, decode, truncate, length, capacity, decode_rows)");
  check_speculation(who, target, draft, prompt, max_new_tokens, k);
  constexpr bool hidden_wanted = draft_wants_hidden<Draft>;
  const std::size_t vocab = target.config().vocab_size;
  auto pick = [&](std::span<const float> logits, std::span<const std::int32_t> context) {
    return target_rng ? target_rng->sample(logits, context) : greedy_token(logits);
  };

  target.reset();
  // Prefill keeps only what the draft needs: the last row's logits (and its hidden row).
  auto first = output_selection::last();
  if (hidden_wanted) first.hidden_last();
  const step_output pre = target.prefill(prompt, first);
  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  context.push_back(pick(pre.logits_of(prompt.size() - 1), prompt));
  std::vector<float> hidden;
  if constexpr (hidden_wanted) {
    const auto h = pre.hidden_of(prompt.size() - 1);
    hidden.assign(h.begin(), h.end());
  }

  speculative_stats local;
  const std::size_t end = prompt.size() + max_new_tokens;
  while (context.size() < end) {
    // Never more than the round can emit: the accepted proposals and one target token.
    const std::size_t asked = std::min(k, end - context.size() - 1);
    const draft_proposal d =
        asked == 0 ? draft_proposal{} : draft.propose(context, hidden, asked, draft_rng);
    check_proposal(d, asked, vocab);
    const std::size_t m = d.tokens.size();
    std::vector<std::int32_t> ids{context.back()};
    ids.insert(ids.end(), d.tokens.begin(), d.tokens.end());
    std::vector<std::size_t> rows(m + 1);
    std::iota(rows.begin(), rows.end(), std::size_t{0});
    output_selection sel;
    sel.logits_for(rows);
    if (hidden_wanted) sel.hidden_for(rows);
    const std::size_t base = target.length();       // context but its last token
    if (target_rng) target_rng->prefetch(context);  // the first row's context: always checked
    const step_output v = target.decode(ids, sel);
    const round_verdict r =
        verify_round([&](std::size_t i) { return v.logits_of(i); }, d, target_rng, context);
    target.truncate(base + 1 + r.accepted);  // rejected KV rolled back
    context.insert(context.end(), r.tokens.begin(), r.tokens.end());
    if constexpr (hidden_wanted) {
      const auto h = v.hidden_of(r.accepted);
      hidden.assign(h.begin(), h.end());
    }
    ++local.rounds;
    local.proposed += m;
    local.accepted += r.accepted;
  }
  if (stats) *stats = local;
  return {context.begin() + static_cast<std::ptrdiff_t>(prompt.size()), context.end()};
}

}  // namespace detail

// Greedy speculative decoding of max_new_tokens after prompt with up to k proposals a round:
// exactly plain greedy decoding's tokens. The target's decode shape must hold k + 1 rows.
// Arguments are checked before the target changes (invalid_argument / capacity_exhausted).
template <class Target, draft_source Draft>
std::vector<std::int32_t> speculative_generate(Target& target, Draft& draft,
                                               std::span<const std::int32_t> prompt,
                                               std::size_t max_new_tokens, std::size_t k,
                                               speculative_stats* stats = nullptr) {
  return detail::speculate("speculative_generate", target, draft, prompt, max_new_tokens, k,
                           nullptr, nullptr, stats);
}

// Sampled speculative decoding: the draft draws its proposals with its own sampler (seeded from
// seed) and keeps their distributions q; verify_sampled accepts or resamples with the target's.
// Each token is distributed as the target's sampler (config) would draw it.
template <class Target, draft_source Draft>
std::vector<std::int32_t> speculative_generate_sampled(Target& target, Draft& draft,
                                                       std::span<const std::int32_t> prompt,
                                                       std::size_t max_new_tokens, std::size_t k,
                                                       const sampler_config& config,
                                                       std::uint64_t seed,
                                                       speculative_stats* stats = nullptr) {
  sampler target_rng(config, seed), draft_rng(config, seed ^ 0x9e3779b97f4a7c15ull);
  return detail::speculate("speculative_generate_sampled", target, draft, prompt, max_new_tokens, k,
                           &target_rng, &draft_rng, stats);
}

}  // namespace npullm::batch
