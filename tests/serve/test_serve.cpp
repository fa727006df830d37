// npullm_server's request reader and tool-call parser (serve/openai.hpp), without a model:
// OpenAI's fields read with their meanings, wrong types and ranges refused naming the field
// (the error object's param), limits, the tool-call formats of the template families, and the
// fuzz corpus (tests/serve/corpus_request) replayed through fuzz_server_request.cpp's checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "support.hpp"

#define NPULLM_SERVER_FUZZ_NO_ENTRY
#include "serve/fuzz_server_request.cpp"

#include "npullm/serve/openai.hpp"

namespace {

using namespace npullm;
using serve::endpoint;
using serve::parse_completion_request;

serve::api_error refusal(std::string_view body, endpoint kind = endpoint::chat) {
  try {
    (void)parse_completion_request(body, kind);
  } catch (const error& e) {
    return serve::to_api_error(e);
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(ServeRequest, ReadsOpenAIsFields) {
  const auto r = parse_completion_request(R"({
    "model": "x", "messages": [{"role": "system", "content": "s"},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}],
    "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9, "seed": 3,
    "stop": "END", "presence_penalty": 1, "frequency_penalty": -1.5, "logit_bias": {"12": -100},
    "logprobs": true, "top_logprobs": 4, "n": 2, "top_k": 40, "min_p": 0.1, "ignore_eos": true,
    "stream_options": {"include_usage": true}, "some_future_field": {"ignored": true}})",
                                          endpoint::chat);
  EXPECT_EQ(r.model, "x");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1]["content"], "ab");  // text parts joined
  EXPECT_EQ(r.max_tokens, 7u);                // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.seed, 3u);
  ASSERT_EQ(r.stop.size(), 1u);
  EXPECT_EQ(r.stop[0], "END");
  ASSERT_EQ(r.logit_bias.size(), 1u);
  EXPECT_EQ(r.logit_bias[0].token, 12);
  EXPECT_FLOAT_EQ(r.logit_bias[0].bias, -100.0f);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4u);
  EXPECT_EQ(r.n, 2u);
  EXPECT_EQ(r.top_k, 40u);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_TRUE(r.include_usage);
  // Completions: logprobs is the number of alternatives; prompt as token ids.
  const auto c = parse_completion_request(R"({"prompt": [5, 6, 7], "logprobs": 2})",
                                          endpoint::completion);
  EXPECT_EQ(c.prompt_ids, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 2u);
  // Assistant tool-call arguments given as a JSON string reach the template as an object.
  const auto t = parse_completion_request(R"({"messages": [{"role": "assistant", "content": null,
    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]})",
                                          endpoint::chat);
  EXPECT_EQ(t.messages[0]["tool_calls"][0]["function"]["arguments"]["a"], 1);
}

TEST(ServeRequest, WrongTypesAndRangesAreRefusedNamingTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "x"}])";
  struct bad {
    std::string fields, param;
  };
  for (const bad& b : std::vector<bad>{
           {R"("temperature": "hot")", "temperature"},
           {R"("temperature": 2.5)", "temperature"},
           {R"("top_p": 1.5)", "top_p"},
           {R"("max_tokens": 0)", "max_tokens"},
           {R"("max_tokens": 1.5)", "max_tokens"},
           {R"("n": 17)", "n"},
           {R"("stop": [1])", "stop"},
           {R"("stop": "")", "stop"},
           {R"("logit_bias": {"abc": 1})", "logit_bias"},
           {R"("logit_bias": {"1": 101})", "logit_bias"},
           {R"("top_logprobs": 3)", "top_logprobs"},  // without logprobs
           {R"("top_logprobs": 21, "logprobs": true)", "top_logprobs"},
           {R"("stream": "yes")", "stream"},
           {R"("response_format": {"type": "xml"})", "response_format"},
           {R"("tool_choice": "required")", "tool_choice"},  // no tools
           {R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}})", "tool_choice"},
           {R"("grammar": "root ::= \"a\"", "response_format": {"type": "json_object"})", "response_format"},
       }) {
    const auto e = refusal("{" + m + ", " + b.fields + "}");
    EXPECT_EQ(e.status, 400) << b.fields;
    EXPECT_EQ(e.param, b.param) << b.fields << ": " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  EXPECT_EQ(refusal("{").status, 400);
  EXPECT_NE(refusal("{").message.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(refusal(R"({"messages": []})").param, "messages");
  EXPECT_EQ(refusal(R"({"messages": [{"content": "x"}]})").param, "messages");
  EXPECT_EQ(refusal(R"({"prompt": ""})", endpoint::completion).param, "prompt");
  // Nesting past the limit is refused before nlohmann's recursive parser sees it.
  const auto deep = refusal(std::string(100000, '['));
  EXPECT_NE(deep.message.find("nested deeper than 64"), std::string::npos) << deep.message;
  // The error object.
  const auto j = deep.to_json();
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(ServeToolCalls, TheTemplateFamiliesFormats) {
  std::string content;
  auto calls = serve::parse_tool_calls(
      "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
      content);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(serve::json::parse(calls[0].arguments)["city"], "Paris");
  EXPECT_EQ(calls[1].name, "get_time");
  EXPECT_EQ(content, "Let me look.\n");
  calls = serve::parse_tool_calls(R"([TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}])", content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(content, "");
  calls = serve::parse_tool_calls(
      "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"npu\"}}", content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "search");
  EXPECT_EQ(serve::json::parse(calls[0].arguments)["q"], "npu");
  calls = serve::parse_tool_calls(
      "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C><\xEF\xBD\x9Ctool"
      "\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>function<\xEF\xBD\x9Ctool\xE2\x96\x81"
      "sep\xEF\xBD\x9C>lookup\n```json\n{\"id\": 7}\n```<\xEF\xBD\x9Ctool\xE2\x96\x81" "call"
      "\xE2\x96\x81" "end\xEF\xBD\x9C>",
      content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "lookup");
  EXPECT_EQ(serve::json::parse(calls[0].arguments)["id"], 7);
  // Plain text: no calls, the content unchanged; a broken call: none either.
  EXPECT_TRUE(serve::parse_tool_calls("Just text {not json", content).empty());
  EXPECT_EQ(content, "Just text {not json");
  EXPECT_TRUE(serve::parse_tool_calls("<tool_call>{broken", content).empty());
}

TEST(ServeToolCalls, TheRequiredCallSchema) {
  const auto r = parse_completion_request(R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "b"}}], "tool_choice": "required"})",
                                          endpoint::chat);
  const auto s = serve::tool_call_schema(r);
  ASSERT_TRUE(s.contains("anyOf"));
  EXPECT_EQ(s["anyOf"].size(), 2u);
  EXPECT_EQ(s["anyOf"][0]["properties"]["name"]["const"], "a");
}

// The fuzz corpus through fuzz_server_request.cpp's checks; and the checks catch a request
// past its limits (a violation the harness must see).
TEST(ServeRequestFuzz, CorpusReplays) {
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(NPULLM_SERVE_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(npullm_fuzz_server_request::run_one(bytes)) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 15u);
  // A parser that let n = 17 through would be caught: the harness checks n against its limit.
  serve::request_limits loose;
  loose.max_n = 100;
  const auto r = parse_completion_request(R"({"messages": [{"role": "user", "content": "x"}],
                                              "n": 17})", endpoint::chat, loose);
  EXPECT_THROW(npullm_fuzz_server_request::require(r.n <= serve::request_limits{}.max_n, "n"),
               npullm_fuzz_server_request::violation);
}

}  // namespace
