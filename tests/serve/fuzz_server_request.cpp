// libFuzzer harness over npullm_server's request reader (serve/openai.hpp): an input's first
// byte picks the endpoint (even: chat, odd: completions); the rest is the HTTP body. For
// every input:
//   - parse_completion_request either gives a request or raises npullm::error (never another
//     exception, a crash, or deep recursion: bodies nested past the limit are refused first);
//   - an error becomes OpenAI's error object with a 4xx status and a message;
//   - a request read is within its limits (n, stop strings, top_logprobs, ranges), and the
//     body read twice gives the same request;
//   - parse_tool_calls over the body's text finds calls with names, or none, and never throws.
// Built with clang when available (target fuzz_server_request); test_serve replays the corpus
// (tests/serve/corpus_request) through the same checks.
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "npullm/serve/openai.hpp"

namespace npullm_fuzz_server_request {

struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what) {
  if (!ok) throw violation(what);
}

inline void run_one(std::string_view input) {
  namespace serve = npullm::serve;
  if (input.empty() || input.size() > (1u << 20)) return;
  const auto kind = static_cast<unsigned char>(input[0]) % 2 == 0 ? serve::endpoint::chat
                                                                  : serve::endpoint::completion;
  const std::string_view body = input.substr(1);
  std::string content;
  for (const auto& call : serve::parse_tool_calls(body, content))
    require(!call.name.empty() || call.arguments.size() >= 2, "a tool call without a name");
  serve::completion_request r;
  try {
    r = serve::parse_completion_request(body, kind);
  } catch (const npullm::error& e) {
    const serve::api_error a = serve::to_api_error(e);
    require(a.status >= 400 && a.status < 500, "a refused body is not a 4xx");
    require(!a.message.empty(), "an error without a message");
    require(a.to_json()["error"]["message"].is_string(), "the error object has no message");
    return;
  }
  const serve::request_limits limits;
  require(r.n >= 1 && r.n <= limits.max_n, "n outside its limit");
  require(r.stop.size() <= limits.max_stop, "too many stop strings");
  for (const auto& s : r.stop) require(!s.empty() && s.size() <= limits.max_stop_bytes, "stop string");
  require(r.top_logprobs <= limits.max_top_logprobs, "top_logprobs outside its limit");
  require(r.temperature >= 0 && r.temperature <= 2, "temperature outside [0, 2]");
  require(r.top_p > 0 && r.top_p <= 1, "top_p outside (0, 1]");
  require(!r.max_tokens || *r.max_tokens >= 1, "max_tokens 0");
  require(kind != serve::endpoint::chat || !r.messages.empty(), "chat without messages");
  require(kind != serve::endpoint::completion || !r.prompt.empty() || !r.prompt_ids.empty(),
          "completion without a prompt");
  const serve::completion_request again = serve::parse_completion_request(body, kind);
  require(again.messages == r.messages && again.prompt == r.prompt && again.stop == r.stop &&
              again.n == r.n && again.schema == r.schema,
          "the same body read twice differs");
}

}  // namespace npullm_fuzz_server_request

#ifndef NPULLM_SERVER_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_server_request::run_one({reinterpret_cast<const char*>(data), size});
  } catch (const npullm_fuzz_server_request::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
