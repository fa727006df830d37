// jinja_operators: what Jinja's expressions do to values, over the render's budget: attributes
// (a method first, then the item, as Jinja's getattr does) and items (the item first), a for
// loop's `loop`, Jinja's attribute paths ('a.b.0'), slices, unary and binary operators (+ - * /
// // % ** ~ with Python's types and errors, integer overflow refused), comparisons and `in`,
// each counted as work. ~ and + consume their left operand and grow it in place when nothing
// else holds it (a string or list built by appending in a loop is linear); '*' and + check the
// size they would make before allocating. Also the callables a template can hold (macros,
// builtins, bound methods) and the method tables (text/jinja_methods.hpp calls them).
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_ast.hpp"
#include "npullm/text/jinja_ops.hpp"
#include "npullm/text/jinja_print.hpp"
#include "npullm/text/jinja_strings.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

enum class callable_kind : std::uint8_t {
  macro,
  range,
  namespace_,
  dict,
  raise_exception,
  strftime_now,
  method,
  cycle
};

struct callable_data {
  callable_kind kind;
  const node* macro = nullptr;
  value self;             // method: the object; cycle: the loop
  std::string_view name;  // macro or method name
};

struct loop_data {
  std::vector<value> items;
  std::size_t index = 0;
};

// Attributes, items, slices and operators.
class value_ops : protected string_ops {
 public:
  using string_ops::string_ops;

 protected:
  static value builtin(callable_kind kind, std::string_view name, value self = {}) {
    auto c = std::make_shared<callable_data>();
    c->kind = kind;
    c->name = name;
    c->self = std::move(self);
    value v;
    v.kind = value_kind::callable;
    v.owner = std::move(c);
    return v;
  }

  static constexpr std::array<std::string_view, 20> string_methods = {
      "startswith", "endswith", "split",   "rsplit",  "strip",      "lstrip", "rstrip",
      "upper",      "lower",    "replace", "title",   "capitalize", "find",   "count",
      "join",       "isdigit",  "isspace", "isalpha", "isalnum",    "format"};
  static constexpr std::array<std::string_view, 4> dict_methods = {"items", "keys", "values",
                                                                   "get"};
  static constexpr std::array<std::string_view, 13> mutating = {
      "append",  "extend", "insert",     "pop",     "remove",      "clear", "sort",
      "reverse", "update", "setdefault", "popitem", "__setitem__", "copy"};

  template <std::size_t N>
  static bool among(const std::array<std::string_view, N>& names, std::string_view s) {
    return std::find(names.begin(), names.end(), s) != names.end();
  }
  // A method's name as the static tables hold it (a bound method outlives the string it was
  // looked up with).
  static std::string_view method_name(std::string_view s) {
    for (const auto* table : {string_methods.data(), dict_methods.data(), mutating.data()}) {
      const std::size_t n = table == string_methods.data() ? string_methods.size()
                            : table == dict_methods.data() ? dict_methods.size()
                                                           : mutating.size();
      for (std::size_t k = 0; k < n; ++k) {
        if (table[k] == s) return table[k];
      }
    }
    return s == "index" ? std::string_view("index") : std::string_view();
  }

  // obj.name: Python's attribute (a method) first, then the item, as Jinja's getattr does. An
  // undefined result keeps `keep` (the owner of name's text) alive.
  value get_attribute(const value& obj, std::string_view name, int line,
                      const std::shared_ptr<void>& keep = nullptr) const {
    switch (obj.kind) {
      case value_kind::undefined: fail_undefined(line, obj);
      case value_kind::object: {
        if (among(dict_methods, name) || among(mutating, name))
          return builtin(callable_kind::method, method_name(name), obj);
        value v;
        if (obj.get(name, v)) return v;
        break;
      }
      case value_kind::space: {
        if (const value* v = obj.obj().find(name)) return *v;
        break;
      }
      case value_kind::string:
        if (among(string_methods, name))
          return builtin(callable_kind::method, method_name(name), obj);
        break;
      case value_kind::array:
        if (among(mutating, name) || name == "index" || name == "count")
          return builtin(callable_kind::method, method_name(name), obj);
        break;
      case value_kind::loop: {
        value v = loop_attribute(obj, name, line);
        if (v.is(value_kind::undefined)) v.owner = keep;
        return v;
      }
      default: break;
    }
    value u = value::undefined(name, undefined_from::attribute, obj.kind);
    u.owner = keep;
    return u;
  }

