// Token ids against a vocabulary: the one check every entry point that takes ids runs.
//
//   check_token_ids(ids, vocab, "causal_lm:")   // "causal_lm: token 600 at 1 outside the ..."
//   check_token_ids(stop, vocab, "generator: request ", id, ": stop")
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"

namespace npullm {
inline namespace NPULLM_ISA_NAMESPACE {  // a loop that raises through the ISA's raise (isa.hpp)

// Throws invalid_argument "<context...> token <id> at <i> outside the vocabulary of <vocab>"
// for the first id outside [0, vocab). The context is formatted only then.
template <class... Context>
void check_token_ids(std::span<const std::int32_t> ids, std::size_t vocab,
                     const Context&... context) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= vocab) [[unlikely]] {
      raise(error_code::invalid_argument, context..., " token ", ids[i], " at ", i,
            " outside the vocabulary of ", vocab);
    }
  }
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm
