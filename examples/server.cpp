// npullm_server: an OpenAI-compatible HTTP server on npullm's continuous-batching generator,
// the library's reference integration (how the pieces fit in an engine):
//
//   HTTP threads (cpp-httplib)      parse and check the body (serve/openai.hpp), render the chat
//                                   template, tokenize, compile a grammar (grammar_cache), check
//                                   the context, then submit one request per choice and stream
//                                   what comes back (SSE or one JSON body)
//   the engine thread (serve/engine.hpp)  owns the pipeline, the block pool and the generator:
//                                   admits requests (prefix cache), decodes every running
//                                   sequence in one step, cancels those whose client left
//
//   npullm_server -m FILE.gguf [--host 127.0.0.1] [--port 8080] [-t N] [--parallel N]
//                 [--ctx-size N] [--max-queue N] [--api-key KEY] [--chat-template-file F]
//                 [--alias NAME] [--body-limit BYTES] [--drain-timeout S] [--no-batch-invariant]
//
// Endpoints: POST /v1/chat/completions, /v1/completions (also without /v1), GET /v1/models,
// GET /health (503 while loading), GET /metrics (Prometheus), POST /tokenize, /detokenize,
// /apply-template. Errors: OpenAI's error object with 400 (bad request, context too long), 401
// (--api-key), 404, 413 (body over --body-limit), 503 + Retry-After (queue full, loading,
// draining). SIGTERM / SIGINT: no new requests, running ones finish (at most --drain-timeout
// seconds), exit 0.
//
// A client that hangs up is noticed at the next write: streams write every token and an SSE
// comment every 200 ms while waiting; a non-streaming response writes a space (JSON allows
// leading whitespace) every 200 ms until its body. Its request is cancelled at the next step.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "npullm/batch/drafts.hpp"
#include "npullm/batch/grammar_processor.hpp"
#include "npullm/grammar/grammar_cache.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/serve/engine.hpp"
#include "npullm/serve/openai.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/tokenizer.hpp"
#include "tools/cli.hpp"
#include "tools/model_file.hpp"

namespace {

namespace cli = npullm_tools::cli;
namespace serve = npullm::serve;
using npullm::error;
using npullm::error_code;
using serve::json;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::size_t threads =
      std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, cli::max_threads);
  std::size_t parallel = 4;
  std::size_t ctx = 4096;
  std::size_t max_queue = 64;
  std::string api_key;
  std::optional<std::string> chat_template_file;
  std::string alias;
  std::size_t body_limit = 8u << 20;
  double drain_timeout = 30;
  bool batch_invariant = true;       // --no-batch-invariant: dense weights as fast as they go
  std::optional<std::string> draft;  // --draft FILE.gguf: speculative decoding with that model
  std::size_t draft_max = 4;         // --draft-max N: proposals per sequence a step
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m FILE.gguf [--host 127.0.0.1] [--port 8080] [-t N] [--parallel N]\n"
      "          [--ctx-size N] [--max-queue N] [--api-key KEY] [--chat-template-file F]\n"
      "          [--alias NAME] [--body-limit BYTES] [--drain-timeout S] [--no-batch-invariant]\n"
      "          [--draft FILE.gguf [--draft-max N]]\n\n"
      "An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models,\n"
      "/health, /metrics, /tokenize, /detokenize, /apply-template).\n"
      "  --parallel N     sequences decoded together (default 4); -np is the same\n"
      "  --ctx-size N     KV tokens in the pool, shared by all sequences, and the longest\n"
      "                   request (prompt + max_tokens); default 4096\n"
      "  --max-queue N    requests waiting beyond --parallel before 503 (default 64)\n"
      "  --api-key KEY    requests need 'Authorization: Bearer KEY' (/health excepted)\n"
      "  --no-batch-invariant  dense (bf16 / f16 / f32) weights without the packed LM head\n"
      "                   and panels that make a request's output independent of the load\n"
      "  --draft FILE     speculative decoding: FILE (same vocabulary, smaller) proposes, the\n"
      "                   model verifies; -md / --model-draft are the same\n"
      "  --draft-max N    tokens proposed per sequence a step (default 4)\n",
      argv0);
}

void send_error(httplib::Response& res, const serve::api_error& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(e.to_json().dump(), "application/json");
}
serve::api_error make_error(int status, std::string message, std::string type = {},
                            std::string code = {}) {
  serve::api_error e;
  e.status = status;
  e.message = std::move(message);
  if (!type.empty()) e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// Compares without stopping at the first difference (the key's bytes do not leak by timing).
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  return diff == 0;
}

std::string random_id(std::string_view prefix) {
  static std::mutex m;
  static std::mt19937_64 rng(std::random_device{}());
  const std::lock_guard<std::mutex> lock(m);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + buf;
}
std::uint64_t random_seed() {
  static std::mutex m;
  static std::mt19937_64 rng(std::random_device{}());
  const std::lock_guard<std::mutex> lock(m);
  return rng();
}

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* finish_name(npullm::batch::finish_reason f) {
  switch (f) {
    case npullm::batch::finish_reason::length: return "length";
    case npullm::batch::finish_reason::stop: return "stop";
    case npullm::batch::finish_reason::cancelled: return "cancelled";
    case npullm::batch::finish_reason::running:
    case npullm::batch::finish_reason::failed: break;
  }
  return "stop";
}

