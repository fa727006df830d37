// pretokenizer: how a byte-level BPE vocabulary splits text into words before merging, for
// each `tokenizer.ggml.pre` name. Each variant is a sequence of patterns (the regular
// expressions of the model's tokenizer.json, as llama.cpp lists them), written here as
// hand-made matchers over code points, not a regex engine.
//
// Semantics of one pattern over a piece of text: scan left to right; at each position the
// pattern either matches (the alternatives tried in order, each quantifier greedy with the
// backtracking the regex would do) or not; a match becomes a piece and scanning resumes after
// it; the text between matches becomes a piece as well. A sequence applies its patterns one
// after the other, each to every piece the previous ones left, and sees a piece's end as the
// end of the text (so `\s+(?!\S)` and `\s+$` look no further).
//
//   \s        White_Space (unicode.hpp)       \p{L} \p{N} \p{P}  the general categories
//   a byte that is not valid UTF-8 is one code point of class symbol (as U+FFFD would be)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::text {

// The pre-tokenizer families; several `tokenizer.ggml.pre` names share one.
enum class pretokenizer_kind {
  default_bpe,     // "default": llama.cpp's default for BPE vocabularies
  llama3,          // "llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"
  qwen2,           // "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez": llama3 but 1 digit
  gpt2,            // "gpt-2", "mpt", "olmo", "jais", "phi-2", "roberta-bpe", ...
  starcoder,       // "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", ...
  falcon,          // "falcon"
  deepseek_llm,    // "deepseek-llm"
  deepseek_coder,  // "deepseek-coder"
};

struct pretokenizer_info {
  pretokenizer_kind kind = pretokenizer_kind::default_bpe;
  bool ignore_merges = false;  // a word that is a token is that token (llama3)
  bool add_bos = false;        // the family's default for adding BOS
};

// The family of a `tokenizer.ggml.pre` name; an unknown name is `unsupported`, naming it.
inline pretokenizer_info pretokenizer_of(std::string_view pre) {
  using k = pretokenizer_kind;
  const auto any = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), pre) != names.end();
  };
  if (pre.empty() || pre == "default") return {k::default_bpe, false, false};
  if (any({"llama3", "llama-v3", "llama-bpe", "falcon3"})) return {k::llama3, true, true};
  if (any({"dbrx", "smaug-bpe", "chatglm-bpe"})) return {k::llama3, false, false};
  if (any({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})) return {k::qwen2, false, false};
  if (any({"gpt-2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
           "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe"})) {
    return {k::gpt2, false, false};
  }
  if (any({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})) {
    return {k::starcoder, false, false};
  }
  if (pre == "falcon") return {k::falcon, false, false};
  if (pre == "deepseek-llm") return {k::deepseek_llm, false, false};
  if (pre == "deepseek-coder") return {k::deepseek_coder, false, false};
  raise(error_code::unsupported, "pre-tokenizer '", pre,
        "' is not implemented (known: default, llama3 / llama-bpe, qwen2, gpt-2, mpt, olmo, "
        "starcoder, refact, command-r, smollm, falcon, deepseek-llm, deepseek-coder and their "
        "aliases)");
}

namespace detail {

// The text as code points: byte offset of each (and one past the end), classes of each.
struct code_points {
  std::vector<std::uint32_t> cp;
  std::vector<std::uint8_t> cls;
  std::vector<std::size_t> offset;  // cp.size() + 1 entries

