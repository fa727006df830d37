// jinja_value: the values a Jinja template computes with (text/jinja.hpp's interpreter), as
// Python and Jinja2 see them: undefined, None, bool, int, float, str, list / tuple, dict,
// namespace, callables (macros, builtins, bound methods) and a for loop's `loop`.
//
// A value is small (48 bytes) and cheap to copy: strings are a view plus an owner (the template's
// literal, the caller's JSON, or a shared string made by an operation); lists and dicts are
// either borrowed from the caller's JSON (never copied) or shared, immutable once built (the
// template is sandboxed as transformers' ImmutableSandboxedEnvironment is); only a namespace
// is changed in place ({% set ns.x = ... %}).
//
// Also here: what Python prints for a value (str() and repr()), and tojson as Python's
// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...) writes it.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"

namespace npullm::text::jinja {

// The caller's variables: JSON whose objects keep their keys in insertion order (as Python's
// dicts do, so that tojson writes them in the order given).
using json = nlohmann::ordered_json;

enum class value_kind : std::uint8_t {
  undefined,  // a name or attribute that does not exist (Jinja's default Undefined)
  none,
  boolean,
  integer,
  floating,
  string,
  array,     // list (aux = 0) or tuple (aux = 1)
  object,    // dict
  space,     // namespace(): the one mutable value
  callable,  // macro, builtin function, bound method
  loop,      // a for loop's `loop`
};

// Where an undefined value came from, for the message when it is used.
enum class undefined_from : std::uint8_t { name, attribute, index };

// Lists and dicts a template builds nest at most this deep (printing, tojson, comparing and
// freeing them recurse): deeper is capacity_exhausted. The caller's JSON is not counted.
inline constexpr std::uint32_t max_nesting = 256;

// What a built list / dict holds: its nesting depth (1: no list or dict inside) and whether a
// namespace is inside (a namespace may not hold one: no value can contain itself).
struct nesting {
  std::uint32_t depth = 1;
  bool has_space = false;
};

struct value;
struct array_data {
  std::vector<value> items;
  nesting nest;
};
struct object_data {
  std::vector<std::pair<std::string, value>> entries;
  nesting nest;
  value* find(std::string_view key);
};
struct callable_data;
struct loop_data;

struct value {
  value_kind kind = value_kind::undefined;
  std::uint8_t aux = 0;  // array: tuple; undefined: undefined_from; string: 1 when owner is a
                         // std::string whose whole text s is (made by value::string)
  value_kind parent = value_kind::undefined;  // undefined: the kind of the object it was read from
  union {
    bool b;
    std::int64_t i = 0;  // integer; undefined from an index: the index
    double d;
    const json* j;  // array / object borrowed from the caller's JSON (else owner holds it)
  };
  std::string_view s;           // string: its text; undefined: the name or attribute
  std::shared_ptr<void> owner;  // owned string, array_data, object_data, callable, loop

  static value none() { return with(value_kind::none); }
  static value boolean(bool v) {
    value r = with(value_kind::boolean);
    r.b = v;
    return r;
  }
  static value integer(std::int64_t v) {
    value r = with(value_kind::integer);
    r.i = v;
    return r;
  }
  static value floating(double v) {
    value r = with(value_kind::floating);
    r.d = v;
    return r;
  }
  // A view whose text lives as long as the template or the caller's JSON.
  static value view(std::string_view text) {
    value r = with(value_kind::string);
    r.s = text;
    return r;
  }
  static value string(std::string text) {
    auto p = std::make_shared<std::string>(std::move(text));
    value r = with(value_kind::string);
    r.aux = 1;
    r.s = *p;
    r.owner = std::move(p);
    return r;
  }
  // The std::string this string value alone owns, all of whose text it is, or nullptr: then an
  // operation may grow it in place (s ~ t, s + t, xs + ys with this value consumed) instead of
  // copying, since nothing else can see the change. Re-point s after changing it.
  [[nodiscard]] std::string* sole_text() const {
    if (kind != value_kind::string || aux != 1 || owner.use_count() != 1) return nullptr;
    auto* p = static_cast<std::string*>(owner.get());
    return p->data() == s.data() && p->size() == s.size() ? p : nullptr;
  }
  // The array_data this list alone owns (not borrowed, no other value shares it), or nullptr.
  [[nodiscard]] array_data* sole_items() const {
    if (kind != value_kind::array || borrowed() || owner.use_count() != 1) return nullptr;
    return &arr();
  }
  static value array(std::vector<value> items, bool tuple = false) {
    nesting n;
    for (const value& x : items) n = outer(n, x);
    value r = with(value_kind::array);
    r.aux = tuple ? 1 : 0;
    r.j = nullptr;
    r.owner = std::make_shared<array_data>(array_data{std::move(items), n});
    return r;
  }
  static value object(std::vector<std::pair<std::string, value>> entries,
                      value_kind k = value_kind::object) {
    nesting n;
    for (const auto& e : entries) n = outer(n, e.second);
    if (k == value_kind::space && n.has_space) {
      raise(error_code::unsupported, "a namespace holding a namespace is not supported");
    }
    value r = with(k);
    r.j = nullptr;
    r.owner = std::make_shared<object_data>(object_data{std::move(entries), n});
    return r;
  }
  // The nesting of a built list or dict (borrowed JSON and scalars: depth 0).
  [[nodiscard]] nesting nest() const {
    if (kind == value_kind::array && !borrowed()) return arr().nest;
    if ((kind == value_kind::object && !borrowed()) || kind == value_kind::space) {
      nesting n = obj().nest;
      n.has_space = n.has_space || kind == value_kind::space;
      return n;
    }
    return {0, false};
  }
  // The nesting of a container n that also holds x; deeper than max_nesting is an error.
  static nesting outer(nesting n, const value& x) {
    const nesting inner = x.nest();
    n.depth = std::max(n.depth, inner.depth + 1);
    n.has_space = n.has_space || inner.has_space;
    if (n.depth > max_nesting) {
      raise(error_code::capacity_exhausted, "lists and dicts nested deeper than ", max_nesting);
    }
    return n;
  }
  static value undefined(std::string_view name, undefined_from from = undefined_from::name,
                         value_kind parent = value_kind::undefined) {
    value r;
    r.s = name;
    r.aux = static_cast<std::uint8_t>(from);
    r.parent = parent;
    return r;
  }
  // The caller's JSON, borrowed: it must outlive the value.
  static value from_json(const json& v) {
    switch (v.type()) {
      case json::value_t::null: return none();
      case json::value_t::boolean: return boolean(v.get<bool>());
      case json::value_t::number_integer: return integer(v.get<std::int64_t>());
      case json::value_t::number_unsigned: {
        const auto u = v.get<std::uint64_t>();
        return u > static_cast<std::uint64_t>(INT64_MAX) ? floating(static_cast<double>(u))
                                                         : integer(static_cast<std::int64_t>(u));
      }
      case json::value_t::number_float: return floating(v.get<double>());
      case json::value_t::string: return view(v.get_ref<const std::string&>());
      case json::value_t::array: {
        value r = with(value_kind::array);
        r.j = &v;
        return r;
      }
      case json::value_t::object: {
        value r = with(value_kind::object);
        r.j = &v;
        return r;
      }
      default: return none();  // binary and discarded values: not in JSON text
    }
  }

