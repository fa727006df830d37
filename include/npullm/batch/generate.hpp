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
// Each request samples with its own seeded sampler, so its tokens do not depend on the batch.
// (Numerically, batching changes only the summation order of f32 GEMMs; greedy and sampled
// choices agree unless two candidates are within that rounding of each other.)
//
// Not thread-safe: one generator per thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "npullm/batch/sampler.hpp"
#include "npullm/core/error.hpp"
#include "npullm/kv/prefix_cache.hpp"

namespace npullm::batch {

struct request {
  std::vector<std::int32_t> prompt;
  std::size_t max_new_tokens = 16;
  std::vector<std::int32_t> stop;  // a stop token ends the request (and is part of the output)
  sampler_config sampling{};
  std::uint64_t seed = 0;
};

enum class finish_reason { running, length, stop };

struct generation {
  std::vector<std::int32_t> tokens;
  finish_reason finish = finish_reason::running;
};

// Called for every generated token: (request id, token, finished).
using token_callback = std::function<void(std::size_t, std::int32_t, bool)>;

struct generator_options {
  std::size_t max_batch = 16;  // running sequences at most
  bool prefix_cache = true;
};

struct generator_stats {
  std::size_t steps = 0;           // decode steps
  std::size_t prefill_tokens = 0;  // prompt tokens computed
  std::size_t reused_tokens = 0;   // prompt tokens taken from the prefix cache
  std::size_t preemptions = 0;
  std::size_t max_running = 0;
};

template <class LM>
class generator {
  using kv_type = typename LM::KvT;
  using table_type = kv::block_table<kv_type>;

 public:
  explicit generator(LM& lm, generator_options options = {}) : lm_(&lm), options_(options) {
    if (options.max_batch == 0) raise(error_code::invalid_argument, "generator: max_batch 0");
    if (options.prefix_cache) cache_.emplace(lm.kv_pool());
  }
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;

