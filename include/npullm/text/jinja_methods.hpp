// jinja_methods: the methods and global functions a Jinja template calls, with Python's
// arguments (by position or by name, checked) and errors: str's startswith, endswith, split,
// rsplit, strip, lstrip, rstrip, upper, lower, replace, title, capitalize, find, count, join,
// isdigit, isspace, isalpha, isalnum (their string operations are text/jinja_strings.hpp's,
// which the filters share); dict's items, keys, values, get; list's index and count; a method
// that would change a list or dict is the sandbox's error (transformers'
// ImmutableSandboxedEnvironment). Globals: range (bounded by max_iterations and max_items),
// namespace, dict, raise_exception, strftime_now; a loop's cycle.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_operators.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// A call's arguments, evaluated: positional, then keyword.
struct call_args {
  std::vector<value> pos;
  std::vector<std::pair<std::string_view, value>> kw;
};

// Methods and global functions.
class method_ops : protected value_ops {
 public:
  using value_ops::value_ops;

 protected:
  // A builtin's parameters: each by position or by name, with a default.
  struct binder {
    const call_args& a;
    std::string_view fn;
    int line;
    std::array<std::string_view, 4> params{};  // a copy: an initializer_list's array would
    std::size_t count = 0;                     // not outlive the constructor's call

    binder(const call_args& args, std::string_view f, int l,
           std::initializer_list<std::string_view> p)
        : a(args), fn(f), line(l), count(std::min(p.size(), params.size())) {
      std::copy_n(p.begin(), count, params.begin());
      if (a.pos.size() > count) {
        fail(line, fn, "() takes at most ", count, " argument(s) (", a.pos.size(), " given)");
      }
      for (const auto& [k, v] : a.kw) {
        if (std::find(params.begin(), params.begin() + static_cast<std::ptrdiff_t>(count), k) ==
            params.begin() + static_cast<std::ptrdiff_t>(count))
          fail(line, fn, "() got an unexpected keyword argument '", k, "'");
      }
    }
    // The k-th parameter, or nullptr when not given.
    const value* get(std::size_t k) const {
      if (k < a.pos.size()) return &a.pos[k];
      const std::string_view name = params[k];
      for (const auto& [n, v] : a.kw) {
        if (n == name) return &v;
      }
      return nullptr;
    }
    value get(std::size_t k, value dflt) const {
      const value* v = get(k);
      return v ? *v : dflt;
    }
    std::string_view text(std::size_t k, std::string_view dflt) const {
      const value* v = get(k);
      if (v == nullptr || v->is(value_kind::none)) return dflt;
      if (!v->is(value_kind::string)) {
        fail(line, std::string(fn), "(): argument '", params[k], "' must be a string, not ",
             std::string(type_name(*v)));
      }
      return v->s;
    }
    std::int64_t integer(std::size_t k, std::int64_t dflt) const {
      const value* v = get(k);
      if (v == nullptr || v->is(value_kind::none)) return dflt;
      if (!is_int(*v)) {
        fail(line, std::string(fn), "(): argument '", params[k], "' must be an integer, not ",
             std::string(type_name(*v)));
      }
      return as_int(*v);
    }
    bool flag(std::size_t k, bool dflt) const {
      const value* v = get(k);
      return v ? truthy(*v) : dflt;
    }
  };

