// generator: batched generation with continuous batching over a block-KV causal_lm.
//
// Requests (prompt ids, max_new_tokens, stop ids, sampler, seed) join at any time (submit);
// each step admits waiting requests (prefilling only what the prefix cache does not already
// hold), then runs one decode step for every running sequence together: one GEMM per
// projection over all their rows, attention per sequence over its own block table. Finished
// sequences leave at once and free their blocks.
//
// KV: one block pool shared by every sequence. A prefix cache reuses the full blocks of earlier
// prompts. When blocks run out, new requests wait; if a running sequence cannot get the block
// for its next token, the newest running sequence is preempted: its blocks are freed and it
// goes back to the front of the queue, to be recomputed later (its generated tokens become part
// of its context; nothing is sampled twice, so the output is the one it would have had).
//
// Each request samples with its own seeded sampler and its own settings (sampler.hpp: bias,
// penalties over its context, processor, top-k / top-p / min-p, temperature), so its tokens do
// not depend on the batch. The sampler's context is the request's prompt and generated tokens.
// (Numerically, batching changes only the summation order of f32 GEMMs; greedy and sampled
// choices agree unless two candidates are within that rounding of each other.)
//
// Speculative decoding (generator<LM, Draft>, options.draft_tokens = k; see speculative.hpp):
// each decode step first asks the draft for up to k tokens per sequence (propose_batch, or
// propose per sequence), then verifies every sequence's proposals in one packed pass of
// (proposals + 1) rows per sequence, with logits for exactly those rows (and their pre-norm
// hidden rows for a draft head). Each sequence accepts its own count (greedy: the agreeing
// prefix; sampled: verify_sampled with its own sampler) plus the target's next token, and its
// table is truncated to the verified tokens: its KV is what plain decoding leaves, and greedy
// output is plain batched greedy decoding's. When blocks run short the proposals go first (a
// plain step), then the newest sequence as above.
//
// A sequence that finishes or is preempted registers the full blocks of its verified tokens in
// the prefix cache (a follow-up prompt or the recompute reuses them); proposals never get there,
// the rollback has removed them before.
//
// Not thread-safe: one generator per thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "npullm/batch/generation.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/batch/stop_strings.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tokens.hpp"
#include "npullm/kv/prefix_cache.hpp"
#include "npullm/step/pipeline.hpp"

namespace npullm::batch {

// generator<LM>: plain decoding, no draft.
struct no_draft {};

namespace detail {
template <class Table>
struct prefix_cache_for;
template <class T, class Allocator>
struct prefix_cache_for<kv::block_table<T, Allocator>> {
  using type = kv::prefix_cache<T, Allocator>;
};
}  // namespace detail

template <class LM, class Draft = no_draft>
class generator {
  static_assert(block_pipeline<LM>,
                "batch::generator<LM>: LM must run many sequences over block KV (block_pipeline "
                "in step/pipeline.hpp); configure the pipeline with model::block_kv<T, BlockSize>, "
                "or score with batch_unroll / batched_scorer");
  static constexpr bool speculative = !std::is_same_v<Draft, no_draft>;
  static constexpr bool hidden_wanted = draft_wants_hidden<Draft>;
  // The pipeline's block table (whatever allocator its pool uses) and the prefix cache over it.
  using table_type = typename LM::table_type;
  using cache_type = typename detail::prefix_cache_for<table_type>::type;

 public:
  explicit generator(LM& lm, generator_options options = {}) requires(!speculative)
      : generator(lm, nullptr, options) {}
  // Speculative decoding with `draft` (options.draft_tokens >= 1); the draft must outlive this.
  generator(LM& lm, Draft& draft, generator_options options) requires speculative
      : generator(lm, &draft, options) {}
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;

