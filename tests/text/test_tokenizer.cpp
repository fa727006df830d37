// The tokenizer against llama.cpp's test vectors (../shared/vocab: vocabulary-only GGUF files
// with .inp / .out pairs), round trips, special tokens and the streaming detokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "npullm/text/detokenizer.hpp"
#include "npullm/text/tokenizer.hpp"
#include "npullm/text/unicode.hpp"

namespace {

namespace fs = std::filesystem;
using npullm::text::tokenizer;

const fs::path vocab_dir = NPULLM_VOCAB_DIR;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct vector_case {
  std::string text;
  std::vector<std::int32_t> ids;
};

// .inp: strings separated by "\n__ggml_vocab_test__\n"; .out: one line of ids per string.
std::vector<vector_case> read_vectors(const fs::path& gguf) {
  const std::string inp = read_all(gguf.string() + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (std::size_t pos = 0; pos < inp.size();) {
    const std::size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(gguf.string() + ".out");
  std::vector<vector_case> cases;
  std::string line;
  for (std::size_t i = 0; std::getline(out, line); ++i) {
    vector_case c;
    c.text = i < texts.size() ? texts[i] : std::string();
    std::istringstream ls(line);
    for (std::int32_t id = 0; ls >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << gguf;
  return cases;
}

class vocab_vectors : public ::testing::TestWithParam<std::string> {};

TEST_P(vocab_vectors, every_id_of_every_line_matches) {
  const fs::path file = vocab_dir / ("ggml-vocab-" + GetParam() + ".gguf");
  if (!fs::exists(file)) GTEST_SKIP() << file << " is absent (../shared/vocab beside the checkout)";
  const auto tok = tokenizer::from_gguf(file);
  const auto cases = read_vectors(file);
  ASSERT_FALSE(cases.empty());
  std::size_t matched = 0;
  for (const auto& c : cases) {
    const auto ids = tok.encode(c.text, {.add_special = false, .parse_special = false});
    if (ids == c.ids) {
      ++matched;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << c.text << "'\n expected "
                    << ::testing::PrintToString(c.ids) << "\n      got "
                    << ::testing::PrintToString(ids);
    }
    // Round trip: byte-level BPE gives any text back; SentencePiece all but a literal "▁".
    const bool promised = tok.vocab().model == npullm::text::tokenizer_model::bpe ||
                          c.text.find("\xe2\x96\x81") == std::string::npos;
    if (promised) {
      EXPECT_EQ(tok.decode(ids), c.text) << GetParam();
    }
  }
  std::printf("[ vectors  ] %-15s %zu / %zu lines match\n", GetParam().c_str(), matched,
              cases.size());
}

INSTANTIATE_TEST_SUITE_P(vocab, vocab_vectors,
                         ::testing::Values("llama-spm", "phi-3", "qwen2", "llama-bpe", "gpt-2",
                                           "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                                           "starcoder", "refact"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = (c == '-') ? '_' : c;
                           return s;
                         });

}  // namespace

namespace {

std::optional<tokenizer> load(const std::string& name) {
  const fs::path file = vocab_dir / ("ggml-vocab-" + name + ".gguf");
  if (!fs::exists(file)) return std::nullopt;
  return tokenizer::from_gguf(file);
}
#define NPULLM_LOAD_OR_SKIP(var, name)                                                            \
  const auto var##_opt = load(name);                                                              \
  if (!var##_opt) GTEST_SKIP() << "ggml-vocab-" << (name) << ".gguf is absent (../shared/vocab)"; \
  const tokenizer& var = *var##_opt

TEST(tokenizer, special_tokens_are_parsed_only_when_asked) {
  NPULLM_LOAD_OR_SKIP(tok, "qwen2");
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto start = tok.find("<|im_start|>");
  const auto end = tok.find("<|im_end|>");
  ASSERT_TRUE(start && end);
  const auto parsed = tok.encode(text, {.add_special = true, .parse_special = true});
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), *start);
  EXPECT_EQ(parsed.back(), *end);
  // Without parsing, the markers are plain text: neither id appears.
  const auto plain = tok.encode(text, {.add_special = true, .parse_special = false});
  EXPECT_EQ(std::count(plain.begin(), plain.end(), *start), 0);
  EXPECT_GT(plain.size(), parsed.size());
  // Both decode back to the text when the specials are rendered.
  EXPECT_EQ(tok.decode(parsed, {.render_special = true}), text);
  EXPECT_EQ(tok.decode(parsed), "user\nhi");
  EXPECT_EQ(tok.decode(plain), text);
  // qwen2 adds no BOS; its EOS is <|im_end|>, which ends a generation.
  EXPECT_FALSE(tok.vocab().add_bos);
  EXPECT_TRUE(tok.vocab().is_eog(*end));
}

TEST(tokenizer, sentencepiece_bos_and_space_prefix) {
  NPULLM_LOAD_OR_SKIP(tok, "llama-spm");
  const auto ids = tok.encode("Hello world");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 1);  // <s>
  EXPECT_EQ(tok.vocab().tokens[static_cast<std::size_t>(ids[1])].text, "\xe2\x96\x81Hello");
  EXPECT_EQ(tok.decode(ids), "Hello world");
  EXPECT_EQ(tok.decode(ids, {.render_special = true}), "<s>Hello world");
  // After a parsed special token the encoder adds the space prefix again; decode removes it.
  const auto two = tok.encode("a</s>b", {.add_special = false, .parse_special = true});
  EXPECT_EQ(std::count(two.begin(), two.end(), 2), 1);
  EXPECT_EQ(tok.decode(two, {.render_special = true}), "a</s>b");
  // Byte fallback: a character with no token becomes its UTF-8 bytes' <0xXX> tokens.
  const auto rare = tok.encode("\xf0\x9f\xa6\x99", {.add_special = false});  // U+1F999
  ASSERT_EQ(rare.size(), 5u);                                                // "▁" + 4 bytes
  EXPECT_EQ(tok.vocab().tokens[static_cast<std::size_t>(rare[1])].type,
            npullm::text::token_type::byte);
  EXPECT_EQ(tok.decode(rare), "\xf0\x9f\xa6\x99");
}

TEST(tokenizer, phi3_special_tokens_strip_the_whitespace_after_them) {
  NPULLM_LOAD_OR_SKIP(tok, "phi-3");
  const auto user = tok.find("<|user|>");
  ASSERT_TRUE(user);
  const auto a = tok.encode("<|user|>\n  Hi", {.add_special = false, .parse_special = true});
  const auto b = tok.encode("<|user|>Hi", {.add_special = false, .parse_special = true});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front(), *user);
}

TEST(tokenizer, invalid_utf8_round_trips_through_byte_level_bpe) {
  NPULLM_LOAD_OR_SKIP(tok, "gpt-2");
  const std::string bytes = std::string("ab\xff\xc3(\x80 z\xe2\x82", 10);
  const auto ids = tok.encode(bytes);
  EXPECT_EQ(tok.decode(ids), bytes);
}

TEST(tokenizer, ids_outside_the_vocabulary_are_refused) {
  NPULLM_LOAD_OR_SKIP(tok, "gpt-2");
  const std::vector<std::int32_t> bad = {1, 50257};
  try {
    (void)tok.decode(bad);
    FAIL() << "decode accepted id 50257";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::out_of_range);
  }
  EXPECT_THROW((void)tok.piece(-1), npullm::error);
}

TEST(tokenizer, streaming_never_splits_a_character) {
  NPULLM_LOAD_OR_SKIP(tok, "llama-bpe");
  // Emoji and CJK split into partial-byte tokens by byte-level BPE.
  const std::string text =
      "Hi \xf0\x9f\xa6\x99\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f "
      "\xe6\x88\x91\xe6\x83\xb3 ok";
  const auto ids = tok.encode(text, {.add_special = false});
  npullm::text::streaming_detokenizer stream(tok);
  std::string all;
  bool held_back = false;
  for (const std::int32_t id : ids) {
    const std::string part = stream.push(id);
    EXPECT_TRUE(npullm::text::valid_utf8(part)) << "token " << id;
    held_back = held_back || stream.pending_bytes() > 0;
    all += part;
  }
  all += stream.flush();
  EXPECT_TRUE(held_back);  // the text does split characters across tokens
  EXPECT_EQ(all, text);
}

TEST(tokenizer, streaming_sentencepiece_strips_the_prefix_space_once) {
  NPULLM_LOAD_OR_SKIP(tok, "llama-spm");
  const auto ids = tok.encode("Hello big world \xf0\x9f\xa6\x99");
  npullm::text::streaming_detokenizer stream(tok);
  std::string all;
  for (const std::int32_t id : ids) all += stream.push(id);
  EXPECT_EQ(all + stream.flush(), "Hello big world \xf0\x9f\xa6\x99");
}

TEST(tokenizer, unknown_models_and_pretokenizers_name_what_was_found) {
  try {
    (void)npullm::text::pretokenizer_of("klingon-bpe");
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("klingon-bpe"), std::string::npos);
  }
  const fs::path bert = vocab_dir / "ggml-vocab-bert-bge.gguf";
  if (!fs::exists(bert)) GTEST_SKIP() << bert << " is absent";
  try {
    (void)tokenizer::from_gguf(bert);
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("'bert'"), std::string::npos);
  }
}

