// jinja_filters: Jinja's filters and tests as the interpreter applies them (text/jinja.hpp
// evaluates their arguments): abs, attr, capitalize, count, default (d), dictsort, escape (e,
// forceescape), first, float, indent, int, items, join, last, length, list, lower, map, max,
// min, reject, rejectattr, replace, reverse, round, safe, select, selectattr, sort, string,
// sum, title, tojson, trim, unique, upper, wordcount; the tests of jinja_ast.hpp's test_names.
// A filter on text shares its string operation with the str method of the same meaning
// (text/jinja_strings.hpp); a filter's input that is not a string is printed first (str()).
// Sizes are checked before anything is allocated; scans and comparisons count as work.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_ast.hpp"
#include "npullm/text/jinja_methods.hpp"
#include "npullm/text/jinja_print.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// Filters and tests.
class filter_ops : protected method_ops {
 public:
  using method_ops::method_ops;

 protected:
  bool run_test(test_id id, std::string_view name, const value& v, const call_args& a, int line) {
    const auto arg = [&]() -> const value& {
      if (a.pos.empty()) fail(line, "the test '", std::string(name), "' needs an argument");
      return a.pos[0];
    };
    switch (id) {
      case test_id::defined: return !v.is(value_kind::undefined);
      case test_id::undefined: return v.is(value_kind::undefined);
      case test_id::none: return v.is(value_kind::none);
      case test_id::boolean: return v.is(value_kind::boolean);
      case test_id::true_: return v.is(value_kind::boolean) && v.b;
      case test_id::false_: return v.is(value_kind::boolean) && !v.b;
      case test_id::integer: return v.is(value_kind::integer);
      case test_id::float_: return v.is(value_kind::floating);
      case test_id::number: return v.is_number();
      case test_id::string: return v.is(value_kind::string);
      case test_id::mapping: return v.is(value_kind::object);
      case test_id::iterable:
        return v.is(value_kind::string) || v.is(value_kind::array) || v.is(value_kind::object) ||
               v.is(value_kind::undefined);
      case test_id::sequence:
        return v.is(value_kind::string) || v.is(value_kind::array) || v.is(value_kind::object) ||
               v.is(value_kind::undefined);
      case test_id::callable: return v.is(value_kind::callable);
      case test_id::sameas: {
        const value& o = arg();
        if (v.kind != o.kind) return false;
        if (v.is(value_kind::none) || v.is(value_kind::undefined)) return true;
        if (v.is(value_kind::boolean)) return v.b == o.b;
        if (v.borrowed() || o.borrowed()) return v.j == o.j;
        if (v.owner || o.owner) return v.owner == o.owner;
        return equal(v, o);
      }
      case test_id::eq: return equal(v, arg());
      case test_id::ne: return !equal(v, arg());
      case test_id::lt: return order(v, arg(), "<", line) < 0;
      case test_id::le: return order(v, arg(), "<=", line) <= 0;
      case test_id::gt: return order(v, arg(), ">", line) > 0;
      case test_id::ge: return order(v, arg(), ">=", line) >= 0;
      case test_id::in: return contains(arg(), v, line);
      case test_id::odd:
      case test_id::even:
      case test_id::divisibleby: {
        if (v.is(value_kind::undefined)) fail_undefined(line, v);
        if (!is_int(v))
          fail(line, "the test '", std::string(name), "' needs an integer, not ",
               std::string(type_name(v)));
        const std::int64_t x = as_int(v);
        if (id == test_id::odd) return x % 2 != 0;
        if (id == test_id::even) return x % 2 == 0;
        const value& d = arg();
        if (!is_int(d) || as_int(d) == 0) fail(line, "divisibleby needs a non-zero integer");
        return x % as_int(d) == 0;
      }
      case test_id::lower:
      case test_id::upper: {
        return v.is(value_kind::string) && cased_as(v.s, id == test_id::lower);
      }
    }
    return false;
  }

