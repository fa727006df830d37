// libFuzzer harness over encode / decode: the first byte of an input picks a vocabulary of
// ../shared/vocab (byte-level BPE: qwen2, deepseek-llm, falcon; SentencePiece: llama-spm,
// phi-3) and the options; the rest is the text. For every input:
//   - encode never throws and gives ids inside the vocabulary, with and without special tokens;
//   - decode(encode(text)) == text where the format promises it (byte-level BPE for text whose
//     every byte has a token that decodes to it, with parse_special and rendered specials too;
//     SentencePiece without "▁" in the text; not Phi-3, whose special tokens eat the whitespace
//     after them);
//   - the text of valid UTF-8 decodes to valid UTF-8;
//   - the streaming detokenizer gives decode's text, in pieces of whole characters when the
//     text is valid UTF-8;
//   - the pre-tokenizer's words cover the text in order.
// Built with clang when available (target fuzz_tokenizer); test_tokenizer replays the corpus
// (tests/text/corpus_tokenizer) through the same checks.
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/text/detokenizer.hpp"
#include "npullm/text/tokenizer.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm_fuzz_tokenizer {

struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what) {
  if (!ok) throw violation(what);
}

inline constexpr std::array<const char*, 5> vocab_names = {"qwen2", "llama-spm", "deepseek-llm",
                                                           "phi-3", "falcon"};

// The tokenizers, loaded once; nullptr where the file is absent.
inline const npullm::text::tokenizer* vocabulary(std::size_t i) {
  static const auto all = [] {
    std::array<std::unique_ptr<npullm::text::tokenizer>, vocab_names.size()> t;
    for (std::size_t k = 0; k < t.size(); ++k) {
      const auto file = std::filesystem::path(NPULLM_VOCAB_DIR) /
                        (std::string("ggml-vocab-") + vocab_names[k] + ".gguf");
      if (std::filesystem::exists(file)) {
        t[k] = std::make_unique<npullm::text::tokenizer>(npullm::text::tokenizer::from_gguf(file));
      }
    }
    return t;
  }();
  return all[i % all.size()].get();
}

// Which bytes encode to tokens that decode to that byte: a vocabulary may have no token for
// a byte (falcon: some control characters) or a user-defined one whose text is the byte's
// character (deepseek-llm: the bytes C0, C1, F5..FF, never in valid UTF-8).
inline std::array<bool, 256> bytes_that_round_trip(const npullm::text::tokenizer& tok) {
  std::array<bool, 256> ok{};
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    ok[static_cast<std::size_t>(b)] = tok.decode(tok.encode(one, {.add_special = false})) == one;
  }
  return ok;
}

// Whether byte b of vocabulary vocab_index (vocabulary(vocab_index) is tok) encodes to tokens
// that decode to it; computed once per vocabulary.
inline bool byte_round_trips(const npullm::text::tokenizer& tok, std::size_t vocab_index,
                             unsigned char b) {
  static std::array<std::optional<std::array<bool, 256>>, vocab_names.size()> byte_ok;
  auto& ok = byte_ok[vocab_index % vocab_names.size()];
  if (!ok) ok = bytes_that_round_trip(tok);
  return (*ok)[b];
}

// The checks on one encoding of text by vocabulary vocab_index (tok): ids, what decode gave
// for them (plain; rendered: with special tokens rendered), where add_special was set. A
// violation is thrown where ids are outside the vocabulary, valid UTF-8 decoded to invalid,
// the round trip was promised and rendered is not text, or the streaming detokenizer's pieces
// split a character or do not make plain.
inline void check_encoding(const npullm::text::tokenizer& tok, std::size_t vocab_index,
                           std::string_view text, bool add_special,
                           const std::vector<std::int32_t>& ids, const std::string& plain,
                           const std::string& rendered) {
  using namespace npullm::text;
  const bool phi3 = vocab_index % vocab_names.size() == 3;
  const bool bpe = tok.vocab().model == tokenizer_model::bpe;
  const bool valid = valid_utf8(text);
  for (const std::int32_t id : ids)
    require(id >= 0 && static_cast<std::size_t>(id) < tok.size(), "id range");
  if (valid) require(valid_utf8(plain) && valid_utf8(rendered), "invalid UTF-8 out of valid UTF-8");
  if (!phi3) {
    if (bpe) {
      bool promised = !add_special || !tok.vocab().add_bos;
      for (const char c : text)
        promised = promised && byte_round_trips(tok, vocab_index, static_cast<unsigned char>(c));
      if (promised) require(rendered == text, "BPE round trip");
    } else if (text.find("\xe2\x96\x81") == std::string_view::npos && !add_special) {
      require(rendered == text, "SentencePiece round trip");
    }
  }
  streaming_detokenizer stream(tok);
  std::string streamed;
  for (const std::int32_t id : ids) {
    const std::string part = stream.push(id);
    if (valid) require(valid_utf8(part), "streamed piece splits a character");
    streamed += part;
  }
  streamed += stream.flush();
  require(streamed == plain, "streaming differs from decode");
}

inline void run_one(std::string_view input) {
  using namespace npullm::text;
  if (input.empty()) return;
  const auto selector = static_cast<unsigned char>(input[0]);
  const std::size_t index = selector % vocab_names.size();
  const tokenizer* tok = vocabulary(index);
  if (tok == nullptr) return;
  const bool add_special = (selector >> 4) & 1;
  const std::string_view text = input.substr(1);
  try {
    for (const bool parse : {false, true}) {
      const auto ids = tok->encode(text, {.add_special = add_special, .parse_special = parse});
      check_encoding(*tok, index, text, add_special, ids, tok->decode(ids),
                     tok->decode(ids, {.render_special = true}));
    }
    if (tok->vocab().model == tokenizer_model::bpe) {
      const pretokenizer pre(tok->vocab().pre_info.kind);
      std::size_t at = 0;
      for (const std::string_view w : pre.split(text)) {
        require(!w.empty() && w.data() == text.data() + at, "words in order");
        at += w.size();
      }
      require(at == text.size(), "words cover the text");
    }
  } catch (const npullm::error& e) {
    throw violation(std::string("npullm::error from valid calls: ") + e.what());
  }
}

}  // namespace npullm_fuzz_tokenizer

#ifndef NPULLM_TOKENIZER_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_tokenizer::run_one({reinterpret_cast<const char*>(data), size});
  } catch (const npullm_fuzz_tokenizer::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
