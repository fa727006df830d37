// detokenizer: streaming decode. Tokens come one at a time (generation); the text handed out
// is always whole UTF-8 characters: bytes of a character that later tokens complete are held
// back until they arrive (a byte-level or byte-fallback token may carry part of one).
#pragma once

#include <cstdint>
#include <string>

#include "npullm/text/tokenizer.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::text {

class streaming_detokenizer {
 public:
  explicit streaming_detokenizer(const tokenizer& tok, decode_options opt = {})
      : tok_(&tok), opt_(opt), strip_(tok.strips(opt)) {}

  // The text that `id` completes (possibly empty); an id outside the vocabulary is out_of_range
  // and changes nothing.
  std::string push(std::int32_t id) {
    tok_->check(id);
    tok_->append_piece(pending_, id, opt_, strip_);
    const std::size_t n = complete_utf8_prefix(pending_);
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return out;
  }

  // Bytes held back (an unfinished character at the end of the stream), handed out as they are.
  std::string flush() {
    std::string out;
    out.swap(pending_);
    return out;
  }

  // Back to the start of a new text.
  void reset() {
    pending_.clear();
    strip_ = tok_->strips(opt_);
  }

  [[nodiscard]] std::size_t pending_bytes() const noexcept { return pending_.size(); }

 private:
  const tokenizer* tok_;
  decode_options opt_;
  bool strip_;
  std::string pending_;
};

}  // namespace npullm::text
