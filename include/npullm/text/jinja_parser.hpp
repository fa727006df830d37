// jinja_parser: a Jinja template's source to its syntax tree (text/jinja.hpp runs it).
//
// Lexing follows Jinja2 3.1 with the settings Hugging Face transformers renders chat templates
// with: trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs from the start of a line to a block or comment tag are dropped), whitespace
// control ({%- -%} {{- -}} {#- -#} strip all whitespace on that side; {%+ and +%} keep it),
// newlines normalized to \n, one trailing newline of the source dropped, {% raw %}.
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
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja_value.hpp"
#include "npullm/text/unicode.hpp"

namespace npullm::text::jinja {

enum class node_kind : std::uint8_t {
  // statements
  data,       // text: the literal text
  output,     // {{ kids[0] }}
  if_,        // kids[0] condition; body; orelse (an elif is an if_ alone in orelse)
  for_,       // names: targets; kids[0] iterable, kids[1] filter condition or null; body; orelse
  set,        // names: targets; text: namespace attribute (names[0].text = ...); kids[0] value
  set_block,  // names[0]: target; body; kids: filter nodes applied in order (operand null)
  macro,      // text: name; names: parameters; kids: defaults (null: none); body
  break_,
  continue_,
  filter_block,  // body; kids: filter nodes (operand null)
  with,          // names / kids: the assignments; body
  scope,         // body only ({% generation %})
  // expressions
  literal,    // constant
  name,       // text
  list,       // kids
  tuple,      // kids
  dict,       // kids: key, value, key, value, ...
  attribute,  // kids[0].text
  index,      // kids[0][kids[1]]
  slice,      // kids[0][kids[1]:kids[2]:kids[3]] (null: absent)
  call,       // kids[0](kids[1..]); names: keyword names of the last names.size() arguments
  filter,     // kids[0] | op(kids[1..]); names as call; text: the filter's name
  test,       // kids[0] is [not] op(kids[1..]); negated; text: the test's name
  unary,      // op: not / neg / pos; kids[0]
  binary,     // kids[0] ops[0] kids[1] ops[1] kids[2] ...: left-associative operators of one
              // precedence, applied left to right (((k0 o0 k1) o1 k2) ...), and / or short-cut
  compare,    // kids[0] ops[0] kids[1] ops[1] kids[2] ... (chained as Python chains them)
  condition,  // kids[1] ? kids[0] : kids[2] (kids[2] null: undefined)
};

enum class op : std::uint8_t {
  add,
  sub,
  mul,
  div,
  floordiv,
  mod,
  pow,
  concat,
  and_,
  or_,
  not_,
  neg,
  pos,
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  in,
  not_in,
};

// The filters: one entry per name (aliases share an id).
enum class filter_id : std::uint8_t {
  abs,
  attr,
  capitalize,
  count,
  default_,
  dictsort,
  escape,
  first,
  float_,
  indent,
  int_,
  items,
  join,
  last,
  length,
  list,
  lower,
  map,
  max,
  min,
  reject,
  rejectattr,
  replace,
  reverse,
  round,
  safe,
  select,
  selectattr,
  sort,
  string,
  sum,
  title,
  tojson,
  trim,
  unique,
  upper,
  wordcount,
};
inline constexpr std::array<std::pair<std::string_view, filter_id>, 40> filter_names = {{
    {"abs", filter_id::abs},
    {"attr", filter_id::attr},
    {"capitalize", filter_id::capitalize},
    {"count", filter_id::count},
    {"d", filter_id::default_},
    {"default", filter_id::default_},
    {"dictsort", filter_id::dictsort},
    {"e", filter_id::escape},
    {"escape", filter_id::escape},
    {"first", filter_id::first},
    {"float", filter_id::float_},
    {"indent", filter_id::indent},
    {"int", filter_id::int_},
    {"items", filter_id::items},
    {"join", filter_id::join},
    {"last", filter_id::last},
    {"length", filter_id::length},
    {"list", filter_id::list},
    {"lower", filter_id::lower},
    {"map", filter_id::map},
    {"max", filter_id::max},
    {"min", filter_id::min},
    {"reject", filter_id::reject},
    {"rejectattr", filter_id::rejectattr},
    {"replace", filter_id::replace},
    {"reverse", filter_id::reverse},
    {"round", filter_id::round},
    {"safe", filter_id::safe},
    {"select", filter_id::select},
    {"selectattr", filter_id::selectattr},
    {"sort", filter_id::sort},
    {"string", filter_id::string},
    {"sum", filter_id::sum},
    {"title", filter_id::title},
    {"tojson", filter_id::tojson},
    {"trim", filter_id::trim},
    {"unique", filter_id::unique},
    {"upper", filter_id::upper},
    {"wordcount", filter_id::wordcount},
    {"forceescape", filter_id::escape},
}};

enum class test_id : std::uint8_t {
  boolean,
  callable,
  defined,
  divisibleby,
  eq,
  even,
  false_,
  float_,
  ge,
  gt,
  in,
  integer,
  iterable,
  le,
  lower,
  lt,
  mapping,
  ne,
  none,
  number,
  odd,
  sameas,
  sequence,
  string,
  true_,
  undefined,
  upper,
};
inline constexpr std::array<std::pair<std::string_view, test_id>, 36> test_names = {{
    {"boolean", test_id::boolean},
    {"callable", test_id::callable},
    {"defined", test_id::defined},
    {"divisibleby", test_id::divisibleby},
    {"eq", test_id::eq},
    {"equalto", test_id::eq},
    {"==", test_id::eq},
    {"even", test_id::even},
    {"false", test_id::false_},
    {"float", test_id::float_},
    {"ge", test_id::ge},
    {">=", test_id::ge},
    {"gt", test_id::gt},
    {">", test_id::gt},
    {"greaterthan", test_id::gt},
    {"in", test_id::in},
    {"integer", test_id::integer},
    {"iterable", test_id::iterable},
    {"le", test_id::le},
    {"<=", test_id::le},
    {"lower", test_id::lower},
    {"lt", test_id::lt},
    {"<", test_id::lt},
    {"lessthan", test_id::lt},
    {"mapping", test_id::mapping},
    {"ne", test_id::ne},
    {"!=", test_id::ne},
    {"none", test_id::none},
    {"number", test_id::number},
    {"odd", test_id::odd},
    {"sameas", test_id::sameas},
    {"sequence", test_id::sequence},
    {"string", test_id::string},
    {"true", test_id::true_},
    {"undefined", test_id::undefined},
    {"upper", test_id::upper},
}};

struct node {
  node() = default;
  node(const node&) = delete;
  node& operator=(const node&) = delete;
  ~node();

