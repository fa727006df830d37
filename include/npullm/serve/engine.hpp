// serve/engine.hpp: a continuous-batching generator (batch/generate.hpp) behind a thread, for a
// server: one engine thread owns the pipeline, its block pool and the generator; any other
// thread submits requests and reads their output as it comes, and may cancel them.
//
//   serve::engine<LM> e(lm, {.parallel = 8, .max_queue = 64});
//   auto s = e.submit(request);          // capacity_exhausted: the queue is full (HTTP 503)
//   for (;;) {
//     auto p = s->take(std::chrono::milliseconds(100));  // new text / tokens, or nothing yet
//     ...                                                // client gone: e.cancel(*s)
//     if (p.finished) break;
//   }
//
// Each engine step: requests that arrived are submitted to the generator (a request it refuses
// fails alone, with the generator's error), cancelled ones leave it (their blocks go back to
// the pool before the next step), then one generator step runs (admissions and one decode
// step for every running sequence); then what each request gained is handed to its stream, and
// finished requests are released from the generator, so its memory does not grow with the
// requests served. A cancel takes effect at the next step: at most one step later.
//
// An error that escapes a step (a bug, or memory) fails every request in flight with that
// error, the generator is rebuilt over the same pipeline and pool (every table freed), and the
// engine goes on serving new requests.
//
// Output does not depend on the load: the generator samples each request with its own seeded
// sampler from its own logits row, and the pipeline's kernels compute each row of a step the
// same way whatever the other rows are (tests/serve checks tokens and logprobs bit for bit,
// alone and among 15 others).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/batch/generate.hpp"
#include "npullm/core/error.hpp"

namespace npullm::serve {

struct engine_options {
  std::size_t parallel = 4;    // sequences decoded together at most (the generator's max_batch)
  std::size_t max_queue = 64;  // requests waiting beyond those: more are refused
  bool prefix_cache = true;
  std::size_t draft_tokens = 4;  // an engine with a draft: proposals per sequence a step (k)
};

// What the engine reports (a snapshot, consistent with itself).
struct engine_metrics {
  std::size_t running = 0;
  std::size_t waiting = 0;  // queued in the engine or the generator
  std::size_t steps = 0;
  std::size_t prompt_tokens = 0;         // computed
  std::size_t cached_prompt_tokens = 0;  // taken from the prefix cache instead
  std::size_t generated_tokens = 0;
  std::size_t preemptions = 0;
  std::size_t blocks_total = 0;
  std::size_t blocks_free = 0;
  std::size_t finished = 0;
  std::size_t cancelled = 0;
  std::size_t failed = 0;
  double step_seconds = 0;         // time in generator steps
  std::size_t draft_proposed = 0;  // draft tokens verified (an engine with a draft)
  std::size_t draft_accepted = 0;  // of those, accepted
};

// One request's output on its way from the engine thread to a reader.
class output_stream {
 public:
  struct piece {
    std::string text;                             // streamed text (stop strings held back)
    std::vector<std::int32_t> tokens;             // tokens of the result gained since
    std::vector<batch::token_logprobs> logprobs;  // with logprobs: theirs
    bool finished = false;
    batch::finish_reason finish = batch::finish_reason::running;
    std::optional<error> failure;  // the request failed (finished too)
  };

  // Waits up to `timeout` for something new; takes it (empty when nothing came).
  template <class Rep, class Period>
  piece take(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, timeout, [&] { return fresh_ || finished_; });
    piece p;
    p.text.swap(text_);
    p.tokens.swap(tokens_);
    p.logprobs.swap(logprobs_);
    p.finished = finished_;
    p.finish = finish_;
    p.failure = failure_;
    fresh_ = false;
    return p;
  }
  [[nodiscard]] bool cancelled() const noexcept { return cancelled_.load(); }
  // Prompt tokens: computed and taken from the prefix cache (known once admitted).
  [[nodiscard]] std::size_t prompt_tokens() const noexcept { return prompt_tokens_.load(); }

 private:
  template <class LM, class Draft>
  friend class engine;
  void add_text(std::string_view t) {
    const std::lock_guard<std::mutex> lock(m_);
    text_.append(t);
    fresh_ = true;
    cv_.notify_all();
  }
  void add_tokens(std::span<const std::int32_t> t, std::span<const batch::token_logprobs> lp) {
    const std::lock_guard<std::mutex> lock(m_);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
    logprobs_.insert(logprobs_.end(), lp.begin(), lp.end());
    fresh_ = true;
    cv_.notify_all();
  }
  void finish(batch::finish_reason why, std::optional<error> failure = std::nullopt) {
    const std::lock_guard<std::mutex> lock(m_);
    finished_ = true;
    finish_ = why;
    failure_ = std::move(failure);
    cv_.notify_all();
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<std::int32_t> tokens_;
  std::vector<batch::token_logprobs> logprobs_;
  bool fresh_ = false, finished_ = false;
  batch::finish_reason finish_ = batch::finish_reason::running;
  std::optional<error> failure_;
  std::atomic<bool> cancelled_{false};
  std::atomic<std::size_t> prompt_tokens_{0};
};

// engine<LM>: plain decoding; engine<LM, Draft>: speculative decoding with a draft (a
// batch::model_draft over a second pipeline, say), options.draft_tokens proposals per sequence a
// step, verified by the generator (batch/generate.hpp).
template <class LM, class Draft = batch::no_draft>
class engine {
  static constexpr bool speculative = !std::is_same_v<Draft, batch::no_draft>;