  // A test by its name at render time (select('odd'), selectattr('x', 'equalto', 1)).
  bool test_by_name(std::string_view name, const value& v, const call_args& a, int line) {
    for (const auto& [n, id] : test_names) {
      if (n == name) return run_test(id, name, v, a, line);
    }
    raise(error_code::unsupported, "chat template line ", line, ": the test '", name,
          "' is not supported by npullm's Jinja interpreter");
  }

  // select / reject / selectattr / rejectattr.
  value select(const value& v, const call_args& a, bool by_attribute, bool keep, int line) {
    std::size_t first = 0;
    std::string_view attr;
    if (by_attribute) {
      if (a.pos.empty() || !a.pos[0].is(value_kind::string))
        fail(line, "selectattr / rejectattr need an attribute name");
      attr = a.pos[0].s;
      first = 1;
    }
    std::string_view test;
    call_args rest;
    if (a.pos.size() > first) {
      if (!a.pos[first].is(value_kind::string)) fail(line, "the test name must be a string");
      test = a.pos[first].s;
      rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(first + 1), a.pos.end());
    }
    std::vector<value> out;
    for (const value& x : items_of(v, line)) {
      const value y = by_attribute ? attribute_path(x, attr, line) : x;
      const bool r = test.empty() ? truthy(y) : test_by_name(test, y, rest, line);
      if (r == keep) out.push_back(x);
    }
    return value::array(std::move(out));
  }

  value filter(filter_id id, std::string_view name, value v, const call_args& a, int line) {
    switch (id) {
      case filter_id::safe: {
        const binder b(a, name, line, {});
        return v;
      }
      case filter_id::string: {
        const binder b(a, name, line, {});
        return text_of(v, line);
      }
      case filter_id::trim: {
        const binder b(a, name, line, {"chars"});
        const value s = text_of(v, line);
        return strip(s, b.get(0), true, true, line);
      }
      case filter_id::length:
      case filter_id::count: {
        const binder b(a, name, line, {});
        if (v.is(value_kind::string)) made(v.s.size(), line);  // a scan of the text
        return value::integer(static_cast<std::int64_t>(length(v, line)));
      }
      case filter_id::upper:
      case filter_id::lower: {
        const binder b(a, name, line, {});
        return case_changed(text_of(v, line), id == filter_id::upper, line);
      }
      case filter_id::capitalize: {
        const binder b(a, name, line, {});
        return capitalized(text_of(v, line), line);
      }
      case filter_id::title: {
        const binder b(a, name, line, {});
        return title_case(text_of(v, line), title_words::jinja, line);
      }
      case filter_id::replace: {
        const binder b(a, name, line, {"old", "new", "count"});
        if (!b.get(0) || !b.get(1)) fail(line, "replace needs old and new");
        const value s = text_of(v, line);
        return replaced(s.s, text_of(*b.get(0), line).s, text_of(*b.get(1), line).s,
                        b.integer(2, -1), line);
      }
      case filter_id::escape: {
        const binder b(a, name, line, {});
        return escaped(text_of(v, line).s, line);
      }
      case filter_id::indent: {
        const binder b(a, name, line, {"width", "first", "blank"});
        std::string pad;
        const value w = b.get(0, value::integer(4));
        if (w.is(value_kind::string)) {
          pad = std::string(w.s);
        } else {
          pad.assign(static_cast<std::size_t>(std::clamp<std::int64_t>(b.integer(0, 4), 0, 1024)),
                     ' ');
        }
        const bool first = b.flag(1, false), blank = b.flag(2, false);
        std::string s = to_str(v, bound(line));
        made(s.size(), line);
        return indented(std::move(s), pad, first, blank, line);
      }
      case filter_id::default_: {
        const binder b(a, name, line, {"default_value", "boolean"});
        const bool use = b.flag(1, false) ? !truthy(v) : v.is(value_kind::undefined);
        return use ? b.get(0, value::view("")) : v;
      }
      case filter_id::first:
      case filter_id::last: {
        const binder b(a, name, line, {});
        if (v.is(value_kind::array) && v.size() != 0)
          return v.at(id == filter_id::first ? 0 : v.size() - 1);
        if (v.is(value_kind::array) || v.is(value_kind::undefined)) return value::undefined(name);
        const std::vector<value> items = items_of(v, line);
        if (items.empty()) return value::undefined(name);
        return id == filter_id::first ? items.front() : items.back();
      }
      case filter_id::items: {
        const binder b(a, name, line, {});
        if (v.is(value_kind::undefined)) return value::array({});
        if (!v.is(value_kind::object)) fail(line, "Can only get item pairs from a mapping.");
        std::vector<value> items;
        v.each_entry([&](std::string_view k, const value& x) {
          items.push_back(value::array({key_value(k, v), x}, true));
        });
        return value::array(std::move(items));
      }
      case filter_id::list: {
        const binder b(a, name, line, {});
        return value::array(items_of(v, line));
      }
      case filter_id::reverse: {
        const binder b(a, name, line, {});
        if (v.is(value_kind::string)) return reversed(v, line);
        std::vector<value> items = items_of(v, line);
        std::reverse(items.begin(), items.end());
        return value::array(std::move(items));
      }
      case filter_id::join: {
        const binder b(a, name, line, {"d", "attribute"});
        const std::string_view sep = b.text(0, "");
        const value* attr = b.get(1);
        std::vector<value> items = items_of(v, line);
        if (attr && !attr->is(value_kind::none)) {
          const std::string path = str_of(*attr, line);
          for (value& x : items) x = attribute_path(x, path, line);
        }
        return joined(sep, items, false, line);
      }
      case filter_id::map: {
        std::vector<value> out;
        const value* attr = nullptr;
        const value* dflt = nullptr;
        for (const auto& [k, x] : a.kw) {
          if (k == "attribute")
            attr = &x;
          else if (k == "default")
            dflt = &x;
          else if (a.pos.empty())
            fail(line, "map got an unexpected keyword argument '", std::string(k), "'");
        }
        const std::vector<value> items = items_of(v, line);
        if (attr) {
          for (const value& x : items) {
            value y = attribute_path(x, str_of(*attr, line), line);
            if (y.is(value_kind::undefined) && dflt) y = *dflt;
            out.push_back(std::move(y));
          }
          return value::array(std::move(out));
        }
        if (a.pos.empty() || !a.pos[0].is(value_kind::string))
          fail(line, "map needs a filter name or attribute=");
        const std::string_view fname = a.pos[0].s;
        filter_id fid{};
        bool known = false;
        for (const auto& [n, i] : filter_names) {
          if (n == fname) {
            fid = i;
            known = true;
          }
        }
        if (!known) {
          raise(error_code::unsupported, "chat template line ", line, ": the filter '", fname,
                "' is not supported by npullm's Jinja interpreter");
        }
        call_args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (const value& x : items) out.push_back(filter(fid, fname, x, rest, line));
        return value::array(std::move(out));
      }
      case filter_id::select: return select(v, a, false, true, line);
      case filter_id::reject: return select(v, a, false, false, line);
      case filter_id::selectattr: return select(v, a, true, true, line);
      case filter_id::rejectattr: return select(v, a, true, false, line);
      case filter_id::attr: {
        const binder b(a, name, line, {"name"});
        const std::string_view n = b.text(0, "");
        const std::shared_ptr<void> keep = b.get(0) ? b.get(0)->owner : nullptr;
        if (v.is(value_kind::object)) {
          // getattr only: a dict's keys are not its attributes.
          if (among(dict_methods, n)) return builtin(callable_kind::method, method_name(n), v);
          value u = value::undefined(n, undefined_from::attribute, v.kind);
          u.owner = keep;
          return u;
        }
        return get_attribute(v, n, line, keep);
      }
      case filter_id::int_: {
        const binder b(a, name, line, {"default", "base"});
        const value dflt = b.get(0, value::integer(0));
        if (is_int(v)) return value::integer(as_int(v));
        if (v.is(value_kind::floating)) {
          if (!std::isfinite(v.d) || std::fabs(v.d) >= 9.2e18) return dflt;
          return value::integer(static_cast<std::int64_t>(v.d));
        }
        if (v.is(value_kind::string)) {
          const value s = strip(v, nullptr, true, true, line);
          std::string digits;
          for (const char c : s.s) {
            if (c != '_') digits += c;
          }
          std::int64_t x = 0;
          const int base = static_cast<int>(b.integer(1, 10));
          const char* p = digits.data() + (!digits.empty() && digits[0] == '+');
          const auto r = std::from_chars(p, digits.data() + digits.size(), x,
                                         base < 2 || base > 36 ? 10 : base);
          if (r.ec == std::errc{} && r.ptr == digits.data() + digits.size() && !digits.empty())
            return value::integer(x);
          char* end = nullptr;
          const double d = std::strtod(digits.c_str(), &end);
          if (!digits.empty() && end == digits.c_str() + digits.size() && std::isfinite(d) &&
              std::fabs(d) < 9.2e18)
            return value::integer(static_cast<std::int64_t>(d));
        }
        return dflt;
      }
      case filter_id::float_: {
        const binder b(a, name, line, {"default"});
        if (v.is_number()) return value::floating(as_double(v));
        if (v.is(value_kind::string)) {
          const value s = strip(v, nullptr, true, true, line);
          const std::string t(s.s);
          char* end = nullptr;
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end == t.c_str() + t.size()) return value::floating(d);
        }
        return b.get(0, value::floating(0.0));
      }
      case filter_id::abs: {
        const binder b(a, name, line, {});
        if (v.is(value_kind::floating)) return value::floating(std::fabs(v.d));
        if (is_int(v)) {
          const std::int64_t x = as_int(v);
          if (x == std::numeric_limits<std::int64_t>::min()) fail(line, "integer overflow");
          return value::integer(x < 0 ? -x : x);
        }
        fail(line, "bad operand type for abs(): '", std::string(type_name(v)), "'");
      }
      case filter_id::round: {
        const binder b(a, name, line, {"precision", "method"});
        if (!v.is_number()) fail(line, "round needs a number, not ", std::string(type_name(v)));
        const std::int64_t p = std::clamp<std::int64_t>(b.integer(0, 0), -300, 300);
        const std::string_view method = b.text(1, "common");
        const double scale = std::pow(10.0, static_cast<double>(p));
        const double x = as_double(v) * scale;
        double r;
        if (method == "common")
          r = std::nearbyint(x);  // Python's round: half to even
        else if (method == "ceil")
          r = std::ceil(x);
        else if (method == "floor")
          r = std::floor(x);
        else
          fail(line, "method must be 'common', 'ceil' or 'floor'");
        return value::floating(r / scale);
      }
      case filter_id::wordcount: {
        const binder b(a, name, line, {});
        return value::integer(word_count(text_of(v, line).s, line));
      }
      case filter_id::tojson: {
        const binder b(a, name, line, {"ensure_ascii", "indent", "separators", "sort_keys"});
        json_format f;
        f.ensure_ascii = b.flag(0, false);
        const value* indent = b.get(1);
        if (indent && !indent->is(value_kind::none)) {
          f.indented = true;
          if (indent->is(value_kind::string)) {
            f.indent = std::string(indent->s);
          } else if (is_int(*indent)) {
            f.indent.assign(
                static_cast<std::size_t>(std::clamp<std::int64_t>(as_int(*indent), 0, 1024)), ' ');
          } else {
            fail(line, "tojson: indent must be an integer or a string");
          }
          f.item_sep = ",";
        }
        const value* seps = b.get(2);
        if (seps && !seps->is(value_kind::none)) {
          if (!seps->is(value_kind::array) || seps->size() != 2 ||
              !seps->at(0).is(value_kind::string) || !seps->at(1).is(value_kind::string)) {
            fail(line, "tojson: separators must be two strings");
          }
          f.item_sep = std::string(seps->at(0).s);
          f.key_sep = std::string(seps->at(1).s);
        }
        f.sort_keys = b.flag(3, false);
        std::string s;
        append_json(s, v, f, bound(line));
        made(s.size(), line);
        return value::string(std::move(s));
      }
      case filter_id::sort:
      case filter_id::unique:
      case filter_id::min:
      case filter_id::max: {
        const bool sort = id == filter_id::sort;
        const binder b(
            a, name, line,
            sort ? std::initializer_list<std::string_view>{"reverse", "case_sensitive", "attribute"}
                 : std::initializer_list<std::string_view>{"case_sensitive", "attribute"});
        const bool reverse = sort && b.flag(0, false);
        const bool case_sensitive = b.flag(sort ? 1 : 0, false);
        const value* attr = b.get(sort ? 2 : 1);
        std::vector<value> items = items_of(v, line);
        const auto key = [&](const value& x) {
          value k = attr && !attr->is(value_kind::none)
                        ? attribute_path(x, str_of(*attr, line), line)
                        : x;
          if (!case_sensitive && k.is(value_kind::string)) return case_changed(k, false, line);
          return k;
        };
        if (id == filter_id::unique) {
          std::vector<value> out, seen;
          for (const value& x : items) {
            const value k = key(x);
            if (std::none_of(seen.begin(), seen.end(),
                             [&](const value& s) { return counted_equal(s, k, line); })) {
              seen.push_back(k);
              out.push_back(x);
            }
          }
          return value::array(std::move(out));
        }
        std::vector<std::pair<value, value>> keyed;
        for (const value& x : items) keyed.emplace_back(key(x), x);
        std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
          return reverse ? counted_less(q.first, p.first, line)
                         : counted_less(p.first, q.first, line);
        });
        if (id == filter_id::min)
          return keyed.empty() ? value::undefined(name) : keyed.front().second;
        if (id == filter_id::max)
          return keyed.empty() ? value::undefined(name) : keyed.back().second;
        std::vector<value> out;
        for (auto& p : keyed) out.push_back(std::move(p.second));
        return value::array(std::move(out));
      }
      case filter_id::dictsort: {
        const binder b(a, name, line, {"case_sensitive", "by", "reverse"});
        if (!v.is(value_kind::object)) fail(line, "dictsort needs a dict");
        const bool case_sensitive = b.flag(0, false);
        const bool by_value = b.text(1, "key") == "value";
        const bool reverse = b.flag(2, false);
        std::vector<value> items;
        v.each_entry([&](std::string_view k, const value& x) {
          items.push_back(value::array({key_value(k, v), x}, true));
        });
        const auto key = [&](const value& p) {
          value k = p.at(by_value ? 1 : 0);
          if (!case_sensitive && k.is(value_kind::string)) return case_changed(k, false, line);
          return k;
        };
        std::stable_sort(items.begin(), items.end(), [&](const value& p, const value& q) {
          return reverse ? counted_less(key(q), key(p), line) : counted_less(key(p), key(q), line);
        });
        return value::array(std::move(items));
      }
      case filter_id::sum: {
        const binder b(a, name, line, {"attribute", "start"});
        const value* attr = b.get(0);
        value total = b.get(1, value::integer(0));
        for (const value& x : items_of(v, line)) {
          total =
              add(std::move(total),
                  attr && !attr->is(value_kind::none) ? attribute_path(x, str_of(*attr, line), line)
                                                      : x,
                  line);
        }
        return total;
      }
    }
    fail(line, "filter '", std::string(name), "' not implemented");
  }
};

}  // namespace npullm::text::jinja
