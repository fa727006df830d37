// Chat templates: the vocabularies' own Jinja templates rendered by npullm's interpreter and
// compared with Jinja2's renderings (../shared/vectors/chat-templates; Phi-3's real template
// drops system messages), the chat API's messages (null content, tool calls, tool messages),
// tools and variables; the fallback formats for a file without a template (npullm's own
// texts, written from the formats' definitions).
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "npullm/text/chat_template.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using npullm::text::chat_format;
using npullm::text::chat_message;
using npullm::text::chat_options;
using npullm::text::chat_template;
using json = npullm::text::jinja::json;

const fs::path vocab_dir = NPULLM_VOCAB_DIR;
const fs::path vectors = NPULLM_CHAT_TEMPLATES_DIR;

const std::vector<chat_message> conversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};

// conversations.json's multi_turn.
const std::vector<chat_message> multi_turn = {{"system", "Answer in French."},
                                              {"user", "Hi"},
                                              {"assistant", "Bonjour !"},
                                              {"user", "How are you?"}};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

npullm::text::jinja::render_options fixed_date() {
  npullm::text::jinja::render_options o;
  std::tm date{};
  date.tm_year = 2024 - 1900, date.tm_mon = 6, date.tm_mday = 26;
  o.now = date;
  return o;
}

TEST(chat_template, the_vocabularies_templates_are_rendered_as_jinja2_does) {
  const fs::path qwen = vocab_dir / "ggml-vocab-qwen2.gguf";
  const fs::path phi3 = vocab_dir / "ggml-vocab-phi-3.gguf";
  if (!fs::exists(qwen) || !fs::exists(phi3)) GTEST_SKIP() << vocab_dir << " is absent";
  if (!fs::exists(vectors / "expected")) GTEST_SKIP() << vectors << " is absent";
  const auto q = npullm::text::tokenizer::from_gguf(qwen);
  const auto t = chat_template::from_vocabulary(q.vocab());
  EXPECT_TRUE(t.is_jinja());
  EXPECT_EQ(t.name(), "jinja");
  // Qwen2's vocabulary carries the Qwen3 template.
  EXPECT_EQ(t.apply(multi_turn), slurp(vectors / "expected/qwen3/multi_turn.gen.txt"));
  EXPECT_EQ(t.apply(multi_turn, false), slurp(vectors / "expected/qwen3/multi_turn.nogen.txt"));
  // Encoded with parse_special, the markers are Qwen's control tokens.
  const auto ids = q.encode(t.apply(conversation), {.add_special = true, .parse_special = true});
  EXPECT_EQ(ids.front(), *q.find("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *q.find("<|im_end|>")), 4);
  // Phi-3's real template writes BOS and drops the system message (no <|system|>).
  const auto p = chat_template::from_vocabulary(npullm::text::vocabulary::from_gguf(phi3));
  EXPECT_EQ(p.bos_token(), "<s>");
  const std::string text = p.apply(multi_turn);
  EXPECT_EQ(text, slurp(vectors / "expected/phi3/multi_turn.gen.txt"));
  EXPECT_EQ(text.find("<|system|>"), std::string::npos);
  EXPECT_EQ(text.find("Answer in French."), std::string::npos);
  // A vocabulary without a template says so.
  const fs::path gpt2 = vocab_dir / "ggml-vocab-gpt-2.gguf";
  try {
    (void)chat_template::from_vocabulary(npullm::text::vocabulary::from_gguf(gpt2));
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos);
  }
}

TEST(chat_template, tool_calls_tool_messages_tools_and_variables) {
  if (!fs::exists(vectors / "expected")) GTEST_SKIP() << vectors << " is absent";
  const json convs = json::parse(slurp(vectors / "conversations.json"));
  const auto qwen3 =
      chat_template::from_jinja(slurp(vectors / "templates/qwen3.jinja"), "", "<|im_end|>");
  // The tool conversation as chat_message values: an assistant turn with empty content and a
  // tool call, a tool message, the tool list.
  const json& tc = convs["tools_empty_content"];
  std::vector<chat_message> messages;
  for (const auto& m : tc["messages"]) {
    chat_message cm{m["role"].get<std::string>(), m["content"].get<std::string>()};
    if (m.contains("tool_calls")) cm.tool_calls = m["tool_calls"];
    messages.push_back(std::move(cm));
  }
  EXPECT_EQ(qwen3.apply(messages, chat_options{.tools = tc["tools"]}),
            slurp(vectors / "expected/qwen3/tools_empty_content.gen.txt"));
  // Null content: Qwen3's template fails as Jinja2 does ('</think>' in None).
  messages[2].content.reset();
  try {
    (void)qwen3.apply(messages, chat_options{.tools = tc["tools"]});
    FAIL() << "null content rendered";
  } catch (const npullm::error& e) {
    EXPECT_NE(std::string(e.what()).find("argument of type 'NoneType' is not iterable"),
              std::string::npos)
        << e.what();
  }
  // Extra variables: enable_thinking false, from JSON messages.
  const json& off = convs["thinking_off"];
  EXPECT_EQ(qwen3.apply_json(off["messages"], chat_options{.variables = off["variables"]}),
            slurp(vectors / "expected/qwen3/thinking_off.gen.txt"));
  // Gemma 3's own error for two user turns in a row.
  const auto gemma = chat_template::from_jinja(slurp(vectors / "templates/gemma3.jinja"), "<bos>",
                                               "<end_of_turn>");
  try {
    (void)gemma.apply_json(convs["two_users"]["messages"], chat_options{.render = fixed_date()});
    FAIL() << "two user turns rendered";
  } catch (const npullm::error& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos);
  }
  EXPECT_EQ(gemma.apply_json(convs["multi_turn"]["messages"], {}),
            slurp(vectors / "expected/gemma3/multi_turn.gen.txt"));
}