  node_kind kind = node_kind::data;
  int line = 0;
  std::uint8_t id = 0;  // op, filter_id or test_id
  bool negated = false;
  std::string text;
  value literal;
  std::vector<std::unique_ptr<node>> kids;
  std::vector<std::string> names;
  std::vector<op> ops;
  std::vector<std::unique_ptr<node>> body, orelse;
};
using node_ptr = std::unique_ptr<node>;

// A tree is freed with an explicit stack: each node's children are moved onto it before the
// node goes, so freeing never recurses, however deep the tree (a node freed from the stack has
// no children left and frees nothing more).
inline node::~node() {
  std::vector<node_ptr> pending;
  const auto take = [&pending](std::vector<node_ptr>& from) {
    for (auto& k : from) {
      if (k) pending.push_back(std::move(k));
    }
    from.clear();
  };
  take(kids);
  take(body);
  take(orelse);
  while (!pending.empty()) {
    node_ptr n = std::move(pending.back());
    pending.pop_back();
    take(n->kids);
    take(n->body);
    take(n->orelse);
  }
}

struct parse_limits {
  // Nesting of blocks and expressions, chains of filters / tests / attributes / subscripts /
  // calls / conditional expressions and elif chains all count: a template deeper than this is
  // capacity_exhausted (the parser and the interpreter recurse on the tree, about 0.3-1 KiB of
  // stack a level in a release build: 256 keeps a render well inside a 1 MiB stack).
  std::size_t max_depth = 256;
};

namespace detail_parse {

enum class tok : std::uint8_t {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct token {
  tok type;
  int line;
  std::string text;  // data, name, string value, operator
  std::int64_t i = 0;
  double d = 0;
};

inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

template <class... Parts>
[[noreturn]] void syntax(int line, const Parts&... what) {
  raise(error_code::corrupt_data, "chat template syntax error, line ", line, ": ", what...);
}

// Python's string escapes: \n \t \r \\ \' \" \b \f \v \a \0oo \xHH \uHHHH \UHHHHHHHH; any other
// keeps its backslash (the lexer's string literals).
class lexer {
 public:
  explicit lexer(std::string_view source) {
    // Newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (std::size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<token> run() {
    std::size_t pos = 0;
    std::string pending;  // data since the last tag
    std::size_t pending_start = 0;
    while (pos < src_.size()) {
      const std::size_t open = find_open(pos);
      if (open == std::string::npos) {
        pending.append(src_, pos, std::string::npos);
        pos = src_.size();
        break;
      }
      pending.append(src_, pos, open - pos);
      const char kind = src_[open + 1];  // '{', '%', '#'
      std::size_t p = open + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign) ++p;
      // Whitespace control of the text before the tag.
      if (sign == '-') {
        while (!pending.empty() && is_space(pending.back())) pending.pop_back();
      } else if (sign != '+' && kind != '{') {
        lstrip(pending, pending_start);
      }
      flush(pending, line_at(pending_start));
      const int line = line_at(open);
      if (kind == '#') {
        const std::size_t close = src_.find("#}", p);
        if (close == std::string::npos) syntax(line, "comment not closed ('#}' missing)");
        pos = after_end(close, close + 2, true);
      } else if (kind == '{') {
        tokens_.push_back({tok::var_begin, line, {}});
        pos = inside(p, false);
      } else if (is_raw(p)) {
        pos = raw(p, line);
      } else {
        tokens_.push_back({tok::block_begin, line, {}});
        pos = inside(p, true);
      }
      pending_start = pos;
    }
    flush(pending, line_at(pending_start));
    tokens_.push_back({tok::eof, line_at(src_.size()), {}});
    return std::move(tokens_);
  }

