// jinja_print: what Python prints for a Jinja value (text/jinja_value.hpp): str() (what
// {{ v }} writes), repr() (inside lists and dicts), floats as Python's repr, and tojson as
// Python's json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...) writes
// it. Every print is bounded by a text_bound (render_limits::max_output_bytes), checked before
// each piece is appended, and by max_print_depth levels of nesting.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// How much text may be made while printing a value (str(), repr(), tojson): past max bytes
// the print is refused (capacity_exhausted, naming line and the limit) before the piece that
// would cross it is appended, so printing a list of a million 16 MiB strings allocates at most
// max (plus a few bytes of punctuation), not the terabytes it would take. Printing recurses
// once a level of nesting: the caller's JSON (not bounded by max_nesting) nested deeper than
// max_print_depth is refused likewise.
struct text_bound {
  std::size_t max = SIZE_MAX;
  int line = 0;
};

// Room for n more bytes after out's: refused before the append when it would pass b.max.
inline void room(const std::string& out, std::size_t n, const text_bound& b) {
  if (n > b.max || out.size() > b.max - n) {
    raise(error_code::capacity_exhausted, "chat template line ", b.line, ": text of ", out.size(),
          " + ", n, " bytes exceeds the limit of ", b.max,
          " bytes (render_limits::max_output_bytes)");
  }
}

inline void print_depth(int depth, const text_bound& b) {
  if (depth > max_print_depth) {
    raise(error_code::capacity_exhausted, "chat template line ", b.line,
          ": a value nested deeper than ", max_print_depth, " levels cannot be printed");
  }
}

// Python's repr() of a float: the shortest digits that read back, exponent form below 1e-4
// and from 1e16 ("1e-05", "1e+16", "0.1", "100.0", "inf", "nan").
inline void append_float(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "nan";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(r.ptr - buf));  // -d.ddde[+-]XX
  const std::size_t e = sci.find('e');
  std::string_view mant = sci.substr(0, e);
  int exp = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exp);
  std::string digits;
  if (!mant.empty() && mant[0] == '-') {
    out += '-';
    mant.remove_prefix(1);
  }
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int n = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  } else if (exp < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exp - 1), '0');
    out += digits;
  } else if (exp + 1 >= n) {
    out += digits;
    out.append(static_cast<std::size_t>(exp + 1 - n), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<std::size_t>(exp + 1));
    out += '.';
    out.append(digits, static_cast<std::size_t>(exp + 1));
  }
}

void append_repr(std::string& out, const value& v, const text_bound& b = {}, int depth = 0);

// Python's repr() of a str: single quotes unless the text has ' and no ".
inline void append_string_repr(std::string& out, std::string_view s, const text_bound& b = {}) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  room(out, s.size() + 2, b);  // at least this; escapes add more, checked every 4 KiB
  out += q;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if ((k & 4095) == 0) room(out, std::min<std::size_t>(s.size() - k, 4096), b);
    const char c = s[k];
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  out += q;
}

// str(v) appended: what {{ v }} prints. Undefined prints nothing.
inline void append_str(std::string& out, const value& v, const text_bound& b = {}) {
  switch (v.kind) {
    case value_kind::undefined: return;
    case value_kind::none: out += "None"; return;
    case value_kind::boolean: out += v.b ? "True" : "False"; return;
    case value_kind::integer: out += std::to_string(v.i); return;
    case value_kind::floating: append_float(out, v.d); return;
    case value_kind::string:
      room(out, v.s.size(), b);
      out += v.s;
      return;
    default: append_repr(out, v, b);
  }
}

inline std::string to_str(const value& v, const text_bound& b = {}) {
  std::string out;
  append_str(out, v, b);
  return out;
}