  // Queues a request; returns its id. Rejects, naming the request, empty prompts,
  // max_new_tokens = 0, ids outside the vocabulary (prompt, stop, logit_bias), bad sampler
  // settings, empty stop strings, stop strings or on_text without detokenize, top_logprobs
  // without logprobs (invalid_argument), and prompts that cannot fit in max_sequence
  // (capacity_exhausted). A rejected request changes nothing.
  std::size_t submit(request r) {
    const std::size_t id = next_id_;
    const std::size_t vocab = lm_->config().vocab_size;
    auto reject = [&](const auto&... why) {
      raise(error_code::invalid_argument, "generator: request ", id, ": ", why...);
    };
    if (r.prompt.empty()) reject("empty prompt");
    if (r.max_new_tokens == 0) reject("max_new_tokens is 0");
    check_token_ids(r.prompt, vocab, "generator: request ", id, ": prompt");
    check_token_ids(r.stop, vocab, "generator: request ", id, ": stop");
    try {
      r.sampling.validate();
    } catch (const error& e) {
      raise(e.code(), "generator: request ", id, ": ", e.message());
    }
    for (const token_bias& b : r.sampling.logit_bias) {
      if (static_cast<std::size_t>(b.token) >= vocab) {
        reject("logit_bias token ", b.token, " outside the vocabulary of ", vocab);
      }
    }
    for (std::size_t i = 0; i < r.stop_strings.size(); ++i) {
      if (r.stop_strings[i].empty()) reject("stop string ", i, " is empty");
    }
    if (!r.detokenize && (!r.stop_strings.empty() || r.on_text)) {
      reject("stop strings and on_text need a detokenize callback");
    }
    if (r.top_logprobs > 0 && !r.logprobs)
      reject("top_logprobs ", r.top_logprobs, " without logprobs");
    if (r.prompt.size() + r.max_new_tokens > lm_->capacity()) {
      raise(error_code::capacity_exhausted, "generator: request ", id, ": prompt of ",
            r.prompt.size(), " + ", r.max_new_tokens, " new tokens exceeds max_sequence ",
            lm_->capacity());
    }
    if constexpr (requires { draft_->check(vocab, std::size_t{}); }) {
      draft_->check(vocab, r.prompt.size() + r.max_new_tokens - 1);
    }
    sampler rng(r.sampling, r.seed), draft_rng(r.sampling, r.seed ^ 0x9e3779b97f4a7c15ull);
    state s{std::move(r), rng, draft_rng, {}, {}, 0, {}};
    s.context = s.req.prompt;
    requests_.emplace(id, std::move(s));
    ++next_id_;
    waiting_.push_back(id);
    return id;
  }

  // Ends request `id` now, between steps: a waiting request leaves the queue, a running one
  // leaves the batch and its blocks go back to the pool (its verified full blocks stay in the
  // prefix cache, as any finished sequence's). Its result keeps the tokens generated so far,
  // finish = cancelled; no callback is called. False (nothing changes) when it had already
  // finished; out_of_range for an id never submitted or released.
  bool cancel(std::size_t id) {
    state& s = at(id, "cancel");
    if (s.out.finish != finish_reason::running) return false;
    if (const auto w = std::find(waiting_.begin(), waiting_.end(), id); w != waiting_.end()) {
      waiting_.erase(w);
    } else if (const auto r = std::find_if(running_.begin(), running_.end(),
                                           [&](const sequence& q) { return q.id == id; });
               r != running_.end()) {
      retire(id, r->table);
      running_.erase(r);  // the table goes: its blocks are freed
    }
    s.out.finish = finish_reason::cancelled;
    return true;
  }

  // Forgets a finished (or cancelled) request: its result, context and sampler are freed, and
  // result(id) is out_of_range from now on. A long-running caller (a server) releases every
  // request it has read, so the generator's memory does not grow with the requests it served.
  // invalid_argument for a request still running or waiting (cancel it first).
  void release(std::size_t id) {
    const state& s = at(id, "release");
    if (s.out.finish == finish_reason::running) {
      raise(error_code::invalid_argument, "generator: release of request ", id,
            " that is still running (cancel it first)");
    }
    requests_.erase(id);
  }