// What the HTTP side needs of the model, whatever its weight type: the service behind the
// routes (absent while loading).
class service {
 public:
  virtual ~service() = default;
  virtual void completion(const httplib::Request&, httplib::Response&, serve::endpoint) = 0;
  virtual void tokenize(const httplib::Request&, httplib::Response&) = 0;
  virtual void detokenize(const httplib::Request&, httplib::Response&) = 0;
  virtual void apply_template(const httplib::Request&, httplib::Response&) = 0;
  virtual void metrics(httplib::Response&) = 0;
  virtual bool drain(double seconds) = 0;
};

// Counters of the HTTP side (the engine has its own).
struct http_counters {
  std::atomic<std::size_t> requests{0}, errors{0}, rejected_busy{0}, disconnects{0};
};

template <class W>
class model_service final : public service {
 public:
  using config = npullm::model::pipeline_config<npullm::model::block_kv<npullm::bfloat16, 16>,
                                                npullm::model::dynamic_attention<>, W>;
  using lm_type = npullm::model::causal_lm<config>;
  using draft_type = npullm::batch::model_draft<lm_type>;

  model_service(const options& o, npullm::text::tokenizer tok,
                std::optional<npullm::text::chat_template> tmpl, std::string name,
                http_counters& counters)
      : o_(o),
        tok_(std::move(tok)),
        template_(std::move(tmpl)),
        name_(std::move(name)),
        counters_(counters),
        pool_(o.threads),
        lm_(load(o.model), pipeline_options(o)),
        grammars_(std::make_shared<const npullm::grammar::token_index>(
                      npullm::grammar::token_index::of(tok_)),
                  16) {
    vocab_ = std::min(lm_.config().vocab_size, tok_.size());
    const serve::engine_options eo{
        .parallel = o.parallel, .max_queue = o.max_queue, .draft_tokens = o.draft_max};
    if (o.draft) {  // its own pipeline and KV pool, as large as the model's
      draft_lm_.emplace(load(*o.draft), pipeline_options(o));
      draft_.emplace(*draft_lm_);
      speculative_ = std::make_unique<serve::engine<lm_type, draft_type>>(lm_, *draft_, eo);
    } else {
      plain_ = std::make_unique<serve::engine<lm_type>>(lm_, eo);
    }
  }