  void assign(std::string_view text) {
    cp.clear();
    cls.clear();
    offset.clear();
    for (std::size_t i = 0; i < text.size();) {
      std::uint32_t c = 0;
      const std::size_t n = decode_utf8(text.substr(i), c);
      cp.push_back(c);
      cls.push_back(classes_of(c));
      offset.push_back(i);
      i += n;
    }
    offset.push_back(text.size());
  }
};

// A pattern: the end of its match at pos within [pos, end), or pos when it does not match.
enum class pattern {
  gpt2,           // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
  llama3,         // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                  //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,          // the same with \p{N} for \p{N}{1,3}
  newline,        // [\r\n]
  digit,          // \p{N}
  digits,         // \p{N}+
  ascii_3digits,  // [0-9][0-9][0-9]
  punct_run,      // [\p{P}\$\+<=>\^~\|]+
  punct_run_bq,   // [\p{P}\$\+<=>\^~\|`]+
  ws_letters,     // \s?\p{L}+
  ws_puncts,      // \s?\p{P}+
  ds_letters,     // \s?[A-Za-zµÀ-ÖØ-öø-ƺ...𞤀-𞥃]+ (deepseek-llm's cased letters)
  ds_puncts,      // \s?[!-/:-~！-／：-～‘-‟　-。]+
  trailing_ws,    // \s+$
  cjk,            // [一-龥ࠀ-一가-퟿]+
};

// deepseek-llm's letter class, as inclusive code point ranges.
inline constexpr std::pair<std::uint32_t, std::uint32_t> deepseek_letters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

inline bool in_ranges(std::uint32_t c, const std::pair<std::uint32_t, std::uint32_t>* first,
                      const std::pair<std::uint32_t, std::uint32_t>* last) noexcept {
  for (auto* r = first; r != last; ++r) {
    if (c >= r->first && c <= r->second) return true;
  }
  return false;
}

class pattern_matcher {
 public:
  explicit pattern_matcher(const code_points& t) : t_(t) {}