// The fallback formats (for a file without a template): npullm's texts, not a model's template.
TEST(chat_template, fallback_formats_applied_to_a_conversation) {
  EXPECT_EQ(chat_template(chat_format::chatml).apply(conversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat_template(chat_format::chatml)
                .apply(conversation, false)
                .find("<|im_start|>assistant\n", 100),
            std::string::npos);
  EXPECT_EQ(chat_template(chat_format::llama3).apply(conversation),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(chat_template(chat_format::llama2_sys).apply(conversation),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
  EXPECT_EQ(chat_template(chat_format::llama2).apply(conversation),
            "[INST] Be brief.\n\nHi [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
  EXPECT_EQ(chat_template(chat_format::mistral_v1).apply(conversation),
            " [INST] Be brief.\n\nHi [/INST] Hello.</s> [INST] 2+2? [/INST]");
  EXPECT_EQ(chat_template(chat_format::mistral_v3).apply(conversation),
            "[INST]Be brief.\n\nHi[/INST] Hello.</s>[INST]2+2?[/INST]");
  EXPECT_EQ(chat_template(chat_format::mistral_v7).apply(conversation),
            "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST] Hello.</s>[INST]2+2?[/INST]");
  EXPECT_EQ(chat_template(chat_format::gemma).apply(conversation),
            "<start_of_turn>user\nBe "
            "brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(chat_template(chat_format::phi3).apply(conversation),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
  EXPECT_EQ(chat_template::named("gemma").format(), chat_format::gemma);
  EXPECT_EQ(chat_template(chat_format::mistral_v3).name(), "mistral-v3");
  EXPECT_THROW((void)chat_template::named("vicuna"), npullm::error);
  const std::vector<chat_message> odd = {{"tool", "x"}};
  EXPECT_THROW((void)chat_template(chat_format::gemma).apply(odd), npullm::error);
  EXPECT_NO_THROW((void)chat_template(chat_format::chatml).apply(odd));
  EXPECT_FALSE(chat_template(chat_format::chatml).is_jinja());
  // Tools need a template.
  EXPECT_THROW((void)chat_template(chat_format::chatml)
                   .apply(conversation, chat_options{.tools = json::array()}),
               npullm::error);
}

}  // namespace