  value loop_attribute(const value& obj, std::string_view name, int /*line*/) const {
    const auto& l = *static_cast<loop_data*>(obj.owner.get());
    const auto n = static_cast<std::int64_t>(l.items.size());
    const auto k = static_cast<std::int64_t>(l.index);
    if (name == "index") return value::integer(k + 1);
    if (name == "index0") return value::integer(k);
    if (name == "revindex") return value::integer(n - k);
    if (name == "revindex0") return value::integer(n - k - 1);
    if (name == "first") return value::boolean(k == 0);
    if (name == "last") return value::boolean(k == n - 1);
    if (name == "length") return value::integer(n);
    if (name == "depth") return value::integer(1);
    if (name == "depth0") return value::integer(0);
    if (name == "previtem") return k > 0 ? l.items[l.index - 1] : value::undefined("previtem");
    if (name == "nextitem") return k + 1 < n ? l.items[l.index + 1] : value::undefined("nextitem");
    if (name == "cycle") return builtin(callable_kind::cycle, "cycle", obj);
    return value::undefined(name, undefined_from::attribute, value_kind::loop);
  }

  // obj[key]: the item first, then the attribute.
  value get_item(const value& obj, const value& key, int line) const {
    if (obj.is(value_kind::undefined)) fail_undefined(line, obj);
    const bool int_key = key.is(value_kind::integer) || key.is(value_kind::boolean);
    const std::int64_t i = key.is(value_kind::boolean) ? key.b : key.i;
    if (obj.is(value_kind::array) && int_key) {
      const auto n = static_cast<std::int64_t>(obj.size());
      const std::int64_t k = i < 0 ? i + n : i;
      if (k >= 0 && k < n) return obj.at(static_cast<std::size_t>(k));
    } else if (obj.is(value_kind::string) && int_key) {
      // The code point found by a walk (no table of every offset): s[0] costs one step, and a
      // walk is counted as work (an index in a loop over a long string is bounded).
      const std::string_view t = obj.s;
      std::int64_t k = i;
      if (i < 0) {
        made(t.size() * 8, line);
        k += static_cast<std::int64_t>(detail_eval::code_points(t));
      }
      std::size_t at = 0;
      for (std::int64_t m = 0; m < k && at < t.size(); ++m) at += detail_eval::step(t, at);
      made(at * 8, line);  // a walk by code points: about 8 times a copy's time a byte
      if (k >= 0 && at < t.size()) return substring(obj, at, detail_eval::step(t, at));
    } else if (obj.is(value_kind::object) && key.is(value_kind::string)) {
      value v;
      if (obj.get(key.s, v)) return v;
      return get_attribute(obj, key.s, line, key.owner);
    } else if (key.is(value_kind::string)) {
      return get_attribute(obj, key.s, line, key.owner);
    }
    value u = value::undefined({}, undefined_from::index, obj.kind);
    u.i = int_key ? i : 0;
    return u;
  }

  // Jinja's attribute lookup for filters' attribute='a.b.0'.
  value attribute_path(const value& v, std::string_view path, int line) const {
    value cur = v;
    std::size_t b = 0;
    while (b <= path.size()) {
      const std::size_t e = std::min(path.find('.', b), path.size());
      const std::string_view part = path.substr(b, e - b);
      std::int64_t idx = 0;
      const auto r = std::from_chars(part.data(), part.data() + part.size(), idx);
      if (cur.is(value_kind::undefined)) return cur;
      cur = r.ec == std::errc{} && r.ptr == part.data() + part.size() && !part.empty()
                ? get_item(cur, value::integer(idx), line)
                : get_item(cur, value::string(std::string(part)), line);
      b = e + 1;
    }
    return cur;
  }

