// Chat templates: recognized from the vocabularies' own templates and from each format's
// markers, applied to a conversation (expected texts written from the formats' definitions),
// an unknown template refused with what was found.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "npullm/text/chat_template.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using npullm::text::chat_format;
using npullm::text::chat_message;
using npullm::text::chat_template;

const fs::path vocab_dir = NPULLM_VOCAB_DIR;

const std::vector<chat_message> conversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};

TEST(chat_template, the_vocabularies_templates_are_recognized) {
  const fs::path qwen = vocab_dir / "ggml-vocab-qwen2.gguf";
  const fs::path llama3 = vocab_dir / "ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(qwen) || !fs::exists(llama3)) GTEST_SKIP() << "../shared/vocab is absent";
  const auto q = npullm::text::tokenizer::from_gguf(qwen);
  const auto t = chat_template::from_vocabulary(q.vocab());
  EXPECT_EQ(t.format(), chat_format::chatml);
  // Encoded with parse_special, the markers are Qwen's control tokens.
  const auto ids = q.encode(t.apply(conversation), {.add_special = true, .parse_special = true});
  EXPECT_EQ(ids.front(), *q.find("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *q.find("<|im_end|>")), 4);
  const auto l = npullm::text::vocabulary::from_gguf(llama3);
  EXPECT_EQ(chat_template::from_vocabulary(l).format(), chat_format::llama3);
  // A vocabulary without a template says so.
  const fs::path gpt2 = vocab_dir / "ggml-vocab-gpt-2.gguf";
  try {
    (void)chat_template::from_vocabulary(npullm::text::vocabulary::from_gguf(gpt2));
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos);
  }
}

TEST(chat_template, formats_by_their_markers) {
  const auto is = [](std::string_view jinja, chat_format f) {
    EXPECT_EQ(chat_template::detect(jinja).format(), f) << jinja;
  };
  is("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n'}}", chat_format::chatml);
  is("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}",
     chat_format::llama3);
  is("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}", chat_format::llama2);
  is("{{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}", chat_format::llama2_sys);
  is("{{ ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
     chat_format::mistral_v1);
  is("{{ '[AVAILABLE_TOOLS]' }}{{ '[INST]' + message['content'] + '[/INST]' }}",
     chat_format::mistral_v3);
  is("{{ '[SYSTEM_PROMPT]' + system + '[/SYSTEM_PROMPT]' }}{{ '[INST]' }}",
     chat_format::mistral_v7);
  is("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
     chat_format::gemma);
  is("{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + "
     "'<|end|>\\n'}}{{'<|assistant|>\\n'}}",
     chat_format::phi3);
  try {
    (void)chat_template::detect("{{ 'USER: ' + x + ' ASSISTANT: ' }}");
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("starts '{{ 'USER: '"), std::string::npos) << e.what();
  }
}

TEST(chat_template, applied_to_a_conversation) {
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
}

}  // namespace
