// serve/openai.hpp: OpenAI's HTTP API as data: a request body checked and read into
// completion_request (no model needed: the server's HTTP threads run this, and the fuzzer
// fuzz_server_request), the error object, and the response and stream-chunk bodies.
//
//   const completion_request r = parse_completion_request(body, endpoint::chat);  // or raises
//   ... the engine generates ...
//   json body = chat_response(r, id, created, model, choices, usage);
//
// Fields read (OpenAI's names and meanings; llama.cpp's extensions marked *):
//   messages (chat) / prompt (completions: a string or token ids), max_tokens /
//   max_completion_tokens, temperature [0, 2], top_p (0, 1], seed, stop (a string or a list of
//   up to 16), presence_penalty / frequency_penalty [-2, 2], logit_bias {"token id": [-100, 100]},
//   logprobs (chat: bool, with top_logprobs 0..20; completions: 0..20), n 1..16, stream,
//   stream_options.include_usage, response_format (text, json_object, json_schema with
//   json_schema.schema), tools + tool_choice (none, auto, required, {"type": "function",
//   "function": {"name"}}), user, model; *top_k, *min_p, *repeat_penalty, *repeat_last_n,
//   *ignore_eos, *cache_prompt, *grammar (GBNF). Unknown fields are ignored, as OpenAI's API
//   does; a known field of the wrong type or out of its range is refused (invalid_argument,
//   the message starting with the field's name: to_api_error makes that the error's param).
//   Refused by name: two of grammar / response_format / a required tool call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/batch/sampler.hpp"
#include "npullm/core/error.hpp"

namespace npullm::serve {

using json = nlohmann::ordered_json;

enum class endpoint { chat, completion };

enum class response_format { text, json_object, json_schema };
enum class tool_choice { none, automatic, required, named };

// Limits on what one request may ask for (a server option may lower them).
struct request_limits {
  std::size_t max_n = 16;
  std::size_t max_stop = 16;
  std::size_t max_stop_bytes = 256;  // each stop string
  std::size_t max_top_logprobs = 20;
  std::size_t max_logit_bias = 1024;
  std::size_t max_messages = 4096;
  std::size_t max_json_depth = 64;  // nesting of the body (nlohmann parses recursively)
};

struct completion_request {
  endpoint kind = endpoint::chat;
  std::string model;
  json messages = json::array();      // chat: as given (content parts joined to text)
  std::string prompt;                  // completions: the text
  std::vector<std::int32_t> prompt_ids;  // completions: token ids instead of text
  std::optional<std::size_t> max_tokens;
  float temperature = 1.0f;  // OpenAI's default
  float top_p = 1.0f;
  std::size_t top_k = 0;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  std::int64_t repeat_last_n = 64;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<batch::token_bias> logit_bias;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  std::size_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  std::size_t top_logprobs = 0;
  response_format format = response_format::text;
  std::string schema;  // json_schema: the schema's text
  json tools = nullptr;
  tool_choice tools_choice = tool_choice::automatic;
  std::string tool_name;  // named
  bool ignore_eos = false;
  bool cache_prompt = true;
  std::string grammar;  // GBNF (llama.cpp's extension)
};

// OpenAI's error object: {"error": {"message", "type", "param", "code"}} and the HTTP status.
struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null

  [[nodiscard]] json to_json() const {
    json e = json::object();
    e["message"] = message;
    e["type"] = type;
    e["param"] = param.empty() ? json(nullptr) : json(param);
    e["code"] = code.empty() ? json(nullptr) : json(code);
    json body = json::object();
    body["error"] = std::move(e);
    return body;
  }
};

