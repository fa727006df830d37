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
// return their text. This header holds the statements and expressions (the evaluator) and
// template_program; the rest is in (from jinja_ops.hpp on, each header's class derives from
// the one listed before it, and the evaluator from filter_ops):
//   text/jinja_parser.hpp      syntax: statements (jinja_expression_parser.hpp: expressions,
//                              jinja_lexer.hpp: tokens, jinja_ast.hpp: the tree)
//   text/jinja_value.hpp       values (jinja_print.hpp: str, repr, tojson)
//   text/jinja_ops.hpp         Python's semantics: truthiness, ==, ordering, `in`, iteration
//   text/jinja_budget.hpp      render_limits, render_options and their accounting
//   text/jinja_strings.hpp     the string operations, one each, shared by methods and filters
//   text/jinja_operators.hpp   attributes, items, slices, operators, comparisons
//   text/jinja_methods.hpp     str / dict / list methods; range, namespace, dict,
//                              raise_exception, strftime_now
//   text/jinja_filters.hpp     filters and tests
// upper / lower / title / capitalize change ASCII letters only.
//
// The template is untrusted input: it reaches only the variables given, lists and dicts are
// immutable (list.append is the sandbox's error), and render_limits bound the output, every
// string made (its size is computed, or checked piece by piece, before it is allocated: a
// replace, `*`, `~`, indent or tojson bomb is refused, never a std::bad_alloc), every list made,
// the total work of a render (bytes of strings and lists made or scanned), the loop iterations
// (all loops together, range() sizes too), nested macro calls and the interpreter's
// recursion; lists built inside lists nest at most max_nesting deep; parse_limits bound the
// syntax tree's depth (text/jinja_ast.hpp). A render past a limit is capacity_exhausted
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
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_ast.hpp"
#include "npullm/text/jinja_budget.hpp"
#include "npullm/text/jinja_filters.hpp"
#include "npullm/text/jinja_parser.hpp"
#include "npullm/text/jinja_print.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

class template_program;

// The interpreter: statements and expressions, over the filters, methods, operators, string
// operations and budget it derives from.
class evaluator : filter_ops {
 public:
  evaluator(const json& vars, const render_options& opt, std::string& out)
      : filter_ops(opt), vars_(vars), out_(&out) {}

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
      case node_kind::unary: return unary(static_cast<op>(n.id), eval(*n.kids[0], sc), n.line);
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
    return slice_value(obj, part(0), part(1), part(2), n.line);
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
    if (c.kind == callable_kind::macro) return call_macro(c, a, n.line);
    return call_builtin(c, a, n.line);
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

  // ---- filters and tests ------------------------------------------------------------------
  value apply_filter(const node& f, value v, scope& sc) {
    const call_args a = arguments(f, sc, 1);
    return filter(static_cast<filter_id>(f.id), f.text, std::move(v), a, f.line);
  }

  bool apply_test(const node& t, const value& v, scope& sc) {
    const call_args a = arguments(t, sc, 1);
    return run_test(static_cast<test_id>(t.id), t.text, v, a, t.line);
  }

  const json& vars_;
  std::string* out_;
  scope* top_ = nullptr;
  std::size_t depth_ = 0;  // macro calls inside macro calls
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
