// generation: what a generator (generate.hpp) takes and gives: a request (prompt, limits,
// stops, sampling, streaming), its result (generation, finish_reason), the callbacks, and the
// generator's options and counters. Apart so that a server or a test can name them without
// the generator's template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/batch/sampler.hpp"
#include "npullm/batch/stop_strings.hpp"
#include "npullm/core/error.hpp"

namespace npullm::batch {

// A token's text (bytes; a piece of a UTF-8 character is fine): the caller's detokenizer.
using detokenizer = std::function<std::string(std::int32_t)>;
// Streamed text of one request: (new bytes, finished). Called after every token with the bytes
// that can no longer be part of a stop string (possibly none), never ending inside a UTF-8
// character unless the text ends there, and once with finished = true.
using text_callback = std::function<void(std::string_view, bool)>;

// Stop strings (matched on the bytes of detokenize(token) appended for every generated token,
// so a stop string may span tokens; the prompt is not part of that text): the first token whose
// text completes a stop string ends the request. Then result().tokens stops before that token
// (it is left out) and result().text stops right before the stop string; so the text may hold
// bytes of the left-out token that precede the stop string, and may lack bytes of kept tokens
// that begin it. Stop tokens are checked after stop strings.
struct request {
  std::vector<std::int32_t> prompt;
  std::size_t max_new_tokens = 16;
  std::vector<std::int32_t> stop{};  // a stop token ends the request (and is part of the output)
  sampler_config sampling{};
  std::uint64_t seed = 0;
  std::vector<std::string> stop_strings{};  // need detokenize; none may be empty
  detokenizer detokenize{};                 // given: result().text is kept (and streamed)
  text_callback on_text{};                  // needs detokenize
  bool logprobs = false;                    // result().logprobs: one entry per token
  std::size_t top_logprobs = 0;             // with logprobs: the n most likely tokens too
  bool cache_prompt = true;  // false: the prompt is computed whole, not taken from the prefix
                             // cache (its blocks still go there for later requests)
};

enum class finish_reason {
  running,
  length,     // max_new_tokens generated
  stop,       // a stop token (kept) or a stop string (see request)
  cancelled,  // cancel(id): the tokens so far are kept, nothing more is generated
  failed,     // its own sampling raised (a grammar the matcher gave up on): see failure
};

struct generation {
  std::vector<std::int32_t> tokens;
  finish_reason finish = finish_reason::running;
  std::string text;                      // with detokenize: the tokens' text (see request)
  std::vector<token_logprobs> logprobs;  // with logprobs: per token, from its raw logits row
  std::size_t stop_string = stop_string_match::none;  // the stop string that ended it, if one
  std::optional<error> failure;  // finish == failed: the error its sampling raised
};

// Called for every generated token: (request id, token, finished).
// Every sampled token is reported, also one that completes a stop string (with finished =
// true) although result().tokens leaves it out.
using token_callback = std::function<void(std::size_t, std::int32_t, bool)>;

struct generator_options {
  std::size_t max_batch = 16;  // running sequences at most
  bool prefix_cache = true;
  std::size_t draft_tokens = 0;  // k: proposals per sequence a step (with a draft); 0 without
};

struct generator_stats {
  std::size_t steps = 0;           // decode steps
  std::size_t prefill_steps = 0;   // admission steps (prompts prefilled together count once)
  std::size_t prefill_tokens = 0;  // prompt tokens computed
  std::size_t reused_tokens = 0;   // prompt tokens taken from the prefix cache
  std::size_t preemptions = 0;
  std::size_t max_running = 0;
  std::size_t proposed = 0;  // draft tokens verified
  std::size_t accepted = 0;  // draft tokens accepted
};

}  // namespace npullm::batch
