// jinja_ops: Python's semantics of text/jinja.hpp's values, as the interpreter applies them:
// truthiness, ==, ordering, `in`, iteration, slices, len(), the errors Jinja raises
// (UndefinedError's and TypeError's words), and the UTF-8 helpers str's operations use
// (text/jinja_strings.hpp). Whitespace is Python's str.isspace().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

namespace detail_eval {

// Python's str.isspace() for one code point.
inline bool is_py_space(std::uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// The code point at s[k] and its length in bytes (a malformed byte is itself).
inline std::uint32_t decode(std::string_view s, std::size_t k, std::size_t& len) {
  const auto u = static_cast<unsigned char>(s[k]);
  len = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : u >= 0xc0 ? 2 : 1;
  if (k + len > s.size()) len = 1;
  if (len == 1) return u;
  std::uint32_t cp = u & (0x7fu >> len);
  for (std::size_t m = 1; m < len; ++m)
    cp = (cp << 6) | (static_cast<unsigned char>(s[k + m]) & 0x3fu);
  return cp;
}

// Byte offsets of a string's code points (and its size at the end).
inline std::vector<std::size_t> char_starts(std::string_view s) {
  std::vector<std::size_t> at;
  at.reserve(s.size() + 1);
  for (std::size_t k = 0; k < s.size();) {
    at.push_back(k);
    std::size_t len = 1;
    decode(s, k, len);
    k += len;
  }
  at.push_back(s.size());
  return at;
}

// The length in bytes of the code point at s[k], as decode and char_starts step.
inline std::size_t step(std::string_view s, std::size_t k) {
  std::size_t len = 1;
  decode(s, k, len);
  return len;
}

// The number of code points as char_starts counts them (its size - 1), without the table.
inline std::size_t code_points(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < s.size(); k += step(s, k)) ++n;
  return n;
}

inline std::size_t char_count(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

inline char ascii_upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
inline char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
inline bool ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Python's slice.indices(): start, stop, step for a length, and the count.
struct slice_range {
  std::int64_t start, step, count;
};

}  // namespace detail_eval

// The operations, as static members: the interpreter derives from it.
struct python_ops {
  // The message's parts are streamed (detail::concat), never joined with operator+ (GCC 12's
  // -Wrestrict false positive on "..." + std::string&&).
  template <class... Parts>
  [[noreturn]] static void fail(int line, const Parts&... what) {
    raise(error_code::invalid_argument, "chat template line ", line, ": ", what...);
  }

  template <class... Parts>
  [[noreturn]] static void fail_limit(int line, const Parts&... what) {
    raise(error_code::capacity_exhausted, "chat template line ", line, ": ", what...);
  }

  static std::string object_repr(value_kind k) {
    switch (k) {
      case value_kind::object: return "'dict object'";
      case value_kind::array: return "'list object'";
      case value_kind::string: return "'str object'";
      case value_kind::none: return "None";
      case value_kind::integer: return "'int object'";
      case value_kind::floating: return "'float object'";
      case value_kind::boolean: return "'bool object'";
      case value_kind::space: return "'Namespace object'";
      case value_kind::loop: return "'LoopContext object'";
      default: return "'object'";
    }
  }

  // Jinja's UndefinedError message for a value that is undefined.
  [[noreturn]] static void fail_undefined(int line, const value& v) {
    const auto from = static_cast<undefined_from>(v.aux);
    if (from == undefined_from::name) fail(line, "'", std::string(v.s), "' is undefined");
    if (from == undefined_from::index) {
      fail(line, object_repr(v.parent), " has no element ", std::to_string(v.i));
    }
    fail(line, object_repr(v.parent), " has no attribute '", std::string(v.s), "'");
  }

  // The items a for loop (or list(), join, ...) goes through: a list's elements, a dict's keys,
  // a string's characters; Undefined is empty.
  static std::vector<value> iterate(const value& v, int line) {
    std::vector<value> items;
    switch (v.kind) {
      case value_kind::undefined: break;
      case value_kind::array: {
        const std::size_t n = v.size();
        items.reserve(n);
        for (std::size_t k = 0; k < n; ++k) items.push_back(v.at(k));
        break;
      }
      case value_kind::object:
        v.each_entry([&](std::string_view k, const value&) { items.push_back(key_value(k, v)); });
        break;
      case value_kind::string: {
        const auto at = detail_eval::char_starts(v.s);
        for (std::size_t k = 0; k + 1 < at.size(); ++k)
          items.push_back(substring(v, at[k], at[k + 1] - at[k]));
        break;
      }
      default: fail(line, "'", std::string(type_name(v)), "' object is not iterable");
    }
    return items;
  }

  // A key of dict d as a string value (a view while d is borrowed or alive).
  static value key_value(std::string_view k, const value& d) {
    value r = value::view(k);
    if (!d.borrowed()) r.owner = d.owner;
    return r;
  }

  static value substring(const value& s, std::size_t at, std::size_t n) {
    value r = value::view(s.s.substr(at, n));
    r.owner = s.owner;
    return r;
  }

  static bool truthy(const value& v) {
    switch (v.kind) {
      case value_kind::undefined:
      case value_kind::none: return false;
      case value_kind::boolean: return v.b;
      case value_kind::integer: return v.i != 0;
      case value_kind::floating: return v.d != 0;
      case value_kind::string: return !v.s.empty();
      case value_kind::array:
      case value_kind::object: return v.size() != 0;
      default: return true;
    }
  }