  // End of the match of p at pos within [pos, end), pos when none.
  [[nodiscard]] std::size_t match(pattern p, std::size_t pos, std::size_t end) const {
    switch (p) {
      case pattern::gpt2: return gpt2(pos, end);
      case pattern::llama3: return llama3(pos, end, 3);
      case pattern::qwen2: return llama3(pos, end, 1);
      case pattern::newline: return is_cr_lf(pos, end) ? pos + 1 : pos;
      case pattern::digit: return has(pos, end, number) ? pos + 1 : pos;
      case pattern::digits:
        return run(pos, end, [&](std::size_t i) { return has(i, end, number); });
      case pattern::ascii_3digits: {
        for (std::size_t i = pos; i < pos + 3; ++i) {
          if (i >= end || t_.cp[i] < '0' || t_.cp[i] > '9') return pos;
        }
        return pos + 3;
      }
      case pattern::punct_run:
        return run(pos, end, [&](std::size_t i) { return punct_or(i, end, "$+<=>^~|"); });
      case pattern::punct_run_bq:
        return run(pos, end, [&](std::size_t i) { return punct_or(i, end, "$+<=>^~|`"); });
      case pattern::ws_letters:
        return ws_then_run(pos, end, [&](std::size_t i) { return has(i, end, letter); });
      case pattern::ws_puncts:
        return ws_then_run(pos, end, [&](std::size_t i) { return has(i, end, punctuation); });
      case pattern::ds_letters:
        return ws_then_run(pos, end, [&](std::size_t i) {
          return i < end &&
                 in_ranges(t_.cp[i], std::begin(deepseek_letters), std::end(deepseek_letters));
        });
      case pattern::ds_puncts:
        return ws_then_run(pos, end, [&](std::size_t i) {
          static constexpr std::pair<std::uint32_t, std::uint32_t> set[] = {
              {0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
              {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
          return i < end && in_ranges(t_.cp[i], std::begin(set), std::end(set));
        });
      case pattern::trailing_ws: {
        const std::size_t e = run(pos, end, [&](std::size_t i) { return has(i, end, whitespace); });
        return (e > pos && e == end) ? end : pos;
      }
      case pattern::cjk:
        return run(pos, end, [&](std::size_t i) {
          static constexpr std::pair<std::uint32_t, std::uint32_t> set[] = {
              {0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};
          return i < end && in_ranges(t_.cp[i], std::begin(set), std::end(set));
        });
    }
    return pos;
  }

 private:
  [[nodiscard]] bool has(std::size_t i, std::size_t end, std::uint8_t cls) const noexcept {
    return i < end && (t_.cls[i] & cls) != 0;
  }
  // [^\s\p{L}\p{N}]
  [[nodiscard]] bool other(std::size_t i, std::size_t end) const noexcept {
    return i < end && (t_.cls[i] & (whitespace | letter | number)) == 0;
  }
  [[nodiscard]] bool is_cr_lf(std::size_t i, std::size_t end) const noexcept {
    return i < end && (t_.cp[i] == '\r' || t_.cp[i] == '\n');
  }
  [[nodiscard]] bool is(std::size_t i, std::size_t end, char c) const noexcept {
    return i < end && t_.cp[i] == static_cast<std::uint32_t>(c);
  }
  [[nodiscard]] bool punct_or(std::size_t i, std::size_t end,
                              std::string_view extra) const noexcept {
    if (i >= end) return false;
    if (t_.cls[i] & punctuation) return true;
    return t_.cp[i] < 128 && extra.find(static_cast<char>(t_.cp[i])) != std::string_view::npos;
  }
  template <class In>
  [[nodiscard]] std::size_t run(std::size_t pos, std::size_t /*end*/, In in) const {
    while (in(pos)) ++pos;
    return pos;
  }
  // \s?X+ : the optional whitespace is taken only when X follows it.
  template <class In>
  [[nodiscard]] std::size_t ws_then_run(std::size_t pos, std::size_t end, In in) const {
    if (has(pos, end, whitespace) && in(pos + 1)) return run(pos + 1, end, in);
    return in(pos) ? run(pos, end, in) : pos;
  }
  // ' ?X+'
  template <class In>
  [[nodiscard]] std::size_t space_then_run(std::size_t pos, std::size_t end, In in) const {
    if (is(pos, end, ' ') && in(pos + 1)) return run(pos + 1, end, in);
    return in(pos) ? run(pos, end, in) : pos;
  }
  // 's|'t|'re|'ve|'m|'ll|'d, ASCII case-insensitively when `fold`.
  [[nodiscard]] std::size_t contraction(std::size_t pos, std::size_t end, bool fold) const {
    if (!is(pos, end, '\'') || pos + 1 >= end) return pos;
    const auto low = [&](std::size_t i) -> std::uint32_t {
      if (i >= end) return 0;
      const std::uint32_t c = t_.cp[i];
      return (fold && c >= 'A' && c <= 'Z') ? c + 32 : c;
    };
    const std::uint32_t a = low(pos + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    const std::uint32_t b = low(pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    return pos;
  }
  [[nodiscard]] std::size_t whitespace_run(std::size_t pos, std::size_t end) const {
    return run(pos, end, [&](std::size_t i) { return has(i, end, whitespace); });
  }

  [[nodiscard]] std::size_t gpt2(std::size_t pos, std::size_t end) const {
    if (std::size_t e = contraction(pos, end, false); e != pos) return e;
    if (std::size_t e =
            space_then_run(pos, end, [&](std::size_t i) { return has(i, end, letter); });
        e != pos)
      return e;
    if (std::size_t e =
            space_then_run(pos, end, [&](std::size_t i) { return has(i, end, number); });
        e != pos)
      return e;
    if (std::size_t e = space_then_run(pos, end, [&](std::size_t i) { return other(i, end); });
        e != pos)
      return e;
    // \s+(?!\S): all of a run that reaches the end, else all but its last (if that leaves any).
    const std::size_t w = whitespace_run(pos, end);
    if (w == end) return w;
    if (w > pos + 1) return w - 1;
    return pos;
  }

  [[nodiscard]] std::size_t llama3(std::size_t pos, std::size_t end, std::size_t max_digits) const {
    if (std::size_t e = contraction(pos, end, true); e != pos) return e;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    const auto is_letter = [&](std::size_t i) { return has(i, end, letter); };
    if (is_letter(pos)) return run(pos, end, is_letter);
    if (!is_cr_lf(pos, end) && !has(pos, end, number) && is_letter(pos + 1))
      return run(pos + 1, end, is_letter);
    // \p{N}{1,max_digits}
    if (has(pos, end, number)) {
      std::size_t e = pos;
      while (e - pos < max_digits && has(e, end, number)) ++e;
      return e;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    {
      std::size_t e = space_then_run(pos, end, [&](std::size_t i) { return other(i, end); });
      if (e != pos) {
        while (is_cr_lf(e, end)) ++e;
        return e;
      }
    }
    const std::size_t w = whitespace_run(pos, end);
    if (w == pos) return pos;
    // \s*[\r\n]+: up to the last \r or \n of the run.
    for (std::size_t i = w; i > pos; --i) {
      if (is_cr_lf(i - 1, end)) return i;
    }
    // \s+(?!\S) then \s+
    if (w == end) return w;
    return w > pos + 1 ? w - 1 : w;
  }

  const code_points& t_;
};

// The patterns of a family, applied in order.
inline std::vector<pattern> patterns_of(pretokenizer_kind kind) {
  using p = pattern;
  switch (kind) {
    case pretokenizer_kind::default_bpe:
      return {p::punct_run, p::gpt2, p::digits, p::ascii_3digits};
    case pretokenizer_kind::llama3: return {p::llama3};
    case pretokenizer_kind::qwen2: return {p::qwen2};
    case pretokenizer_kind::gpt2: return {p::gpt2};
    case pretokenizer_kind::starcoder: return {p::digit, p::gpt2};
    case pretokenizer_kind::falcon: return {p::punct_run_bq, p::gpt2, p::ascii_3digits};
    case pretokenizer_kind::deepseek_llm:
      return {p::newline, p::ds_letters, p::ds_puncts, p::trailing_ws, p::cjk, p::digits};
    case pretokenizer_kind::deepseek_coder:
      return {p::newline, p::ws_letters, p::ws_puncts, p::cjk, p::digit};
  }
  return {};
}

}  // namespace detail

// Splits text into words: byte ranges [first, second) that cover it in order. Reusable
// scratch buffers make repeated calls allocation-free once warm.
class pretokenizer {
 public:
  explicit pretokenizer(pretokenizer_kind kind)
      : kind_(kind), patterns_(detail::patterns_of(kind)) {}

  [[nodiscard]] pretokenizer_kind kind() const noexcept { return kind_; }

  // Words of `text` as byte ranges, appended to `out` after clearing it.
  void split(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out,
             detail::code_points& cps) const {
    out.clear();
    if (text.empty()) return;
    cps.assign(text);
    const detail::pattern_matcher m(cps);
    // Pieces as code point ranges; each pattern refines all of them.
    std::vector<std::pair<std::size_t, std::size_t>> pieces{{0, cps.cp.size()}};
    std::vector<std::pair<std::size_t, std::size_t>> next;
    for (const detail::pattern p : patterns_) {
      next.clear();
      for (const auto& [b, e] : pieces) {
        std::size_t gap = b;  // start of the text not matched yet
        for (std::size_t pos = b; pos < e;) {
          const std::size_t m_end = m.match(p, pos, e);
          if (m_end == pos) {
            ++pos;
            continue;
          }
          if (gap < pos) next.emplace_back(gap, pos);
          next.emplace_back(pos, m_end);
          pos = gap = m_end;
        }
        if (gap < e) next.emplace_back(gap, e);
      }
      pieces.swap(next);
    }
    out.reserve(pieces.size());
    for (const auto& [b, e] : pieces) out.emplace_back(cps.offset[b], cps.offset[e]);
  }

  [[nodiscard]] std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    detail::code_points cps;
    split(text, ranges, cps);
    std::vector<std::string_view> words;
    words.reserve(ranges.size());
    for (const auto& [b, e] : ranges) words.push_back(text.substr(b, e - b));
    return words;
  }

 private:
  pretokenizer_kind kind_;
  std::vector<detail::pattern> patterns_;
};

}  // namespace npullm::text
