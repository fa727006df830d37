// jinja_lexer: a Jinja template's source to tokens (text/jinja_parser.hpp parses them).
//
// Lexing follows Jinja2 3.1 with the settings Hugging Face transformers renders chat templates
// with: trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs from the start of a line to a block or comment tag are dropped), whitespace
// control ({%- -%} {{- -}} {#- -#} strip all whitespace on that side; {%+ and +%} keep it),
// newlines normalized to \n, one trailing newline of the source dropped, {% raw %}. Literals:
// names, Python's strings (with their escapes), integers and floats (with '_'), operators. A
// syntax error is corrupt_data naming its line.
#pragma once

#include <array>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::text::jinja::detail_parse {

enum class tok : std::uint8_t {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct token {
  tok type;
  int line;
  std::string text;  // data, name, string value, operator
  std::int64_t i = 0;
  double d = 0;
};

inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

template <class... Parts>
[[noreturn]] void syntax(int line, const Parts&... what) {
  raise(error_code::corrupt_data, "chat template syntax error, line ", line, ": ", what...);
}

// Python's string escapes: \n \t \r \\ \' \" \b \f \v \a \0oo \xHH \uHHHH \UHHHHHHHH; any other
// keeps its backslash (the lexer's string literals).
class lexer {
 public:
  explicit lexer(std::string_view source) {
    // Newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (std::size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<token> run() {
    std::size_t pos = 0;
    std::string pending;  // data since the last tag
    std::size_t pending_start = 0;
    while (pos < src_.size()) {
      const std::size_t open = find_open(pos);
      if (open == std::string::npos) {
        pending.append(src_, pos, std::string::npos);
        pos = src_.size();
        break;
      }
      pending.append(src_, pos, open - pos);
      const char kind = src_[open + 1];  // '{', '%', '#'
      std::size_t p = open + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign) ++p;
      // Whitespace control of the text before the tag.
      if (sign == '-') {
        while (!pending.empty() && is_space(pending.back())) pending.pop_back();
      } else if (sign != '+' && kind != '{') {
        lstrip(pending, pending_start);
      }
      flush(pending, line_at(pending_start));
      const int line = line_at(open);
      if (kind == '#') {
        const std::size_t close = src_.find("#}", p);
        if (close == std::string::npos) syntax(line, "comment not closed ('#}' missing)");
        pos = after_end(close, close + 2, true);
      } else if (kind == '{') {
        tokens_.push_back({tok::var_begin, line, {}});
        pos = inside(p, false);
      } else if (is_raw(p)) {
        pos = raw(p, line);
      } else {
        tokens_.push_back({tok::block_begin, line, {}});
        pos = inside(p, true);
      }
      pending_start = pos;
    }
    flush(pending, line_at(pending_start));
    tokens_.push_back({tok::eof, line_at(src_.size()), {}});
    return std::move(tokens_);
  }

 private:
  std::size_t find_open(std::size_t pos) const {
    for (std::size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    }
    return std::string::npos;
  }

