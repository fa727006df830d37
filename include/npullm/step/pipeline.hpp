// The contracts between the executors (batch/) and the pipelines (model/): what batch_unroll,
// speculative decoding and the batched generator call. An executor static_asserts the concept
// with a sentence, so a pipeline that does not fit fails with that sentence first.
//
//   batch1_pipeline     one sequence: prefill with an output selection, reset, config sizes
//   decoding_pipeline   + decode after the sequence (early exit through the first n layers),
//                       truncate, length, capacity, decode_rows (speculative targets, drafts)
//   block_pipeline      many sequences over block KV: new_sequence, step_sequences, kv_pool,
//                       step_rows, capacity (the batched generator, batched drafts)
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "npullm/core/tensor.hpp"
#include "npullm/step/output.hpp"

namespace npullm {

template <class P>
concept batch1_pipeline = requires(P& p, const P& cp, std::span<const std::int32_t> ids,
                                   const output_selection& sel) {
  { p.prefill(ids, sel) } -> std::same_as<step_output>;
  p.reset();
  { cp.config().vocab_size } -> std::convertible_to<std::size_t>;
  { cp.config().hidden_size } -> std::convertible_to<std::size_t>;
};

template <class P>
concept decoding_pipeline =
    batch1_pipeline<P> && requires(P& p, const P& cp, std::span<const std::int32_t> ids,
                                   const output_selection& sel, std::size_t n) {
  { p.decode(ids, sel) } -> std::same_as<step_output>;
  { p.decode(ids, sel, n) } -> std::same_as<step_output>;  // through the first n layers
  p.truncate(n);
  { cp.length() } -> std::convertible_to<std::size_t>;
  { cp.capacity() } -> std::convertible_to<std::size_t>;
  { cp.decode_rows() } -> std::convertible_to<std::size_t>;
};

// sequence_input: {table_type* table; std::span<const std::int32_t> ids;}, one per sequence.
template <class P>
concept block_pipeline = requires(P& p, const P& cp,
                                  std::span<const typename P::sequence_input> inputs,
                                  const output_selection& sel, std::size_t layers) {
  typename P::table_type;
  requires std::same_as<decltype(std::declval<typename P::sequence_input&>().table),
                        typename P::table_type*>;
  { p.new_sequence() } -> std::same_as<typename P::table_type>;
  p.kv_pool();
  { p.step_sequences(inputs) } -> std::same_as<tensor<float, 2>>;  // last rows' logits
  { p.step_sequences(inputs, sel, layers) } -> std::same_as<step_output>;
  { cp.step_rows() } -> std::convertible_to<std::size_t>;
  { cp.capacity() } -> std::convertible_to<std::size_t>;
  { cp.config().vocab_size } -> std::convertible_to<std::size_t>;
};

}  // namespace npullm

// batch:: spelled batch1_pipeline before it moved here; callers keep compiling.
namespace npullm::batch {
using npullm::batch1_pipeline;
}  // namespace npullm::batch