 public:
  engine(LM& lm, engine_options options) requires(!speculative) : engine(lm, nullptr, options) {}
  // The draft must outlive the engine; it is used on the engine thread only.
  engine(LM& lm, Draft& draft, engine_options options) requires speculative
      : engine(lm, &draft, options) {}
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() { stop(); }

  // Queues a request (its on_text is the engine's: leave it unset; give detokenize for text).
  // capacity_exhausted when parallel + max_queue requests are already in flight, or after
  // stop(); the request's own errors (the generator's checks) come through its stream.
  std::shared_ptr<output_stream> submit(batch::request r) {
    auto s = std::make_shared<output_stream>();
    if (r.on_text)
      raise(error_code::invalid_argument, "engine: a request's on_text is the engine's");
    if (r.detokenize) {
      std::weak_ptr<output_stream> w = s;
      r.on_text = [w](std::string_view text, bool) {
        if (auto p = w.lock()) p->add_text(text);
      };
    }
    {
      const std::lock_guard<std::mutex> lock(m_);
      if (stopping_) raise(error_code::capacity_exhausted, "engine: stopping, no new requests");
      if (in_flight_ >= options_.parallel + options_.max_queue) {
        raise(error_code::capacity_exhausted, "engine: ", in_flight_, " requests in flight, the ",
              "most is parallel ", options_.parallel, " + queue ", options_.max_queue);
      }
      ++in_flight_;
      inbox_.push_back({std::move(r), s});
    }
    cv_.notify_all();
    return s;
  }

  // The request leaves at the next step (its stream finishes with finish_reason::cancelled).
  void cancel(output_stream& s) {
    s.cancelled_ = true;
    cv_.notify_all();
  }

  // Requests queued or running.
  [[nodiscard]] std::size_t in_flight() const {
    const std::lock_guard<std::mutex> lock(m_);
    return in_flight_;
  }
  [[nodiscard]] engine_metrics metrics() const {
    const std::lock_guard<std::mutex> lock(m_);
    return metrics_;
  }
  [[nodiscard]] const engine_options& options() const noexcept { return options_; }

  // No new requests from now on; waits up to `bound` for those in flight to finish, then
  // cancels the rest and ends the engine thread. True when all finished in time.
  template <class Rep, class Period>
  bool drain(std::chrono::duration<Rep, Period> bound) {
    std::unique_lock<std::mutex> lock(m_);
    stopping_ = true;
    const bool all = idle_cv_.wait_for(lock, bound, [&] { return in_flight_ == 0; });
    lock.unlock();
    stop();
    return all;
  }

  // Cancels everything and ends the engine thread (idempotent).
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(m_);
      stopping_ = true;
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct job {
    batch::request req;
    std::shared_ptr<output_stream> out;
  };
  struct active {
    std::shared_ptr<output_stream> out;
    std::size_t sent = 0;  // result tokens handed to the stream
  };

  engine(LM& lm, Draft* draft, engine_options options)
      : lm_(&lm), draft_(draft), options_(options) {
    if (options.parallel == 0) raise(error_code::invalid_argument, "engine: parallel 0");
    make_generator();
    thread_ = std::thread([this] { loop(); });
  }

  void make_generator() {
    if (gen_) {  // its totals stay in the metrics
      const batch::generator_stats& st = gen_->stats();
      base_.steps += st.steps;
      base_.prefill_tokens += st.prefill_tokens;
      base_.reused_tokens += st.reused_tokens;
      base_.preemptions += st.preemptions;
      base_.proposed += st.proposed;
      base_.accepted += st.accepted;
    }
    gen_.reset();  // every table freed: the pool is whole again
    batch::generator_options go{.max_batch = options_.parallel,
                                .prefix_cache = options_.prefix_cache};
    if constexpr (speculative) {
      go.draft_tokens = options_.draft_tokens;
      gen_ = std::make_unique<generator_type>(*lm_, *draft_, go);
    } else {
      gen_ = std::make_unique<generator_type>(*lm_, go);
    }
  }

