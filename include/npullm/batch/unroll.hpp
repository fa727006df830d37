// batch_unroll: scores [N, L] through a batch-1 pipeline (what a static-shape device compiles),
// one row at a time.
//
// For each row r: reset the pipeline's KV state, hand it a zero-copy view of the row's tokens,
// run its prefill, and write the outputs into row r of [N, ...] results: last-token logits by
// default; pooled pre-norm hidden states on request. Results equal running each row alone, bit
// for bit. Generation is not unrolled: generate() throws unsupported (batched generation needs
// the batched generator). An error in row r is rethrown naming the row, with the pipeline reset
// and usable.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "npullm/batch/inputs.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/step/pipeline.hpp"

namespace npullm::batch {

enum class pooling { none, last, mean };  // of pre-norm hidden states

struct unroll_options {
  bool logits = true;              // last-token logits -> (N, vocab)
  pooling hidden = pooling::none;  // pooled pre-norm hidden states -> (N, hidden)
};

struct unroll_result {
  tensor<float, 2> logits;  // (N, vocab), or empty
  tensor<float, 2> hidden;  // (N, hidden), or empty
};

template <class P>
class batch_unroll {
  static_assert(batch1_pipeline<P>,
                "batch_unroll<P>: P must be a batch-1 pipeline (step/pipeline.hpp: prefill(ids, "
                "output_selection) -> step_output, reset(), config().vocab_size / hidden_size)");

 public:
  explicit batch_unroll(P& pipeline) noexcept : p_(&pipeline) {}

  unroll_result run(const batch_inputs& in, const unroll_options& opt = {}) {
    const auto rows = resolve_rows(in);
    const std::size_t n = rows.size();
    const auto& c = p_->config();
    unroll_result out{
        opt.logits ? tensor<float, 2>(n, c.vocab_size) : tensor<float, 2>(),
        opt.hidden != pooling::none ? tensor<float, 2>(n, c.hidden_size) : tensor<float, 2>()};
    for (std::size_t r = 0; r < n; ++r) {
      const std::size_t len = rows[r].tokens.size();
      output_selection sel = opt.logits ? output_selection::last() : output_selection::none();
      if (opt.hidden == pooling::last) sel.hidden_last();
      if (opt.hidden == pooling::mean) {
        std::vector<std::size_t> all(len);
        for (std::size_t i = 0; i < len; ++i) all[i] = i;
        sel.hidden_for(std::move(all));
      }
      p_->reset();
      try {
        const step_output o = p_->prefill(rows[r].tokens, sel);
        if (opt.logits)
          std::copy_n(o.logits.data(), c.vocab_size, out.logits.data() + r * c.vocab_size);
        if (opt.hidden != pooling::none) {
          float* dst = out.hidden.data() + r * c.hidden_size;
          std::fill_n(dst, c.hidden_size, 0.0f);
          for (std::size_t i = 0; i < o.hidden.extent(0); ++i) {
            for (std::size_t d = 0; d < c.hidden_size; ++d) dst[d] += o.hidden.view()(i, d);
          }
          const float inv = 1.0f / static_cast<float>(o.hidden.extent(0));
          for (std::size_t d = 0; d < c.hidden_size; ++d) dst[d] *= inv;
        }
      } catch (const error& e) {
        p_->reset();
        raise(e.code(), "batch_unroll: row ", r, " of ", n, ": ", e.message());
      }
    }
    p_->reset();
    return out;
  }

  // Last-token logits of every row: (N, vocab).
  tensor<float, 2> score(const batch_inputs& in) { return run(in).logits; }

  [[noreturn]] void generate(const batch_inputs&, std::size_t /*max_new_tokens*/) {
    raise(
        error_code::unsupported,
        "batch_unroll: generation is not unrolled row by row; batched generation needs the batched "
        "generator (npullm/batch/generate.hpp)");
  }

 private:
  P* p_;
};

}  // namespace npullm::batch
