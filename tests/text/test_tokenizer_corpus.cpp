// Replays the fuzz corpus (tests/text/corpus_tokenizer) through fuzz_tokenizer.cpp's checks,
// so those inputs run in CI without libFuzzer; skipped, saying so, without ../shared/vocab.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define NPULLM_TOKENIZER_FUZZ_NO_ENTRY
#include "text/fuzz_tokenizer.cpp"

namespace {

TEST(tokenizer_fuzz, corpus_replays) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(NPULLM_VOCAB_DIR) / "ggml-vocab-qwen2.gguf")) {
    GTEST_SKIP() << NPULLM_VOCAB_DIR << " is absent: the corpus needs its vocabularies";
  }
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_TOKENIZER_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(npullm_fuzz_tokenizer::run_one(bytes)) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 20u);
}

// The checks catch a wrong result: a real encoding and its decodes by Qwen2's vocabulary
// (byte-level BPE, whose round trip is promised), then the same with a decode that dropped a
// byte, an encoding that dropped its last token, an id outside the vocabulary and a decode
// the streaming detokenizer does not give.
TEST(tokenizer_fuzz, checks_catch_a_broken_round_trip) {
  namespace fz = npullm_fuzz_tokenizer;
  const npullm::text::tokenizer* tok = fz::vocabulary(0);
  if (tok == nullptr) GTEST_SKIP() << NPULLM_VOCAB_DIR << " is absent: the check needs Qwen2's";
  const std::string text = "Hello, world: caf\xc3\xa9 \xe2\x82\xac 42.";
  const auto ids = tok->encode(text, {.add_special = false});
  const std::string plain = tok->decode(ids);
  const std::string rendered = tok->decode(ids, {.render_special = true});
  ASSERT_EQ(rendered, text);
  EXPECT_NO_THROW(fz::check_encoding(*tok, 0, text, false, ids, plain, rendered));

  EXPECT_THROW(
      fz::check_encoding(*tok, 0, text, false, ids, plain, rendered.substr(0, rendered.size() - 1)),
      fz::violation);
  std::vector<std::int32_t> fewer = ids;
  fewer.pop_back();
  EXPECT_THROW(fz::check_encoding(*tok, 0, text, false, fewer, tok->decode(fewer),
                                  tok->decode(fewer, {.render_special = true})),
               fz::violation);
  std::vector<std::int32_t> outside = ids;
  outside.push_back(static_cast<std::int32_t>(tok->size()));
  EXPECT_THROW(fz::check_encoding(*tok, 0, text, false, outside, plain, rendered), fz::violation);
  EXPECT_THROW(fz::check_encoding(*tok, 0, text, false, ids, plain + "x", rendered), fz::violation);
}

}  // namespace