namespace detail {

// Raises invalid_argument naming the field first ("temperature: ..."): to_api_error's param.
template <class... Parts>
[[noreturn]] void refuse(std::string_view field, const Parts&... parts) {
  raise(error_code::invalid_argument, field, ": ", parts...);
}

inline std::string_view type_name(const json& v) {
  return v.is_number_integer() ? "an integer" : v.is_number() ? "a number" : v.type_name();
}

inline double number(const json& v, std::string_view field, double lo, double hi) {
  if (!v.is_number()) refuse(field, "must be a number, not ", type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) refuse(field, d, " outside [", lo, ", ", hi, "]");
  return d;
}

inline std::int64_t integer(const json& v, std::string_view field, std::int64_t lo,
                            std::int64_t hi) {
  if (!v.is_number_integer()) {
    // 5.0 is 5 (JSON has one number type); 5.5 is not an integer.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) &&
          d <= static_cast<double>(hi))
        return static_cast<std::int64_t>(d);
    }
    refuse(field, "must be an integer, not ", v.is_number() ? v.dump() : type_name(v));
  }
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    refuse(field, v.dump(), " outside [", lo, ", ", hi, "]");
  const std::int64_t i = v.get<std::int64_t>();
  if (i < lo || i > hi) refuse(field, i, " outside [", lo, ", ", hi, "]");
  return i;
}

inline bool boolean(const json& v, std::string_view field) {
  if (!v.is_boolean()) refuse(field, "must be true or false, not ", type_name(v));
  return v.get<bool>();
}

inline const std::string& string(const json& v, std::string_view field) {
  if (!v.is_string()) refuse(field, "must be a string, not ", type_name(v));
  return v.get_ref<const std::string&>();
}

// A message's content: a string, null, or a list of parts of which only text is read.
inline json content_text(const json& c, std::string_view field) {
  if (c.is_null() || c.is_string()) return c;
  if (!c.is_array()) refuse(field, "must be a string, null or a list of parts, not ", type_name(c));
  std::string text;
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      refuse(field, "a content part must be an object with a type");
    const std::string& t = part["type"].get_ref<const std::string&>();
    if (t != "text") refuse(field, "content parts of type '", t, "' are not supported (text only)");
    if (!part.contains("text")) refuse(field, "a text part has no text");
    text += string(part["text"], field);
  }
  return text;
}

inline std::size_t depth_of(const json& v, std::size_t limit, std::size_t depth = 0) {
  if (depth > limit) return depth;
  std::size_t deepest = depth;
  if (v.is_structured()) {
    for (const json& c : v) deepest = std::max(deepest, depth_of(c, limit, depth + 1));
  }
  return deepest;
}

// Nesting of the raw text, counted before nlohmann's recursive parser sees it.
inline std::size_t text_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace detail

// A request body as a JSON object: its nesting counted on the text first (nlohmann's parser
// and its copies recurse, so a body nested 10^5 deep would overflow the stack before any check
// of ours), then parsed. Raises invalid_argument (too deep, not an object) or corrupt_data.
inline json parse_json_body(std::string_view body, const request_limits& limits = {}) {
  if (detail::text_depth(body) > limits.max_json_depth) {
    raise(error_code::invalid_argument, "body: JSON nested deeper than ",
          limits.max_json_depth, " levels");
  }
  json v = json::parse(body, nullptr, false);
  if (v.is_discarded()) raise(error_code::corrupt_data, "body: not valid JSON");
  if (!v.is_object()) raise(error_code::invalid_argument, "body: must be a JSON object");
  return v;
}