TEST(unicode, utf8_decoding_and_complete_prefixes) {
  using npullm::text::complete_utf8_prefix;
  using npullm::text::decode_utf8;
  std::uint32_t cp = 0;
  EXPECT_EQ(decode_utf8("\xe2\x96\x81", cp), 3u);
  EXPECT_EQ(cp, 0x2581u);
  EXPECT_EQ(decode_utf8("\xc0\x80", cp), 1u);  // overlong
  EXPECT_EQ(cp, npullm::text::invalid_code_point);
  EXPECT_EQ(decode_utf8("\xed\xa0\x80", cp), 1u);      // surrogate
  EXPECT_EQ(decode_utf8("\xf4\x90\x80\x80", cp), 1u);  // past U+10FFFF
  EXPECT_EQ(complete_utf8_prefix("ab\xe2\x96"), 2u);   // unfinished: held back
  EXPECT_EQ(complete_utf8_prefix("ab\xf0"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xe2\x96\x81"), 5u);  // complete
  EXPECT_EQ(complete_utf8_prefix("ab\xed\xa0"), 4u);      // a surrogate never completes
  EXPECT_EQ(complete_utf8_prefix("ab\xc1"), 3u);          // overlong lead
  EXPECT_EQ(complete_utf8_prefix("\x80\x80"), 2u);        // stray continuations
  EXPECT_EQ(npullm::text::classes_of('a'), npullm::text::letter);
  EXPECT_EQ(npullm::text::classes_of(0x3000), npullm::text::separator | npullm::text::whitespace);
  EXPECT_EQ(npullm::text::classes_of(0x0663), npullm::text::number);  // Arabic-Indic three
  EXPECT_EQ(npullm::text::classes_of(0x1F999), npullm::text::symbol);
}

}  // namespace