  int line_at(std::size_t pos) {
    // Lines counted incrementally: positions only grow.
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_++] == '\n') ++line_;
    }
    return line_;
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  void lstrip(std::string& text, std::size_t text_start) const {
    std::size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t' || text[k - 1] == '\v' ||
                     text[k - 1] == '\f' || text[k - 1] == '\r')) {
      --k;
    }
    const bool line_start =
        k > 0 ? text[k - 1] == '\n' : (text_start == 0 || src_[text_start - 1] == '\n');
    if (line_start) text.resize(k);
  }

  void flush(std::string& text, int line) {
    if (!text.empty()) tokens_.push_back({tok::data, line, std::move(text)});
    text.clear();
  }

  // The position after a tag's end at [end_at, end_after): '-' before it strips the whitespace
  // after; trim_blocks drops one newline after a block or comment tag unless '+'.
  std::size_t after_end(std::size_t end_at, std::size_t end_after, bool block) const {
    std::size_t pos = end_after;
    const char sign = end_at > 0 ? src_[end_at - 1] : 0;
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (block && sign != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  bool is_raw(std::size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  std::size_t raw(std::size_t p, int line) {
    // Jinja's {% raw %} ends without trim_blocks (only '-%}' strips what follows).
    const std::size_t close = src_.find("%}", p);
    std::size_t pos = close + 2;
    if (src_[close - 1] == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    }
    for (std::size_t k = src_.find("{%", pos); k != std::string::npos; k = src_.find("{%", k + 2)) {
      std::size_t q = k + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos, k - pos);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+') {
        lstrip(text, pos);
      }
      flush(text, line);
      return after_end(q, q + 2, true);
    }
    syntax(line, "{% raw %} without {% endraw %}");
  }

  // Tokens inside a tag, up to and past its end; returns the position after it.
  std::size_t inside(std::size_t pos, bool block) {
    int depth = 0;  // brackets open: a '}}' inside a dict literal does not end the tag
    const int line0 = line_at(pos);
    for (;;) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) syntax(line0, block ? "'%}' missing" : "'}}' missing");
      const int line = line_at(pos);
      const std::string_view rest(src_.data() + pos, src_.size() - pos);
      if (depth == 0) {
        const std::string_view end = block ? "%}" : "}}";
        const std::size_t skip = (rest[0] == '-' || (block && rest[0] == '+')) ? 1 : 0;
        if (rest.substr(skip, 2) == end) {
          tokens_.push_back({block ? tok::block_end : tok::var_end, line, {}});
          return after_end(pos + skip, pos + skip + 2, block);
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({tok::name, line, std::string(rest.substr(0, n))});
        pos += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos += number(rest, line);
      } else if (c == '\'' || c == '"') {
        pos += string(rest, line);
      } else {
        static constexpr std::array<std::string_view, 27> ops = {
            "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
            "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", ";", "!"};
        std::string_view found;
        for (const std::string_view o : ops) {
          if (rest.substr(0, o.size()) == o) {
            found = o;
            break;
          }
        }
        if (found.empty() || found == ";" || found == "!") {
          syntax(line, "unexpected character '", std::string(1, c), "'");
        }
        if (found == "(" || found == "[" || found == "{") ++depth;
        if ((found == ")" || found == "]" || found == "}") && depth > 0) --depth;
        tokens_.push_back({tok::op, line, std::string(found)});
        pos += found.size();
      }
    }
  }

  std::size_t number(std::string_view rest, int line) {
    std::size_t n = 0;
    std::string digits;
    bool is_float = false;
    const auto run = [&] {
      while (n < rest.size() &&
             (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    run();
    if (n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      digits += rest[n++];
      run();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      std::size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        digits += 'e';
        digits.append(rest.substr(n + 1, m - n - 1));
        n = m;
        run();
      }
    }
    token t{is_float ? tok::floating : tok::integer, line, digits};
    if (is_float) {
      t.d = std::strtod(digits.c_str(), nullptr);
    } else {
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
      if (r.ec != std::errc{}) syntax(line, "integer ", digits, " too large");
    }
    tokens_.push_back(std::move(t));
    return n;
  }

  std::size_t string(std::string_view rest, int line) {
    const char q = rest[0];
    std::string out;
    std::size_t n = 1;
    for (;;) {
      if (n >= rest.size()) syntax(line, "string literal not closed");
      const char c = rest[n];
      if (c == q) break;
      if (c != '\\' || n + 1 >= rest.size()) {
        out += c;
        ++n;
        continue;
      }
      const char e = rest[n + 1];
      n += 2;
      const auto hex = [&](std::size_t len) {
        std::uint32_t cp = 0;
        if (n + len > rest.size()) syntax(line, "truncated \\x / \\u escape");
        for (std::size_t k = 0; k < len; ++k) {
          const char h = rest[n + k];
          const int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (v < 0) syntax(line, "bad \\x / \\u escape");
          cp = cp * 16 + static_cast<std::uint32_t>(v);
        }
        n += len;
        if (cp > 0x10ffff) syntax(line, "\\U escape beyond U+10FFFF");
        append_utf8(out, cp);
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\n': break;  // a line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t cp = static_cast<std::uint32_t>(e - '0');
            for (int k = 0; k < 2 && n < rest.size() && rest[n] >= '0' && rest[n] <= '7'; ++k)
              cp = cp * 8 + static_cast<std::uint32_t>(rest[n++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({tok::string, line, std::move(out)});
    return n + 1;
  }

  std::string src_;
  std::vector<token> tokens_;
  std::size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace npullm::text::jinja::detail_parse
