// jinja_parser: a Jinja template's source to its syntax tree (text/jinja.hpp runs it): the
// statements, over the expression grammar (text/jinja_expression_parser.hpp) and the lexer's
// tokens (text/jinja_lexer.hpp: trim_blocks, lstrip_blocks and whitespace control as
// transformers renders chat templates); the tree's nodes are text/jinja_ast.hpp's.
//
// What it parses: {% if / elif / else %}, {% for x[, y] in e [if c] %} ... {% else %},
// {% set x = e %}, {% set a, b = e %}, {% set ns.attr = e %}, {% set x %}...{% endset %} (with
// filters), {% macro m(a, b=1) %}, {% call %}-less macro calls, {% break / continue %},
// {% filter f %}, {% with %}, {% generation %} (transformers' tag: its body is rendered), and
// every expression of Jinja but `*args` / `**kwargs` at a call. Filters and tests are known at
// parse time: an unknown one, or a statement this interpreter does not implement ({% include %},
// {% extends %}, {% block %}, {% import %}, {% call %}, {% do %}, ...), is refused here with
// error_code::unsupported naming it and its line; a syntax error is corrupt_data with its line.
// Nesting deeper than parse_limits::max_depth is refused too (capacity_exhausted naming the
// limit): the parser, the interpreter and fix_literals recurse on the tree, so every path that
// makes the tree deeper takes one level of that one budget: a block inside a block, an
// expression inside brackets, each link of a chain of filters, tests, attributes, subscripts
// or calls (x|trim|trim, x.a.a), of conditional expressions (a if b if c) and each elif.
// Operators of one precedence (a ~ b ~ c, a + b - c, a and b and c) are one node whatever
// their number, evaluated by a loop: a chain of 200,000 terms parses and renders. Trees are
// freed without recursion (node's destructor).
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_ast.hpp"
#include "npullm/text/jinja_expression_parser.hpp"
#include "npullm/text/jinja_lexer.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

namespace detail_parse {

// The statements of a template, over the expression grammar.
class parser : expression_parser {
 public:
  using expression_parser::expression_parser;

  std::vector<node_ptr> parse_template() {
    std::vector<node_ptr> body;
    const std::string end = statements(body, {});
    if (!end.empty()) syntax(cur().line, "unexpected '", std::string(end), "'");
    return body;
  }

 private:
  // consumed, its block_end not), or to the end of the template ("").
  std::string statements(std::vector<node_ptr>& out, std::initializer_list<std::string_view> ends) {
    level guard(*this);
    for (;;) {
      const token& t = cur();
      if (t.type == tok::eof) {
        if (ends.size() != 0) {
          syntax(t.line, "unexpected end of template: '", std::string(*(ends.end() - 1)),
                 "' missing");
        }
        return {};
      }
      if (t.type == tok::data) {
        auto n = make(node_kind::data, t.line);
        n->text = t.text;
        out.push_back(std::move(n));
        ++pos_;
      } else if (t.type == tok::var_begin) {
        ++pos_;
        auto n = make(node_kind::output, t.line);
        n->kids.push_back(expression());
        if (cur().type != tok::var_end) syntax(cur().line, "expected '}}', found ", shown(cur()));
        ++pos_;
        out.push_back(std::move(n));
      } else if (t.type == tok::block_begin) {
        ++pos_;
        const token& kw = cur();
        if (kw.type != tok::name) syntax(kw.line, "expected a statement name, found ", shown(kw));
        for (const std::string_view e : ends) {
          if (kw.text == e) {
            ++pos_;
            return kw.text;
          }
        }
        out.push_back(statement());
      } else {
        syntax(t.line, "unexpected ", shown(t));
      }
    }
  }

  node_ptr statement() {
    const token& kw = cur();
    const int line = kw.line;
    const std::string name = kw.text;
    ++pos_;
    if (name == "if") return if_statement(line);
    if (name == "for") return for_statement(line);
    if (name == "set") return set_statement(line);
    if (name == "macro") return macro_statement(line);
    if (name == "break" || name == "continue") {
      if (loops_ == 0) syntax(line, "'", name, "' outside a for loop");
      expect_block_end();
      return make(name == "break" ? node_kind::break_ : node_kind::continue_, line);
    }
    if (name == "filter") {
      auto n = make(node_kind::filter_block, line);
      filters(n->kids);
      expect_block_end();
      statements(n->body, {"endfilter"});
      expect_block_end();
      return n;
    }
    if (name == "with") {
      auto n = make(node_kind::with, line);
      while (cur().type != tok::block_end) {
        if (!n->names.empty()) expect_op(",");
        n->names.push_back(expect_name());
        expect_op("=");
        n->kids.push_back(expression());
      }
      expect_block_end();
      statements(n->body, {"endwith"});
      expect_block_end();
      return n;
    }
    if (name == "generation") {
      auto n = make(node_kind::scope, line);
      expect_block_end();
      statements(n->body, {"endgeneration"});
      expect_block_end();
      return n;
    }
    static constexpr std::array<std::string_view, 16> known = {
        "include", "import",    "from", "extends", "block", "call",  "do",        "autoescape",
        "trans",   "pluralize", "raw",  "print",   "debug", "cycle", "spaceless", "sandbox"};
    for (const std::string_view k : known) {
      if (name == k) {
        raise(error_code::unsupported, "chat template line ", line, ": the statement {% ", name,
              " %} is not supported by npullm's Jinja interpreter");
      }
    }
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      syntax(line, "unexpected '", name, "'");
    }
    raise(error_code::unsupported, "chat template line ", line, ": unknown statement {% ", name,
          " %}");
  }