  // obj[start:stop:step] (absent parts: nullptr), as Python slices a list, tuple or str.
  value slice_value(const value& obj, const value* start, const value* stop, const value* step,
                    int line) const {
    if (obj.is(value_kind::undefined)) fail_undefined(line, obj);
    if (obj.is(value_kind::array)) {
      const auto r = slice_indices(static_cast<std::int64_t>(obj.size()), start, stop, step, line);
      std::vector<value> items;
      items.reserve(static_cast<std::size_t>(r.count));
      for (std::int64_t k = 0; k < r.count; ++k)
        items.push_back(obj.at(static_cast<std::size_t>(r.start + k * r.step)));
      return value::array(std::move(items), obj.aux != 0);
    }
    if (obj.is(value_kind::string)) {
      made(obj.s.size() * (1 + sizeof(std::size_t)), line);
      const auto at = detail_eval::char_starts(obj.s);
      const auto r =
          slice_indices(static_cast<std::int64_t>(at.size()) - 1, start, stop, step, line);
      if (r.step == 1) {
        const auto b = static_cast<std::size_t>(r.start);
        return r.count == 0
                   ? value::view("")
                   : substring(obj, at[b], at[b + static_cast<std::size_t>(r.count)] - at[b]);
      }
      std::string s;
      for (std::int64_t k = 0; k < r.count; ++k) {
        const auto c = static_cast<std::size_t>(r.start + k * r.step);
        s.append(obj.s.substr(at[c], at[c + 1] - at[c]));
      }
      return value::string(std::move(s));
    }
    fail(line, "'", std::string(type_name(obj)), "' object is not subscriptable");
  }

  // not v, -v, +v.
  value unary(op o, const value& v, int line) const {
    if (o == op::not_) return value::boolean(!truthy(v));
    if (v.is(value_kind::undefined)) fail_undefined(line, v);
    if (v.is(value_kind::floating)) return value::floating(o == op::neg ? -v.d : v.d);
    if (v.is(value_kind::integer) || v.is(value_kind::boolean)) {
      const std::int64_t x = v.is(value_kind::boolean) ? v.b : v.i;
      if (o == op::neg && x == std::numeric_limits<std::int64_t>::min())
        fail(line, "integer overflow");
      return value::integer(o == op::neg ? -x : x);
    }
    fail(line, std::string("bad operand type for unary "), (o == op::neg ? "-" : "+"), ": '",
         std::string(type_name(v)), "'");
  }

  // l ~ r, l consumed: appended in place when l alone owns its text (amortized growth), else a
  // new string; either way bounded by max_output_bytes before the bytes are appended.
  value concat(value l, const value& r, int line) const {
    if (std::string* p = l.sole_text()) {
      const std::size_t before = p->size();
      append_str(*p, r, bound(line));
      made(p->size() - before, line);
      l.s = *p;
      return l;
    }
    std::string s;
    if (l.is(value_kind::string) && r.is(value_kind::string)) {
      check_size(l.s.size() + r.s.size(), line);
      s.reserve(l.s.size() + r.s.size());
      s.append(l.s);
      s.append(r.s);
      return value::string(std::move(s));
    }
    append_str(s, l, bound(line));
    append_str(s, r, bound(line));
    made(s.size(), line);
    return value::string(std::move(s));
  }