 private:
  std::size_t find_open(std::size_t pos) const {
    for (std::size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    }
    return std::string::npos;
  }

  int line_at(std::size_t pos) {
    // Lines counted incrementally: positions only grow.
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_++] == '\n') ++line_;
    }
    return line_;
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  void lstrip(std::string& text, std::size_t text_start) const {
    std::size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t' || text[k - 1] == '\v' ||
                     text[k - 1] == '\f' || text[k - 1] == '\r')) {
      --k;
    }
    const bool line_start =
        k > 0 ? text[k - 1] == '\n' : (text_start == 0 || src_[text_start - 1] == '\n');
    if (line_start) text.resize(k);
  }

  void flush(std::string& text, int line) {
    if (!text.empty()) tokens_.push_back({tok::data, line, std::move(text)});
    text.clear();
  }

  // The position after a tag's end at [end_at, end_after): '-' before it strips the whitespace
  // after; trim_blocks drops one newline after a block or comment tag unless '+'.
  std::size_t after_end(std::size_t end_at, std::size_t end_after, bool block) const {
    std::size_t pos = end_after;
    const char sign = end_at > 0 ? src_[end_at - 1] : 0;
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (block && sign != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  bool is_raw(std::size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  std::size_t raw(std::size_t p, int line) {
    // Jinja's {% raw %} ends without trim_blocks (only '-%}' strips what follows).
    const std::size_t close = src_.find("%}", p);
    std::size_t pos = close + 2;
    if (src_[close - 1] == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    }
    for (std::size_t k = src_.find("{%", pos); k != std::string::npos; k = src_.find("{%", k + 2)) {
      std::size_t q = k + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos, k - pos);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+') {
        lstrip(text, pos);
      }
      flush(text, line);
      return after_end(q, q + 2, true);
    }
    syntax(line, "{% raw %} without {% endraw %}");
  }

  // Tokens inside a tag, up to and past its end; returns the position after it.
  std::size_t inside(std::size_t pos, bool block) {
    int depth = 0;  // brackets open: a '}}' inside a dict literal does not end the tag
    const int line0 = line_at(pos);
    for (;;) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) syntax(line0, block ? "'%}' missing" : "'}}' missing");
      const int line = line_at(pos);
      const std::string_view rest(src_.data() + pos, src_.size() - pos);
      if (depth == 0) {
        const std::string_view end = block ? "%}" : "}}";
        const std::size_t skip = (rest[0] == '-' || (block && rest[0] == '+')) ? 1 : 0;
        if (rest.substr(skip, 2) == end) {
          tokens_.push_back({block ? tok::block_end : tok::var_end, line, {}});
          return after_end(pos + skip, pos + skip + 2, block);
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({tok::name, line, std::string(rest.substr(0, n))});
        pos += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos += number(rest, line);
      } else if (c == '\'' || c == '"') {
        pos += string(rest, line);
      } else {
        static constexpr std::array<std::string_view, 27> ops = {
            "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
            "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", ";", "!"};
        std::string_view found;
        for (const std::string_view o : ops) {
          if (rest.substr(0, o.size()) == o) {
            found = o;
            break;
          }
        }
        if (found.empty() || found == ";" || found == "!") {
          syntax(line, "unexpected character '", std::string(1, c), "'");
        }
        if (found == "(" || found == "[" || found == "{") ++depth;
        if ((found == ")" || found == "]" || found == "}") && depth > 0) --depth;
        tokens_.push_back({tok::op, line, std::string(found)});
        pos += found.size();
      }
    }
  }

  std::size_t number(std::string_view rest, int line) {
    std::size_t n = 0;
    std::string digits;
    bool is_float = false;
    const auto run = [&] {
      while (n < rest.size() &&
             (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    run();
    if (n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      digits += rest[n++];
      run();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      std::size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        digits += 'e';
        digits.append(rest.substr(n + 1, m - n - 1));
        n = m;
        run();
      }
    }
    token t{is_float ? tok::floating : tok::integer, line, digits};
    if (is_float) {
      t.d = std::strtod(digits.c_str(), nullptr);
    } else {
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
      if (r.ec != std::errc{}) syntax(line, "integer ", digits, " too large");
    }
    tokens_.push_back(std::move(t));
    return n;
  }

  std::size_t string(std::string_view rest, int line) {
    const char q = rest[0];
    std::string out;
    std::size_t n = 1;
    for (;;) {
      if (n >= rest.size()) syntax(line, "string literal not closed");
      const char c = rest[n];
      if (c == q) break;
      if (c != '\\' || n + 1 >= rest.size()) {
        out += c;
        ++n;
        continue;
      }
      const char e = rest[n + 1];
      n += 2;
      const auto hex = [&](std::size_t len) {
        std::uint32_t cp = 0;
        if (n + len > rest.size()) syntax(line, "truncated \\x / \\u escape");
        for (std::size_t k = 0; k < len; ++k) {
          const char h = rest[n + k];
          const int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (v < 0) syntax(line, "bad \\x / \\u escape");
          cp = cp * 16 + static_cast<std::uint32_t>(v);
        }
        n += len;
        if (cp > 0x10ffff) syntax(line, "\\U escape beyond U+10FFFF");
        append_utf8(out, cp);
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\n': break;  // a line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t cp = static_cast<std::uint32_t>(e - '0');
            for (int k = 0; k < 2 && n < rest.size() && rest[n] >= '0' && rest[n] <= '7'; ++k)
              cp = cp * 8 + static_cast<std::uint32_t>(rest[n++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({tok::string, line, std::move(out)});
    return n + 1;
  }

  std::string src_;
  std::vector<token> tokens_;
  std::size_t line_pos_ = 0;
  int line_ = 1;
};

class parser {
 public:
  parser(std::vector<token> tokens, parse_limits limits) : t_(std::move(tokens)), limits_(limits) {}

  std::vector<node_ptr> parse_template() {
    std::vector<node_ptr> body;
    const std::string end = statements(body, {});
    if (!end.empty()) syntax(cur().line, "unexpected '", std::string(end), "'");
    return body;
  }

 private:
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
    explicit level(parser& p) : p_(p) { p_.enter(); }
    ~level() { --p_.depth_; }
    level(const level&) = delete;
    level& operator=(const level&) = delete;
    parser& p_;
  };
  // The levels a chain takes, one a link (the tree grows one node deeper a link), given back
  // when the chain is parsed.
  struct chain {
    explicit chain(parser& p) : p_(p) {}
    void link() {
      p_.enter();
      ++n_;
    }
    ~chain() { p_.depth_ -= n_; }
    chain(const chain&) = delete;
    chain& operator=(const chain&) = delete;
    parser& p_;
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