  // A global function's call (range, namespace, dict, raise_exception, strftime_now) or a
  // loop's cycle; macros are the interpreter's (text/jinja.hpp).
  value call_builtin(const callable_data& c, const call_args& a, int line) {
    switch (c.kind) {
      case callable_kind::method: return call_method(c.self, c.name, a, line);
      case callable_kind::range: return range(a, line);
      case callable_kind::namespace_:
      case callable_kind::dict: {
        std::vector<std::pair<std::string, value>> entries;
        for (const value& p : a.pos) {
          if (!p.is(value_kind::object) && !p.is(value_kind::space))
            fail(line, std::string(c.name), "() takes a dict or keyword arguments");
          p.each_entry([&](std::string_view k, const value& v) { entries.emplace_back(k, v); });
        }
        for (const auto& kw : a.kw) {
          auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const auto& e) { return e.first == kw.first; });
          if (it != entries.end()) {
            it->second = kw.second;
          } else {
            entries.emplace_back(kw.first, kw.second);
          }
        }
        return value::object(std::move(entries), c.kind == callable_kind::namespace_
                                                     ? value_kind::space
                                                     : value_kind::object);
      }
      case callable_kind::raise_exception: {
        const binder b(a, "raise_exception", line, {"message"});
        const value* m = b.get(0);
        raise(error_code::invalid_argument, "chat template line ", line,
              ": raise_exception: ", m ? str_of(*m, line) : std::string());
      }
      case callable_kind::strftime_now: {
        const binder b(a, "strftime_now", line, {"format"});
        return strftime_now(b.text(0, ""), line);
      }
      case callable_kind::cycle: {
        if (a.pos.empty()) fail(line, "no items for cycling given");
        const auto& l = *static_cast<loop_data*>(c.self.owner.get());
        return a.pos[l.index % a.pos.size()];
      }
      case callable_kind::macro: break;
    }
    fail(line, "not callable");
  }

  value range(const call_args& a, int line) {
    if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3)
      fail(line, "range() takes 1 to 3 integer arguments");
    for (const value& v : a.pos) {
      if (!is_int(v))
        fail(line, "range(): '", std::string(type_name(v)),
             "' object cannot be interpreted as an integer");
    }
    std::int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = as_int(a.pos[0]);
    } else {
      start = as_int(a.pos[0]);
      stop = as_int(a.pos[1]);
      if (a.pos.size() == 3) step = as_int(a.pos[2]);
    }
    if (step == 0) fail(line, "range() arg 3 must not be zero");
    const long double span = (static_cast<long double>(stop) - start) / step;
    const long double count = span > 0 ? std::ceil(span) : 0;
    if (count > static_cast<long double>(opt_.limits.max_iterations))
      fail_limit(line, "range() of more than ", std::to_string(opt_.limits.max_iterations),
                 " items (render_limits)");
    std::vector<value> items;
    const auto n = static_cast<std::int64_t>(count);
    check_items(static_cast<std::size_t>(n), line);
    items.reserve(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) items.push_back(value::integer(start + k * step));
    return value::array(std::move(items));
  }

  value strftime_now(std::string_view format, int line) const {
    std::tm t{};
    if (opt_.now) {
      t = *opt_.now;
    } else {
      const std::time_t now = std::time(nullptr);
      localtime_r(&now, &t);
    }
    if (format.empty()) return value::view("");
    std::string fmt(format);
    check_size(256 + fmt.size() * 8, line);
    std::string buf(256 + fmt.size() * 8, '\0');
    const std::size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
    if (n == 0) fail(line, "strftime_now: format '", fmt, "' gives no text");
    buf.resize(n);
    return value::string(std::move(buf));
  }

  value call_method(const value& self, std::string_view name, const call_args& a, int line) {
    if (self.is(value_kind::string)) {
      const std::string_view t = self.s;
      if (name == "startswith" || name == "endswith") {
        const binder b(a, name, line, {"prefix", "start", "end"});
        const value* p = b.get(0);
        if (p == nullptr) fail(line, std::string(name), "() takes at least 1 argument (0 given)");
        const bool starts = name == "startswith";
        const auto test = [&](const value& x) {
          if (!x.is(value_kind::string)) {
            fail(line, std::string(name), " first arg must be str or a tuple of str, not ",
                 std::string(type_name(x)));
          }
          return starts ? t.substr(0, x.s.size()) == x.s
                        : t.size() >= x.s.size() && t.substr(t.size() - x.s.size()) == x.s;
        };
        if (p->is(value_kind::array) && p->aux) {
          for (std::size_t k = 0; k < p->size(); ++k) {
            if (test(p->at(k))) return value::boolean(true);
          }
          return value::boolean(false);
        }
        return value::boolean(test(*p));
      }
      if (name == "split" || name == "rsplit") {
        const binder b(a, name, line, {"sep", "maxsplit"});
        made(t.size(), line);
        std::vector<value> parts =
            split(self, b.get(0), b.integer(1, -1), name == "rsplit", line, opt_.limits.max_items);
        check_items(parts.size(), line);
        return value::array(std::move(parts));
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const binder b(a, name, line, {"chars"});
        return strip(self, b.get(0), name != "rstrip", name != "lstrip", line);
      }
      if (name == "upper" || name == "lower") {
        const binder b(a, name, line, {});
        return case_changed(self, name == "upper", line);
      }
      if (name == "replace") {
        const binder b(a, name, line, {"old", "new", "count"});
        if (!b.get(0) || !b.get(1)) fail(line, "replace() takes at least 2 arguments");
        return replaced(t, b.text(0, ""), b.text(1, ""), b.integer(2, -1), line);
      }
      if (name == "title") {
        const binder b(a, name, line, {});
        return title_case(self, title_words::python, line);
      }
      if (name == "capitalize") {
        const binder b(a, name, line, {});
        return capitalized(self, line);
      }
      if (name == "find" || name == "count") {
        const binder b(a, name, line, {"sub"});
        const std::string_view sub = b.text(0, "");
        return value::integer(name == "find" ? find_in(t, sub, line) : count_in(t, sub, line));
      }
      if (name == "join") {
        const binder b(a, name, line, {"iterable"});
        const value* it = b.get(0);
        if (!it) fail(line, "join() takes exactly one argument (0 given)");
        return joined(t, items_of(*it, line), true, line);
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        const binder b(a, name, line, {});
        return value::boolean(all_of_class(t,
                                           name == "isdigit"   ? char_class::digit
                                           : name == "isspace" ? char_class::space
                                           : name == "isalpha" ? char_class::alpha
                                                               : char_class::alnum,
                                           line));
      }
      raise(error_code::unsupported, "chat template line ", line, ": str.", name,
            "() is not supported by npullm's Jinja interpreter");
    }
    if (self.is(value_kind::object) && among(dict_methods, name)) {
      if (name == "get") {
        const binder b(a, name, line, {"key", "default"});
        const value* k = b.get(0);
        if (!k) fail(line, "get expected at least 1 argument, got 0");
        value v;
        if (k->is(value_kind::string) && self.get(k->s, v)) return v;
        return b.get(1, value::none());
      }
      const binder b(a, name, line, {});
      std::vector<value> items;
      self.each_entry([&](std::string_view k, const value& v) {
        if (name == "keys") {
          items.push_back(key_value(k, self));
        } else if (name == "values") {
          items.push_back(v);
        } else {
          items.push_back(value::array({key_value(k, self), v}, true));
        }
      });
      return value::array(std::move(items));
    }
    if (self.is(value_kind::array) && (name == "index" || name == "count")) {
      const binder b(a, name, line, {"value"});
      const value* x = b.get(0);
      if (!x) fail(line, std::string(name), "() takes exactly one argument (0 given)");
      std::int64_t n = 0;
      for (std::size_t k = 0; k < self.size(); ++k) {
        if (equal(self.at(k), *x)) {
          if (name == "index") return value::integer(static_cast<std::int64_t>(k));
          ++n;
        }
      }
      if (name == "index") fail(line, "value is not in list");
      return value::integer(n);
    }
    // The sandbox refuses what would change a list or dict.
    fail(line, "access to attribute '", std::string(name), "' of '", std::string(type_name(self)),
         "' object is unsafe");
  }
};

}  // namespace npullm::text::jinja
