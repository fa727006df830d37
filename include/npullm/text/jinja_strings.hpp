// jinja_strings: the operations on strings of Jinja's str methods and filters, one
// implementation of each that both call: s.upper() and s|upper, s.title() and s|title (each
// with its own word rule), s.capitalize() and s|capitalize, s.replace() and s|replace,
// s.strip() and s|trim, str.join and s|join, and those only one of them has (split / rsplit,
// find, count, isdigit / isspace / isalpha / isalnum, escape, indent, reverse, wordcount, the
// tests lower / upper). UTF-8 text by code points where Python counts them; case changes touch
// ASCII letters only; whitespace is Python's str.isspace(). Every string made is within
// render_limits: its size is computed (or checked piece by piece) before it is allocated, so a
// replace or indent bomb is refused, never a std::bad_alloc (text/jinja_budget.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/text/jinja_budget.hpp"
#include "npullm/text/jinja_ops.hpp"
#include "npullm/text/jinja_print.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// The string operations, over the render's budget.
class string_ops : protected render_budget {
 public:
  using render_budget::render_budget;

 protected:
  static bool strip_char(std::uint32_t c, const std::vector<std::uint32_t>* chars) {
    if (chars == nullptr) return detail_eval::is_py_space(c);
    return std::find(chars->begin(), chars->end(), c) != chars->end();
  }