  node_ptr if_statement(int line) {
    auto n = make(node_kind::if_, line);
    n->kids.push_back(expression());
    expect_block_end();
    const std::string end = statements(n->body, {"elif", "else", "endif"});
    if (end == "elif") {
      // An elif is an if_ inside the orelse, parsed by recursion: each one is a level deeper.
      level guard(*this);
      n->orelse.push_back(if_statement(t_[pos_ - 1].line));
      return n;  // the elif consumed the endif
    }
    if (end == "else") {
      expect_block_end();
      statements(n->orelse, {"endif"});
    }
    expect_block_end();
    return n;
  }

  void targets(std::vector<std::string>& names) {
    const bool paren = is_op("(");
    if (paren) ++pos_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++pos_;
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
  }

  node_ptr for_statement(int line) {
    auto n = make(node_kind::for_, line);
    targets(n->names);
    if (!is_name("in")) syntax(cur().line, "expected 'in' in the for statement");
    ++pos_;
    n->kids.push_back(ternary(false));
    if (is_name("if")) {
      ++pos_;
      n->kids.push_back(ternary(false));
    } else {
      n->kids.push_back(nullptr);
    }
    if (is_name("recursive")) {
      raise(error_code::unsupported, "chat template line ", line,
            ": recursive for loops are not supported by npullm's Jinja interpreter");
    }
    expect_block_end();
    ++loops_;
    const std::string end = statements(n->body, {"else", "endfor"});
    --loops_;
    if (end == "else") {
      expect_block_end();
      statements(n->orelse, {"endfor"});
    }
    expect_block_end();
    return n;
  }

  node_ptr set_statement(int line) {
    auto n = make(node_kind::set, line);
    targets(n->names);
    if (n->names.size() == 1 && is_op(".")) {
      ++pos_;
      n->text = expect_name();
    }
    if (is_op("=")) {
      ++pos_;
      n->kids.push_back(tuple_or_expression());
      expect_block_end();
      return n;
    }
    if (n->names.size() != 1 || !n->text.empty()) syntax(line, "expected '=' in the set statement");
    n->kind = node_kind::set_block;
    if (is_op("|")) {
      ++pos_;
      filters(n->kids);
    }
    expect_block_end();
    statements(n->body, {"endset"});
    expect_block_end();
    return n;
  }

  node_ptr macro_statement(int line) {
    auto n = make(node_kind::macro, line);
    n->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      n->names.push_back(expect_name());
      if (is_op("=")) {
        ++pos_;
        n->kids.push_back(expression());
      } else {
        n->kids.push_back(nullptr);
      }
    }
    ++pos_;
    expect_block_end();
    const int loops = loops_;
    loops_ = 0;  // break / continue do not cross a macro
    statements(n->body, {"endmacro"});
    loops_ = loops;
    if (cur().type == tok::name) ++pos_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }
};

// String literals view their node's own text: pointed there once the nodes no longer move.
// A walk with an explicit stack (no recursion, whatever the tree's depth).
inline void fix_literals(node& root) {
  std::vector<node*> pending{&root};
  while (!pending.empty()) {
    node& n = *pending.back();
    pending.pop_back();
    if (n.kind == node_kind::literal && n.literal.kind == value_kind::string) {
      n.literal = value::view(n.text);
    }
    for (const auto* list : {&n.kids, &n.body, &n.orelse}) {
      for (const auto& k : *list) {
        if (k) pending.push_back(k.get());
      }
    }
  }
}

}  // namespace detail_parse

// The syntax tree of a template source.
inline std::vector<node_ptr> parse(std::string_view source, parse_limits limits = {}) {
  detail_parse::lexer lex(source);
  detail_parse::parser p(lex.run(), limits);
  auto body = p.parse_template();
  for (auto& n : body) detail_parse::fix_literals(*n);
  return body;
}

}  // namespace npullm::text::jinja
