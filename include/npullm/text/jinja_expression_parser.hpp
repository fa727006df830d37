// jinja_expression_parser: the expression grammar of Jinja templates, over the lexer's tokens
// (text/jinja_lexer.hpp), building the syntax tree's nodes (text/jinja_ast.hpp); the statement
// parser (text/jinja_parser.hpp) derives from it. Every expression of Jinja but `*args` /
// `**kwargs` at a call: conditional expressions, or / and / not, comparisons (chained as Python
// chains them), + - ~ * / // % **, unary - +, literals (strings, numbers, lists, tuples, dicts),
// attributes, subscripts and slices, calls with keyword arguments, filters and tests (known at
// parse time: an unknown one is unsupported naming it and its line).
//
// Depth: every path that makes the tree deeper takes one level of parse_limits::max_depth (an
// expression inside brackets, each link of a chain of filters, tests, attributes, subscripts
// or calls, of conditional expressions). Operators of one precedence (a ~ b ~ c, a + b - c,
// a and b and c) are one node whatever their number, evaluated by a loop: a chain of 200,000
// terms parses and renders.
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
#include "npullm/text/jinja_lexer.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja::detail_parse {

// The parser's tokens, position and depth budget, its helpers, and the expression grammar.
class expression_parser {
 public:
  expression_parser(std::vector<token> tokens, parse_limits limits)
      : t_(std::move(tokens)), limits_(limits) {}

 protected:
  // One level deeper: refused past max_depth, since the parser and the interpreter recurse.
  void enter() {
    if (depth_ + 1 > limits_.max_depth) {
      raise(error_code::capacity_exhausted, "chat template line ", cur().line,
            ": nested deeper than ", limits_.max_depth,
            " levels (parse_limits::max_depth; blocks, brackets and each link of a chain of "
            "filters, attributes, subscripts, calls or elifs count)");
    }
    ++depth_;
  }
  struct level {
    explicit level(expression_parser& p) : p_(p) { p_.enter(); }
    ~level() { --p_.depth_; }
    level(const level&) = delete;
    level& operator=(const level&) = delete;
    expression_parser& p_;
  };
  // The levels a chain takes, one a link (the tree grows one node deeper a link), given back
  // when the chain is parsed.
  struct chain {
    explicit chain(expression_parser& p) : p_(p) {}
    void link() {
      p_.enter();
      ++n_;
    }
    ~chain() { p_.depth_ -= n_; }
    chain(const chain&) = delete;
    chain& operator=(const chain&) = delete;
    expression_parser& p_;
    std::size_t n_ = 0;
  };

