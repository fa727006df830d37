// jinja: a Jinja2 interpreter for chat templates, rendering as Hugging Face transformers'
// apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols; tojson = json.dumps(ensure_ascii=False); raise_exception; strftime_now).
//
//   auto t = jinja::template_program::parse(source);          // once: syntax tree
//   std::string text = t.render(variables, options);          // variables: a JSON object
//
// Semantics are Jinja2's and Python's: Undefined prints as nothing, is false and iterates as
// empty, but an attribute of it, arithmetic or comparison on it is an error ("'x' is
// undefined", "'dict object' has no attribute 'y'"); None + 'a' is Python's TypeError; a
// `set` inside a for loop stays in that iteration (namespace() carries values out); macros
// return their text. Syntax (statements, expressions, filters, tests): text/jinja_parser.hpp;
// values: text/jinja_value.hpp; Python's operations on them: text/jinja_ops.hpp. Methods: str's
// startswith, endswith, split, rsplit, strip, lstrip, rstrip, upper, lower, replace, title,
// capitalize, find, count, join, isdigit, isspace, isalpha, isalnum (not format); dict's items,
// keys, values, get; list's index, count. Globals: range, namespace, dict, raise_exception,
// strftime_now. upper / lower / title / capitalize change ASCII letters only.
//
// The template is untrusted input: it reaches only the variables given, lists and dicts are
// immutable (list.append is the sandbox's error), and render_limits bound the output, every
// string made (its size is computed, or checked piece by piece, before it is allocated: a
// replace, `*`, `~`, indent or tojson bomb is refused, never a std::bad_alloc), every list made,
// the total work of a render (bytes of strings and lists made or scanned), the loop iterations
// (all loops together, range() sizes too), nested macro calls and the interpreter's
// recursion; lists built inside lists nest at most max_nesting deep; parse_limits bound the
// syntax tree's depth (text/jinja_parser.hpp). A render past a limit is capacity_exhausted
// naming the limit, never a crash or a hang. Building a string or a list by appending in a
// loop ({% set ns.s = ns.s ~ x %}, {% set ns.xs = ns.xs + [x] %}) grows it in place when
// nothing else holds it: linear, not quadratic.
//
// Errors (npullm::error, message "chat template line N: ..."): raise_exception(msg) is
// invalid_argument whose message ends with msg; type errors and undefined values are
// invalid_argument with Python's / Jinja's words.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_ops.hpp"
#include "npullm/text/jinja_parser.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// What one render may use; past any of them the render is capacity_exhausted naming it.
// The defaults keep a render within about 1 GiB of memory and a few seconds.
struct render_limits {
  std::size_t max_output_bytes = std::size_t{16} << 20;  // the text, and any string made
  std::size_t max_iterations = std::size_t{1} << 20;     // loop iterations of one render
  std::size_t max_call_depth = 64;                       // macro calls inside macro calls
  std::size_t max_depth = 1024;  // expressions and statements evaluated inside one another
                                 // (macro calls' bodies included): the interpreter's recursion
  std::size_t max_items = std::size_t{1} << 20;  // elements of any list made (48 bytes each)
  // Bytes of strings and lists made, output written and text scanned by the operations of
  // one render, all together (a comparison of two values counts 16): bounds the time of a
  // render that makes or scans big values many times (quadratic appends, a 16 MiB string
  // copied in each of 10^6 iterations) to about a second.
  std::size_t max_work_bytes = std::size_t{1} << 30;
};

struct render_options {
  // strftime_now's date and time (a std::tm as localtime gives it); absent: the current local
  // time.
  std::optional<std::tm> now;
  render_limits limits;
};

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

class template_program;

class evaluator : python_ops {
 public:
  evaluator(const json& vars, const render_options& opt, std::string& out)
      : vars_(vars), opt_(opt), out_(&out) {}

  void run(const std::vector<node_ptr>& body) {
    scope top;
    top_ = &top;
    exec_body(body, top);
  }

 private:
  enum class flow : std::uint8_t { normal, break_, continue_ };

  struct scope {
    std::vector<std::pair<std::string_view, value>> vars;
    scope* parent = nullptr;

    value* find(std::string_view name) {
      for (scope* s = this; s != nullptr; s = s->parent) {
        for (auto& [k, v] : s->vars) {
          if (k == name) return &v;
        }
      }
      return nullptr;
    }
    void assign(std::string_view name, value v) {
      for (auto& [k, x] : vars) {
        if (k == name) {
          x = std::move(v);
          return;
        }
      }
      vars.emplace_back(name, std::move(v));
    }
  };