  [[nodiscard]] bool is(value_kind k) const noexcept { return kind == k; }
  [[nodiscard]] bool is_number() const noexcept {
    return kind == value_kind::integer || kind == value_kind::floating ||
           kind == value_kind::boolean;
  }
  [[nodiscard]] bool borrowed() const noexcept {
    return (kind == value_kind::array || kind == value_kind::object) && j != nullptr;
  }
  [[nodiscard]] array_data& arr() const { return *static_cast<array_data*>(owner.get()); }
  [[nodiscard]] object_data& obj() const { return *static_cast<object_data*>(owner.get()); }

  // Elements of a list / tuple (or entries of a dict).
  [[nodiscard]] std::size_t size() const {
    if (borrowed()) return j->size();
    if (kind == value_kind::array) return arr().items.size();
    return obj().entries.size();
  }
  [[nodiscard]] value at(std::size_t k) const {
    return borrowed() ? from_json((*j)[k]) : arr().items[k];
  }
  // A dict's value for key, or nullopt-like undefined with ok = false.
  [[nodiscard]] bool get(std::string_view key, value& out) const {
    if (borrowed()) {
      for (auto it = j->begin(); it != j->end(); ++it) {
        if (it.key() == key) {
          out = from_json(it.value());
          return true;
        }
      }
      return false;
    }
    if (const value* v = obj().find(key)) {
      out = *v;
      return true;
    }
    return false;
  }
  // Calls f(key, value) for each entry of a dict, in order.
  template <class F>
  void each_entry(F&& f) const {
    if (borrowed()) {
      for (auto it = j->begin(); it != j->end(); ++it)
        f(std::string_view(it.key()), from_json(it.value()));
    } else {
      for (const auto& [k, v] : obj().entries) f(std::string_view(k), v);
    }
  }

 private:
  static value with(value_kind k) {
    value r;
    r.kind = k;
    return r;
  }
};

inline value* object_data::find(std::string_view key) {
  for (auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

// How much text may be made while printing a value (str(), repr(), tojson): past max bytes
// the print is refused (capacity_exhausted, naming line and the limit) before the piece that
// would cross it is appended, so printing a list of a million 16 MiB strings allocates at most
// max (plus a few bytes of punctuation), not the terabytes it would take. Printing recurses
// once a level of nesting: the caller's JSON (not bounded by max_nesting) nested deeper than
// max_print_depth is refused likewise.
inline constexpr int max_print_depth = 1024;
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

// Refuses (capacity_exhausted, naming what) JSON nested deeper than max_depth, found by a walk
// with an explicit stack: before a copy of the caller's JSON (nlohmann::json's copy recurses
// once a level, so a request nested 100,000 deep would overflow the stack in it).
inline void check_json_depth(const json& root, std::size_t max_depth, std::string_view what) {
  std::vector<std::pair<const json*, std::size_t>> pending{{&root, 0}};
  while (!pending.empty()) {
    const auto [v, depth] = pending.back();
    pending.pop_back();
    if (!v->is_structured()) continue;
    if (depth >= max_depth) {
      raise(error_code::capacity_exhausted, what, " nested deeper than ", max_depth, " levels");
    }
    for (const auto& x : *v) pending.emplace_back(&x, depth + 1);
  }
}

// Python's name of a value's type, as its TypeErrors say ('NoneType', 'str', ...).
inline std::string_view type_name(const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return "Undefined";
    case value_kind::none: return "NoneType";
    case value_kind::boolean: return "bool";
    case value_kind::integer: return "int";
    case value_kind::floating: return "float";
    case value_kind::string: return "str";
    case value_kind::array: return v.aux ? "tuple" : "list";
    case value_kind::object: return "dict";
    case value_kind::space: return "Namespace";
    case value_kind::callable: return "function";
    case value_kind::loop: return "LoopContext";
  }
  return "object";
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
