// Replays the fuzz corpus (tests/text/corpus_tokenizer) through fuzz_tokenizer.cpp's checks,
// so those inputs run in CI without libFuzzer; skipped, saying so, without ../shared/vocab.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

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

// The checks can fail: a tokenizer whose decode dropped a byte would be caught.
TEST(tokenizer_fuzz, checks_catch_a_broken_round_trip) {
  EXPECT_THROW(npullm_fuzz_tokenizer::require(false, "x"), npullm_fuzz_tokenizer::violation);
}

}  // namespace
