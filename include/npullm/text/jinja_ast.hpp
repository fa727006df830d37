// jinja_ast: the syntax tree of a Jinja template (text/jinja_parser.hpp builds it,
// text/jinja.hpp runs it): node kinds, operators, the known filters and tests by name (an
// unknown one is refused at parse time), the node itself (freed without recursion, however
// deep), and parse_limits, the one depth budget the parser and the interpreter share.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/text/jinja_value.hpp"

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

}  // namespace npullm::text::jinja