  // s.strip / lstrip / rstrip(chars) on code points.
  static value strip(const value& s, const value* chars, bool left, bool right, int line) {
    std::vector<std::uint32_t> set;
    const std::vector<std::uint32_t>* cs = nullptr;
    if (chars && !chars->is(value_kind::none)) {
      if (!chars->is(value_kind::string))
        fail(line, "strip arg must be None or str, not ", std::string(type_name(*chars)));
      for (std::size_t k = 0, len = 1; k < chars->s.size(); k += len)
        set.push_back(detail_eval::decode(chars->s, k, len));
      cs = &set;
    }
    std::string_view t = s.s;
    std::size_t b = 0, e = t.size();
    if (left) {
      while (b < e) {
        std::size_t len = 1;
        const std::uint32_t c = detail_eval::decode(t, b, len);
        if (!strip_char(c, cs)) break;
        b += len;
      }
    }
    if (right) {
      while (e > b) {
        std::size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(t[k]) & 0xc0) == 0x80) --k;
        std::size_t len = 1;
        const std::uint32_t c = detail_eval::decode(t, k, len);
        if (!strip_char(c, cs)) break;
        e = k;
      }
    }
    return substring(s, b, e - b);
  }

  // max_parts: more parts than this are refused (capacity_exhausted) as they are found, before
  // a list of them is made.
  static std::vector<value> split(const value& s, const value* sep, std::int64_t maxsplit,
                                  bool from_right, int line, std::size_t max_parts = SIZE_MAX) {
    std::vector<value> parts;
    const std::string_view t = s.s;
    const auto count = [&](std::size_t n) {
      if (n > max_parts) {
        fail_limit(line, "split into more than ", std::to_string(max_parts),
                   " parts (render_limits::max_items)");
      }
    };
    if (sep == nullptr || sep->is(value_kind::none)) {
      // Runs of whitespace; no empty parts.
      std::vector<std::pair<std::size_t, std::size_t>> words;  // [begin, end)
      std::size_t k = 0;
      while (k < t.size()) {
        std::size_t len = 1;
        if (detail_eval::is_py_space(detail_eval::decode(t, k, len))) {
          k += len;
          continue;
        }
        const std::size_t b = k;
        while (k < t.size() && !detail_eval::is_py_space(detail_eval::decode(t, k, len))) k += len;
        words.emplace_back(b, k);
        count(words.size());
      }
      if (maxsplit >= 0 && static_cast<std::size_t>(maxsplit) + 1 < words.size()) {
        const auto m = static_cast<std::size_t>(maxsplit);
        if (!from_right) {
          std::size_t e = t.size();
          // The rest after the m-th split, trailing whitespace stripped as Python does.
          while (e > words[m].first &&
                 detail_eval::is_py_space(static_cast<unsigned char>(t[e - 1])))
            --e;
          words[m].second = e;
          words.resize(m + 1);
        } else {
          const std::size_t keep = words.size() - m - 1;
          words[keep].first = words.front().first;
          words.erase(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(keep));
        }
      }
      for (const auto& [b, e] : words) parts.push_back(substring(s, b, e - b));
      return parts;
    }
    if (!sep->is(value_kind::string))
      fail(line, "must be str or None, not ", std::string(type_name(*sep)));
    const std::string_view d = sep->s;
    if (d.empty()) fail(line, "empty separator");
    std::vector<std::size_t> cuts;  // positions of separators used
    if (!from_right) {
      for (std::size_t at = t.find(d); at != std::string_view::npos;
           at = t.find(d, at + d.size())) {
        if (maxsplit >= 0 && cuts.size() == static_cast<std::size_t>(maxsplit)) break;
        cuts.push_back(at);
        count(cuts.size() + 1);
      }
    } else {
      std::size_t end = t.size();
      while (end >= d.size()) {
        if (maxsplit >= 0 && cuts.size() == static_cast<std::size_t>(maxsplit)) break;
        const std::size_t at = t.rfind(d, end - d.size());
        if (at == std::string_view::npos) break;
        cuts.push_back(at);  // from the right: reversed below (not inserted at the front)
        count(cuts.size() + 1);
        end = at;
      }
      std::reverse(cuts.begin(), cuts.end());
    }
    std::size_t b = 0;
    for (const std::size_t at : cuts) {
      parts.push_back(substring(s, b, at - b));
      b = at + d.size();
    }
    parts.push_back(substring(s, b, t.size() - b));
    return parts;
  }

  // size: the result's size when the caller computed it (checked against its limit first),
  // reserved at once.
  static std::string replace_all(std::string_view t, std::string_view from, std::string_view to,
                                 std::int64_t count, std::size_t size = 0) {
    std::string out;
    out.reserve(size);
    if (from.empty()) {
      // Python inserts `to` around every character.
      std::int64_t done = 0;
      std::size_t k = 0;
      while (k <= t.size()) {
        if (count < 0 || done < count) {
          out.append(to);
          ++done;
        }
        if (k == t.size()) break;
        std::size_t len = 1;
        detail_eval::decode(t, k, len);
        out.append(t.substr(k, len));
        k += len;
      }
      return out;
    }
    std::size_t b = 0;
    std::int64_t done = 0;
    for (std::size_t at = t.find(from); at != std::string_view::npos && (count < 0 || done < count);
         at = t.find(from, b)) {
      out.append(t.substr(b, at - b));
      out.append(to);
      b = at + from.size();
      ++done;
    }
    out.append(t.substr(b));
    return out;
  }

  // t.replace(from, to, count): the result's size computed (one pass counting the matches)
  // and checked before it is allocated: s.replace('x', s) on a 10^6-byte s is refused at once.
  value replaced(std::string_view t, std::string_view from, std::string_view to, std::int64_t count,
                 int line) const {
    made(t.size(), line);
    std::size_t matches = 0;
    if (from.empty()) {
      matches = detail_eval::code_points(t) + 1;  // Python inserts `to` around each character
    } else {
      for (std::size_t at = t.find(from); at != std::string_view::npos;
           at = t.find(from, at + from.size()))
        ++matches;
    }
    if (count >= 0) matches = std::min(matches, static_cast<std::size_t>(count));
    const std::size_t kept = t.size() - (from.empty() ? 0 : matches * from.size());
    const std::size_t max = opt_.limits.max_output_bytes;
    if (kept > max || (!to.empty() && matches > (max - kept) / to.size())) {
      fail_limit(line, "replace would make ", std::to_string(kept), " + ", std::to_string(matches),
                 " x ", std::to_string(to.size()), " bytes, which exceeds the limit of ",
                 std::to_string(max), " (render_limits::max_output_bytes)");
    }
    check_size(kept + matches * to.size(), line);
    return value::string(replace_all(t, from, to, count, kept + matches * to.size()));
  }
  // s.upper() / s.lower(), the upper / lower filters and sort's case-insensitive keys: ASCII
  // letters changed, the size checked first.
  value case_changed(const value& s, bool upper, int line) const {
    check_size(s.s.size(), line);
    std::string out(s.s);
    for (char& c : out) c = upper ? detail_eval::ascii_upper(c) : detail_eval::ascii_lower(c);
    return value::string(std::move(out));
  }

  // Where a word starts for title case: Python's str.title() (after anything but a letter) or
  // Jinja's title filter (after whitespace, '-', '(', '{', '[' or '<').
  enum class title_words : std::uint8_t { python, jinja };

  // s.title() and the title filter: each word's first letter upper case, the rest lower case.
  value title_case(const value& s, title_words words, int line) const {
    check_size(s.s.size(), line);
    std::string out(s.s);
    bool start = true;
    for (char& c : out) {
      const bool word_break = words == title_words::python
                                  ? !detail_eval::ascii_alpha(c)
                                  : detail_eval::is_py_space(static_cast<unsigned char>(c)) ||
                                        c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      if (word_break) {
        start = true;
        continue;
      }
      c = start ? detail_eval::ascii_upper(c) : detail_eval::ascii_lower(c);
      start = false;
    }
    return value::string(std::move(out));
  }

  // s.capitalize() and the capitalize filter: the first character upper case, the rest lower.
  value capitalized(const value& s, int line) const {
    check_size(s.s.size(), line);
    std::string out(s.s);
    for (std::size_t k = 0; k < out.size(); ++k)
      out[k] = k == 0 ? detail_eval::ascii_upper(out[k]) : detail_eval::ascii_lower(out[k]);
    return value::string(std::move(out));
  }

  // sep.join(items) (str.join: strings_only, any other item is Python's TypeError) and the join
  // filter (each item as str() prints it): bounded as it is written.
  value joined(std::string_view sep, const std::vector<value>& items, bool strings_only,
               int line) const {
    std::string s;
    bool first = true;
    for (const value& x : items) {
      if (strings_only && !x.is(value_kind::string)) {
        fail(line, "sequence item: expected str instance, ", std::string(type_name(x)), " found");
      }
      room(s, sep.size(), bound(line));
      if (!first) s.append(sep);
      first = false;
      append_str(s, x, bound(line));
    }
    made(s.size(), line);
    return value::string(std::move(s));
  }

  // s.find(sub): the index in code points, or -1.
  std::int64_t find_in(std::string_view t, std::string_view sub, int line) const {
    made(t.size(), line);  // a scan of the text
    const std::size_t at = t.find(sub);
    return at == std::string_view::npos
               ? -1
               : static_cast<std::int64_t>(detail_eval::char_count(t.substr(0, at)));
  }

  // s.count(sub): non-overlapping occurrences; an empty sub is found around each character.
  std::int64_t count_in(std::string_view t, std::string_view sub, int line) const {
    made(t.size(), line);  // a scan of the text
    if (sub.empty()) return static_cast<std::int64_t>(detail_eval::char_count(t) + 1);
    std::int64_t n = 0;
    for (std::size_t at = t.find(sub); at != std::string_view::npos;
         at = t.find(sub, at + sub.size()))
      ++n;
    return n;
  }

  // s.isdigit() / isspace() / isalpha() / isalnum() (ASCII digits and letters, Python's
  // whitespace): true when t is not empty and every byte is of the class.
  enum class char_class : std::uint8_t { digit, space, alpha, alnum };
  bool all_of_class(std::string_view t, char_class k, int line) const {
    made(t.size(), line);  // a scan of the text
    bool r = !t.empty();
    for (const char c : t) {
      const bool digit = c >= '0' && c <= '9';
      const bool ok = k == char_class::digit ? digit
                      : k == char_class::space
                          ? detail_eval::is_py_space(static_cast<unsigned char>(c))
                      : k == char_class::alpha ? detail_eval::ascii_alpha(c)
                                               : detail_eval::ascii_alpha(c) || digit;
      r = r && ok;
    }
    return r;
  }

  // The tests `is lower` / `is upper`: a cased letter, and every ASCII letter of that case.
  static bool cased_as(std::string_view t, bool lower) {
    bool cased = false;
    for (const char c : t) {
      if (!detail_eval::ascii_alpha(c)) continue;
      cased = true;
      if (lower != (c >= 'a' && c <= 'z')) return false;
    }
    return cased;
  }

  // The escape filter: & < > " ' as HTML entities (Markup's escaping), the size counted first.
  value escaped(std::string_view t, int line) const {
    std::size_t n = t.size();  // the size made, counted before it is allocated
    for (const char c : t)
      n += c == '&' || c == '"' || c == '\'' ? 4 : c == '<' || c == '>' ? 3 : 0;
    check_size(n, line);
    std::string s;
    s.reserve(n);
    for (const char c : t) {
      switch (c) {
        case '&': s += "&amp;"; break;
        case '<': s += "&lt;"; break;
        case '>': s += "&gt;"; break;
        case '"': s += "&#34;"; break;
        case '\'': s += "&#39;"; break;
        default: s += c;
      }
    }
    return value::string(std::move(s));
  }

  // The reverse filter on a string: its code points in reverse order.
  value reversed(const value& v, int line) const {
    check_size(v.s.size(), line);
    made(v.s.size() * sizeof(std::size_t), line);
    const auto at = detail_eval::char_starts(v.s);
    std::string s;
    for (std::size_t k = at.size() - 1; k > 0; --k)
      s.append(v.s.substr(at[k - 1], at[k] - at[k - 1]));
    return value::string(std::move(s));
  }

  // The wordcount filter: runs of word characters (ASCII letters, digits, '_', any non-ASCII
  // byte).
  std::int64_t word_count(std::string_view t, int line) const {
    made(t.size(), line);
    std::int64_t n = 0;
    bool in_word = false;
    for (const char c : t) {
      const bool w = detail_eval::ascii_alpha(c) || (c >= '0' && c <= '9') || c == '_' ||
                     (static_cast<unsigned char>(c) & 0x80);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return n;
  }

  // The indent filter: s + "\n" split into lines (Python's splitlines), joined with "\n" and
  // pad before each line but the first (the first too when first; blank lines too when blank).
  value indented(std::string s, std::string_view pad, bool first, bool blank, int line) const {
    s += '\n';
    // The lines, walked twice (no table of them: a string of 16 Mi newlines would make one of
    // 256 MiB): first for the size, checked before anything is allocated, then to write.
    const auto each_line = [&s](auto&& f) {
      std::size_t bgn = 0, k = 0;
      for (; k < s.size(); ++k) {
        const char c = s[k];
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' ||
            c == '\x1e') {
          f(std::string_view(s).substr(bgn, k - bgn), bgn == 0);
          if (c == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          bgn = k + 1;
        }
      }
      if (bgn < s.size()) f(std::string_view(s).substr(bgn), bgn == 0);
    };
    // The size made: each line, a newline between two, the indent before each indented one.
    std::size_t padded = first ? 1 : 0, n = 0;
    each_line([&](std::string_view l, bool at_start) {
      n += l.size() + (at_start ? 0 : 1);
      if (!at_start && (blank || !l.empty())) ++padded;
    });
    if (!pad.empty() &&
        padded > (opt_.limits.max_output_bytes - std::min(n, opt_.limits.max_output_bytes)) /
                     pad.size()) {
      fail_limit(line, "indent would make ", std::to_string(n), " + ", std::to_string(padded),
                 " x ", std::to_string(pad.size()), " bytes, which exceeds the limit of ",
                 std::to_string(opt_.limits.max_output_bytes),
                 " (render_limits::max_output_bytes)");
    }
    check_size(n + padded * pad.size(), line);
    std::string r;
    r.reserve(n + padded * pad.size());
    if (first) r += pad;
    each_line([&](std::string_view l, bool at_start) {
      if (!at_start) {
        r += '\n';
        if (blank || !l.empty()) r += pad;
      }
      r.append(l);
    });
    return value::string(std::move(r));
  }
};

}  // namespace npullm::text::jinja