  // l + r, l consumed: strings and lists appended in place when l alone owns them (a list or
  // string built by appending in a loop is linear), sizes checked before allocating.
  value add(value l, const value& r, int line) const {
    if (l.is(value_kind::string) && r.is(value_kind::string)) {
      if (std::string* p = l.sole_text()) {
        room(*p, r.s.size(), bound(line));
        made(r.s.size(), line);
        p->append(r.s);
        l.s = *p;
        return l;
      }
      check_size(l.s.size() + r.s.size(), line);
      std::string s;
      s.reserve(l.s.size() + r.s.size());
      s.append(l.s);
      s.append(r.s);
      return value::string(std::move(s));
    }
    if (l.is(value_kind::array) && r.is(value_kind::array) && l.aux == r.aux) {
      const std::size_t n = r.size();
      if (array_data* a = l.sole_items()) {
        if (a->items.size() + n > opt_.limits.max_items) check_items(a->items.size() + n, line);
        made(n * sizeof(value), line);
        if (a->items.size() + n > a->items.capacity())  // doubled: amortized appends
          a->items.reserve(std::max(a->items.size() + n, a->items.capacity() * 2));
        for (std::size_t k = 0; k < n; ++k) {
          value x = r.at(k);
          a->nest = value::outer(a->nest, x);
          a->items.push_back(std::move(x));
        }
        return l;
      }
      check_items(l.size() + n, line);
      std::vector<value> items;
      items.reserve(l.size() + n);
      for (std::size_t k = 0; k < l.size(); ++k) items.push_back(l.at(k));
      for (std::size_t k = 0; k < n; ++k) items.push_back(r.at(k));
      return value::array(std::move(items), l.aux != 0);
    }
    return binary(op::add, l, r, line);
  }

  value binary(op o, const value& l, const value& r, int line) const {
    if (o == op::concat) return concat(l, r, line);
    if (l.is(value_kind::undefined)) fail_undefined(line, l);
    if (r.is(value_kind::undefined)) fail_undefined(line, r);
    static constexpr std::array<std::string_view, 7> symbols = {"+",  "-", "*", "/",
                                                                "//", "%", "**"};
    const std::string_view sym = symbols[static_cast<std::size_t>(o)];
    if (l.is_number() && r.is_number()) {
      if (is_int(l) && is_int(r) && o != op::div) {
        const std::int64_t a = as_int(l), b = as_int(r);
        std::int64_t x = 0;
        bool overflow = false;
        switch (o) {
          case op::add: overflow = __builtin_add_overflow(a, b, &x); break;
          case op::sub: overflow = __builtin_sub_overflow(a, b, &x); break;
          case op::mul: overflow = __builtin_mul_overflow(a, b, &x); break;
          case op::floordiv:
          case op::mod: {
            if (b == 0) fail(line, "integer division or modulo by zero");
            if (a == std::numeric_limits<std::int64_t>::min() && b == -1) {
              overflow = true;
              break;
            }
            std::int64_t q = a / b, m = a % b;
            if (m != 0 && ((m < 0) != (b < 0))) {
              --q;
              m += b;
            }
            x = o == op::floordiv ? q : m;
            break;
          }
          case op::pow: {
            if (b < 0)
              return value::floating(std::pow(static_cast<double>(a), static_cast<double>(b)));
            x = 1;
            for (std::int64_t k = 0; k < b && !overflow; ++k) {
              overflow = __builtin_mul_overflow(x, a, &x);
              if (x == 0 || x == 1) break;
            }
            if (!overflow && a == -1) x = (b % 2 == 0) ? 1 : -1;
            break;
          }
          default: break;
        }
        if (overflow) fail(line, "integer overflow in '", std::string(sym), "'");
        return value::integer(x);
      }
      const double a = as_double(l), b = as_double(r);
      switch (o) {
        case op::add: return value::floating(a + b);
        case op::sub: return value::floating(a - b);
        case op::mul: return value::floating(a * b);
        case op::div:
          if (b == 0) fail(line, "division by zero");
          return value::floating(a / b);
        case op::floordiv:
          if (b == 0) fail(line, "float floor division by zero");
          return value::floating(std::floor(a / b));
        case op::mod: {
          if (b == 0) fail(line, "float modulo");
          double m = std::fmod(a, b);
          if (m != 0 && ((m < 0) != (b < 0))) m += b;
          return value::floating(m);
        }
        case op::pow: return value::floating(std::pow(a, b));
        default: break;
      }
    }
    if (o == op::add) {
      if ((l.is(value_kind::string) && r.is(value_kind::string)) ||
          (l.is(value_kind::array) && r.is(value_kind::array) && l.aux == r.aux)) {
        return add(l, r, line);
      }
      if (l.is(value_kind::string) || (l.is(value_kind::array) && l.aux == 0)) {
        fail(line, "can only concatenate ", std::string(type_name(l)), " (not \"",
             std::string(type_name(r)), "\") to ", std::string(type_name(l)));
      }
    }
    if (o == op::mul) {
      const value* seq = is_int(r) ? &l : is_int(l) ? &r : nullptr;
      const value& times = is_int(r) ? r : l;
      if (seq && (seq->is(value_kind::string) || seq->is(value_kind::array))) {
        // The size (unit times t) checked before anything is allocated; an empty unit gives
        // an empty result at once, whatever t (no loop of t empty appends).
        const auto t = static_cast<std::uint64_t>(std::max<std::int64_t>(0, as_int(times)));
        const bool text = seq->is(value_kind::string);
        const std::size_t unit = text ? seq->s.size() : seq->size();
        const std::size_t max = text ? opt_.limits.max_output_bytes : opt_.limits.max_items;
        if (unit == 0 || t == 0) return text ? value::view("") : value::array({}, seq->aux != 0);
        if (t > max / unit) {
          fail_limit(
              line, "'*' would make ", std::to_string(unit), " x ", std::to_string(t),
              text ? " bytes, which exceeds the limit of " : " items, which exceeds the limit of ",
              std::to_string(max),
              text ? " (render_limits::max_output_bytes)" : " (render_limits::max_items)");
        }
        const auto count = static_cast<std::size_t>(t);
        if (text) {
          check_size(unit * count, line);
          std::string s;
          s.reserve(unit * count);
          for (std::size_t k = 0; k < count; ++k) s.append(seq->s);
          return value::string(std::move(s));
        }
        check_items(unit * count, line);
        std::vector<value> items;
        items.reserve(unit * count);
        const std::vector<value> one = iterate(*seq, line);
        for (std::size_t k = 0; k < count; ++k) items.insert(items.end(), one.begin(), one.end());
        return value::array(std::move(items), seq->aux != 0);
      }
    }
    if (o == op::mod && l.is(value_kind::string)) {
      raise(error_code::unsupported, "chat template line ", line,
            ": string % formatting is not supported by npullm's Jinja interpreter");
    }
    unsupported_operands(sym, l, r, line);
  }