  // Queues a request; returns its id. Rejects (invalid_argument, naming the request) empty
  // prompts, max_new_tokens = 0, ids outside the vocabulary, and prompts that cannot fit.
  std::size_t submit(request r) {
    const std::size_t id = requests_.size();
    const std::size_t vocab = lm_->config().vocab_size;
    auto reject = [&](const auto&... why) {
      raise(error_code::invalid_argument, "generator: request ", id, ": ", why...);
    };
    if (r.prompt.empty()) reject("empty prompt");
    if (r.max_new_tokens == 0) reject("max_new_tokens is 0");
    for (std::size_t i = 0; i < r.prompt.size(); ++i) {
      if (r.prompt[i] < 0 || static_cast<std::size_t>(r.prompt[i]) >= vocab) {
        reject("prompt token ", r.prompt[i], " at ", i, " outside the vocabulary of ", vocab);
      }
    }
    for (std::int32_t s : r.stop) {
      if (s < 0 || static_cast<std::size_t>(s) >= vocab)
        reject("stop token ", s, " outside the vocabulary of ", vocab);
    }
    if (r.prompt.size() + r.max_new_tokens > lm_->capacity()) {
      reject("prompt of ", r.prompt.size(), " + ", r.max_new_tokens,
             " new tokens exceeds max_sequence ", lm_->capacity());
    }
    state s{std::move(r), sampler(sampler_config{}, 0), {}, {}};
    s.rng = sampler(s.req.sampling, s.req.seed);
    requests_.push_back(std::move(s));
    waiting_.push_back(id);
    return id;
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

  [[nodiscard]] const generation& result(std::size_t id) const { return requests_.at(id).out; }
  [[nodiscard]] const generator_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::size_t running() const noexcept { return running_.size(); }
  [[nodiscard]] std::size_t waiting() const noexcept { return waiting_.size(); }

 private:
  struct state {
    request req;
    sampler rng;
    generation out;
    std::int32_t pending = 0;  // sampled, not yet fed to the model
  };
  struct sequence {
    std::size_t id;
    table_type table;
  };

  // Records a sampled token; true when the request is finished.
  bool emit(std::size_t id, std::int32_t token, const token_callback& cb) {
    state& s = requests_[id];
    s.out.tokens.push_back(token);
    s.pending = token;
    const bool stop = std::find(s.req.stop.begin(), s.req.stop.end(), token) != s.req.stop.end();
    const bool length = s.out.tokens.size() >= s.req.max_new_tokens;
    if (stop || length) s.out.finish = stop ? finish_reason::stop : finish_reason::length;
    if (cb) cb(id, token, stop || length);
    return stop || length;
  }

  void admit(const token_callback& cb) {
    while (!waiting_.empty() && running_.size() < options_.max_batch) {
      const std::size_t id = waiting_.front();
      state& s = requests_[id];
      // The context whose KV the sequence needs: the prompt, and after a preemption the tokens
      // generated since (but the last one, which is fed by the next decode step).
      std::vector<std::int32_t> context = s.req.prompt;
      const bool resumed = !s.out.tokens.empty();
      if (resumed) context.insert(context.end(), s.out.tokens.begin(), s.out.tokens.end() - 1);
      table_type table = lm_->new_sequence();
      const std::size_t covered = cache_ ? cache_->attach(table, context) : 0;
      const std::span<const std::int32_t> rest =
          std::span<const std::int32_t>(context).subspan(covered);
      tensor<float, 2> logits;
      try {
        const typename LM::sequence_input in{&table, rest};
        logits = lm_->step_sequences(std::span(&in, 1));
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        if (running_.empty()) {
          raise(error_code::capacity_exhausted, "generator: request ", id, " (", context.size(),
                " context tokens) does not fit in the KV pool even alone: ", e.what());
        }
        return;  // wait for running sequences to free blocks
      }
      waiting_.pop_front();
      stats_.prefill_tokens += rest.size();
      stats_.reused_tokens += covered;
      if (cache_) cache_->insert(table, context);  // every context token is verified
      if (resumed) {
        s.pending = s.out.tokens.back();
      } else if (emit(id, s.rng.sample({logits.data(), logits.extent(1)}), cb)) {
        continue;  // finished on its first token: the table goes, the blocks stay cached
      }
      running_.push_back({id, std::move(table)});
      stats_.max_running = std::max(stats_.max_running, running_.size());
    }
  }

  void decode(const token_callback& cb) {
    if (running_.empty()) return;
    tensor<float, 2> logits;
    for (;;) {
      std::vector<typename LM::sequence_input> inputs;
      inputs.reserve(running_.size());
      for (auto& q : running_)
        inputs.push_back({&q.table, std::span<const std::int32_t>(&requests_[q.id].pending, 1)});
      try {
        logits = lm_->step_sequences(inputs);
        break;
      } catch (const error& e) {
        if (e.code() != error_code::capacity_exhausted) throw;
        if (running_.size() == 1) {
          raise(error_code::capacity_exhausted, "generator: request ", running_[0].id,
                " cannot continue even alone: ", e.what());
        }
        // Preempt the newest: free its blocks, recompute it later.
        sequence& newest = running_.back();
        newest.table.reset();
        waiting_.push_front(newest.id);
        running_.pop_back();
        ++stats_.preemptions;
      }
    }
    ++stats_.steps;
    std::vector<sequence> still;
    still.reserve(running_.size());
    for (std::size_t i = 0; i < running_.size(); ++i) {
      const std::size_t id = running_[i].id;
      const std::int32_t token =
          requests_[id].rng.sample({logits.data() + i * logits.extent(1), logits.extent(1)});
      if (!emit(id, token, cb))
        still.push_back(std::move(running_[i]));  // finished: blocks freed now
    }
    running_ = std::move(still);
  }

  LM* lm_;
  generator_options options_;
  std::optional<kv::prefix_cache<kv_type>> cache_;
  std::vector<state> requests_;
  std::deque<std::size_t> waiting_;
  std::vector<sequence> running_;
  generator_stats stats_;
};

}  // namespace npullm::batch