  static detail_eval::slice_range slice_indices(std::int64_t len, const value* start,
                                                const value* stop, const value* step, int line) {
    const auto as_int = [&](const value* v, std::int64_t& out) {
      if (v == nullptr || v->is(value_kind::none)) return false;
      if (v->is(value_kind::integer)) {
        out = v->i;
      } else if (v->is(value_kind::boolean)) {
        out = v->b;
      } else {
        fail(line, "slice indices must be integers or None");
      }
      return true;
    };
    std::int64_t st = 1;
    as_int(step, st);
    if (st == 0) fail(line, "slice step cannot be zero");
    std::int64_t b = 0, e = 0;
    const bool has_b = as_int(start, b), has_e = as_int(stop, e);
    const auto adjust = [&](std::int64_t x, bool has, std::int64_t dflt) {
      if (!has) return dflt;
      if (x < 0) {
        x += len;
        if (x < 0) x = st < 0 ? -1 : 0;
      } else if (x >= len) {
        x = st < 0 ? len - 1 : len;
      }
      return x;
    };
    b = adjust(b, has_b, st < 0 ? len - 1 : 0);
    e = adjust(e, has_e, st < 0 ? -1 : len);
    std::int64_t count = 0;
    if (st > 0 && e > b) count = (e - b + st - 1) / st;
    if (st < 0 && b > e) count = (b - e - st - 1) / (-st);
    return {b, st, count};
  }

  static double as_double(const value& v) {
    return v.is(value_kind::floating)  ? v.d
           : v.is(value_kind::boolean) ? v.b
                                       : static_cast<double>(v.i);
  }

  static std::int64_t as_int(const value& v) { return v.is(value_kind::boolean) ? v.b : v.i; }

  static bool is_int(const value& v) {
    return v.is(value_kind::integer) || v.is(value_kind::boolean);
  }

  [[noreturn]] static void unsupported_operands(std::string_view sym, const value& l,
                                                const value& r, int line) {
    fail(line, "unsupported operand type(s) for ", std::string(sym), ": '",
         std::string(type_name(l)), "' and '", std::string(type_name(r)), "'");
  }

  // Comparing recurses once a level of nesting: values nested deeper than max_print_depth (the
  // caller's JSON may be) are refused rather than overflowing the stack.
  static void compare_depth(int depth) {
    if (depth > max_print_depth) {
      raise(error_code::capacity_exhausted, "values nested deeper than ", max_print_depth,
            " levels cannot be compared");
    }
  }

  static bool equal(const value& a, const value& b, int depth = 0) {
    if (a.is_number() && b.is_number()) {
      if (is_int(a) && is_int(b)) return as_int(a) == as_int(b);
      return as_double(a) == as_double(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
      case value_kind::undefined:
      case value_kind::none: return true;
      case value_kind::string:  // the same text (shared or a view of it): no scan
        return (a.s.data() == b.s.data() && a.s.size() == b.s.size()) || a.s == b.s;
      case value_kind::array: {
        if (a.aux != b.aux || a.size() != b.size()) return false;
        compare_depth(depth);
        for (std::size_t k = 0; k < a.size(); ++k) {
          if (!equal(a.at(k), b.at(k), depth + 1)) return false;
        }
        return true;
      }
      case value_kind::object: {
        if (a.size() != b.size()) return false;
        compare_depth(depth);
        bool same = true;
        a.each_entry([&](std::string_view k, const value& x) {
          value y;
          if (same && (!b.get(k, y) || !equal(x, y, depth + 1))) same = false;
        });
        return same;
      }
      default: return a.owner == b.owner;
    }
  }

  // a < b as Python orders them (numbers, strings, lists); anything else is a TypeError.
  static int order(const value& a, const value& b, std::string_view sym, int line, int depth = 0) {
    if (a.is(value_kind::undefined)) fail_undefined(line, a);
    if (b.is(value_kind::undefined)) fail_undefined(line, b);
    if (a.is_number() && b.is_number()) {
      if (is_int(a) && is_int(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
      const double x = as_double(a), y = as_double(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is(value_kind::string) && b.is(value_kind::string)) {
      const int c = a.s.compare(b.s);
      return c < 0 ? -1 : c > 0;
    }
    if (a.is(value_kind::array) && b.is(value_kind::array) && a.aux == b.aux) {
      compare_depth(depth);
      const std::size_t n = std::min(a.size(), b.size());
      for (std::size_t k = 0; k < n; ++k) {
        const value x = a.at(k), y = b.at(k);
        if (!equal(x, y, depth + 1)) return order(x, y, sym, line, depth + 1);
      }
      return a.size() < b.size() ? -1 : a.size() > b.size();
    }
    fail(line, "'", std::string(sym), "' not supported between instances of '",
         std::string(type_name(a)), "' and '", std::string(type_name(b)), "'");
  }

  static bool contains(const value& hay, const value& needle, int line) {
    switch (hay.kind) {
      case value_kind::undefined: return false;
      case value_kind::string:
        if (!needle.is(value_kind::string)) {
          fail(line, "'in <string>' requires string as left operand, not ",
               std::string(type_name(needle)));
        }
        return hay.s.find(needle.s) != std::string_view::npos;
      case value_kind::array:
        for (std::size_t k = 0; k < hay.size(); ++k) {
          if (equal(hay.at(k), needle)) return true;
        }
        return false;
      case value_kind::object: {
        if (!needle.is(value_kind::string)) return false;
        value v;
        return hay.get(needle.s, v);
      }
      default: fail(line, "argument of type '", std::string(type_name(hay)), "' is not iterable");
    }
  }

  static std::size_t length(const value& v, int line) {
    switch (v.kind) {
      case value_kind::undefined: return 0;
      case value_kind::string: return detail_eval::char_count(v.s);
      case value_kind::array:
      case value_kind::object: return v.size();
      default: fail(line, "object of type '", std::string(type_name(v)), "' has no len()");
    }
  }
};

}  // namespace npullm::text::jinja