  void completion(const httplib::Request& req, httplib::Response& res,
                  serve::endpoint kind) override {
    serve::completion_request r;
    std::vector<std::int32_t> prompt;
    std::shared_ptr<npullm::grammar::token_grammar> constraint;
    try {
      r = serve::parse_completion_request(req.body, kind);
      prompt = prompt_of(r);
      constraint = constraint_of(r);
    } catch (const error& e) {
      return send_error(res, serve::to_api_error(e));
    }
    const std::size_t max_new =
        r.max_tokens.value_or(o_.ctx > prompt.size() ? o_.ctx - prompt.size() : 0);
    if (prompt.size() + max_new > o_.ctx || max_new == 0) {
      auto e = make_error(400,
                          "This model's maximum context length is " + std::to_string(o_.ctx) +
                              " tokens. However, you requested " +
                              std::to_string(prompt.size() + std::max<std::size_t>(max_new, 1)) +
                              " tokens (" + std::to_string(prompt.size()) + " in the prompt, " +
                              std::to_string(max_new) + " for the completion).",
                          {}, "context_length_exceeded");
      e.param = r.kind == serve::endpoint::chat ? "messages" : "prompt";
      return send_error(res, e);
    }
    const std::uint64_t seed = r.seed ? *r.seed : random_seed();
    std::vector<std::shared_ptr<serve::output_stream>> streams;
    try {
      for (std::size_t i = 0; i < r.n; ++i) {
        // Choice i of a seeded request: seed + i, so choices differ and each is reproducible.
        streams.push_back(with_engine([&](auto& e) {
          return e.submit(request_of(r, prompt, max_new, seed + i, constraint));
        }));
      }
    } catch (const error& e) {
      for (auto& s : streams) with_engine([&](auto& e) { e.cancel(*s); });
      if (e.code() == error_code::capacity_exhausted) {
        ++counters_.rejected_busy;
        return send_error(
            res,
            make_error(503, "The server is busy: " + std::string(e.message()) + ". Retry later.",
                       "server_error", "overloaded"));
      }
      return send_error(res, serve::to_api_error(e));
    }
    auto job = std::make_shared<response_job>(response_job{
        std::move(r), std::move(streams), prompt.size(),
        random_id(kind == serve::endpoint::chat ? "chatcmpl-" : "cmpl-"), unix_time()});
    if (job->req.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, job](std::size_t, httplib::DataSink& sink) { return stream_body(*job, sink); },
          [this, job](bool) { cancel_all(*job); });
    } else {
      // "; charset=utf-8": cpp-httplib gzips a chunked "application/json" body for clients that
      // accept it, and the compressor would hold back the spaces that notice a gone client.
      res.set_chunked_content_provider(
          "application/json; charset=utf-8",
          [this, job](std::size_t, httplib::DataSink& sink) { return whole_body(*job, sink); },
          [this, job](bool) { cancel_all(*job); });
    }
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) override {
    json v;
    try {
      v = serve::parse_json_body(req.body);
    } catch (const error& e) {
      return send_error(res, serve::to_api_error(e));
    }
    if (!v.contains("content") || !v["content"].is_string())
      return send_error(res, make_error(400, "content: a string is required"));
    const auto flag = [&](const char* k) {
      return v.contains(k) && v[k].is_boolean() && v[k].get<bool>();
    };
    const bool add_special = flag("add_special");
    const bool with_pieces = flag("with_pieces");
    const auto ids = tok_.encode(v["content"].get<std::string>(),
                                 {.add_special = add_special, .parse_special = true});
    json out = json::object();
    out["tokens"] = json::array();
    for (const std::int32_t id : ids) {
      if (with_pieces) {
        out["tokens"].push_back({{"id", id}, {"piece", std::string(tok_.piece(id, true))}});
      } else {
        out["tokens"].push_back(id);
      }
    }
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) override {
    json v;
    try {
      v = serve::parse_json_body(req.body);
    } catch (const error& e) {
      return send_error(res, serve::to_api_error(e));
    }
    if (!v.contains("tokens") || !v["tokens"].is_array())
      return send_error(res, make_error(400, "tokens: a list of token ids is required"));
    std::vector<std::int32_t> ids;
    for (const json& t : v["tokens"]) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
          t.get<std::int64_t>() >= static_cast<std::int64_t>(tok_.size()))
        return send_error(res, make_error(400, "tokens: " + t.dump() +
                                                   " is not a token id of this "
                                                   "vocabulary of " +
                                                   std::to_string(tok_.size())));
      ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
    }
    json out = {{"content", tok_.decode(ids)}};
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void apply_template(const httplib::Request& req, httplib::Response& res) override {
    try {
      const auto r = serve::parse_completion_request(req.body, serve::endpoint::chat);
      const json out = {{"prompt", render(r)}};
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    } catch (const error& e) {
      send_error(res, serve::to_api_error(e));
    }
  }

  void metrics(httplib::Response& res) override {
    const serve::engine_metrics m = with_engine([](auto& e) { return e.metrics(); });
    std::ostringstream out;
    const auto metric = [&](const char* name, const char* type, const char* help, double v) {
      out << "# HELP npullm_" << name << ' ' << help << "\n# TYPE npullm_" << name << ' ' << type
          << "\nnpullm_" << name << ' ' << v << '\n';
    };
    metric("requests_running", "gauge", "Sequences in the decode batch.", double(m.running));
    metric("requests_waiting", "gauge", "Requests queued (engine and generator).",
           double(m.waiting));
    metric("requests_total", "counter", "HTTP completion requests received.",
           double(counters_.requests));
    metric("requests_finished_total", "counter", "Choices finished.", double(m.finished));
    metric("requests_cancelled_total", "counter", "Choices cancelled (client gone).",
           double(m.cancelled));
    metric("requests_failed_total", "counter", "Choices failed.", double(m.failed));
    metric("requests_rejected_busy_total", "counter", "Requests refused with 503.",
           double(counters_.rejected_busy));
    metric("prompt_tokens_total", "counter", "Prompt tokens computed.", double(m.prompt_tokens));
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prefix cache.",
           double(m.cached_prompt_tokens));
    metric("generated_tokens_total", "counter", "Tokens generated.", double(m.generated_tokens));
    metric("engine_steps_total", "counter", "Generator steps.", double(m.steps));
    metric("engine_step_seconds_total", "counter", "Seconds in generator steps.", m.step_seconds);
    metric("preemptions_total", "counter", "Sequences preempted for KV blocks.",
           double(m.preemptions));
    metric("draft_tokens_proposed_total", "counter", "Draft tokens verified (--draft).",
           double(m.draft_proposed));
    metric("draft_tokens_accepted_total", "counter", "Draft tokens accepted (--draft).",
           double(m.draft_accepted));
    metric("kv_blocks_total", "gauge", "KV blocks in the pool.", double(m.blocks_total));
    metric("kv_blocks_free", "gauge",
           "KV blocks free (those holding cached prefixes too: a hit takes one back, else it is "
           "evicted on demand).",
           double(m.blocks_free));
    metric("kv_blocks_used", "gauge", "KV blocks held by the running sequences.",
           double(m.blocks_total - m.blocks_free));
    res.set_content(out.str(), "text/plain; version=0.0.4");
  }

  bool drain(double seconds) override {
    return with_engine([&](auto& e) { return e.drain(std::chrono::duration<double>(seconds)); });
  }

 private:
  struct response_job {
    serve::completion_request req;
    std::vector<std::shared_ptr<serve::output_stream>> streams;
    std::size_t prompt_tokens = 0;
    std::string id;
    std::int64_t created = 0;
    // Stream state.
    bool started = false;
    std::vector<std::string> text{};  // per choice
    std::vector<json> logprobs{};     // per choice (chat: content list; completions: lists)
    std::vector<std::size_t> tokens{};
    std::vector<npullm::batch::finish_reason> finish{};
    std::vector<bool> done{};
    std::optional<error> failure{};
    clock_type::time_point last_write = clock_type::now();
  };

  static std::shared_ptr<const npullm::model::model_weights<W>> load(const std::string& path) {
    return npullm::model::model_weights<W>::load_gguf(path);
  }
  npullm::model::pipeline_options pipeline_options(const options& o) {
    return {.max_sequence = o.ctx,
            .kv_capacity = o.ctx,
            .pool = &pool_,
            .batch_invariant = o.batch_invariant};
  }
  // f on the engine in use: with a draft, or plain.
  template <class F>
  decltype(auto) with_engine(F&& f) {
    if (speculative_) return f(*speculative_);
    return f(*plain_);
  }

  std::string render(const serve::completion_request& r) const {
    if (!template_) {
      raise(
          error_code::unsupported, "messages: the model has no chat template ",
          "(tokenizer.chat_template); give one with --chat-template-file, or use /v1/completions");
    }
    npullm::text::chat_options co{.add_generation_prompt = true};
    if (!r.tools.is_null() && r.tools_choice != serve::tool_choice::none) co.tools = r.tools;
    return template_->apply_json(r.messages, co);
  }

  std::vector<std::int32_t> prompt_of(const serve::completion_request& r) const {
    if (r.kind == serve::endpoint::completion && !r.prompt_ids.empty()) {
      for (const std::int32_t id : r.prompt_ids) {
        if (static_cast<std::size_t>(id) >= vocab_)
          raise(error_code::invalid_argument, "prompt: token ", id, " outside the vocabulary of ",
                vocab_);
      }
      return r.prompt_ids;
    }
    std::string text = r.kind == serve::endpoint::chat ? render(r) : r.prompt;
    const auto& v = tok_.vocab();
    // The template's BOS, where encoding adds one too, once (as llama.cpp does).
    if (r.kind == serve::endpoint::chat && v.bos >= 0 && v.add_bos) {
      const std::string bos = v.tokens[static_cast<std::size_t>(v.bos)].text;
      if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) text.erase(0, bos.size());
    }
    auto ids =
        tok_.encode(text, {.add_special = true, .parse_special = r.kind == serve::endpoint::chat});
    if (ids.empty()) raise(error_code::invalid_argument, "prompt: it has no tokens");
    return ids;
  }

  std::shared_ptr<npullm::grammar::token_grammar> constraint_of(
      const serve::completion_request& r) {
    const npullm::grammar::json_schema_options js{npullm::grammar::json_whitespace::separators};
    try {
      if (!r.grammar.empty()) return grammars_.gbnf(r.grammar);
      switch (r.format) {
        case serve::response_format::json_object:
          return grammars_.json_schema(R"({"type": "object"})", js);
        case serve::response_format::json_schema: return grammars_.json_schema(r.schema, js);
        case serve::response_format::text: break;
      }
      if (r.tools_choice == serve::tool_choice::required ||
          r.tools_choice == serve::tool_choice::named)
        return grammars_.json_schema(serve::tool_call_schema(r).dump(), js);
    } catch (const error& e) {
      raise(e.code(),
            r.grammar.empty()
                ? (r.format != serve::response_format::text ? "response_format" : "tools")
                : "grammar",
            ": ", e.message());
    }
    return nullptr;
  }

  npullm::batch::request request_of(
      const serve::completion_request& r, const std::vector<std::int32_t>& prompt,
      std::size_t max_new, std::uint64_t seed,
      const std::shared_ptr<npullm::grammar::token_grammar>& g) const {
    npullm::batch::request q;
    q.prompt = prompt;
    q.max_new_tokens = max_new;
    if (!r.ignore_eos) q.stop = tok_.vocab().eog;
    q.sampling.temperature = r.temperature;
    q.sampling.top_p = r.top_p;
    q.sampling.top_k = r.top_k;
    q.sampling.min_p = r.min_p;
    q.sampling.repeat_penalty = r.repeat_penalty;
    q.sampling.presence_penalty = r.presence_penalty;
    q.sampling.frequency_penalty = r.frequency_penalty;
    q.sampling.penalty_last_n =
        r.repeat_last_n < 0 ? std::numeric_limits<std::int64_t>::max() : r.repeat_last_n;
    for (const auto& b : r.logit_bias) {
      if (static_cast<std::size_t>(b.token) >= vocab_)
        raise(error_code::invalid_argument, "logit_bias: token ", b.token,
              " outside the vocabulary of ", vocab_);
      q.sampling.logit_bias.push_back(b);
    }
    // Ids past the tokenizer (an embedding padded to a round size) are never sampled.
    for (std::size_t id = vocab_; id < lm_.config().vocab_size; ++id)
      q.sampling.logit_bias.push_back(
          {static_cast<std::int32_t>(id), -std::numeric_limits<float>::infinity()});
    if (g) {
      const npullm::batch::grammar_processor p(g, prompt.size());
      q.sampling.processor = p;
      q.sampling.prefetch = p.prefetcher();
    }
    q.seed = seed;
    q.stop_strings = r.stop;
    q.detokenize = [this](std::int32_t id) { return std::string(tok_.piece(id)); };
    q.cache_prompt = r.cache_prompt;
    q.logprobs = r.logprobs;
    q.top_logprobs = r.top_logprobs;
    q.sampling.validate();
    return q;
  }

  void cancel_all(response_job& job) {
    for (auto& s : job.streams) {
      if (!s->cancelled()) with_engine([&](auto& e) { e.cancel(*s); });
    }
  }

  json logprob_entry(std::int32_t id, double lp) const {
    const std::string text(tok_.piece(id));
    json bytes = json::array();
    for (const unsigned char c : text) bytes.push_back(c);
    return {{"token", text}, {"logprob", lp}, {"bytes", bytes}};
  }

  // Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
  json chat_logprobs(const std::vector<std::int32_t>& tokens,
                     const std::vector<npullm::batch::token_logprobs>& lps) const {
    json content = json::array();
    for (std::size_t i = 0; i < lps.size() && i < tokens.size(); ++i) {
      json e = logprob_entry(lps[i].chosen.token, lps[i].chosen.logprob);
      json top = json::array();
      for (const auto& t : lps[i].top) top.push_back(logprob_entry(t.token, t.logprob));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return content;
  }

  // Takes what the choices gained into the job; true when something came.
  bool gather(response_job& job, std::vector<serve::output_stream::piece>& pieces) {
    bool any = false;
    pieces.clear();
    for (std::size_t i = 0; i < job.streams.size(); ++i) {
      auto p = job.streams[i]->take(
          std::chrono::milliseconds(job.done[i] ? 0 : 200 / job.streams.size() + 1));
      if (p.failure && !job.failure) job.failure = p.failure;
      any = any || !p.text.empty() || !p.tokens.empty() || (p.finished && !job.done[i]);
      pieces.push_back(std::move(p));
    }
    return any;
  }

  void init(response_job& job) {
    if (job.started) return;
    job.started = true;
    const std::size_t n = job.streams.size();
    job.text.assign(n, {});
    job.logprobs.assign(n, json::array());
    job.tokens.assign(n, 0);
    job.finish.assign(n, npullm::batch::finish_reason::running);
    job.done.assign(n, false);
  }

  json usage(const response_job& job) const {
    std::size_t completion = 0;
    for (const std::size_t t : job.tokens) completion += t;
    return {{"prompt_tokens", job.prompt_tokens},
            {"completion_tokens", completion},
            {"total_tokens", job.prompt_tokens + completion}};
  }

  bool write(httplib::DataSink& sink, const std::string& s, response_job& job) {
    job.last_write = clock_type::now();
    if (!sink.write(s.data(), s.size())) {
      ++counters_.disconnects;
      cancel_all(job);
      return false;
    }
    return true;
  }

  bool tools_wanted(const serve::completion_request& r) const {
    return r.kind == serve::endpoint::chat && !r.tools.is_null() &&
           r.tools_choice != serve::tool_choice::none;
  }

  // The message of a finished chat choice: content, or tool_calls parsed from it.
  json message_of(const response_job& job, std::size_t i, const char*& finish) const {
    json m = {{"role", "assistant"}};
    const std::string& text = job.text[i];
    if (tools_wanted(job.req)) {
      std::string content;
      std::vector<serve::tool_call> calls;
      const bool constrained = job.req.tools_choice == serve::tool_choice::required ||
                               job.req.tools_choice == serve::tool_choice::named;
      if (constrained) {  // the grammar made the text one {"name", "arguments"} object
        content.clear();
        calls = serve::detail::calls_of(json::parse(text, nullptr, false));
        if (calls.empty()) content = text;
      } else {
        calls = serve::parse_tool_calls(text, content);
      }
      if (!calls.empty()) {
        json list = json::array();
        for (std::size_t k = 0; k < calls.size(); ++k) {
          list.push_back(
              {{"id", "call_" + job.id.substr(job.id.size() - 8) + std::to_string(i) + "_" +
                          std::to_string(k)},
               {"type", "function"},
               {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
        }
        m["content"] = content.empty() ? json(nullptr) : json(content);
        m["tool_calls"] = std::move(list);
        finish = "tool_calls";
        return m;
      }
    }
    m["content"] = text;
    return m;
  }

  // Non-streaming: spaces while waiting (a gone client is noticed), then the whole body.
  bool whole_body(response_job& job, httplib::DataSink& sink) {
    init(job);
    std::vector<serve::output_stream::piece> pieces;
    gather(job, pieces);
    bool all = true;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      auto& p = pieces[i];
      job.text[i] += p.text;
      job.tokens[i] += p.tokens.size();
      if (job.req.logprobs) {
        json more = job.req.kind == serve::endpoint::chat ? chat_logprobs(p.tokens, p.logprobs)
                                                          : json::array();
        if (job.req.kind == serve::endpoint::chat) {
          for (auto& e : more) job.logprobs[i].push_back(std::move(e));
        } else {
          for (std::size_t k = 0; k < p.logprobs.size(); ++k) {
            json top = json::object();
            for (const auto& t : p.logprobs[k].top)
              top[std::string(tok_.piece(t.token))] = t.logprob;
            job.logprobs[i].push_back(
                {{"token", std::string(tok_.piece(p.logprobs[k].chosen.token))},
                 {"logprob", p.logprobs[k].chosen.logprob},
                 {"top", top}});
          }
        }
      }
      if (p.finished) {
        job.done[i] = true;
        job.finish[i] = p.finish;
      }
      all = all && job.done[i];
    }
    if (!all) {
      if (clock_type::now() - job.last_write > std::chrono::milliseconds(200))
        return write(sink, " ", job);
      return true;
    }
    json body;
    if (job.failure) {
      body = serve::to_api_error(*job.failure).to_json();
    } else {
      json choices = json::array();
      for (std::size_t i = 0; i < job.streams.size(); ++i) {
        const char* finish = finish_name(job.finish[i]);
        if (job.req.kind == serve::endpoint::chat) {
          json c = {{"index", i}};
          c["message"] = message_of(job, i, finish);
          c["logprobs"] = job.req.logprobs ? json{{"content", job.logprobs[i]}} : json(nullptr);
          c["finish_reason"] = finish;
          choices.push_back(std::move(c));
        } else {
          json lp = nullptr;
          if (job.req.logprobs) {
            lp = {{"tokens", json::array()},
                  {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()},
                  {"text_offset", json::array()}};
            std::size_t offset = 0;
            for (const json& e : job.logprobs[i]) {
              lp["tokens"].push_back(e["token"]);
              lp["token_logprobs"].push_back(e["logprob"]);
              lp["top_logprobs"].push_back(e["top"]);
              lp["text_offset"].push_back(offset);
              offset += e["token"].get_ref<const std::string&>().size();
            }
          }
          choices.push_back(
              {{"text", job.text[i]}, {"index", i}, {"logprobs", lp}, {"finish_reason", finish}});
        }
      }
      body = {
          {"id", job.id},
          {"object", job.req.kind == serve::endpoint::chat ? "chat.completion" : "text_completion"},
          {"created", job.created},
          {"model", name_},
          {"system_fingerprint", "npullm"},
          {"choices", std::move(choices)},
          {"usage", usage(job)}};
    }
    if (!write(sink, body.dump(-1, ' ', false, json::error_handler_t::replace), job)) return false;
    sink.done();
    return true;
  }

  std::string event(const json& chunk) const {
    return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  json chunk_of(const response_job& job, json choice) const {
    const bool chat = job.req.kind == serve::endpoint::chat;
    json c = {{"id", job.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", job.created},
              {"model", name_},
              {"system_fingerprint", "npullm"},
              {"choices", json::array({std::move(choice)})}};
    return c;
  }

  // Streaming: SSE chunks as the text comes, each naming its choice (index); after the last
  // choice finishes, the usage chunk (include_usage) and [DONE].
  bool stream_body(response_job& job, httplib::DataSink& sink) {
    const bool chat = job.req.kind == serve::endpoint::chat;
    const bool buffer = tools_wanted(job.req);  // tool calls are parsed from the whole text
    if (!job.started) {
      init(job);
      if (chat) {
        for (std::size_t i = 0; i < job.streams.size(); ++i) {
          json d = {{"index", i},
                    {"delta", {{"role", "assistant"}, {"content", ""}}},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}};
          if (!write(sink, event(chunk_of(job, d)), job)) return false;
        }
      }
    }
    std::vector<serve::output_stream::piece> pieces;
    gather(job, pieces);
    if (job.failure) {
      write(sink, event(serve::to_api_error(*job.failure).to_json()), job);
      write(sink, "data: [DONE]\n\n", job);
      sink.done();
      return true;
    }
    bool all = true;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      auto& p = pieces[i];
      job.tokens[i] += p.tokens.size();
      if (!p.text.empty() || (!p.tokens.empty() && job.req.logprobs)) {
        if (buffer) {
          job.text[i] += p.text;
        } else {
          json d;
          if (chat) {
            d = {{"index", i}, {"delta", {{"content", p.text}}}};
            d["logprobs"] = job.req.logprobs
                                ? json{{"content", chat_logprobs(p.tokens, p.logprobs)}}
                                : json(nullptr);
          } else {
            d = {{"text", p.text}, {"index", i}};
            d["logprobs"] = nullptr;
            if (job.req.logprobs) {
              json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}};
              for (const auto& e : p.logprobs) {
                lp["tokens"].push_back(std::string(tok_.piece(e.chosen.token)));
                lp["token_logprobs"].push_back(e.chosen.logprob);
              }
              d["logprobs"] = lp;
            }
          }
          d["finish_reason"] = nullptr;
          if (!write(sink, event(chunk_of(job, d)), job)) return false;
        }
      }
      if (p.finished && !job.done[i]) {
        job.done[i] = true;
        job.finish[i] = p.finish;
        const char* finish = finish_name(p.finish);
        json d;
        if (chat) {
          json delta = json::object();
          if (buffer) {
            json m = message_of(job, i, finish);
            if (m.contains("tool_calls")) {
              json calls = m["tool_calls"];
              for (std::size_t k = 0; k < calls.size(); ++k) calls[k]["index"] = k;
              delta["tool_calls"] = calls;
            } else {
              delta["content"] = m["content"];
            }
          }
          d = {{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}};
        } else {
          d = {{"text", ""}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", finish}};
        }
        if (!write(sink, event(chunk_of(job, d)), job)) return false;
      }
      all = all && job.done[i];
    }
    if (all) {
      if (job.req.include_usage) {
        json u = chunk_of(job, nullptr);
        u["choices"] = json::array();
        u["usage"] = usage(job);
        if (!write(sink, event(u), job)) return false;
      }
      if (!write(sink, "data: [DONE]\n\n", job)) return false;
      sink.done();
      return true;
    }
    if (clock_type::now() - job.last_write > std::chrono::milliseconds(200))
      return write(sink, ": waiting\n\n", job);
    return true;
  }

  const options& o_;
  npullm::text::tokenizer tok_;
  std::optional<npullm::text::chat_template> template_;
  std::string name_;
  http_counters& counters_;
  npullm::thread_pool pool_;
  lm_type lm_;
  npullm::grammar::grammar_cache grammars_;
  std::size_t vocab_ = 0;
  std::optional<lm_type> draft_lm_;  // --draft
  std::optional<draft_type> draft_;
  // Last: an engine's thread stops first. One of the two is made.
  std::unique_ptr<serve::engine<lm_type>> plain_;
  std::unique_ptr<serve::engine<lm_type, draft_type>> speculative_;
};

std::unique_ptr<service> load_service(const options& o, http_counters& counters) {
  const auto file = npullm::io::gguf_file::open(o.model);
  auto tok = npullm::text::tokenizer::from_gguf(*file);
  const auto& v = tok.vocab();
  const auto token_text = [&](std::int32_t id) {
    return id >= 0 && static_cast<std::size_t>(id) < v.size() ? v.tokens[id].text : std::string();
  };
  std::optional<npullm::text::chat_template> tmpl;
  if (o.chat_template_file) {
    std::ifstream in(*o.chat_template_file, std::ios::binary);
    if (!in)
      raise(error_code::io, "--chat-template-file ", *o.chat_template_file, ": cannot be read");
    const std::string source((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    tmpl = npullm::text::chat_template::from_jinja(source, token_text(v.bos), token_text(v.eos));
  } else if (v.chat_template) {
    tmpl = npullm::text::chat_template::from_vocabulary(v);
  }
  const std::string name =
      o.alias.empty() ? std::filesystem::path(o.model).filename().string() : o.alias;
  switch (cli::dense_matrix_type(*file)) {
    case npullm::dtype::f16:
      return std::make_unique<model_service<npullm::float16>>(o, std::move(tok), std::move(tmpl),
                                                              name, counters);
    case npullm::dtype::bf16:
      return std::make_unique<model_service<npullm::bfloat16>>(o, std::move(tok), std::move(tmpl),
                                                               name, counters);
    case npullm::dtype::f32: break;
  }
  return std::make_unique<model_service<float>>(o, std::move(tok), std::move(tmpl), name, counters);
}

options parse_options(int argc, char** argv, bool& help) {
  options o;
  bool have_model = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return std::string(cli::value(argc, argv, i)); };
    if (a == "-h" || a == "--help") {
      help = true;
      return o;
    } else if (a == "-m" || a == "--model") {
      o.model = value(), have_model = true;
    } else if (a == "--host") {
      o.host = value();
    } else if (a == "--port") {
      o.port = cli::integer<int>(a, value(), "port", 0, 65535);
    } else if (a == "-t" || a == "--threads") {
      o.threads = cli::integer<std::size_t>(a, value(), "threads", 1, cli::max_threads);
    } else if (a == "-np" || a == "--parallel") {
      o.parallel = cli::integer<std::size_t>(a, value(), "parallel", 1, 256);
    } else if (a == "-c" || a == "--ctx-size") {
      o.ctx = cli::integer<std::size_t>(a, value(), "ctx-size", 16, std::size_t{1} << 24);
    } else if (a == "--max-queue") {
      o.max_queue = cli::integer<std::size_t>(a, value(), "max-queue", 0, 1u << 20);
    } else if (a == "--api-key") {
      o.api_key = value();
      if (o.api_key.empty()) cli::refuse(a, o.api_key, "the key must not be empty");
    } else if (a == "--chat-template-file") {
      o.chat_template_file = value();
    } else if (a == "--alias" || a == "-a") {
      o.alias = value();
    } else if (a == "--body-limit") {
      o.body_limit = cli::integer<std::size_t>(a, value(), "body-limit", 1024);
    } else if (a == "--drain-timeout") {
      o.drain_timeout = cli::number(a, value(), "drain-timeout", cli::range::at_least(0));
    } else if (a == "--no-batch-invariant") {
      o.batch_invariant = false;
    } else if (a == "--draft" || a == "-md" || a == "--model-draft") {
      o.draft = value();
    } else if (a == "--draft-max") {
      o.draft_max = cli::integer<std::size_t>(a, value(), "draft-max", 1, 64);
    } else {
      raise(error_code::invalid_argument, "unknown option '", a, "' (-h for help)");
    }
  }
  if (!have_model) raise(error_code::invalid_argument, "-m FILE.gguf is required (-h for help)");
  if (o.ctx < o.parallel) cli::refuse("--ctx-size", std::to_string(o.ctx), "must be >= --parallel");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    bool help = false;
    o = parse_options(argc, argv, help);
    if (help) {
      usage(argv[0]);
      return 0;
    }
  } catch (const error& e) {
    std::fprintf(stderr, "error: %s\n", std::string(e.message()).c_str());
    return 1;
  }
  // SIGTERM / SIGINT go to one thread (sigwait), never to a handler in the middle of a step.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  http_counters counters;
  std::atomic<service*> svc{nullptr};
  std::atomic<bool> draining{false};
  httplib::Server http;
  const std::size_t threads = std::max<std::size_t>(64, o.parallel + o.max_queue + 16);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(o.body_limit);
  http.set_keep_alive_max_count(1u << 20);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);

  const auto busy = [&](httplib::Response& res) {
    send_error(res,
               make_error(503, draining ? "The server is shutting down." : "The model is loading.",
                          "server_error", "unavailable"));
  };
  http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!o.api_key.empty()) {
      const std::string h = req.get_header_value("Authorization");
      if (!h.starts_with("Bearer ") || !same_secret(std::string_view(h).substr(7), o.api_key)) {
        send_error(res, make_error(401, "Incorrect API key provided.", "invalid_request_error",
                                   "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (svc.load() == nullptr || draining) {
      res.status = 503;
      res.set_content(draining ? R"({"status":"draining"})" : R"({"status":"loading"})",
                      "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  const auto with_service = [&](auto fn) {
    return [&, fn](const httplib::Request& req, httplib::Response& res) {
      service* s = svc.load();
      if (s == nullptr || draining) return busy(res);
      fn(*s, req, res);
    };
  };
  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) {
    http.Post(path,
              with_service([&](service& s, const httplib::Request& req, httplib::Response& res) {
                ++counters.requests;
                s.completion(req, res, serve::endpoint::chat);
              }));
  }
  for (const char* path : {"/v1/completions", "/completions"}) {
    http.Post(path,
              with_service([&](service& s, const httplib::Request& req, httplib::Response& res) {
                ++counters.requests;
                s.completion(req, res, serve::endpoint::completion);
              }));
  }
  http.Post("/tokenize", with_service([](service& s, const httplib::Request& req,
                                         httplib::Response& res) { s.tokenize(req, res); }));
  http.Post("/detokenize", with_service([](service& s, const httplib::Request& req,
                                           httplib::Response& res) { s.detokenize(req, res); }));
  http.Post("/apply-template",
            with_service([](service& s, const httplib::Request& req, httplib::Response& res) {
              s.apply_template(req, res);
            }));
  http.Get("/metrics", with_service([](service& s, const httplib::Request&,
                                       httplib::Response& res) { s.metrics(res); }));
  const std::string model_name =
      o.alias.empty() ? std::filesystem::path(o.model).filename().string() : o.alias;
  for (const char* path : {"/v1/models", "/models"}) {
    http.Get(path, [&](const httplib::Request&, httplib::Response& res) {
      const json m = {{"object", "list"},
                      {"data", json::array({{{"id", model_name},
                                             {"object", "model"},
                                             {"created", unix_time()},
                                             {"owned_by", "npullm"}}})}};
      res.set_content(m.dump(), "application/json");
    });
  }
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // an error we wrote
    if (res.status == 404) {
      send_error(res, make_error(404, "Unknown request URL: " + req.method + " " + req.path + ".",
                                 "invalid_request_error", "unknown_url"));
    } else if (res.status == 413) {
      send_error(res, make_error(413, "The request body is larger than the server's limit.",
                                 "invalid_request_error", "body_too_large"));
    } else {
      send_error(res, make_error(res.status, "HTTP error " + std::to_string(res.status) + "."));
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, make_error(500, what, "server_error"));
      });

  const int port = o.port == 0 ? http.bind_to_any_port(o.host)
                               : (http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) {
    std::fprintf(stderr, "error: cannot listen on %s:%d\n", o.host.c_str(), o.port);
    return 1;
  }
  std::thread listener([&] { http.listen_after_bind(); });
  std::fprintf(stderr, "npullm_server: listening on http://%s:%d (loading %s)\n", o.host.c_str(),
               port, o.model.c_str());

  // The signal thread: drain, then stop the HTTP server.
  std::atomic<int> exit_code{0};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "npullm_server: signal %d: draining (at most %.0f s)\n", sig,
                 o.drain_timeout);
    draining = true;
    if (service* s = svc.load()) {
      const bool all = s->drain(o.drain_timeout);
      std::fprintf(stderr, "npullm_server: %s\n",
                   all ? "every request finished" : "drain timeout: the rest were cancelled");
      // Let the HTTP threads write the last bytes of their streams.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    http.stop();
  });

  std::unique_ptr<service> loaded;
  try {
    const auto t = clock_type::now();
    loaded = load_service(o, counters);
    svc = loaded.get();
    std::fprintf(
        stderr,
        "npullm_server: ready in %.2f s: %s, %zu threads, %zu parallel, ctx %zu, queue %zu%s%s\n",
        std::chrono::duration<double>(clock_type::now() - t).count(), model_name.c_str(), o.threads,
        o.parallel, o.ctx, o.max_queue, o.draft ? ", draft " : "",
        o.draft ? (*o.draft + " (" + std::to_string(o.draft_max) + " a step)").c_str() : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    exit_code = 1;
    pthread_kill(signal_thread.native_handle(), SIGTERM);
  }
  listener.join();
  signal_thread.join();
  svc = nullptr;
  loaded.reset();
  return exit_code;
}