  // Admits what fits, then one decode step for every running sequence.
  void step(const token_callback& cb = {}) {
    admit(cb);
    decode(cb);
  }
  [[nodiscard]] bool done() const noexcept { return waiting_.empty() && running_.empty(); }
  void run(const token_callback& cb = {}) {
    while (!done()) step(cb);
  }

  [[nodiscard]] const generation& result(std::size_t id) const { return at(id, "result").out; }
  [[nodiscard]] const generator_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::size_t running() const noexcept { return running_.size(); }
  [[nodiscard]] std::size_t waiting() const noexcept { return waiting_.size(); }
  // The prefix cache (null without one): what later prompts can reuse.
  [[nodiscard]] const cache_type* cached_prefixes() const noexcept {
    return cache_ ? &*cache_ : nullptr;
  }

 private:
  struct state {
    request req;
    sampler rng;
    sampler draft_rng;  // a sampled request's draft proposals
    generation out;
    std::vector<std::int32_t> context;  // prompt + generated tokens
    std::int32_t pending = 0;           // sampled, not yet fed to the model
    std::vector<float> hidden;          // pre-norm hidden row that produced `pending` (heads)
    std::size_t shown = 0;              // bytes of out.text given to on_text
  };
  struct sequence {
    std::size_t id;
    table_type table;
  };