  void loop() {
    for (;;) {
      std::vector<job> arrived;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return quit_ || !inbox_.empty() || !active_.empty(); });
        if (quit_) break;
        arrived.swap(inbox_);
      }
      for (job& j : arrived) admit(std::move(j));
      for (auto it = active_.begin(); it != active_.end();) {
        if (it->second.out->cancelled()) {
          gen_->cancel(it->first);
          it = retire(it, batch::finish_reason::cancelled);
        } else {
          ++it;
        }
      }
      if (!gen_->done()) {
        const auto t = std::chrono::steady_clock::now();
        try {
          gen_->step();
        } catch (const error& e) {
          fail_all(e);
          continue;
        } catch (const std::exception& e) {
          fail_all(error(error_code::resource, std::string("engine: ") + e.what()));
          continue;
        }
        step_seconds_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      }
      harvest();
      publish();
    }
    // Quit: whatever is left is cancelled.
    std::vector<job> left;
    {
      const std::lock_guard<std::mutex> lock(m_);
      left.swap(inbox_);
    }
    for (job& j : left) {
      done_one(&metrics_.cancelled);
      j.out->finish(batch::finish_reason::cancelled);
    }
    for (auto it = active_.begin(); it != active_.end();) {
      gen_->cancel(it->first);
      it = retire(it, batch::finish_reason::cancelled);
    }
    publish();
  }

  void admit(job j) {
    if (j.out->cancelled()) {
      done_one(&metrics_.cancelled);
      j.out->finish(batch::finish_reason::cancelled);
      return;
    }
    try {
      const std::size_t n = j.req.prompt.size();
      const std::size_t id = gen_->submit(std::move(j.req));
      j.out->prompt_tokens_ = n;
      active_.emplace(id, active{std::move(j.out), 0});
    } catch (const error& e) {
      done_one(&metrics_.failed);
      j.out->finish(batch::finish_reason::running, e);
    }
  }

  // Hands each request what it gained; finished ones leave. The metrics are published first,
  // so a client that reads /metrics once its response is complete sees its request counted.
  void harvest() {
    publish();
    for (auto it = active_.begin(); it != active_.end();) {
      const batch::generation& g = gen_->result(it->first);
      active& a = it->second;
      if (g.tokens.size() > a.sent) {
        const std::span<const std::int32_t> t(g.tokens);
        std::span<const batch::token_logprobs> lp;
        if (g.logprobs.size() == g.tokens.size()) lp = std::span(g.logprobs).subspan(a.sent);
        a.out->add_tokens(t.subspan(a.sent), lp);
        generated_ += g.tokens.size() - a.sent;
        a.sent = g.tokens.size();
      }
      it = g.finish == batch::finish_reason::running ? std::next(it) : retire(it, g.finish);
    }
  }

  using active_map = std::unordered_map<std::size_t, active>;
  typename active_map::iterator retire(typename active_map::iterator it, batch::finish_reason why) {
    // A request whose own sampling failed (its grammar's matcher gave up) ends with that error,
    // as a request the generator refused does; the others go on.
    std::optional<error> failure;
    if (why == batch::finish_reason::failed) failure = gen_->result(it->first).failure;
    gen_->release(it->first);
    // Counted before the reader learns it finished: what it reads next includes it.
    done_one(why == batch::finish_reason::cancelled ? &metrics_.cancelled
             : failure                              ? &metrics_.failed
                                                    : &metrics_.finished);
    if (failure) {
      it->second.out->finish(batch::finish_reason::running, std::move(failure));
    } else {
      it->second.out->finish(why);
    }
    return active_.erase(it);
  }

  void fail_all(const error& e) {
    for (auto& [id, a] : active_) {
      // The draft's state of a request (its KV in the draft's pool) goes with the generator.
      if constexpr (requires { draft_->forget(std::size_t{}); }) draft_->forget(id);
      done_one(&metrics_.failed);
      a.out->finish(batch::finish_reason::running, e);
    }
    active_.clear();
    make_generator();
  }

  void done_one(std::size_t* counter) {
    const std::lock_guard<std::mutex> lock(m_);
    ++*counter;
    --in_flight_;
    if (in_flight_ == 0) idle_cv_.notify_all();
  }

  void publish() {
    const batch::generator_stats& st = gen_->stats();
    const std::lock_guard<std::mutex> lock(m_);
    metrics_.running = gen_->running();
    metrics_.waiting = gen_->waiting() + inbox_.size();
    // A rebuilt generator starts its stats again: keep the totals of the ones before.
    metrics_.steps = base_.steps + st.steps;
    metrics_.prompt_tokens = base_.prefill_tokens + st.prefill_tokens;
    metrics_.cached_prompt_tokens = base_.reused_tokens + st.reused_tokens;
    metrics_.preemptions = base_.preemptions + st.preemptions;
    metrics_.generated_tokens = generated_;
    metrics_.blocks_total = lm_->kv_pool().total_count();
    metrics_.blocks_free = lm_->kv_pool().free_count();
    metrics_.step_seconds = step_seconds_;
    metrics_.draft_proposed = base_.proposed + st.proposed;
    metrics_.draft_accepted = base_.accepted + st.accepted;
  }

  using generator_type = batch::generator<LM, Draft>;
  LM* lm_;
  Draft* draft_;
  engine_options options_;
  std::unique_ptr<generator_type> gen_;
  batch::generator_stats base_{};
  active_map active_;  // the engine thread's only
  std::size_t generated_ = 0;
  double step_seconds_ = 0;

  mutable std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::vector<job> inbox_;
  std::size_t in_flight_ = 0;
  bool stopping_ = false, quit_ = false;
  engine_metrics metrics_;
  std::thread thread_;
};

}  // namespace npullm::serve
