// Stop strings on streamed text: where one first occurs, and how much of the text's end a
// stream must hold back because it may be the start of one.
//
// Text grows a token's bytes at a time (detokenized), so a stop string may span tokens:
//   find_stop_string(text, searched, stops)   the earliest occurrence of any stop string that
//                                              ends after byte `searched` (the text's length
//                                              before the last append: earlier bytes were
//                                              searched already), or none
//   stop_string_holdback(text, stops)          the length of the longest end of text that is a
//                                              proper prefix of a stop string: bytes a stream
//                                              must not show yet
//   incomplete_utf8_tail(text)                 the bytes at the end of text that begin a UTF-8
//                                              character not complete yet (0 to 3), which a
//                                              stream holds back too, so that it never splits
//                                              a character (invalid bytes are not held)
// Matching is on bytes (no Unicode normalization); an empty stop string is refused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "npullm/core/error.hpp"

namespace npullm::batch {

struct stop_string_match {
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::size_t position = none;  // the byte where the stop string starts in the text
  std::size_t index = none;     // which stop string (the first listed, at equal positions)
  [[nodiscard]] bool found() const noexcept { return position != none; }
};

// Refuses (invalid_argument) an empty stop string, naming who asks.
inline void check_stop_strings(std::span<const std::string> stops, std::string_view who) {
  for (std::size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty())
      raise(error_code::invalid_argument, who, ": stop string ", i, " is empty");
  }
}

inline stop_string_match find_stop_string(std::string_view text, std::size_t searched,
                                          std::span<const std::string> stops) {
  stop_string_match best;
  searched = std::min(searched, text.size());
  for (std::size_t i = 0; i < stops.size(); ++i) {
    const std::string_view s = stops[i];
    if (s.empty()) continue;
    // An occurrence ending after `searched` starts at searched - |s| + 1 or later.
    const std::size_t from = searched >= s.size() ? searched - s.size() + 1 : 0;
    const std::size_t at = text.find(s, from);
    if (at != std::string_view::npos && at < best.position) best = {at, i};
  }
  return best;
}

inline std::size_t stop_string_holdback(std::string_view text, std::span<const std::string> stops) {
  std::size_t held = 0;
  for (const std::string& s : stops) {
    for (std::size_t k = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); k > held; --k) {
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return held;
}

inline std::size_t incomplete_utf8_tail(std::string_view text) {
  // The last lead byte among the final 3 bytes, and how long its character is.
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t length = (c & 0xE0) == 0xC0   ? 2
                               : (c & 0xF0) == 0xE0 ? 3
                               : (c & 0xF8) == 0xF0 ? 4
                                                    : 1;
    return length > back ? back : 0;
  }
  return 0;
}

}  // namespace npullm::batch
