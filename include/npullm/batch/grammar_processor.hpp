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
// prefetcher() gives the sampler's prefetch hook (sampler_config::prefetch): it brings the
// matcher to a context and computes its mask on another thread while the caller runs the model;
// the next call with that context uses the mask (waiting for it if need be), any other context
// is computed as before. The masks are the same either way. The thread is the processor's own
// worker, started at the first prefetch and kept until the processor goes (one thread per
// sequence that prefetches, not one per token).
//
// Row entries past the vocabulary (an embedding padded to a round size) are masked too.
// Copies share one matcher (std::function copies it): make one processor per sequence; they may
// share a token_grammar (grammar_cache.hpp's), on one thread or several.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
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
    s.wait();
    const bool valid = s.sync(context.subspan(prompt_));
    constexpr float masked = -std::numeric_limits<float>::infinity();
    const grammar::token_index& index = s.matcher.compiled().index();
    const std::size_t n = index.size();
    if (!valid) {
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (!index.is_eog(static_cast<std::int32_t>(i))) row[i] = masked;
      }
      return;
    }
    if (!s.mask_ready) {
      s.matcher.fill_mask(s.mask);
      s.mask_ready = true;
    }
    for (std::size_t w = 0; w < s.mask.size(); ++w) {
      const std::uint64_t bits = s.mask[w];
      if (bits == ~std::uint64_t{0}) continue;
      const std::size_t end = std::min(row.size(), std::min(n, (w + 1) * 64));
      for (std::size_t i = w * 64; i < end; ++i)
        if (!((bits >> (i & 63)) & 1)) row[i] = masked;
    }
    for (std::size_t i = n; i < row.size(); ++i) row[i] = masked;
  }

  // The hook for sampler_config::prefetch (see the top). A context shorter than the prompt is
  // ignored here (the call with it raises).
  [[nodiscard]] std::function<void(std::span<const std::int32_t>)> prefetcher() const {
    return [s = s_, prompt = prompt_](std::span<const std::int32_t> context) {
      if (context.size() < prompt) return;
      s->wait();
      s->post(context.subspan(prompt));
    };
  }

  // The matcher after the last call's context (can_end, accepted tokens).
  [[nodiscard]] const grammar::token_matcher& matcher() const {
    s_->wait();
    return s_->matcher;
  }

 private:
  struct state {
    explicit state(std::shared_ptr<grammar::token_grammar> g)
        : matcher(std::move(g)), mask(matcher.words()) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (!worker.joinable()) return;
      {
        const std::lock_guard<std::mutex> lock(mutex);
        stop = true;
      }
      wake.notify_all();
      worker.join();  // after the job in flight, if any
    }

    // Waits for the prefetch in flight, if any (its errors stay with it: the call with that
    // context computes the mask again, and raises).
    void wait() {
      std::unique_lock<std::mutex> lock(mutex);
      done.wait(lock, [&] { return !pending; });
    }
    // Hands the worker a context's generated tokens (no job in flight: wait() first).
    void post(std::span<const std::int32_t> generated) {
      {
        const std::lock_guard<std::mutex> lock(mutex);
        next_tokens.assign(generated.begin(), generated.end());
        pending = true;
      }
      if (!worker.joinable()) worker = std::thread([this] { run(); });
      wake.notify_one();
    }
    void run() {
      std::unique_lock<std::mutex> lock(mutex);
      for (;;) {
        wake.wait(lock, [&] { return pending || stop; });
        if (!pending) return;  // stop, nothing left to do
        lock.unlock();
        // The caller waits (wait()) before it touches the matcher or the mask again.
        try {
          if (sync(next_tokens) && !mask_ready) {
            matcher.fill_mask(mask);
            mask_ready = true;
          }
        } catch (...) {
          mask_ready = false;
        }
        lock.lock();
        pending = false;
        done.notify_all();
      }
    }
    // Brings the matcher to the generated tokens: rolled back to the longest prefix it shares
    // with them, then the rest accepted. False when the grammar refuses one of them (the
    // matcher then holds the allowed prefix).
    bool sync(std::span<const std::int32_t> generated) {
      std::size_t same = 0;
      while (same < tokens.size() && same < generated.size() && tokens[same] == generated[same])
        ++same;
      if (same == tokens.size() && same == generated.size()) return true;
      mask_ready = false;
      matcher.rollback(tokens.size() - same);
      tokens.resize(same);
      for (std::size_t k = same; k < generated.size(); ++k) {
        if (!matcher.try_accept(generated[k])) return false;
        tokens.push_back(generated[k]);
      }
      return true;
    }

    grammar::token_matcher matcher;
    std::vector<std::int32_t> tokens;  // the generated tokens the matcher has accepted
    std::vector<std::uint64_t> mask;
    bool mask_ready = false;  // mask is the grammar's after exactly `tokens`
    // The prefetch worker: `pending` while it owns the matcher and the mask.
    std::mutex mutex;
    std::condition_variable wake, done;
    std::vector<std::int32_t> next_tokens;  // the context's generated tokens to bring it to
    bool pending = false, stop = false;
    std::thread worker;  // last: started on the first prefetch, joined by ~state
  };
  std::shared_ptr<state> s_;
  std::size_t prompt_ = 0;
};

}  // namespace npullm::batch