  state& at(std::size_t id, const char* what) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) {
      raise(error_code::out_of_range, "generator: ", what, " of request ", id, ", which ",
            id < next_id_ ? "was released" : "was never submitted", " (", next_id_,
            " were submitted)");
    }
    return it->second;
  }
  const state& at(std::size_t id, const char* what) const {
    return const_cast<generator*>(this)->at(id, what);
  }

  generator(LM& lm, Draft* draft, generator_options options)
      : lm_(&lm), draft_(draft), options_(options) {
    if (options.max_batch == 0) raise(error_code::invalid_argument, "generator: max_batch 0");
    if (speculative && options.draft_tokens == 0) {
      raise(error_code::invalid_argument, "generator: a draft needs draft_tokens >= 1");
    }
    if (!speculative && options.draft_tokens != 0) {
      raise(error_code::invalid_argument, "generator: draft_tokens ", options.draft_tokens,
            " without a draft");
    }
    const std::size_t rows = options.max_batch * (options.draft_tokens + 1);
    if (rows > lm.step_rows()) {
      raise(error_code::invalid_argument, "generator: max_batch ", options.max_batch,
            " x (draft_tokens ", options.draft_tokens, " + 1) = ", rows,
            " rows exceed the pipeline's step of ", lm.step_rows(), " rows");
    }
    if (options.prefix_cache) cache_.emplace(lm.kv_pool());
  }

  // A greedy request: argmax choices (the sampler's greedy), no distributions computed.
  static bool greedy(const state& s) noexcept { return s.req.sampling.temperature == 0.0f; }

  // Records a token sampled from the raw logits row `logits`; true when the request is
  // finished. The context keeps every sampled token (also one that completes a stop string).
  bool emit(std::size_t id, std::int32_t token, std::span<const float> logits,
            const token_callback& cb) {
    state& s = requests_.at(id);
    s.context.push_back(token);
    s.pending = token;
    bool stop = false;
    if (s.req.detokenize) {
      const std::size_t searched = s.out.text.size();
      s.out.text += s.req.detokenize(token);
      const stop_string_match m = find_stop_string(s.out.text, searched, s.req.stop_strings);
      if (m.found()) {
        s.out.text.resize(m.position);
        s.out.stop_string = m.index;
        stop = true;
      }
    }
    if (!stop) {  // a token that completes a stop string is left out
      s.out.tokens.push_back(token);
      if (s.req.logprobs) s.out.logprobs.push_back(logprobs_of(logits, token, s.req.top_logprobs));
      stop = std::find(s.req.stop.begin(), s.req.stop.end(), token) != s.req.stop.end();
    }
    const bool length = s.context.size() - s.req.prompt.size() >= s.req.max_new_tokens;
    if (stop || length) s.out.finish = stop ? finish_reason::stop : finish_reason::length;
    if (cb) cb(id, token, stop || length);
    if (s.req.on_text) {
      const std::size_t held = std::max(stop_string_holdback(s.out.text, s.req.stop_strings),
                                        incomplete_utf8_tail(s.out.text));
      const std::size_t upto = s.out.text.size() - (stop || length ? 0 : held);
      if (upto > s.shown || stop || length) {
        s.req.on_text(std::string_view(s.out.text).substr(s.shown, upto - s.shown), stop || length);
        s.shown = upto;
      }
    }
    return stop || length;
  }

  // Request `id` ends with the error its own sampling raised (say, its grammar's matcher gave
  // up: capacity_exhausted); the other requests go on.
  void fail(std::size_t id, const error& e) {
    generation& out = requests_.at(id).out;
    out.finish = finish_reason::failed;
    out.failure = e;
  }

  // A sequence leaves the batch (finished, or preempted: the caller frees the table). Its KV
  // holds the context but its last token, all verified: those full blocks go to the prefix
  // cache. Its draft state goes.
  void retire(std::size_t id, const table_type& table) {
    const state& s = requests_.at(id);
    if (cache_) {
      cache_->insert(table, std::span<const std::int32_t>(s.context).first(s.context.size() - 1));
    }
    if constexpr (requires { draft_->forget(id); }) draft_->forget(id);
  }

  // Admits waiting requests in order while a sequence slot is free: each is prefilled (all but
  // what the prefix cache holds) and samples its first token. Prompts longer than decode_rows
  // that arrive together are prefilled together, packed into one step of up to step_rows rows
  // (a burst of requests then costs a few large steps rather than one step each: the weights
  // are read once per step); a shorter one is prefilled alone, so the path each prompt takes
  // (decode or prefill step) depends only on its own length and the output stays independent
  // of the load (every row and every sequence's attention is computed the same whatever else
  // the step holds).
  void admit(const token_callback& cb) {
    struct entrant {
      std::size_t id;
      table_type table;
      std::span<const std::int32_t> context;
      std::size_t covered;
      bool resumed;
    };
    bool alone = false;  // after a packed step did not fit the pool: one at a time
    while (!waiting_.empty() && running_.size() < options_.max_batch) {
      std::vector<entrant> group;
      std::size_t rows = 0;
      for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
        if (running_.size() + group.size() >= options_.max_batch) break;
        state& s = requests_.at(*it);
        // The context whose KV the sequence needs: the prompt, and after a preemption the
        // tokens generated since (but the last one, which is fed by the next decode step).
        const bool resumed = s.context.size() > s.req.prompt.size();
        const std::span<const std::int32_t> context =
            std::span<const std::int32_t>(s.context).first(s.context.size() - (resumed ? 1 : 0));
        table_type table = lm_->new_sequence();
        const std::size_t covered =
            cache_ && s.req.cache_prompt ? cache_->attach(table, context) : 0;
        const std::size_t rest = context.size() - covered;
        if (group.empty()) {
          // Checked here: the capacity_exhausted caught below means "the pool is full, wait".
          if (rest > lm_->step_rows()) {
            raise(error_code::capacity_exhausted, "generator: request ", *it, ": ", rest,
                  " context tokens to prefill exceed the pipeline's step of ", lm_->step_rows(),
                  " rows");
          }
        } else if (rest <= lm_->decode_rows() || rows + rest > lm_->step_rows()) {
          break;  // its table goes: cached blocks attached to it return to the cache
        }
        group.push_back({*it, std::move(table), context, covered, resumed});
        rows += rest;
        if (alone || rest <= lm_->decode_rows()) break;
      }
      // Only the rows the next step needs: each sequence's last token's logits (and hidden
      // row for a head).
      std::vector<typename LM::sequence_input> inputs;
      std::vector<std::size_t> last;
      std::size_t end = 0;
      for (entrant& e : group) {
        inputs.push_back({&e.table, e.context.subspan(e.covered)});
        last.push_back((end += e.context.size() - e.covered) - 1);
      }
      output_selection sel;
      sel.logits_for(last);
      if (hidden_wanted) sel.hidden_for(last);
      step_output out;
      try {
        out = lm_->step_sequences(inputs, sel);
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        if (group.size() > 1) {  // the pool did not hold them all: the first alone
          alone = true;
          continue;
        }
        if (running_.empty()) {
          raise(error_code::capacity_exhausted, "generator: request ", group[0].id, " (",
                group[0].context.size(), " context tokens) does not fit in the KV pool even ",
                "alone: ", e.message());
        }
        return;  // wait for running sequences to free blocks
      }
      ++stats_.prefill_steps;
      for (std::size_t j = 0; j < group.size(); ++j) {
        entrant& e = group[j];
        state& s = requests_.at(e.id);
        waiting_.pop_front();
        stats_.prefill_tokens += e.context.size() - e.covered;
        stats_.reused_tokens += e.covered;
        if (cache_) cache_->insert(e.table, e.context);  // every context token is verified
        if constexpr (hidden_wanted) {
          const auto h = out.hidden_of(last[j]);
          s.hidden.assign(h.begin(), h.end());
        }
        const auto logits = out.logits_of(last[j]);
        if (e.resumed) {
          s.pending = s.context.back();
        } else {
          std::int32_t token = 0;
          try {
            token = s.rng.sample(logits, s.context);
          } catch (const error& err) {  // this request's own sampling: it alone fails
            fail(e.id, err);
            retire(e.id, e.table);
            continue;
          }
          if (emit(e.id, token, logits, cb)) {
            retire(e.id, e.table);
            continue;  // finished on its first token: the table goes, the blocks stay cached
          }
        }
        running_.push_back({e.id, std::move(e.table)});
        stats_.max_running = std::max(stats_.max_running, running_.size());
      }
    }
  }

  // The draft's proposals for every running sequence (none without a draft). A sequence asks
  // for no more than it can emit: its accepted proposals and one target token.
  std::vector<draft_proposal> propose() {
    std::vector<draft_proposal> out(running_.size());
    if constexpr (speculative) {
      std::vector<draft_query<table_type>> queries;
      for (sequence& q : running_) {
        state& s = requests_.at(q.id);
        const std::size_t remaining = s.req.max_new_tokens - s.out.tokens.size();
        queries.push_back({q.id, &q.table, s.context, s.hidden,
                           std::min(options_.draft_tokens, remaining - 1),
                           greedy(s) ? nullptr : &s.draft_rng});
      }
      const std::span<const draft_query<table_type>> all(queries);
      if constexpr (requires { draft_->propose_batch(all); }) {
        out = draft_->propose_batch(all);
      } else {
        for (std::size_t i = 0; i < queries.size(); ++i) {
          const auto& q = queries[i];
          if (q.n > 0) out[i] = draft_->propose(q.context, q.hidden, q.n, q.rng);
        }
      }
      if (out.size() != queries.size()) {
        raise(error_code::invalid_argument, "generator: the draft gave ", out.size(),
              " proposals for ", queries.size(), " sequences");
      }
      for (std::size_t i = 0; i < out.size(); ++i)
        check_proposal(out[i], queries[i].n, lm_->config().vocab_size);
    }
    return out;
  }

  void decode(const token_callback& cb) {
    if (running_.empty()) return;
    std::vector<draft_proposal> proposals = propose();
    // The samplers' processors may start on the first row's context while the model runs.
    for (const sequence& r : running_) requests_.at(r.id).rng.prefetch(requests_.at(r.id).context);
    step_output out;
    for (;;) {
      // Each sequence's pending token and proposals; logits for every row (and hidden rows).
      std::vector<std::vector<std::int32_t>> ids(running_.size());
      std::vector<typename LM::sequence_input> inputs;
      inputs.reserve(running_.size());
      std::size_t rows = 0;
      for (std::size_t i = 0; i < running_.size(); ++i) {
        ids[i].push_back(requests_.at(running_[i].id).pending);
        ids[i].insert(ids[i].end(), proposals[i].tokens.begin(), proposals[i].tokens.end());
        inputs.push_back({&running_[i].table, ids[i]});
        rows += ids[i].size();
      }
      auto sel = output_selection::all_rows();
      if (hidden_wanted) {
        std::vector<std::size_t> all(rows);
        std::iota(all.begin(), all.end(), std::size_t{0});
        sel.hidden_for(std::move(all));
      }
      try {
        out = lm_->step_sequences(inputs, sel);
        break;
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        const bool proposing =
            std::any_of(proposals.begin(), proposals.end(),
                        [](const draft_proposal& d) { return !d.tokens.empty(); });
        if (proposing) {  // a plain step needs fewer blocks
          for (draft_proposal& d : proposals) d = {};
          continue;
        }
        if (running_.size() == 1) {
          raise(error_code::capacity_exhausted, "generator: request ", running_[0].id,
                " cannot continue even alone: ", e.message());
        }
        // Preempt the newest: free its blocks, recompute it later.
        sequence& newest = running_.back();
        retire(newest.id, newest.table);
        newest.table.reset();
        waiting_.push_front(newest.id);
        running_.pop_back();
        proposals.pop_back();
        ++stats_.preemptions;
      }
    }
    ++stats_.steps;
    std::vector<sequence> still;
    still.reserve(running_.size());
    std::size_t row = 0;  // the sequence's first row in the step
    for (std::size_t i = 0; i < running_.size(); ++i) {
      const std::size_t id = running_[i].id;
      state& s = requests_.at(id);
      const draft_proposal& d = proposals[i];
      table_type& table = running_[i].table;
      round_verdict v;
      try {
        v = verify_round([&](std::size_t j) { return out.logits_of(row + j); }, d, &s.rng,
                         s.context);
      } catch (const error& err) {  // this request's own sampling: it alone fails
        table.truncate(table.length() - d.tokens.size());
        fail(id, err);
        retire(id, table);
        row += d.tokens.size() + 1;
        continue;
      }
      // Keep the pending token and the accepted proposals: rejected KV is rolled back.
      table.truncate(table.length() - d.tokens.size() + v.accepted);
      stats_.proposed += d.tokens.size();
      stats_.accepted += v.accepted;
      bool finished = false;
      for (std::size_t t = 0; t < v.tokens.size() && !finished; ++t)
        finished = emit(id, v.tokens[t], out.logits_of(row + t), cb);
      if (finished) {
        retire(id, table);  // its blocks are freed now
      } else {
        if constexpr (hidden_wanted) {
          const auto h = out.hidden_of(row + v.accepted);
          s.hidden.assign(h.begin(), h.end());
        }
        still.push_back(std::move(running_[i]));
      }
      row += d.tokens.size() + 1;
    }
    running_ = std::move(still);
  }

  LM* lm_;
  Draft* draft_;
  generator_options options_;
  std::optional<cache_type> cache_;
  // Requests by id, until released: a map, so that a server's generator holds only the
  // requests not yet released, and a reference stays valid while others are submitted.
  std::unordered_map<std::size_t, state> requests_;
  std::size_t next_id_ = 0;
  std::deque<std::size_t> waiting_;
  std::vector<sequence> running_;
  generator_stats stats_;
};

}  // namespace npullm::batch
