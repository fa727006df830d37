// grammar_processor: a token grammar (grammar/token_matcher.hpp) as the sampler's logits
// processor (sampler.hpp, step 3): tokens the grammar forbids get -inf, so every sampler
// control (bias, penalties, top-k / top-p / min-p, temperature, greedy) acts on the allowed
// tokens only.
//
// The sampler calls a processor with (context, row), context = prompt + tokens chosen so far,
// and a processor must depend on those arguments only (speculative decoding calls it for rows it
// then discards, and for one context more than once). This one keeps a matcher as a cache of
// the generated part: each call rolls it back to the longest prefix it shares with the
// context's generated tokens and accepts the rest, so the mask is the grammar's after exactly
// those tokens. A context whose generated tokens the grammar does not allow (a draft's
// proposal past a token the target would refuse) leaves only the end-of-generation tokens in
// the row: speculative verification discards that row, and a sampler never chooses such a
// context by itself.
//
// Row entries past the vocabulary (an embedding padded to a round size) are masked too.
// Copies share one matcher (std::function copies it): make one processor per sequence; they may
// share a token_grammar, used by one thread at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/grammar/token_matcher.hpp"

namespace npullm::batch {

class grammar_processor {
 public:
  // prompt_length: how many leading context tokens are the prompt (not checked by the grammar).
  grammar_processor(std::shared_ptr<grammar::token_grammar> g, std::size_t prompt_length)
      : s_(std::make_shared<state>(std::move(g))), prompt_(prompt_length) {}

  void operator()(std::span<const std::int32_t> context, std::span<float> row) const {
    if (context.size() < prompt_)
      raise(error_code::invalid_argument, "grammar_processor: a context of ", context.size(),
            " tokens is shorter than its prompt of ", prompt_);
    state& s = *s_;
    const auto generated = context.subspan(prompt_);
    std::size_t same = 0;
    while (same < s.tokens.size() && same < generated.size() && s.tokens[same] == generated[same])
      ++same;
    s.matcher.rollback(s.tokens.size() - same);
    s.tokens.resize(same);
    bool valid = true;
    for (std::size_t k = same; k < generated.size(); ++k) {
      if (!s.matcher.try_accept(generated[k])) {
        valid = false;
        break;
      }
      s.tokens.push_back(generated[k]);
    }
    constexpr float masked = -std::numeric_limits<float>::infinity();
    const std::size_t n = s.matcher.compiled().index().size();
    if (!valid) {
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (!s.matcher.compiled().index().is_eog(static_cast<std::int32_t>(i))) row[i] = masked;
      }
      return;
    }
    s.matcher.fill_mask(s.mask);
    for (std::size_t w = 0; w < s.mask.size(); ++w) {
      const std::uint64_t bits = s.mask[w];
      if (bits == ~std::uint64_t{0}) continue;
      const std::size_t end = std::min(row.size(), std::min(n, (w + 1) * 64));
      for (std::size_t i = w * 64; i < end; ++i)
        if (!((bits >> (i & 63)) & 1)) row[i] = masked;
    }
    for (std::size_t i = n; i < row.size(); ++i) row[i] = masked;
  }

  // The matcher after the last call's context (can_end, accepted tokens).
  [[nodiscard]] const grammar::token_matcher& matcher() const noexcept { return s_->matcher; }

 private:
  struct state {
    explicit state(std::shared_ptr<grammar::token_grammar> g)
        : matcher(std::move(g)), mask(matcher.words()) {}
    grammar::token_matcher matcher;
    std::vector<std::int32_t> tokens;  // the generated tokens the matcher has accepted
    std::vector<std::uint64_t> mask;
  };
  std::shared_ptr<state> s_;
  std::size_t prompt_ = 0;
};

}  // namespace npullm::batch