  // What comparing a and b costs, counted as work: 16 bytes, the texts' common length, a list's
  // elements' (one level: lists of lists are rare in templates and bounded by max_items).
  void compare_cost(const value& a, const value& b, int line) const {
    std::size_t n = 16;
    if (a.is(value_kind::string) && b.is(value_kind::string)) {
      n += std::min(a.s.size(), b.s.size());
    } else if (a.is(value_kind::array) && b.is(value_kind::array)) {
      const std::size_t m = std::min(a.size(), b.size());
      n += 16 * m;
      for (std::size_t k = 0; k < m; ++k) {
        const value x = a.at(k), y = b.at(k);
        if (x.is(value_kind::string) && y.is(value_kind::string))
          n += std::min(x.s.size(), y.s.size());
      }
    }
    made(n, line);
  }
  bool counted_equal(const value& a, const value& b, int line) const {
    compare_cost(a, b, line);
    return equal(a, b);
  }
  bool counted_less(const value& a, const value& b, int line) const {
    compare_cost(a, b, line);
    return order(a, b, "<", line) < 0;
  }

  bool compare(op o, const value& l, const value& r, int line) const {
    compare_cost(l, r, line);
    switch (o) {
      case op::eq: return equal(l, r);
      case op::ne: return !equal(l, r);
      case op::lt: return order(l, r, "<", line) < 0;
      case op::le: return order(l, r, "<=", line) <= 0;
      case op::gt: return order(l, r, ">", line) > 0;
      case op::ge: return order(l, r, ">=", line) >= 0;
      case op::in:
      case op::not_in: {
        // A scan of the container: counted as work, each element's comparison by its cost.
        if (r.is(value_kind::array)) {
          bool found = false;
          for (std::size_t k = 0; k < r.size() && !found; ++k)
            found = counted_equal(r.at(k), l, line);
          return found == (o == op::in);
        }
        if (r.is(value_kind::string)) made(r.s.size(), line);
        return contains(r, l, line) == (o == op::in);
      }
      default: return false;
    }
  }
};

}  // namespace npullm::text::jinja