  const token& cur() const { return t_[pos_]; }
  const token& peek(std::size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is_op(std::string_view o) const { return cur().type == tok::op && cur().text == o; }
  bool is_name(std::string_view n) const { return cur().type == tok::name && cur().text == n; }
  void expect_op(std::string_view o) {
    if (!is_op(o)) syntax(cur().line, "expected '", std::string(o), "', found ", shown(cur()));
    ++pos_;
  }
  std::string expect_name() {
    if (cur().type != tok::name) syntax(cur().line, "expected a name, found ", shown(cur()));
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != tok::block_end) syntax(cur().line, "expected '%}', found ", shown(cur()));
    ++pos_;
  }
  static std::string shown(const token& t) {
    switch (t.type) {
      case tok::eof: return "the end of the template";
      case tok::block_end: return "'%}'";
      case tok::var_end: return "'}}'";
      case tok::data: return "text";
      case tok::string: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  node_ptr make(node_kind k, int line) {
    auto n = std::make_unique<node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  // Statements up to a block tag whose keyword is one of ends (returned, the tag's keyword

  // name[(args)] | name[(args)] ... as filter nodes without operands (a block's filters).
  void filters(std::vector<node_ptr>& out) {
    for (;;) {
      auto f = filter(nullptr);
      out.push_back(std::move(f));
      if (!is_op("|")) return;
      ++pos_;
    }
  }

  // An expression, or a tuple of them without parentheses (set a, b = 1, 2).
  node_ptr tuple_or_expression() {
    auto first = expression();
    if (!is_op(",")) return first;
    auto t = make(node_kind::tuple, first->line);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (cur().type == tok::block_end || cur().type == tok::var_end) break;
      t->kids.push_back(expression());
    }
    return t;
  }

  node_ptr expression() { return ternary(true); }

  node_ptr ternary(bool with_condition) {
    level guard(*this);
    chain links(*this);  // a if b if c: each condition one node deeper
    auto e = or_expr();
    while (with_condition && is_name("if")) {
      links.link();
      ++pos_;
      auto c = make(node_kind::condition, e->line);
      auto cond = or_expr();
      node_ptr other;
      if (is_name("else")) {
        ++pos_;
        other = ternary(true);
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  // l o r, where l is the chain this precedence's loop is building (grown: it made l) or its
  // first operand: one node for the whole chain, so that its length costs no depth.
  node_ptr binary(node_ptr l, bool& grown, op o, node_ptr r) {
    if (!grown) {
      auto n = make(node_kind::binary, l->line);
      n->kids.push_back(std::move(l));
      l = std::move(n);
      grown = true;
    }
    l->ops.push_back(o);
    l->kids.push_back(std::move(r));
    return l;
  }

  node_ptr or_expr() {
    auto l = and_expr();
    bool grown = false;
    while (is_name("or")) {
      ++pos_;
      l = binary(std::move(l), grown, op::or_, and_expr());
    }
    return l;
  }
  node_ptr and_expr() {
    auto l = not_expr();
    bool grown = false;
    while (is_name("and")) {
      ++pos_;
      l = binary(std::move(l), grown, op::and_, not_expr());
    }
    return l;
  }
  node_ptr not_expr() {
    if (is_name("not")) {
      level guard(*this);
      auto n = make(node_kind::unary, cur().line);
      ++pos_;
      n->id = static_cast<std::uint8_t>(op::not_);
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  node_ptr compare() {
    auto first = math1();
    node_ptr n;
    for (;;) {
      op o;
      if (is_op("=="))
        o = op::eq;
      else if (is_op("!="))
        o = op::ne;
      else if (is_op("<"))
        o = op::lt;
      else if (is_op("<="))
        o = op::le;
      else if (is_op(">"))
        o = op::gt;
      else if (is_op(">="))
        o = op::ge;
      else if (is_name("in"))
        o = op::in;
      else if (is_name("not") && peek().type == tok::name && peek().text == "in") {
        o = op::not_in;
        ++pos_;
      } else {
        break;
      }
      ++pos_;
      if (!n) {
        n = make(node_kind::compare, first->line);
        n->kids.push_back(std::move(first));
      }
      n->ops.push_back(o);
      n->kids.push_back(math1());
    }
    return n ? std::move(n) : std::move(first);
  }
  node_ptr math1() {
    auto l = concat();
    bool grown = false;
    for (;;) {
      if (is_op("+")) {
        ++pos_;
        l = binary(std::move(l), grown, op::add, concat());
      } else if (is_op("-")) {
        ++pos_;
        l = binary(std::move(l), grown, op::sub, concat());
      } else {
        return l;
      }
    }
  }
  node_ptr concat() {
    auto l = math2();
    bool grown = false;
    while (is_op("~")) {
      ++pos_;
      l = binary(std::move(l), grown, op::concat, math2());
    }
    return l;
  }
  node_ptr math2() {
    auto l = power();
    bool grown = false;
    for (;;) {
      op o;
      if (is_op("*"))
        o = op::mul;
      else if (is_op("/"))
        o = op::div;
      else if (is_op("//"))
        o = op::floordiv;
      else if (is_op("%"))
        o = op::mod;
      else
        return l;
      ++pos_;
      l = binary(std::move(l), grown, o, power());
    }
  }
  node_ptr power() {
    auto l = unary(true);
    bool grown = false;
    while (is_op("**")) {
      ++pos_;
      l = binary(std::move(l), grown, op::pow, unary(true));
    }
    return l;
  }
  node_ptr unary(bool with_filter) {
    level guard(*this);
    node_ptr n;
    if (is_op("-") || is_op("+")) {
      n = make(node_kind::unary, cur().line);
      n->id = static_cast<std::uint8_t>(is_op("-") ? op::neg : op::pos);
      ++pos_;
      n->kids.push_back(unary(false));
    } else {
      n = primary();
    }
    n = postfix(std::move(n));
    if (with_filter) n = filter_expr(std::move(n));
    return n;
  }

  node_ptr primary() {
    const token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case tok::name: {
        ++pos_;
        auto n = make(node_kind::literal, line);
        if (t.text == "true" || t.text == "True") {
          n->literal = value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          n->literal = value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          n->literal = value::none();
        } else {
          n->kind = node_kind::name;
          n->text = t.text;
        }
        return n;
      }
      case tok::string: {
        auto n = make(node_kind::literal, line);
        while (cur().type == tok::string) n->text += t_[pos_++].text;  // 'a' 'b' is 'ab'
        n->literal = value::view(n->text);  // re-pointed after the node is placed (stable)
        return n;
      }
      case tok::integer: {
        ++pos_;
        auto n = make(node_kind::literal, line);
        n->literal = value::integer(t.i);
        return n;
      }
      case tok::floating: {
        ++pos_;
        auto n = make(node_kind::literal, line);
        n->literal = value::floating(t.d);
        return n;
      }
      case tok::op: {
        if (t.text == "(") {
          ++pos_;
          if (is_op(")")) {
            ++pos_;
            return make(node_kind::tuple, line);
          }
          auto e = expression();
          if (is_op(",")) {
            auto tup = make(node_kind::tuple, line);
            tup->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++pos_;
              if (is_op(")")) break;
              tup->kids.push_back(expression());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++pos_;
          auto n = make(node_kind::list, line);
          while (!is_op("]")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("]")) break;
            n->kids.push_back(expression());
          }
          ++pos_;
          return n;
        }
        if (t.text == "{") {
          ++pos_;
          auto n = make(node_kind::dict, line);
          while (!is_op("}")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("}")) break;
            n->kids.push_back(expression());
            expect_op(":");
            n->kids.push_back(expression());
          }
          ++pos_;
          return n;
        }
        break;
      }
      default: break;
    }
    syntax(line, "unexpected ", shown(t), " in an expression");
  }

  // x.a[b](c)...: each link wraps the chain so far, one node deeper.
  node_ptr postfix(node_ptr n) {
    chain links(*this);
    for (;;) {
      if (is_op(".") || is_op("[") || is_op("(")) links.link();
      if (is_op(".")) {
        ++pos_;
        auto a = make(node_kind::attribute, n->line);
        if (cur().type == tok::integer) {  // x.0 is x[0]
          a->kind = node_kind::index;
          a->kids.push_back(std::move(n));
          auto k = make(node_kind::literal, cur().line);
          k->literal = value::integer(cur().i);
          ++pos_;
          a->kids.push_back(std::move(k));
        } else {
          a->text = expect_name();
          a->kids.push_back(std::move(n));
        }
        n = std::move(a);
      } else if (is_op("[")) {
        ++pos_;
        n = subscript(std::move(n));
      } else if (is_op("(")) {
        ++pos_;
        auto c = make(node_kind::call, n->line);
        c->kids.push_back(std::move(n));
        arguments(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  node_ptr subscript(node_ptr obj) {
    level guard(*this);
    const int line = obj->line;
    std::array<node_ptr, 3> parts;
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        if (++part > 2) syntax(line, "a slice has at most three parts");
        ++pos_;
        continue;
      }
      if (parts[static_cast<std::size_t>(part)]) syntax(line, "expected ']' or ':'");
      parts[static_cast<std::size_t>(part)] = expression();
      if (cur().type == tok::eof) break;
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) syntax(line, "empty subscript");
      auto n = make(node_kind::index, line);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    auto n = make(node_kind::slice, line);
    n->kids.push_back(std::move(obj));
    for (auto& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  // (a, b, k=v) after the '(': positional arguments, then keyword ones.
  void arguments(node& call) {
    while (!is_op(")")) {
      if (call.kids.size() > 1 || !call.names.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) {
        raise(error_code::unsupported, "chat template line ", cur().line,
              ": *args / **kwargs in a call are not supported by npullm's Jinja interpreter");
      }
      if (cur().type == tok::name && peek().type == tok::op && peek().text == "=") {
        call.names.push_back(cur().text);
        pos_ += 2;
        call.kids.push_back(expression());
      } else {
        if (!call.names.empty()) syntax(cur().line, "positional argument after keyword argument");
        call.kids.push_back(expression());
      }
    }
    ++pos_;
  }

  node_ptr filter(node_ptr operand) {
    const int line = cur().line;
    std::string name = expect_name();
    while (is_op(".")) {  // a dotted filter name
      ++pos_;
      name += '.';
      name += expect_name();
    }
    auto f = make(node_kind::filter, line);
    bool known = false;
    for (const auto& [n, id] : filter_names) {
      if (n == name) {
        f->id = static_cast<std::uint8_t>(id);
        known = true;
        break;
      }
    }
    if (!known) {
      raise(error_code::unsupported, "chat template line ", line, ": the filter '", name,
            "' is not supported by npullm's Jinja interpreter");
    }
    f->text = name;
    f->kids.push_back(std::move(operand));
    if (is_op("(")) {
      ++pos_;
      arguments(*f);
    }
    return f;
  }

  // x | f | g is x tests ...: each link wraps the chain so far, one node deeper.
  node_ptr filter_expr(node_ptr n) {
    chain links(*this);
    for (;;) {
      if (is_op("|") || is_name("is")) links.link();
      if (is_op("|")) {
        ++pos_;
        n = filter(std::move(n));
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(node_kind::test, cur().line);
        if (is_name("not")) {
          t->negated = true;
          ++pos_;
        }
        const int line = cur().line;
        std::string name;
        if (cur().type == tok::name) {
          name = t_[pos_++].text;
        } else if (cur().type == tok::op) {
          name = t_[pos_++].text;  // is ==, is <, ...
        } else {
          syntax(line, "expected a test name after 'is'");
        }
        bool known = false;
        for (const auto& [tn, id] : test_names) {
          if (tn == name) {
            t->id = static_cast<std::uint8_t>(id);
            known = true;
            break;
          }
        }
        if (!known) {
          raise(error_code::unsupported, "chat template line ", line, ": the test '", name,
                "' is not supported by npullm's Jinja interpreter");
        }
        t->text = name;
        t->kids.push_back(std::move(n));
        if (is_op("(")) {
          ++pos_;
          arguments(*t);
        } else if (cur().type == tok::string || cur().type == tok::integer ||
                   cur().type == tok::floating ||
                   (cur().type == tok::name && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if") && !is_name("in") && !is_name("is")) ||
                   is_op("[") || is_op("{")) {
          // A test's one argument without parentheses: x is divisibleby 3, x is sameas none.
          t->kids.push_back(unary(false));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

  std::vector<token> t_;
  std::size_t pos_ = 0;
  parse_limits limits_;
  std::size_t depth_ = 0;
  int loops_ = 0;
};

}  // namespace npullm::text::jinja::detail_parse
