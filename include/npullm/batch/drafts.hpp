// The drafts of speculative decoding (batch/speculative.hpp runs the rounds): what a draft is
// (draft_source: propose(context, hidden, n, rng) -> draft_proposal; draft_query, a sequence of
// a batched round), how a draft token is drawn from a logits row (greedy_token, draw_into), and
// the three drafts:
//   model_draft<LM>   a second, smaller pipeline with its own KV. It keeps in step lazily: each
//                     proposal first rolls its KV back to the longest prefix it shares with the
//                     context, then feeds the rest, so the loops have no catch-up or rollback
//                     code for drafts (and a draft survives a preempted, recomputed sequence)
//   self_draft<LM>    the target itself through its first n layers (early exit: final norm and
//                     LM head after layer n), written into the target's own KV and truncated
//                     away before the verify pass rewrites those positions in every layer
//   head_draft<Head>  a draft head (draft_head) fed by the target's pre-norm hidden row of the
//                     last accepted row: head i proposes the token i + 1 places after the one
//                     that row predicted (Medusa); model::medusa_head (model/medusa_head.hpp)
//                     is one over the target's LM head
// A draft may also offer propose_batch(queries) and forget(id): the batched generator
// (generate.hpp) runs the same rounds for all its sequences in packed passes.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "npullm/batch/sampler.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/step/pipeline.hpp"

namespace npullm::batch {

// What a draft proposes after a context.
struct draft_proposal {
  std::vector<std::int32_t> tokens;    // m tokens after the context's last one
  std::vector<std::vector<double>> q;  // sampled: the (vocab) distribution token i was drawn
                                       // from; empty: deterministic (point masses)
};

// A draft for one sequence. context: prompt + tokens so far (the target's KV holds all but the
// last); hidden: the target's pre-norm hidden row of the row that produced context.back() (empty
// unless the draft declares `static constexpr bool wants_hidden = true`); rng: draw proposals
// with it and keep their distributions (sampled decoding), or null: greedy proposals. A draft
// proposes at most n tokens (fewer is fine). Optional: check(vocab, max_context), called before
// a generation changes anything, to refuse a draft that cannot serve it.
template <class D>
concept draft_source = requires(D& d, std::span<const std::int32_t> context,
                                std::span<const float> hidden, std::size_t n, sampler* rng) {
  { d.propose(context, hidden, n, rng) } -> std::same_as<draft_proposal>;
};

template <class D>
inline constexpr bool draft_wants_hidden = requires {
  requires D::wants_hidden;
};

// One sequence of a batched round, as the generator hands it to a draft's propose_batch.
template <class Table>
struct draft_query {
  std::size_t id;                         // the request: a key for per-sequence draft state
  Table* table;                           // the target's KV of the sequence: context but its last
  std::span<const std::int32_t> context;  // prompt + tokens so far
  std::span<const float> hidden;          // as in draft_source (empty unless wanted)
  std::size_t n;                          // proposals wanted (0: none)
  sampler* rng;                           // sampled request: draw with it; null: greedy
};

// Greedy token of a logits row: ops::argmax (the first largest), after check_logits: a NaN or
// +inf entry, or a row of nothing but -inf, is refused (invalid_argument) as the sampler
// refuses it, rather than choosing whatever argmax makes of it.
inline std::int32_t greedy_token(std::span<const float> logits) {
  check_logits(logits, "greedy decoding");
  return ops::argmax(logits);
}

// The context a row continues: context, then tokens (a round's proposals so far). Built only
// when the sampler's chain reads it (penalties, processor).
inline std::vector<std::int32_t> joined_context(const sampler& rng,
                                                std::span<const std::int32_t> context,
                                                std::span<const std::int32_t> tokens) {
  std::vector<std::int32_t> all;
  if (!rng.config().uses_context()) return all;
  all.reserve(context.size() + tokens.size());
  all.assign(context.begin(), context.end());
  all.insert(all.end(), tokens.begin(), tokens.end());
  return all;
}

// Appends a draft token chosen from a logits row: greedy, or drawn with rng (its distribution,
// through rng's chain after context and the proposals so far, kept in q). Returns the token.
inline std::int32_t draw_into(draft_proposal& out, std::span<const float> logits, sampler* rng,
                              std::span<const std::int32_t> context = {}) {
  std::int32_t t = 0;
  if (rng == nullptr) {
    t = greedy_token(logits);
  } else {
    out.q.push_back(rng->distribution(logits, joined_context(*rng, context, out.tokens)));
    t = rng->sample_from(out.q.back());
  }
  out.tokens.push_back(t);
  return t;
}

// ---- drafts -----------------------------------------------------------------------------------

// A causal_lm as the draft. One sequence: its own single-sequence KV. Batched (block KV): a
// block table per request from its own pool, fed in packed steps.
template <class LM>
class model_draft {
  static_assert(decoding_pipeline<LM>,
                "model_draft<LM>: LM must be a decoding pipeline (step/pipeline.hpp: prefill, "
                "decode, truncate, length, capacity, decode_rows)");

 public:
  explicit model_draft(LM& lm) noexcept : lm_(&lm) {}

  void check(std::size_t vocab, std::size_t max_context) const {
    if (lm_->config().vocab_size != vocab) {
      raise(error_code::invalid_argument, "model_draft: the draft's vocabulary of ",
            lm_->config().vocab_size, " differs from the target's ", vocab);
    }
    if (lm_->capacity() < max_context) {
      raise(error_code::capacity_exhausted, "model_draft: the draft holds ", lm_->capacity(),
            " tokens; the generation needs ", max_context);
    }
  }

  draft_proposal propose(std::span<const std::int32_t> context, std::span<const float>,
                         std::size_t n, sampler* rng) {
    draft_proposal out;
    if (n == 0) return out;
    // Keep the KV of the longest prefix shared with the context (never all of it: the last
    // token is fed again for its logits): after a round, everything up to the first rejected
    // proposal, so only the target's own token (and the last proposal when all were accepted)
    // is fed here.
    std::size_t keep = lm_->length() == fed_.size() ? shared_prefix(fed_, context) : 0;
    keep = std::min(keep, context.size() - 1);
    const auto rest = context.subspan(keep);
    step_output s;
    if (keep == 0) {
      lm_->reset();
      fed_.clear();
      s = lm_->prefill(rest);
    } else {
      lm_->truncate(keep);
      fed_.resize(keep);
      s = rest.size() <= lm_->decode_rows() ? lm_->decode(rest) : lm_->prefill(rest);
    }
    fed_.insert(fed_.end(), rest.begin(), rest.end());
    std::int32_t x = draw_into(out, s.logits_of(rest.size() - 1), rng, context);
    for (std::size_t i = 1; i < n; ++i) {
      const std::array<std::int32_t, 1> one{x};
      const step_output next = lm_->decode(one);
      fed_.push_back(x);
      x = draw_into(out, next.logits_of(0), rng, context);
    }
    return out;
  }

  // Every query's proposals in packed steps of the draft pipeline: the first step brings each
  // request's table up to its context (and draws proposal 0), then one token per request a
  // step. A request whose catch-up does not fit the draft's pool proposes nothing this round;
  // a later step that does not fit ends every proposal there (proposals are only a guess).
  template <class Table>
  std::vector<draft_proposal> propose_batch(std::span<const draft_query<Table>> queries) requires
      block_pipeline<LM> {
    using input = typename LM::sequence_input;
    std::vector<draft_proposal> out(queries.size());
    std::vector<std::size_t> live;  // queries still proposing
    {
      std::vector<input> inputs;
      std::vector<std::size_t> who;
      std::size_t rows = 0;
      auto flush = [&] {
        if (inputs.empty()) return;
        try {
          const auto logits = lm_->step_sequences(inputs);
          for (std::size_t j = 0; j < who.size(); ++j) {
            const draft_query<Table>& q = queries[who[j]];
            lane& l = lane_of(q.id);
            l.fed.insert(l.fed.end(), inputs[j].ids.begin(), inputs[j].ids.end());
            draw_into(out[who[j]], {logits.data() + j * logits.extent(1), logits.extent(1)}, q.rng,
                      q.context);
            live.push_back(who[j]);
          }
        } catch (const error& e) {
          if (e.code() != error_code::capacity_exhausted) throw;
        }
        inputs.clear();
        who.clear();
        rows = 0;
      };
      for (std::size_t i = 0; i < queries.size(); ++i) {
        const draft_query<Table>& q = queries[i];
        if (q.n == 0) continue;
        auto it = lanes_.find(q.id);
        if (it == lanes_.end()) it = lanes_.emplace(q.id, lane{lm_->new_sequence(), {}}).first;
        lane& l = it->second;
        const std::size_t keep = std::min(shared_prefix(l.fed, q.context), q.context.size() - 1);
        l.table.truncate(keep);
        l.fed.resize(keep);
        const auto rest = q.context.subspan(keep);
        // Checked here: flush() takes capacity_exhausted for "the pool is full, no proposals".
        if (rest.size() > lm_->step_rows()) {
          raise(error_code::capacity_exhausted, "model_draft: sequence ", q.id, ": ", rest.size(),
                " tokens to catch up exceed the draft's step of ", lm_->step_rows(), " rows");
        }
        if (rows + rest.size() > lm_->step_rows()) flush();
        inputs.push_back({&l.table, rest});
        who.push_back(i);
        rows += rest.size();
      }
      flush();
    }
    std::sort(live.begin(), live.end());
    for (std::size_t step = 1;; ++step) {
      std::erase_if(live, [&](std::size_t i) { return queries[i].n <= step; });
      if (live.empty()) break;
      std::vector<std::int32_t> last(live.size());  // stable storage for the inputs' ids
      std::vector<input> inputs;
      for (std::size_t j = 0; j < live.size(); ++j) {
        last[j] = out[live[j]].tokens.back();
        inputs.push_back({&lane_of(queries[live[j]].id).table, {&last[j], 1}});
      }
      tensor<float, 2> logits;
      try {
        logits = lm_->step_sequences(inputs);
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        break;
      }
      for (std::size_t j = 0; j < live.size(); ++j) {
        const draft_query<Table>& q = queries[live[j]];
        lane_of(q.id).fed.push_back(last[j]);
        draw_into(out[live[j]], {logits.data() + j * logits.extent(1), logits.extent(1)}, q.rng,
                  q.context);
      }
    }
    return out;
  }

  // A request left the batch: its draft KV goes back to the pool.
  void forget(std::size_t id) { lanes_.erase(id); }

 private:
  // The pipeline's block table type (whatever allocator its pool uses).
  using table_type = typename LM::table_type;
  struct lane {
    table_type table;
    std::vector<std::int32_t> fed;  // the tokens whose KV the table holds
  };
  lane& lane_of(std::size_t id) {
    const auto it = lanes_.find(id);
    if (it == lanes_.end()) raise(error_code::out_of_range, "model_draft: no sequence ", id);
    return it->second;
  }
  static std::size_t shared_prefix(const std::vector<std::int32_t>& fed,
                                   std::span<const std::int32_t> context) {
    const std::size_t n = std::min(fed.size(), context.size());
    return static_cast<std::size_t>(
        std::mismatch(fed.begin(), fed.begin() + static_cast<std::ptrdiff_t>(n), context.begin())
            .first -
        fed.begin());
  }

  LM* lm_;
  std::vector<std::int32_t> fed_;      // the tokens whose KV the single-sequence draft holds
  std::map<std::size_t, lane> lanes_;  // batched: per request
};

// Self-speculation: the target through its first `layers` layers proposes. Its draft steps
// append to the target's own KV (one sequence: the pipeline's sequence; batched: each request's
// table) and are truncated away before the verify pass. That pass then writes every layer of
// those positions again: the accepted tokens' first-layer K/V come out the same as the draft's
// (a layer's K/V at a position depend only on the tokens up to it and the layers below), the
// upper layers' stale values are overwritten, and no draft KV is left past the verified length.
// (Keeping the draft's first-layer K/V and starting the verify pass at layer `layers` would
// save that recomputation; the pipeline does not take a start layer.)
template <class LM>
class self_draft {
  static_assert(decoding_pipeline<LM>,
                "self_draft<LM>: LM must be a decoding pipeline with an early exit "
                "(step/pipeline.hpp: decode(ids, selection, layers), truncate, length)");

 public:
  self_draft(LM& target, std::size_t layers) : lm_(&target), layers_(layers) {
    if (layers > target.config().num_hidden_layers) {
      raise(error_code::invalid_argument, "self_draft: ", layers, " layers; the target has ",
            target.config().num_hidden_layers);
    }
  }
  [[nodiscard]] std::size_t layers() const noexcept { return layers_; }

  draft_proposal propose(std::span<const std::int32_t> context, std::span<const float>,
                         std::size_t n, sampler* rng) {
    draft_proposal out;
    const rollback undo{lm_, lm_->length()};
    std::int32_t x = context.back();
    for (std::size_t i = 0; i < n; ++i) {
      const std::array<std::int32_t, 1> one{x};
      x = draw_into(out, lm_->decode(one, output_selection::last(), layers_).logits_of(0), rng,
                    context);
    }
    return out;
  }

  // Batched: one packed early-exit step per proposal over the queries' own tables, then every
  // table back to its length. A step that does not fit the pool ends the proposals there.
  template <class Table>
  std::vector<draft_proposal> propose_batch(std::span<const draft_query<Table>> queries) requires
      block_pipeline<LM> {
    std::vector<draft_proposal> out(queries.size());
    std::vector<std::size_t> base(queries.size());
    for (std::size_t i = 0; i < queries.size(); ++i) base[i] = queries[i].table->length();
    struct restore {
      std::span<const draft_query<Table>> q;
      const std::vector<std::size_t>& base;
      ~restore() {
        for (std::size_t i = 0; i < q.size(); ++i) q[i].table->truncate(base[i]);
      }
    } undo{queries, base};
    for (std::size_t step = 0;; ++step) {
      std::vector<std::size_t> live;
      std::vector<std::int32_t> last;
      for (std::size_t i = 0; i < queries.size(); ++i) {
        if (queries[i].n <= step) continue;
        live.push_back(i);
        last.push_back(step == 0 ? queries[i].context.back() : out[i].tokens.back());
      }
      if (live.empty()) break;
      std::vector<typename LM::sequence_input> inputs;
      for (std::size_t j = 0; j < live.size(); ++j)
        inputs.push_back({queries[live[j]].table, {&last[j], 1}});
      step_output s;
      try {
        s = lm_->step_sequences(inputs, output_selection::all_rows(), layers_);
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        break;
      }
      for (std::size_t j = 0; j < live.size(); ++j)
        draw_into(out[live[j]], s.logits_of(j), queries[live[j]].rng, queries[live[j]].context);
    }
    return out;
  }

 private:
  struct rollback {
    LM* lm;
    std::size_t length;
    ~rollback() { lm->truncate(length); }
  };
  LM* lm_;
  std::size_t layers_;
};

// A draft head: maps the target's pre-norm hidden row h_t (hidden_size) at position t, whose
// LM-head logits predict token t + 1, to logits (vocab) for token t + 2 + i with head i.
template <class H>
concept draft_head = requires(const H& h, std::span<const float> hidden, std::size_t i) {
  { h.heads() } -> std::convertible_to<std::size_t>;
  { h.vocab() } -> std::convertible_to<std::size_t>;
  { h.hidden_size() } -> std::convertible_to<std::size_t>;
  { h.logits(hidden, i) } -> std::same_as<std::vector<float>>;
};

// A draft from a head: proposal i is head i's token for the hidden row that produced the
// context's last token, so it needs no KV and no catch-up; at most heads() proposals a round.
template <draft_head H>
class head_draft {
 public:
  static constexpr bool wants_hidden = true;
  explicit head_draft(const H& head) noexcept : head_(&head) {}

  void check(std::size_t vocab, std::size_t) const {
    if (head_->vocab() != vocab) {
      raise(error_code::invalid_argument, "head_draft: the head's vocabulary of ", head_->vocab(),
            " differs from the target's ", vocab);
    }
  }

  draft_proposal propose(std::span<const std::int32_t> context, std::span<const float> hidden,
                         std::size_t n, sampler* rng) const {
    if (hidden.size() != head_->hidden_size()) {
      raise(error_code::invalid_shape, "head_draft: a hidden row of ", hidden.size(),
            " values for a head of hidden size ", head_->hidden_size());
    }
    draft_proposal out;
    const std::size_t m = std::min<std::size_t>(n, head_->heads());
    for (std::size_t i = 0; i < m; ++i) draw_into(out, head_->logits(hidden, i), rng, context);
    return out;
  }

 private:
  const H* head_;
};

}  // namespace npullm::batch
