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
// Printing values (str(), repr(), tojson) is text/jinja_print.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
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

// Printing (text/jinja_print.hpp) and comparing (text/jinja_ops.hpp) recurse once a level of
// nesting: the caller's JSON (not bounded by max_nesting) nested deeper than max_print_depth
// is refused rather than overflowing the stack.
inline constexpr int max_print_depth = 1024;

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

}  // namespace npullm::text::jinja