inline void append_repr(std::string& out, const value& v, const text_bound& b, int depth) {
  switch (v.kind) {
    case value_kind::string: append_string_repr(out, v.s, b); return;
    case value_kind::undefined: return;
    case value_kind::array: {
      print_depth(depth, b);
      const bool tuple = v.aux != 0;
      out += tuple ? '(' : '[';
      const std::size_t n = v.size();
      for (std::size_t k = 0; k < n; ++k) {
        room(out, 2, b);
        if (k) out += ", ";
        append_repr(out, v.at(k), b, depth + 1);
      }
      if (tuple && n == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case value_kind::object:
    case value_kind::space: {
      print_depth(depth, b);
      out += v.kind == value_kind::space ? "<Namespace {" : "{";
      bool first = true;
      v.each_entry([&](std::string_view k, const value& x) {
        room(out, 4, b);
        if (!first) out += ", ";
        first = false;
        append_string_repr(out, k, b);
        out += ": ";
        append_repr(out, x, b, depth + 1);
      });
      out += v.kind == value_kind::space ? "}>" : "}";
      return;
    }
    case value_kind::callable: out += "<function>"; return;
    case value_kind::loop: out += "<LoopContext>"; return;
    default: append_str(out, v, b);
  }
}

// tojson's arguments: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys).
struct json_format {
  bool indented = false;  // indent is not None
  std::string indent;     // the text of one level (indent=2: two spaces)
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

namespace detail_json {

inline void append_json_string(std::string& out, std::string_view s, bool ensure_ascii,
                               const text_bound& b) {
  room(out, s.size() + 2, b);  // at least this; escapes add more, checked every 4 KiB
  out += '"';
  std::size_t next_check = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (k >= next_check) {  // k may step over a multiple of 4096 (a UTF-8 sequence)
      room(out, std::min<std::size_t>(s.size() - k, 4096), b);
      next_check = k + 4096;
    }
    const char c = s[k];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char esc[16];
    if (u < 0x20 || (ensure_ascii && u == 0x7f)) {
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else if (ensure_ascii && u >= 0x80) {
      // One UTF-8 sequence as \uXXXX (a surrogate pair above U+FFFF).
      const int len = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : u >= 0xc0 ? 2 : 1;
      std::uint32_t cp = len == 1 ? u : (u & (0x7fu >> len));
      for (int m = 1; m < len && k + 1 < s.size(); ++m) {
        cp = (cp << 6) | (static_cast<unsigned char>(s[++k]) & 0x3fu);
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                      0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(esc, sizeof esc, "\\u%04x", cp);
      }
      out += esc;
    } else {
      out += c;
    }
  }
  out += '"';
}

inline void newline(std::string& out, const json_format& f, int level, const text_bound& b) {
  const auto n = static_cast<std::size_t>(level);
  room(out, 1, b);
  if (!f.indent.empty() && n > b.max / f.indent.size()) room(out, b.max, b);  // refused
  room(out, 1 + n * f.indent.size(), b);
  out += '\n';
  for (int k = 0; k < level; ++k) out += f.indent;
}

}  // namespace detail_json

// Appends json.dumps(v, ...); a value JSON has no form for (undefined, a namespace, a macro)
// is Python's TypeError.
inline void append_json(std::string& out, const value& v, const json_format& f,
                        const text_bound& b = {}, int level = 0) {
  using namespace detail_json;
  switch (v.kind) {
    case value_kind::none: out += "null"; return;
    case value_kind::boolean: out += v.b ? "true" : "false"; return;
    case value_kind::integer: out += std::to_string(v.i); return;
    case value_kind::floating:
      if (std::isnan(v.d)) {
        out += "NaN";
      } else if (std::isinf(v.d)) {
        out += v.d < 0 ? "-Infinity" : "Infinity";
      } else {
        append_float(out, v.d);
      }
      return;
    case value_kind::string: append_json_string(out, v.s, f.ensure_ascii, b); return;
    case value_kind::array: {
      print_depth(level, b);
      const std::size_t n = v.size();
      if (n == 0) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < n; ++k) {
        room(out, f.item_sep.size(), b);
        if (k) out += f.item_sep;
        if (f.indented) newline(out, f, level + 1, b);
        append_json(out, v.at(k), f, b, level + 1);
      }
      if (f.indented) newline(out, f, level, b);
      out += ']';
      return;
    }
    case value_kind::object: {
      print_depth(level, b);
      std::vector<std::pair<std::string_view, value>> entries;
      v.each_entry([&](std::string_view k, const value& x) { entries.emplace_back(k, x); });
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (f.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : entries) {
        room(out, f.item_sep.size() + f.key_sep.size(), b);
        if (!first) out += f.item_sep;
        first = false;
        if (f.indented) newline(out, f, level + 1, b);
        append_json_string(out, k, f.ensure_ascii, b);
        out += f.key_sep;
        append_json(out, x, f, b, level + 1);
      }
      if (f.indented) newline(out, f, level, b);
      out += '}';
      return;
    }
    default:
      raise(error_code::invalid_argument, "Object of type ", type_name(v),
            " is not JSON serializable");
  }
}

}  // namespace npullm::text::jinja