  struct call_args {
    std::vector<value> pos;
    std::vector<std::pair<std::string_view, value>> kw;
  };

  // ---- limits -----------------------------------------------------------------------------
  // Strings made are bounded by max_output_bytes, checked before they are allocated.
  [[nodiscard]] text_bound bound(int line) const { return {opt_.limits.max_output_bytes, line}; }
  // A string of n bytes about to be made: refused past the limit, else counted as work.
  void check_size(std::size_t n, int line) const {
    if (n > opt_.limits.max_output_bytes) {
      fail_limit(line, "text of ", std::to_string(n), " bytes exceeds the limit of ",
                 std::to_string(opt_.limits.max_output_bytes),
                 " (render_limits::max_output_bytes)");
    }
    made(n, line);
  }
  // A list of n elements about to be made: refused past max_items, else counted as work.
  void check_items(std::size_t n, int line) const {
    if (n > opt_.limits.max_items) {
      fail_limit(line, "a list of ", std::to_string(n), " items exceeds the limit of ",
                 std::to_string(opt_.limits.max_items), " (render_limits::max_items)");
    }
    made(n * sizeof(value), line);
  }
  // bytes of work done (made, written or scanned): refused past max_work_bytes in all.
  void made(std::size_t bytes, int line) const {
    work_ += bytes;
    if (work_ > opt_.limits.max_work_bytes) {
      fail_limit(line, "more than ", std::to_string(opt_.limits.max_work_bytes),
                 " bytes of strings and lists made or scanned in one render "
                 "(render_limits::max_work_bytes)");
    }
  }
  // The items of v (iterate) once their number is known to be within max_items.
  std::vector<value> items_of(const value& v, int line) const {
    if (v.is(value_kind::array) || v.is(value_kind::object)) {
      check_items(v.size(), line);
    } else if (v.is(value_kind::string)) {
      made(v.s.size(), line);
      check_items(detail_eval::char_count(v.s), line);
    }
    return iterate(v, line);
  }
  // str(v), bounded by max_output_bytes as it is made, counted as work.
  std::string str_of(const value& v, int line) const {
    std::string s = to_str(v, bound(line));
    made(s.size(), line);
    return s;
  }
  // v itself when a string, else str(v) as a string value.
  value text_of(const value& v, int line) const {
    return v.is(value_kind::string) ? v : value::string(str_of(v, line));
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
  void count_iteration(int line) {
    if (++iterations_ > opt_.limits.max_iterations) {
      fail_limit(line, "more than ", std::to_string(opt_.limits.max_iterations),
                 " loop iterations (render_limits)");
    }
  }

  // ---- statements --------------------------------------------------------------------------
  flow exec_body(const std::vector<node_ptr>& body, scope& sc) {
    for (const auto& n : body) {
      const flow f = exec(*n, sc);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  void emit(std::string_view text, int line) {
    room(*out_, text.size(), bound(line));
    made(text.size(), line);
    out_->append(text);
  }
  // str(v) written to the output, bounded as it is written.
  void emit_value(const value& v, int line) {
    const std::size_t before = out_->size();
    append_str(*out_, v, bound(line));
    made(out_->size() - before, line);
  }

  // One level of the interpreter's recursion, refused past render_limits::max_depth.
  struct depth_guard {
    evaluator& e;
    int line;
    depth_guard(evaluator& ev, int l) : e(ev), line(l) {
      if (++e.eval_depth_ > e.opt_.limits.max_depth) {
        --e.eval_depth_;
        fail_limit(line, "expressions and statements nested deeper than ", e.opt_.limits.max_depth,
                   " while rendering (render_limits)");
      }
    }
    ~depth_guard() { --e.eval_depth_; }
    depth_guard(const depth_guard&) = delete;
    depth_guard& operator=(const depth_guard&) = delete;
  };

  flow exec(const node& n, scope& sc) {
    const depth_guard guard(*this, n.line);
    switch (n.kind) {
      case node_kind::data: emit(n.text, n.line); return flow::normal;
      case node_kind::output: {
        emit_value(eval(*n.kids[0], sc), n.line);
        return flow::normal;
      }
      case node_kind::if_: return exec_body(truthy(eval(*n.kids[0], sc)) ? n.body : n.orelse, sc);
      case node_kind::for_: return exec_for(n, sc);
      case node_kind::set: {
        value v;
        if (!grow_in_place(n, sc, v)) v = eval(*n.kids[0], sc);
        if (!n.text.empty()) {
          value* ns = sc.find(n.names[0]);
          if (ns == nullptr || !ns->is(value_kind::space)) {
            fail(n.line, "cannot assign attribute on non-namespace object ('", n.names[0], "' is ",
                 (ns ? std::string(type_name(*ns)) : "undefined"), ")");
          }
          object_data& o = ns->obj();
          if (v.nest().has_space) {
            raise(error_code::unsupported, "chat template line ", n.line,
                  ": a namespace holding a namespace is not supported");
          }
          o.nest = value::outer(o.nest, v);  // before the change: an error leaves it as it was
          if (value* x = o.find(n.text)) {
            *x = std::move(v);
          } else {
            o.entries.emplace_back(n.text, std::move(v));
          }
        } else {
          assign_targets(n.names, std::move(v), sc, n.line);
        }
        return flow::normal;
      }
      case node_kind::set_block: {
        value v = value::string(capture(n.body, sc));
        for (const auto& f : n.kids) v = apply_filter(*f, std::move(v), sc);
        sc.assign(n.names[0], std::move(v));
        return flow::normal;
      }
      case node_kind::filter_block: {
        value v = value::string(capture(n.body, sc));
        for (const auto& f : n.kids) v = apply_filter(*f, std::move(v), sc);
        emit_value(v, n.line);
        return flow::normal;
      }
      case node_kind::macro: {
        auto c = std::make_shared<callable_data>();
        c->kind = callable_kind::macro;
        c->macro = &n;
        c->name = n.text;
        value v;
        v.kind = value_kind::callable;
        v.owner = std::move(c);
        sc.assign(n.text, std::move(v));
        return flow::normal;
      }
      case node_kind::with: {
        scope inner;
        inner.parent = &sc;
        for (std::size_t k = 0; k < n.names.size(); ++k)
          inner.assign(n.names[k], eval(*n.kids[k], sc));
        return exec_body(n.body, inner);
      }
      case node_kind::scope: return exec_body(n.body, sc);
      case node_kind::break_: return flow::break_;
      case node_kind::continue_: return flow::continue_;
      default: fail(n.line, "an expression where a statement belongs");
    }
  }

  std::string capture(const std::vector<node_ptr>& body, scope& sc) {
    std::string text;
    std::string* saved = out_;
    out_ = &text;
    try {
      exec_body(body, sc);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return text;
  }

  // {% set x = x ~ a ~ b %}, {% set x = x + y %}, {% set ns.x = ns.x ~ a %}: the variable's
  // value (of this scope, or the namespace's attribute) is let go before the operation, so that
  // the operation holds it alone and appends in place: a string or list built by appending in
  // a loop costs its length in all, not its length squared. The operands are evaluated first,
  // from a copy, as they would be (they may read the variable); the variable is let go only if
  // they left it as it was. Only chains of ~ (never a type error) or one +. Returns false (v
  // untouched) where the set is not of that form.
  bool grow_in_place(const node& n, scope& sc, value& v) {
    const node& e = *n.kids[0];
    if (e.kind != node_kind::binary || n.names.size() != 1) return false;
    const op o = e.ops[0];
    if ((o != op::concat && o != op::add) || (o == op::add && e.ops.size() != 1)) return false;
    for (const op x : e.ops) {
      if (x != o) return false;
    }
    const node& first = *e.kids[0];
    const bool plain = n.text.empty();
    if (plain ? (first.kind != node_kind::name || first.text != n.names[0])
              : (first.kind != node_kind::attribute || first.text != n.text ||
                 first.kids[0]->kind != node_kind::name || first.kids[0]->text != n.names[0])) {
      return false;
    }
    const auto slot = [&]() -> value* {
      if (plain) {
        for (auto& [k, x] : sc.vars) {
          if (k == n.names[0]) return &x;
        }
        return nullptr;
      }
      value* ns = sc.find(n.names[0]);
      return ns != nullptr && ns->is(value_kind::space) ? ns->obj().find(n.text) : nullptr;
    };
    const value* at = slot();
    if (at == nullptr ||
        !(at->is(value_kind::string) || (o == op::add && at->is(value_kind::array)))) {
      return false;
    }
    value l = *at;
    std::vector<value> operands;
    operands.reserve(e.kids.size() - 1);
    for (std::size_t k = 1; k < e.kids.size(); ++k) operands.push_back(eval(*e.kids[k], sc));
    value* still = slot();
    if (still != nullptr && still->kind == l.kind && still->owner == l.owner &&
        still->s.data() == l.s.data() && still->s.size() == l.s.size()) {
      *still = value();  // given back by the assignment that follows
    }
    for (const value& r : operands)
      l = o == op::concat ? concat(std::move(l), r, e.line) : add(std::move(l), r, e.line);
    v = std::move(l);
    return true;
  }

  void assign_targets(const std::vector<std::string>& names, value v, scope& sc, int line) {
    if (names.size() == 1) {
      sc.assign(names[0], std::move(v));
      return;
    }
    const std::vector<value> items = items_of(v, line);
    if (items.size() != names.size()) {
      fail(line, items.size() > names.size() ? "too many" : "not enough",
           " values to unpack (expected ", names.size(), ", got ", items.size(), ")");
    }
    for (std::size_t k = 0; k < names.size(); ++k) sc.assign(names[k], items[k]);
  }

  flow exec_for(const node& n, scope& sc) {
    const value seq = eval(*n.kids[0], sc);
    auto loop = std::make_shared<loop_data>();
    std::vector<value> all = items_of(seq, n.line);
    scope it;
    it.parent = &sc;
    if (n.kids[1]) {  // {% for x in xs if cond %}: filtered before the loop counts
      for (auto& x : all) {
        count_iteration(n.line);
        it.vars.clear();
        assign_targets(n.names, x, it, n.line);
        if (truthy(eval(*n.kids[1], it))) loop->items.push_back(std::move(x));
      }
    } else {
      loop->items = std::move(all);
    }
    value loop_value;
    loop_value.kind = value_kind::loop;
    loop_value.owner = loop;
    const std::size_t count = loop->items.size();
    for (std::size_t k = 0; k < count; ++k) {
      count_iteration(n.line);
      loop->index = k;
      it.vars.clear();  // each iteration's sets stay in it
      it.vars.emplace_back("loop", loop_value);
      assign_targets(n.names, loop->items[k], it, n.line);
      if (exec_body(n.body, it) == flow::break_) break;
    }
    if (count == 0) return exec_body(n.orelse, sc);
    return flow::normal;
  }

  // ---- expressions ---------------------------------------------------------------------------

  value lookup(const node& n, scope& sc) {
    if (value* v = sc.find(n.text)) return *v;
    if (vars_.is_object()) {
      const auto it = vars_.find(n.text);
      if (it != vars_.end()) return value::from_json(*it);
    }
    static constexpr std::array<std::pair<std::string_view, callable_kind>, 5> globals = {{
        {"range", callable_kind::range},
        {"namespace", callable_kind::namespace_},
        {"dict", callable_kind::dict},
        {"raise_exception", callable_kind::raise_exception},
        {"strftime_now", callable_kind::strftime_now},
    }};
    for (const auto& [name, kind] : globals) {
      if (name == n.text) return builtin(kind, name);
    }
    return value::undefined(n.text);
  }

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

  value eval(const node& n, scope& sc) {
    const depth_guard guard(*this, n.line);
    switch (n.kind) {
      case node_kind::literal: return n.literal;
      case node_kind::name: return lookup(n, sc);
      case node_kind::list:
      case node_kind::tuple: {
        std::vector<value> items;
        check_items(n.kids.size(), n.line);
        items.reserve(n.kids.size());
        for (const auto& k : n.kids) items.push_back(eval(*k, sc));
        return value::array(std::move(items), n.kind == node_kind::tuple);
      }
      case node_kind::dict: {
        std::vector<std::pair<std::string, value>> entries;
        for (std::size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const value key = eval(*n.kids[k], sc);
          if (!key.is(value_kind::string)) {
            fail(n.line, "dict keys must be strings here (a key is ", std::string(type_name(key)),
                 ")");
          }
          value v = eval(*n.kids[k + 1], sc);
          auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const auto& e) { return e.first == key.s; });
          if (it != entries.end()) {
            it->second = std::move(v);
          } else {
            entries.emplace_back(std::string(key.s), std::move(v));
          }
        }
        return value::object(std::move(entries));
      }
      case node_kind::attribute: return get_attribute(eval(*n.kids[0], sc), n.text, n.line);
      case node_kind::index: return get_item(eval(*n.kids[0], sc), eval(*n.kids[1], sc), n.line);
      case node_kind::slice: return slice(n, sc);
      case node_kind::call: return call(n, sc);
      case node_kind::filter: return apply_filter(n, eval(*n.kids[0], sc), sc);
      case node_kind::test: {
        const bool r = apply_test(n, eval(*n.kids[0], sc), sc);
        return value::boolean(n.negated ? !r : r);
      }
      case node_kind::unary: {
        const value v = eval(*n.kids[0], sc);
        const auto o = static_cast<op>(n.id);
        if (o == op::not_) return value::boolean(!truthy(v));
        if (v.is(value_kind::undefined)) fail_undefined(n.line, v);
        if (v.is(value_kind::floating)) return value::floating(o == op::neg ? -v.d : v.d);
        if (v.is(value_kind::integer) || v.is(value_kind::boolean)) {
          const std::int64_t x = v.is(value_kind::boolean) ? v.b : v.i;
          if (o == op::neg && x == std::numeric_limits<std::int64_t>::min())
            fail(n.line, "integer overflow");
          return value::integer(o == op::neg ? -x : x);
        }
        fail(n.line, std::string("bad operand type for unary "), (o == op::neg ? "-" : "+"), ": '",
             std::string(type_name(v)), "'");
      }
      case node_kind::binary: {
        // A chain of one precedence, left to right, by a loop (no recursion on its length);
        // the value so far is consumed by ~ and +, which append in place when they can.
        value l = eval(*n.kids[0], sc);
        for (std::size_t k = 0; k < n.ops.size(); ++k) {
          const node& r = *n.kids[k + 1];
          switch (n.ops[k]) {
            case op::and_:
              if (truthy(l)) l = eval(r, sc);
              break;
            case op::or_:
              if (!truthy(l)) l = eval(r, sc);
              break;
            case op::concat: l = concat(std::move(l), eval(r, sc), n.line); break;
            case op::add: l = add(std::move(l), eval(r, sc), n.line); break;
            default: l = binary(n.ops[k], l, eval(r, sc), n.line);
          }
        }
        return l;
      }
      case node_kind::compare: {
        value l = eval(*n.kids[0], sc);
        for (std::size_t k = 0; k < n.ops.size(); ++k) {
          value r = eval(*n.kids[k + 1], sc);
          if (!compare(n.ops[k], l, r, n.line)) return value::boolean(false);
          l = std::move(r);
        }
        return value::boolean(true);
      }
      case node_kind::condition: {
        if (truthy(eval(*n.kids[1], sc))) return eval(*n.kids[0], sc);
        return n.kids[2] ? eval(*n.kids[2], sc) : value::undefined("else");
      }
      default: fail(n.line, "a statement where an expression belongs");
    }
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

  value slice(const node& n, scope& sc) {
    const value obj = eval(*n.kids[0], sc);
    value parts[3];
    for (int k = 0; k < 3; ++k) {
      if (n.kids[static_cast<std::size_t>(k + 1)])
        parts[k] = eval(*n.kids[static_cast<std::size_t>(k + 1)], sc);
    }
    const auto part = [&](int k) -> const value* {
      return n.kids[static_cast<std::size_t>(k + 1)] ? &parts[k] : nullptr;
    };
    if (obj.is(value_kind::undefined)) fail_undefined(n.line, obj);
    if (obj.is(value_kind::array)) {
      const auto r =
          slice_indices(static_cast<std::int64_t>(obj.size()), part(0), part(1), part(2), n.line);
      std::vector<value> items;
      items.reserve(static_cast<std::size_t>(r.count));
      for (std::int64_t k = 0; k < r.count; ++k)
        items.push_back(obj.at(static_cast<std::size_t>(r.start + k * r.step)));
      return value::array(std::move(items), obj.aux != 0);
    }
    if (obj.is(value_kind::string)) {
      made(obj.s.size() * (1 + sizeof(std::size_t)), n.line);
      const auto at = detail_eval::char_starts(obj.s);
      const auto r = slice_indices(static_cast<std::int64_t>(at.size()) - 1, part(0), part(1),
                                   part(2), n.line);
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
    fail(n.line, "'", std::string(type_name(obj)), "' object is not subscriptable");
  }

  // ---- operators -------------------------------------------------------------------------

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

  // ---- calls ------------------------------------------------------------------------------
  call_args arguments(const node& n, scope& sc, std::size_t first) {
    call_args a;
    const std::size_t nkw = n.names.size();
    const std::size_t npos = n.kids.size() - first - nkw;
    a.pos.reserve(npos);
    for (std::size_t k = 0; k < npos; ++k) a.pos.push_back(eval(*n.kids[first + k], sc));
    for (std::size_t k = 0; k < nkw; ++k)
      a.kw.emplace_back(n.names[k], eval(*n.kids[first + npos + k], sc));
    return a;
  }

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

  value call(const node& n, scope& sc) {
    const node& callee = *n.kids[0];
    value fn;
    if (callee.kind == node_kind::attribute) {
      // obj.method(...) without making the bound method.
      const value obj = eval(*callee.kids[0], sc);
      if ((obj.is(value_kind::string) && among(string_methods, callee.text)) ||
          (obj.is(value_kind::object) && among(dict_methods, callee.text))) {
        return call_method(obj, callee.text, arguments(n, sc, 1), n.line);
      }
      fn = get_attribute(obj, callee.text, callee.line);
    } else {
      fn = eval(callee, sc);
    }
    if (fn.is(value_kind::undefined)) fail_undefined(n.line, fn);
    if (!fn.is(value_kind::callable)) {
      fail(n.line, "'", std::string(type_name(fn)), "' object is not callable");
    }
    const auto& c = *static_cast<callable_data*>(fn.owner.get());
    const call_args a = arguments(n, sc, 1);
    switch (c.kind) {
      case callable_kind::macro: return call_macro(c, a, n.line);
      case callable_kind::method: return call_method(c.self, c.name, a, n.line);
      case callable_kind::range: return range(a, n.line);
      case callable_kind::namespace_:
      case callable_kind::dict: {
        std::vector<std::pair<std::string, value>> entries;
        for (const value& p : a.pos) {
          if (!p.is(value_kind::object) && !p.is(value_kind::space))
            fail(n.line, std::string(c.name), "() takes a dict or keyword arguments");
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
        const binder b(a, "raise_exception", n.line, {"message"});
        const value* m = b.get(0);
        raise(error_code::invalid_argument, "chat template line ", n.line,
              ": raise_exception: ", m ? str_of(*m, n.line) : std::string());
      }
      case callable_kind::strftime_now: {
        const binder b(a, "strftime_now", n.line, {"format"});
        return strftime_now(b.text(0, ""), n.line);
      }
      case callable_kind::cycle: {
        if (a.pos.empty()) fail(n.line, "no items for cycling given");
        const auto& l = *static_cast<loop_data*>(c.self.owner.get());
        return a.pos[l.index % a.pos.size()];
      }
    }
    fail(n.line, "not callable");
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

  value call_macro(const callable_data& c, const call_args& a, int line) {
    const node& m = *c.macro;
    if (a.pos.size() > m.names.size()) {
      fail(line, "macro '", m.text, "' takes not more than ", std::to_string(m.names.size()),
           " argument(s)");
    }
    if (++depth_ > opt_.limits.max_call_depth) {
      --depth_;
      fail_limit(line, "macro calls nested deeper than ",
                 std::to_string(opt_.limits.max_call_depth), " (render_limits)");
    }
    struct call_guard {
      std::size_t& d;
      ~call_guard() { --d; }
    } calls{depth_};
    scope inner;
    inner.parent = top_;
    for (std::size_t k = 0; k < m.names.size(); ++k) {
      const value* v = k < a.pos.size() ? &a.pos[k] : nullptr;
      for (const auto& [name, x] : a.kw) {
        if (name == m.names[k]) {
          if (v)
            fail(line, "macro '", m.text, "' got multiple values for argument '", m.names[k], "'");
          v = &x;
        }
      }
      if (v) {
        inner.assign(m.names[k], *v);
      } else if (m.kids[k]) {
        inner.assign(m.names[k], eval(*m.kids[k], inner));
      } else {
        inner.assign(m.names[k], value::undefined(m.names[k]));
      }
    }
    for (const auto& [name, x] : a.kw) {
      if (std::find(m.names.begin(), m.names.end(), name) == m.names.end())
        fail(line, "macro '", m.text, "' takes no keyword argument '", std::string(name), "'");
    }
    return value::string(capture(m.body, inner));
  }

  // ---- str and dict methods ---------------------------------------------------------------

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
        check_size(t.size(), line);
        std::string s(t);
        for (char& c : s)
          c = name == "upper" ? detail_eval::ascii_upper(c) : detail_eval::ascii_lower(c);
        return value::string(std::move(s));
      }
      if (name == "replace") {
        const binder b(a, name, line, {"old", "new", "count"});
        if (!b.get(0) || !b.get(1)) fail(line, "replace() takes at least 2 arguments");
        return replaced(t, b.text(0, ""), b.text(1, ""), b.integer(2, -1), line);
      }
      if (name == "title") {
        const binder b(a, name, line, {});
        check_size(t.size(), line);
        return value::string(py_title(t));
      }
      if (name == "capitalize") {
        const binder b(a, name, line, {});
        check_size(t.size(), line);
        return value::string(py_capitalize(t));
      }
      if (name == "find" || name == "count") {
        const binder b(a, name, line, {"sub"});
        made(t.size(), line);  // a scan of the text
        const std::string_view sub = b.text(0, "");
        if (name == "find") {
          const std::size_t at = t.find(sub);
          return value::integer(
              at == std::string_view::npos
                  ? -1
                  : static_cast<std::int64_t>(detail_eval::char_count(t.substr(0, at))));
        }
        if (sub.empty())
          return value::integer(static_cast<std::int64_t>(detail_eval::char_count(t) + 1));
        std::int64_t n = 0;
        for (std::size_t at = t.find(sub); at != std::string_view::npos;
             at = t.find(sub, at + sub.size()))
          ++n;
        return value::integer(n);
      }
      if (name == "join") {
        const binder b(a, name, line, {"iterable"});
        const value* it = b.get(0);
        if (!it) fail(line, "join() takes exactly one argument (0 given)");
        std::string s;
        bool first = true;
        for (const value& x : items_of(*it, line)) {
          if (!x.is(value_kind::string)) {
            fail(line, "sequence item: expected str instance, ", std::string(type_name(x)),
                 " found");
          }
          room(s, t.size() + x.s.size(), bound(line));
          if (!first) s.append(t);
          first = false;
          s.append(x.s);
        }
        made(s.size(), line);
        return value::string(std::move(s));
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        const binder b(a, name, line, {});
        made(t.size(), line);  // a scan of the text
        bool r = !t.empty();
        for (const char c : t) {
          const auto u = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? (c >= '0' && c <= '9')
                          : name == "isspace" ? detail_eval::is_py_space(u)
                          : name == "isalpha"
                              ? detail_eval::ascii_alpha(c)
                              : (detail_eval::ascii_alpha(c) || (c >= '0' && c <= '9'));
          r = r && ok;
        }
        return value::boolean(r);
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

  // ---- filters ----------------------------------------------------------------------------
  value apply_filter(const node& f, value v, scope& sc) {
    const call_args a = arguments(f, sc, 1);
    return filter(static_cast<filter_id>(f.id), f.text, std::move(v), a, sc, f.line);
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
        if (!v.is(value_kind::string)) return false;
        bool cased = false;
        for (const char c : v.s) {
          if (!detail_eval::ascii_alpha(c)) continue;
          cased = true;
          if ((id == test_id::lower) != (c >= 'a' && c <= 'z')) return false;
        }
        return cased;
      }
    }
    return false;
  }

  bool apply_test(const node& t, const value& v, scope& sc) {
    const call_args a = arguments(t, sc, 1);
    return run_test(static_cast<test_id>(t.id), t.text, v, a, t.line);
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

  value filter(filter_id id, std::string_view name, value v, const call_args& a, scope& sc,
               int line) {
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
        std::string s = str_of(v, line);
        if (v.is(value_kind::string)) check_size(s.size(), line);
        for (char& c : s)
          c = id == filter_id::upper ? detail_eval::ascii_upper(c) : detail_eval::ascii_lower(c);
        return value::string(std::move(s));
      }
      case filter_id::capitalize: {
        const binder b(a, name, line, {});
        const value t = text_of(v, line);
        check_size(t.s.size(), line);
        return value::string(py_capitalize(t.s));
      }
      case filter_id::title: {
        // Jinja's own: a word starts after whitespace, '-', '(', '{', '[' or '<'.
        const binder b(a, name, line, {});
        std::string s = str_of(v, line);
        if (v.is(value_kind::string)) check_size(s.size(), line);
        bool start = true;
        for (char& c : s) {
          const bool sep = detail_eval::is_py_space(static_cast<unsigned char>(c)) || c == '-' ||
                           c == '(' || c == '{' || c == '[' || c == '<';
          if (sep) {
            start = true;
            continue;
          }
          c = start ? detail_eval::ascii_upper(c) : detail_eval::ascii_lower(c);
          start = false;
        }
        return value::string(std::move(s));
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
        const value t = text_of(v, line);
        std::size_t n = t.s.size();  // the size made, counted before it is allocated
        for (const char c : t.s) {
          n += c == '&' || c == '"' || c == '\'' ? 4 : c == '<' || c == '>' ? 3 : 0;
        }
        check_size(n, line);
        std::string s;
        s.reserve(n);
        for (const char c : t.s) {
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
        // s + "\n" split into lines (Python's splitlines), joined with "\n" + the indent.
        std::string s = to_str(v, bound(line));
        made(s.size(), line);
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
        if (v.is(value_kind::string)) {
          check_size(v.s.size(), line);
          made(v.s.size() * sizeof(std::size_t), line);
          const auto at = detail_eval::char_starts(v.s);
          std::string s;
          for (std::size_t k = at.size() - 1; k > 0; --k)
            s.append(v.s.substr(at[k - 1], at[k] - at[k - 1]));
          return value::string(std::move(s));
        }
        std::vector<value> items = items_of(v, line);
        std::reverse(items.begin(), items.end());
        return value::array(std::move(items));
      }
      case filter_id::join: {
        const binder b(a, name, line, {"d", "attribute"});
        const std::string_view sep = b.text(0, "");
        const value* attr = b.get(1);
        std::string s;
        bool first = true;
        for (const value& x : items_of(v, line)) {
          room(s, sep.size(), bound(line));
          if (!first) s.append(sep);
          first = false;
          append_str(s,
                     attr && !attr->is(value_kind::none)
                         ? attribute_path(x, str_of(*attr, line), line)
                         : x,
                     bound(line));
        }
        made(s.size(), line);
        return value::string(std::move(s));
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
        for (const value& x : items) out.push_back(filter(fid, fname, x, rest, sc, line));
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
        const value s = text_of(v, line);
        made(s.s.size(), line);
        std::int64_t n = 0;
        bool in_word = false;
        for (const char c : s.s) {
          const bool w = detail_eval::ascii_alpha(c) || (c >= '0' && c <= '9') || c == '_' ||
                         (static_cast<unsigned char>(c) & 0x80);
          if (w && !in_word) ++n;
          in_word = w;
        }
        return value::integer(n);
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
          if (!case_sensitive && k.is(value_kind::string)) {
            check_size(k.s.size(), line);
            std::string s(k.s);
            for (char& c : s) c = detail_eval::ascii_lower(c);
            return value::string(std::move(s));
          }
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
          if (!case_sensitive && k.is(value_kind::string)) {
            check_size(k.s.size(), line);
            std::string s(k.s);
            for (char& c : s) c = detail_eval::ascii_lower(c);
            return value::string(std::move(s));
          }
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

  const json& vars_;
  const render_options& opt_;
  std::string* out_;
  scope* top_ = nullptr;
  std::size_t iterations_ = 0;
  mutable std::size_t work_ = 0;  // bytes made or scanned (render_limits::max_work_bytes)
  std::size_t depth_ = 0;
  std::size_t eval_depth_ = 0;
};

// A parsed template: parse once, render many times (render is const and keeps no state).
class template_program {
 public:
  static template_program parse(std::string_view source, parse_limits limits = {}) {
    template_program t;
    t.body_ = std::make_shared<std::vector<node_ptr>>(jinja::parse(source, limits));
    return t;
  }

  // The text for these variables (a JSON object: messages, add_generation_prompt, ...).
  [[nodiscard]] std::string render(const json& variables,
                                   const render_options& options = {}) const {
    if (!variables.is_object() && !variables.is_null()) {
      raise(error_code::invalid_argument, "chat template variables must be a JSON object, not ",
            variables.type_name());
    }
    std::string out;
    evaluator e(variables, options, out);
    e.run(*body_);
    return out;
  }

 private:
  std::shared_ptr<const std::vector<node_ptr>> body_;
};

}  // namespace npullm::text::jinja