// The body of POST /v1/chat/completions or /v1/completions, checked (see the top). Raises
// invalid_argument (field: why) or corrupt_data (not JSON).
inline completion_request parse_completion_request(std::string_view body, endpoint kind,
                                                   const request_limits& limits = {}) {
  using namespace detail;
  const json v = parse_json_body(body, limits);
  completion_request r;
  r.kind = kind;
  const auto has = [&](const char* k) { return v.contains(k) && !v[k].is_null(); };
  if (has("model")) r.model = string(v["model"], "model");

  if (kind == endpoint::chat) {
    if (!v.contains("messages")) refuse("messages", "required");
    const json& m = v["messages"];
    if (!m.is_array()) refuse("messages", "must be a list, not ", type_name(m));
    if (m.empty()) refuse("messages", "must not be empty");
    if (m.size() > limits.max_messages)
      refuse("messages", m.size(), " messages, more than ", limits.max_messages);
    for (const json& msg : m) {
      if (!msg.is_object()) refuse("messages", "each message must be an object");
      if (!msg.contains("role")) refuse("messages", "a message has no role");
      const std::string& role = string(msg["role"], "messages");
      json out = msg;
      out["content"] = msg.contains("content") ? content_text(msg["content"], "messages")
                                               : json(nullptr);
      if (role != "assistant" && role != "tool" && out["content"].is_null()) {
        refuse("messages", "a ", role, " message needs a content");
      }
      if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
        if (!msg["tool_calls"].is_array()) refuse("messages", "tool_calls must be a list");
        // Arguments arrive as a JSON string; templates expect an object where it parses.
        for (json& call : out["tool_calls"]) {
          if (call.is_object() && call.contains("function") && call["function"].is_object() &&
              call["function"].contains("arguments") &&
              call["function"]["arguments"].is_string()) {
            json a = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
            if (!a.is_discarded()) call["function"]["arguments"] = std::move(a);
          }
        }
      }
      r.messages.push_back(std::move(out));
    }
  } else {
    if (!v.contains("prompt")) refuse("prompt", "required");
    const json& p = v["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number()) {
      for (const json& t : p)
        r.prompt_ids.push_back(static_cast<std::int32_t>(integer(t, "prompt", 0, INT32_MAX)));
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else {
      refuse("prompt", "must be a string, a list of one string or a list of token ids");
    }
    if (r.prompt.empty() && r.prompt_ids.empty()) refuse("prompt", "must not be empty");
  }

  if (has("max_completion_tokens"))
    r.max_tokens = static_cast<std::size_t>(
        integer(v["max_completion_tokens"], "max_completion_tokens", 1, INT32_MAX));
  else if (has("max_tokens"))
    r.max_tokens = static_cast<std::size_t>(integer(v["max_tokens"], "max_tokens", 1, INT32_MAX));
  else if (has("n_predict") && v["n_predict"].is_number_integer() &&
           v["n_predict"].get<std::int64_t>() > 0)
    r.max_tokens = static_cast<std::size_t>(integer(v["n_predict"], "n_predict", 1, INT32_MAX));
  if (has("temperature")) r.temperature = static_cast<float>(number(v["temperature"], "temperature", 0, 2));
  if (has("top_p")) {
    r.top_p = static_cast<float>(number(v["top_p"], "top_p", 0, 1));
    if (r.top_p == 0.0f) r.top_p = 1e-9f;  // 0: only the most likely token, as top_p -> 0
  }
  if (has("top_k")) r.top_k = static_cast<std::size_t>(integer(v["top_k"], "top_k", 0, INT32_MAX));
  if (has("min_p")) r.min_p = static_cast<float>(number(v["min_p"], "min_p", 0, 1));
  if (has("repeat_penalty"))
    r.repeat_penalty = static_cast<float>(number(v["repeat_penalty"], "repeat_penalty", 1e-3, 100));
  if (has("repeat_last_n"))
    r.repeat_last_n = integer(v["repeat_last_n"], "repeat_last_n", -1, INT32_MAX);
  if (has("presence_penalty"))
    r.presence_penalty = static_cast<float>(number(v["presence_penalty"], "presence_penalty", -2, 2));
  if (has("frequency_penalty"))
    r.frequency_penalty =
        static_cast<float>(number(v["frequency_penalty"], "frequency_penalty", -2, 2));
  if (has("logit_bias")) {
    const json& b = v["logit_bias"];
    if (!b.is_object()) refuse("logit_bias", "must be an object of token id: bias");
    if (b.size() > limits.max_logit_bias)
      refuse("logit_bias", b.size(), " entries, more than ", limits.max_logit_bias);
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& key = it.key();
      std::int64_t id = 0;
      if (key.empty() || key.size() > 10 ||
          !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          (id = std::stoll(key)) > INT32_MAX)
        refuse("logit_bias", "key '", key, "' is not a token id");
      r.logit_bias.push_back({static_cast<std::int32_t>(id),
                              static_cast<float>(number(it.value(), "logit_bias", -100, 100))});
    }
  }
  if (has("seed")) {
    const json& s = v["seed"];
    if (s.is_number_unsigned()) r.seed = s.get<std::uint64_t>();
    else r.seed = static_cast<std::uint64_t>(integer(s, "seed", INT64_MIN, INT64_MAX));
  }
  if (has("stop")) {
    const json& s = v["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > limits.max_stop) refuse("stop", s.size(), " strings, more than ", limits.max_stop);
      for (const json& x : s) r.stop.push_back(string(x, "stop"));
    } else {
      refuse("stop", "must be a string or a list of strings, not ", type_name(s));
    }
    for (const std::string& x : r.stop) {
      if (x.empty()) refuse("stop", "a stop string must not be empty");
      if (x.size() > limits.max_stop_bytes)
        refuse("stop", "a stop string of ", x.size(), " bytes, more than ", limits.max_stop_bytes);
    }
  }
  if (has("n")) r.n = static_cast<std::size_t>(integer(v["n"], "n", 1, static_cast<std::int64_t>(limits.max_n)));
  if (has("stream")) r.stream = boolean(v["stream"], "stream");
  if (has("stream_options")) {
    const json& o = v["stream_options"];
    if (!o.is_object()) refuse("stream_options", "must be an object");
    if (o.contains("include_usage") && !o["include_usage"].is_null())
      r.include_usage = boolean(o["include_usage"], "stream_options");
  }
  const auto max_top = static_cast<std::int64_t>(limits.max_top_logprobs);
  if (has("logprobs")) {
    if (kind == endpoint::chat) {
      r.logprobs = boolean(v["logprobs"], "logprobs");
    } else {  // completions: the number of most likely tokens wanted beside the chosen one
      r.top_logprobs = static_cast<std::size_t>(integer(v["logprobs"], "logprobs", 0, max_top));
      r.logprobs = true;
    }
  }
  if (kind == endpoint::chat && has("top_logprobs")) {
    r.top_logprobs = static_cast<std::size_t>(integer(v["top_logprobs"], "top_logprobs", 0, max_top));
    if (!r.logprobs && r.top_logprobs > 0) refuse("top_logprobs", "needs logprobs: true");
  }
  if (has("response_format")) {
    const json& f = v["response_format"];
    if (!f.is_object() || !f.contains("type")) refuse("response_format", "must be an object with a type");
    const std::string& t = string(f["type"], "response_format");
    if (t == "text") {
      r.format = response_format::text;
    } else if (t == "json_object") {
      r.format = response_format::json_object;
    } else if (t == "json_schema") {
      r.format = response_format::json_schema;
      if (!f.contains("json_schema") || !f["json_schema"].is_object())
        refuse("response_format", "json_schema needs a json_schema object");
      const json& js = f["json_schema"];
      if (!js.contains("schema") || !js["schema"].is_object())
        refuse("response_format", "json_schema.schema must be an object (a JSON Schema)");
      r.schema = js["schema"].dump();
    } else {
      refuse("response_format", "type '", t, "' unknown (text, json_object, json_schema)");
    }
  }
  if (has("tools")) {
    const json& t = v["tools"];
    if (!t.is_array()) refuse("tools", "must be a list");
    for (const json& tool : t) {
      if (!tool.is_object() || !tool.contains("type") || tool["type"] != "function" ||
          !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        refuse("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
      if (tool["function"].contains("parameters") && !tool["function"]["parameters"].is_object())
        refuse("tools", "function.parameters must be an object (a JSON Schema)");
    }
    if (!t.empty()) r.tools = t;
  }
  if (has("tool_choice")) {
    const json& c = v["tool_choice"];
    if (c.is_string()) {
      const std::string& s = c.get_ref<const std::string&>();
      if (s == "none") r.tools_choice = tool_choice::none;
      else if (s == "auto") r.tools_choice = tool_choice::automatic;
      else if (s == "required") r.tools_choice = tool_choice::required;
      else refuse("tool_choice", "'", s, "' unknown (none, auto, required or a function)");
    } else if (c.is_object() && c.contains("function") && c["function"].is_object() &&
               c["function"].contains("name") && c["function"]["name"].is_string()) {
      r.tools_choice = tool_choice::named;
      r.tool_name = c["function"]["name"].get<std::string>();
    } else {
      refuse("tool_choice", "must be none, auto, required or {\"type\": \"function\", "
                            "\"function\": {\"name\"}}");
    }
    if ((r.tools_choice == tool_choice::required || r.tools_choice == tool_choice::named) &&
        r.tools.is_null())
      refuse("tool_choice", "a tool call is required but no tools are given");
    if (r.tools_choice == tool_choice::named) {
      const bool known = std::any_of(r.tools.begin(), r.tools.end(), [&](const json& t) {
        return t["function"]["name"] == r.tool_name;
      });
      if (!known) refuse("tool_choice", "function '", r.tool_name, "' is not among the tools");
    }
  }
  if (has("ignore_eos")) r.ignore_eos = boolean(v["ignore_eos"], "ignore_eos");
  if (has("cache_prompt")) r.cache_prompt = boolean(v["cache_prompt"], "cache_prompt");
  if (has("grammar")) r.grammar = string(v["grammar"], "grammar");

  const bool constrained_call =
      r.tools_choice == tool_choice::required || r.tools_choice == tool_choice::named;
  if ((r.format != response_format::text) + !r.grammar.empty() + constrained_call > 1)
    refuse("response_format", "only one of response_format, grammar and a required tool call");
  return r;
}

// An npullm::error as OpenAI's error object: capacity_exhausted is 400 (a context too long)
// unless the caller says otherwise; the param is the field the message starts with.
inline api_error to_api_error(const error& e, int status = 0) {
  api_error a;
  a.message = std::string(e.message());
  switch (e.code()) {
    case error_code::corrupt_data:
    case error_code::invalid_argument:
    case error_code::out_of_range:
    case error_code::invalid_shape: a.status = 400; break;
    case error_code::unsupported: a.status = 400; a.code = "unsupported"; break;
    case error_code::capacity_exhausted: a.status = 400; a.code = "context_length_exceeded"; break;
    default: a.status = 500; a.type = "server_error"; break;
  }
  if (status != 0) a.status = status;
  const std::size_t colon = a.message.find(':');
  if (colon != std::string::npos && colon < 40) {
    const std::string head = a.message.substr(0, colon);
    if (!head.empty() && std::all_of(head.begin(), head.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || c == '_';
        }))
      a.param = head;
  }
  return a;
}

