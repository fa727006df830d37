// unicode: what the tokenizers need to know about text: UTF-8 decoding that never throws (a
// byte that does not start a valid sequence is a code point of its own, `invalid_code_point`,
// so every byte of the input stays accounted for), the Unicode classes of a code point (from
// the generated unicode_tables.hpp), and GPT-2's byte <-> printable-character map that
// byte-level BPE vocabularies are written in.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "npullm/text/unicode_tables.hpp"

namespace npullm::text {

// Unicode classes as bits (a code point has one general-category bit, plus `whitespace` when
// it has the White_Space property). scripts/gen_unicode_tables.py writes the same bits.
enum unicode_class : std::uint8_t {
  letter = 1,        // L*
  number = 2,        // N*
  punctuation = 4,   // P*
  symbol = 8,        // S*
  mark = 16,         // M*
  separator = 32,    // Z*
  control = 64,      // C* (control, format, surrogate, private use, unassigned)
  whitespace = 128,  // White_Space (\s of the pre-tokenizer patterns)
};

// What decode_utf8 returns for a byte that does not start a valid UTF-8 sequence (overlong,
// surrogate, past U+10FFFF, truncated or a stray continuation byte). Outside Unicode; it is
// classed as a symbol, as U+FFFD (what other tokenizers substitute) is.
inline constexpr std::uint32_t invalid_code_point = 0x110000;

// Length of the UTF-8 sequence starting at s[0] (1..4) and its code point in cp; an invalid
// start gives 1 and invalid_code_point. s must not be empty.
inline std::size_t decode_utf8(std::string_view s, std::uint32_t& cp) noexcept {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t n = 0;
  std::uint32_t v = 0;
  std::uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, v = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, v = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, v = b0 & 0x07, min = 0x10000;
  } else {
    cp = invalid_code_point;
    return 1;
  }
  if (s.size() < n) {
    cp = invalid_code_point;
    return 1;
  }
  for (std::size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) {
      cp = invalid_code_point;
      return 1;
    }
    v = (v << 6) | (b & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    cp = invalid_code_point;
    return 1;
  }
  cp = v;
  return n;
}

// Appends cp (< 0x110000) as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Whether s is entirely valid UTF-8.
inline bool valid_utf8(std::string_view s) noexcept {
  std::uint32_t cp = 0;
  for (std::size_t i = 0; i < s.size();) {
    i += decode_utf8(s.substr(i), cp);
    if (cp == invalid_code_point) return false;
  }
  return true;
}

// The length of the longest prefix of s that does not end inside a UTF-8 sequence which more
// bytes could still complete: s.size() minus an unfinished valid start of 1..3 bytes at the
// end. Invalid bytes count as complete (no later byte can mend them).
inline std::size_t complete_utf8_prefix(std::string_view s) noexcept {
  const std::size_t n = s.size();
  // A sequence is at most 4 bytes: only the last 3 can be an unfinished one.
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t need = (b & 0xE0) == 0xC0   ? 2
                             : (b & 0xF0) == 0xE0 ? 3
                             : (b & 0xF8) == 0xF0 ? 4
                                                  : 1;
    if (need <= back) return n;  // complete, ASCII or an invalid byte
    // Unfinished if some completion is valid: the completions' code points form one aligned
    // interval, valid or not at an end, so trying the smallest and the largest settles it.
    for (const char fill : {'\x80', '\xBF'}) {
      std::array<char, 4> seq{};
      std::copy(s.end() - static_cast<std::ptrdiff_t>(back), s.end(), seq.begin());
      std::fill(seq.begin() + static_cast<std::ptrdiff_t>(back),
                seq.begin() + static_cast<std::ptrdiff_t>(need), fill);
      std::uint32_t cp = 0;
      if (decode_utf8(std::string_view(seq.data(), need), cp) == need) return n - back;
    }
    return n;
  }
  return n;
}

// The classes of a code point (bits of unicode_class); invalid_code_point is a symbol.
inline std::uint8_t classes_of(std::uint32_t cp) noexcept {
  // ASCII directly, everything else by binary search over the ranges.
  static constexpr auto ascii = [] {
    std::array<std::uint8_t, 128> t{};
    for (std::uint32_t c = 0; c < 128; ++c) {
      auto it = std::upper_bound(detail::unicode_ranges.begin(), detail::unicode_ranges.end(),
                                 (c << 8) | 0xFF);
      t[c] = static_cast<std::uint8_t>(*(it - 1) & 0xFF);
    }
    return t;
  }();
  if (cp < 128) return ascii[cp];
  if (cp > 0x10FFFF) return symbol;
  const auto it = std::upper_bound(detail::unicode_ranges.begin(), detail::unicode_ranges.end(),
                                   (cp << 8) | 0xFF);
  return static_cast<std::uint8_t>(*(it - 1) & 0xFF);
}

// GPT-2's byte-level alphabet: byte b is written as the code point byte_to_code_point()[b]
// (printable bytes as themselves, the others moved to U+0100 and up), so that every token of
// a byte-level BPE vocabulary is printable text.
inline const std::array<std::uint32_t, 256>& byte_to_code_point() noexcept {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

// The byte a code point of that alphabet stands for, or -1 if it is not in the alphabet.
inline int code_point_to_byte(std::uint32_t cp) noexcept {
  static const std::array<std::int16_t, 324> table = [] {
    std::array<std::int16_t, 324> t{};
    t.fill(-1);
    const auto& fwd = byte_to_code_point();
    for (int b = 0; b < 256; ++b)
      t[fwd[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

}  // namespace npullm::text
