// batched_scorer: scores [N, L] on the host in packed passes, not one row at a time.
//
// The rows' tokens are packed without padding; each projection is one GEMM over all of them;
// attention runs per row with its own causal mask. A host CPU has no batch-1 restriction, so
// this is the fast path; it returns the same last-token logits as batch_unroll (within f32
// rounding) and leaves the pipeline's own sequence untouched.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "npullm/batch/inputs.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"

namespace npullm::batch {

// Pipelines that can score independent sequences in one pass (causal_lm does).
template <class P>
concept packed_scorer = requires(P& p, std::span<const std::span<const std::int32_t>> rows) {
  { p.score(rows) } -> std::same_as<tensor<float, 2>>;
};

template <packed_scorer P>
class batched_scorer {
 public:
  explicit batched_scorer(P& pipeline) noexcept : p_(&pipeline) {}

  // Last-token logits of every row: (N, vocab).
  tensor<float, 2> score(const batch_inputs& in) {
    const auto rows = resolve_rows(in);
    std::vector<std::span<const std::int32_t>> spans;
    spans.reserve(rows.size());
    for (const auto& r : rows) spans.push_back(r.tokens);
    return p_->score(spans);
  }

 private:
  P* p_;
};

}  // namespace npullm::batch