// ---- tool calls in generated text ---------------------------------------------------------------

struct tool_call {
  std::string name;
  std::string arguments;  // JSON text
};

namespace detail {
// {"name": ..., "arguments" | "parameters": {...}} as a call; nullopt otherwise.
inline std::optional<tool_call> call_of(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  if (key == nullptr) return tool_call{j["name"].get<std::string>(), "{}"};
  const json& a = j[key];
  return tool_call{j["name"].get<std::string>(), a.is_string() ? a.get<std::string>() : a.dump()};
}
inline std::vector<tool_call> calls_of(const json& j) {
  std::vector<tool_call> out;
  if (j.is_array()) {
    for (const json& x : j)
      if (auto c = call_of(x)) out.push_back(*c);
  } else if (auto c = call_of(j)) {
    out.push_back(*c);
  }
  return out;
}
}  // namespace detail

// The tool calls a model wrote, in the families' formats: Qwen / Hermes
// `<tool_call>{json}</tool_call>` (any number), Mistral `[TOOL_CALLS][{...}, ...]`, DeepSeek
// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{args}\n```<｜tool▁call▁end｜>`, and
// Llama 3.1's bare JSON object (`<|python_tag|>` optional) when the whole text is one. `content`
// gets the text outside the calls. Text that is none of these: no calls, content unchanged.
inline std::vector<tool_call> parse_tool_calls(std::string_view text, std::string& content) {
  std::vector<tool_call> calls;
  content.assign(text);
  const auto parse = [](std::string_view s) { return json::parse(s, nullptr, false); };
  // Qwen / Hermes
  if (text.find("<tool_call>") != std::string_view::npos) {
    std::string rest;
    std::size_t at = 0;
    while (true) {
      const std::size_t open = text.find("<tool_call>", at);
      if (open == std::string_view::npos) break;
      const std::size_t body = open + 11;
      std::size_t close = text.find("</tool_call>", body);
      const std::size_t end = close == std::string_view::npos ? text.size() : close;
      const json j = parse(text.substr(body, end - body));
      if (j.is_discarded()) break;
      const auto cs = detail::calls_of(j);
      calls.insert(calls.end(), cs.begin(), cs.end());
      rest.append(text.substr(at, open - at));
      at = close == std::string_view::npos ? text.size() : close + 12;
    }
    if (!calls.empty()) {
      rest.append(text.substr(std::min(at, text.size())));
      content = rest;
    }
    return calls;
  }
  // Mistral
  if (const std::size_t m = text.find("[TOOL_CALLS]"); m != std::string_view::npos) {
    const json j = parse(text.substr(m + 12));
    if (!j.is_discarded()) {
      calls = detail::calls_of(j);
      if (!calls.empty()) content.assign(text.substr(0, m));
    }
    return calls;
  }
  // DeepSeek
  constexpr std::string_view ds_begin = "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>";
  constexpr std::string_view ds_sep = "<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>";
  constexpr std::string_view ds_end = "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>";
  if (text.find(ds_begin) != std::string_view::npos) {
    std::size_t at = 0, first = std::string_view::npos;
    while (true) {
      const std::size_t b = text.find(ds_begin, at);
      if (b == std::string_view::npos) break;
      if (first == std::string_view::npos) first = b;
      const std::size_t sep = text.find(ds_sep, b);
      if (sep == std::string_view::npos) break;
      const std::size_t nl = text.find('\n', sep);
      if (nl == std::string_view::npos) break;
      const std::string name(text.substr(sep + ds_sep.size(), nl - sep - ds_sep.size()));
      const std::size_t e = text.find(ds_end, nl);
      std::string_view args = text.substr(nl + 1, (e == std::string_view::npos ? text.size() : e) - nl - 1);
      // ```json\n{...}\n```
      if (args.starts_with("```json")) args.remove_prefix(7);
      while (!args.empty() && (args.back() == '`' || args.back() == '\n')) args.remove_suffix(1);
      const json a = parse(args);
      if (a.is_discarded()) break;
      calls.push_back({name, a.dump()});
      at = e == std::string_view::npos ? text.size() : e + ds_end.size();
    }
    if (!calls.empty()) content.assign(text.substr(0, first));
    return calls;
  }
  // Llama 3.1: the whole text one JSON call
  std::string_view s = text;
  if (s.starts_with("<|python_tag|>")) s.remove_prefix(14);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n')) s.remove_prefix(1);
  if (s.starts_with("{")) {
    const json j = parse(s);
    if (!j.is_discarded()) {
      calls = detail::calls_of(j);
      if (!calls.empty()) content.clear();
    }
  }
  return calls;
}

// The JSON Schema of a required call: {"name": one of the tools', "arguments": its parameters}.
inline json tool_call_schema(const completion_request& r) {
  json any = json::array();
  for (const json& t : r.tools) {
    const json& f = t["function"];
    if (r.tools_choice == tool_choice::named && f["name"] != r.tool_name) continue;
    json s = {{"type", "object"},
              {"properties",
               {{"name", {{"const", f["name"]}}},
                {"arguments", f.contains("parameters") ? f["parameters"] : json::object()}}},
              {"required", {"name", "arguments"}},
              {"additionalProperties", false}};
    any.push_back(std::move(s));
  }
  if (any.size() == 1) return any[0];
  return {{"anyOf", any}};
}

}  // namespace npullm::serve
