// The Jinja interpreter (text/jinja.hpp): every construct chat templates use, against texts
// derived from Jinja2's documented semantics (trim_blocks and lstrip_blocks on, as transformers
// sets them); errors as Jinja's; the safety limits; the real templates of
// ../shared/vectors/chat-templates byte for byte against Jinja2's renderings (skipped, saying
// so, where that folder is absent); the fuzz corpus (tests/text/corpus_jinja) replayed;
// hostile templates (chains of 200,000 terms, size bombs, quadratic appends, deep nesting),
// each in a child process under an address-space limit, on a small stack, with an alarm.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "bounded.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/jinja.hpp"

#define NPULLM_JINJA_FUZZ_NO_ENTRY
#include "text/fuzz_jinja.cpp"

namespace {

namespace fs = std::filesystem;
namespace jinja = npullm::text::jinja;
using jinja::json;
using npullm::error_code;

jinja::render_options fixed_date() {
  jinja::render_options o;
  std::tm date{};
  date.tm_year = 2024 - 1900, date.tm_mon = 6, date.tm_mday = 26, date.tm_wday = 5;
  date.tm_yday = 207;
  o.now = date;
  return o;
}

std::string render(std::string_view source, const json& vars = json::object(),
                   const jinja::render_options& options = fixed_date()) {
  return jinja::template_program::parse(source).render(vars, options);
}

// fn() must throw npullm::error with this code and a message containing fragment.
template <class Fn>
void expect_error(Fn&& fn, error_code code, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected npullm::error containing: " << fragment;
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

void render_error(std::string_view source, const json& vars, error_code code,
                  const std::string& fragment) {
  SCOPED_TRACE(std::string(source));
  expect_error([&] { (void)render(source, vars); }, code, fragment);
}

const json conversation = json::parse(R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello."},
  {"role": "user", "content": "2+2?"}]})");

TEST(jinja, whitespace_control_and_block_trimming) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\n"), "yes\n");
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\nend"), "  x\nend");
  // Not at a line's start: nothing stripped; variable tags are never trimmed.
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");
  EXPECT_EQ(render("{{ 'x' }}\n{{ 'y' }}"), "x\ny");
  // '-' strips all whitespace on its side, newlines included; '+' keeps it.
  EXPECT_EQ(render("a  \n {%- if true -%} \n b \n {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}  \nc"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
  // Comments, trimmed as blocks are.
  EXPECT_EQ(render("a {# note #} b"), "a  b");
  EXPECT_EQ(render("  {# note #}\nx"), "x");
  EXPECT_EQ(render("a {#- note -#} b"), "ab");
  // raw, newlines normalized, one trailing newline dropped (keep_trailing_newline=False).
  EXPECT_EQ(render("{% raw %}{{ x }} {% if %}{% endraw %}"), "{{ x }} {% if %}");
  // {% raw %} itself is not trimmed (Jinja's lexer), its {% endraw %} is.
  EXPECT_EQ(render("{% raw %}\nx\n{% endraw %}\ny"), "\nx\ny");
  EXPECT_EQ(render("{%- raw -%}\n x {%- endraw %}"), "x");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(render("x\n\n"), "x\n");
}

TEST(jinja, values_print_as_python_prints_them) {
  EXPECT_EQ(render("{{ none }}|{{ true }}|{{ False }}|{{ 1.0 }}|{{ 10 / 4 }}|{{ 2 ** 10 }}"),
            "None|True|False|1.0|2.5|1024");
  EXPECT_EQ(render("{{ [1, 'a', none] }}|{{ {'a': 1} }}|{{ (1,) }}|{{ ('a', 2) }}"),
            "[1, 'a', None]|{'a': 1}|(1,)|('a', 2)");
  EXPECT_EQ(render("{{ 1e20 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1_000 }}"), "1e+20|0.0001|1e-05|1000");
  // Undefined prints nothing; 'a' 'b' is one string; escapes as Python's.
  EXPECT_EQ(render("[{{ nothing }}]{{ 'a' 'b' }}{{ '\\t\\u00e9\\x41' }}"),
            "[]ab\t\xc3\xa9"
            "A");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 * 'ab' }}"),
            "3 -4 2 -2 abab");
  EXPECT_EQ(render("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 1 + 0.5 }}"),
            "3 9 4 1.5");
}

TEST(jinja, if_elif_else) {
  const std::string t =
      "{% for n in [0, 1, 2, 3] %}{% if n == 0 %}zero{% elif n == 1 %}one{% elif n is even %}"
      "even{% else %}odd{% endif %},{% endfor %}";
  EXPECT_EQ(render(t), "zero,one,even,odd,");
  EXPECT_EQ(render("{{ 'y' if x else 'n' }}{{ 'y' if not x }}.", json{{"x", false}}), "ny.");
  EXPECT_EQ(render("{% if a and not b or c %}t{% endif %}", json{{"a", 1}, {"b", 0}, {"c", 0}}),
            "t");
  // and / or give an operand, as Python's do.
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|"), "x b |");
}

TEST(jinja, for_loops_and_loop_variables) {
  EXPECT_EQ(render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}"
                   "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}|{% endfor %}"),
            "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"),
            "-2,1-3,2-,");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in nothing %}x{% else %}none{% endfor %}"), "none");
  // The filter runs before the loop counts.
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}"
                   "{% endfor %}"),
            "1,3,5,7,9");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"), "ba");
  EXPECT_EQ(render("{% for c in 'hé!' %}[{{ c }}]{% endfor %}"), "[h][é][!]");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}"
                   "{{ loop.index }}{% endfor %}"),
            "121122");
  EXPECT_EQ(render("{% for m in messages %}{{ m.role[0] }}{% endfor %}", conversation), "suau");
  EXPECT_EQ(
      render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }}"),
      "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
}

TEST(jinja, set_block_set_and_namespace) {
  // A set inside a loop stays in its iteration (Jinja's scoping); namespace carries values out.
  EXPECT_EQ(render("{% set iterated = false %}{% for x in [1] %}{% set iterated = true %}"
                   "{% endfor %}{{ iterated }}"),
            "False");
  EXPECT_EQ(render("{% set ns = namespace(n=0, seen=[]) %}{% for i in [1, 2, 3] %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% set ns = namespace(found=false) %}{% for m in messages %}"
                   "{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}"
                   "{% endfor %}{{ ns.found }}",
                   conversation),
            "True");
  EXPECT_EQ(render("{% set x %}a{{ 1 + 1 }}b{% endset %}{{ x }}"), "a2b");
  EXPECT_EQ(render("{% set x | upper %}abc{% endset %}{{ x }}"), "ABC");
  EXPECT_EQ(render("{% set a, b = 1, 'two' %}{{ a }}{{ b }}"), "1two");
  // An if has no scope of its own.
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(render("{% set x = 1 %}{% with x = 2 %}{{ x }}{% endwith %}{{ x }}"), "21");
}

TEST(jinja, macros) {
  const std::string m =
      "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!"
      "{% endmacro %}";
  EXPECT_EQ(render(m + "{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} "
                       "{{ greet(greeting='Yo', name='Cy') }}"),
            "Hello, Ann! Hi, Bob! Yo, Cy!");
  // A call is its text, usable in expressions; a missing argument is undefined.
  EXPECT_EQ(render(m + "{{ greet('A') | length }} {{ greet() }}"), "9 Hello, !");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ f(3) }}"),
            "321");
  render_error(m + "{{ greet('a', 'b', 'c') }}", json::object(), error_code::invalid_argument,
               "takes not more than 2");
}

TEST(jinja, subscripts_and_slices) {
  EXPECT_EQ(render("{{ messages[1:] | map(attribute='role') | join(',') }}", conversation),
            "user,assistant,user");
  EXPECT_EQ(
      render("{{ (messages[::-1] | first).content }} {{ messages[-1]['role'] }}", conversation),
      "2+2? user");
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5][1:4] }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2][5:] }}"),
            "[2, 3, 4] [1, 3, 5] []");
  EXPECT_EQ(render("{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ 'abc'[-1] }}"),
            "el olleh é c");
  // Out of range: undefined (prints nothing), as Jinja's getitem.
  EXPECT_EQ(render("[{{ messages[9] }}]", conversation), "[]");
  EXPECT_EQ(render("{{ messages[0].role }}{{ messages.0.role }}", conversation), "systemsystem");
}

TEST(jinja, tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ y is undefined }}", json{{"x", 1}}),
            "TrueFalseTrue");
  EXPECT_EQ(render("{{ none is none }}{{ 1 is none }}{{ 1 is not none }}"), "TrueFalseTrue");
  EXPECT_EQ(render("{{ 'a' is string }}{{ 1 is string }}"), "TrueFalse");
  EXPECT_EQ(render("{{ [1] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}"
                   "{{ none is iterable }}"),
            "TrueTrueFalseFalse");
  EXPECT_EQ(render("{{ {} is mapping }}{{ [] is mapping }}"), "TrueFalse");
  EXPECT_EQ(render("{{ 1 is number }}{{ 1.5 is number }}{{ 'a' is number }}{{ 1 is integer }}"
                   "{{ 1.0 is float }}"),
            "TrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ x is false }}{{ 0 is false }}{{ x is boolean }}", json{{"x", false}}),
            "TrueFalseTrue");
  EXPECT_EQ(render("{{ 9 is divisibleby 3 }}{{ 4 is even }}{{ 4 is odd }}{{ 2 is eq 2 }}"
                   "{{ 'ab' is lower }}{{ 'a' is in 'cat' }}"),
            "TrueTrueFalseTrueTrueTrue");
}

TEST(jinja, operators_in_and_concatenation) {
  EXPECT_EQ(render("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}"),
            "TrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 1 ~ 'a' ~ none ~ nothing ~ [1] }}"), "1aNone[1]");
  EXPECT_EQ(render("{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' != 'b' }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}"
                   "{{ [1, 2] < [1, 3] }}{{ 'a' < 'b' }}"),
            "TrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ [1] + [2] }} {{ 'a' + 'b' }}"), "[1, 2] ab");
}

TEST(jinja, string_methods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}"
                   "{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('x') }}"),
            "TrueTrueTrueFalse");
  EXPECT_EQ(
      render("{{ 'a,b,,c'.split(',') }} {{ '  a b\n c '.split() }} {{ 'a-b-c'.split('-', 1) }}"),
      "['a', 'b', '', 'c'] ['a', 'b', 'c'] ['a', 'b-c']");
  EXPECT_EQ(render("[{{ '  hi  '.strip() }}][{{ '  hi  '.lstrip() }}][{{ '  hi  '.rstrip() }}]"
                   "[{{ 'xxhixx'.strip('x') }}][{{ '\nab\n'.lstrip('\n') }}]"),
            "[hi][hi  ][  hi][hi][ab\n]");
  EXPECT_EQ(render("{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'aXa'.replace('a', 'b') }} "
                   "{{ 'hello wORLD'.title() }} {{ 'aaa'.replace('a', 'b', 2) }}"),
            "HELLO hello bXb Hello World bba");
  // Qwen3's thinking split.
  EXPECT_EQ(render("{{ c.split('</think>')[-1].lstrip('\n') }}|"
                   "{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}",
                   json{{"c", "<think>\nwhy\n</think>\n\nanswer"}}),
            "answer|why");
}

TEST(jinja, filters) {
  EXPECT_EQ(render("[{{ '  x \n' | trim }}][{{ 'xxhixx' | trim('x') }}][{{ none | trim }}]"),
            "[x][hi][None]");
  EXPECT_EQ(render("{{ [1, 2, 3] | length }}{{ 'héllo' | length }}{{ {'a': 1} | count }}"
                   "{{ nothing | length }}"),
            "3510");
  EXPECT_EQ(render("{{ ['a', 'b'] | join(', ') }}|{{ [1, 2] | join }}|"
                   "{{ messages | join('/', attribute='role') }}",
                   conversation),
            "a, b|12|system/user/assistant/user");
  EXPECT_EQ(render("{{ ['a', 'b'] | map('upper') | join }} "
                   "{{ messages | map(attribute='content') | first }} "
                   "{{ messages | map(attribute='x', default='-') | join }}",
                   conversation),
            "AB Be brief. ----");
  EXPECT_EQ(
      render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content')"
             " | join(',') }} {{ messages | rejectattr('role', 'eq', 'user') | list | length }}"
             " {{ [{'on': 1}, {'on': 0}, {}] | selectattr('on') | list | length }}"
             " {{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, ''] | reject | list }}",
             conversation),
      "Hi,2+2? 2 1 [1, 3] [0, '']");
  EXPECT_EQ(render("{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }}"
                   "[{{ [] | first }}]"),
            "13a[]");
  EXPECT_EQ(
      render("{{ nope | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }}"
             " {{ 'x' | d('d') }}"),
      "d None d x");
  EXPECT_EQ(
      render("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {{ nothing | items | list }}",
             json{{"d", {{"z", 1}, {"a", 2}}}}),
      "z1a2 []");
  EXPECT_EQ(render("{{ 'ab' | list }} {{ {'a': 1} | list }} {{ (1, 2) | list }}"),
            "['a', 'b'] ['a'] [1, 2]");
  EXPECT_EQ(render("{{ (1 | string) + 'x' }} {{ none | string }} {{ [1] | string }}"),
            "1x None [1]");
  EXPECT_EQ(
      render("{{ '42' | int + 1 }} {{ 'x' | int }} {{ 3.9 | int }} {{ '3.9' | int }} "
             "{{ 'x' | int(7) }} {{ ' 12 ' | int }} {{ 'ff' | int(base=16) }} {{ '2.5' | float }}"),
      "43 0 3 3 7 12 255 2.5");
  EXPECT_EQ(render("{{ '<b>&' | safe }} {{ '<b>&' | e }}"), "<b>& &lt;b&gt;&amp;");
  EXPECT_EQ(render("{{ 'hELLO wORLD' | capitalize }} {{ 'hello-big world' | title }} "
                   "{{ 'Ab' | upper }}{{ 'Ab' | lower }}"),
            "Hello world Hello-Big World ABab");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}|"
                   "{{ 'a\n\nb' | indent('> ', blank=true) }}"),
            "a\n  b\n\n  c|  a\n  b|a\n> \n> b");
  EXPECT_EQ(render("{{ 'a b' | replace(' ', '_') }} {{ -3 | abs }} {{ [3, 1, 2] | sort }} "
                   "{{ [3, 1, 2] | sort(reverse=true) | join }} {{ [1, 1, 2] | unique | list }} "
                   "{{ [1, 2, 3] | sum }} {{ [2, 9, 4] | max }}{{ [2, 9, 4] | min }} "
                   "{{ [1, 2] | reverse | list }} {{ 2.5 | round }} {{ 'one two' | wordcount }}"),
            "a_b 3 [1, 2, 3] 321 [1, 2] 6 92 [2, 1] 2.0 2");
}

TEST(jinja, tojson_writes_what_python_json_dumps_writes) {
  // Default separators ", " and ": "; non-ASCII as is; keys in the caller's order.
  EXPECT_EQ(render("{{ {'a': [1, 2.5, none, true], 'b': 'é\"\\\\\n'} | tojson }}"),
            "{\"a\": [1, 2.5, null, true], \"b\": \"é\\\"\\\\\\n\"}");
  EXPECT_EQ(render("{{ x | tojson }}", json::parse(R"({"x": {"z": 1, "a": {"k": []}}})")),
            "{\"z\": 1, \"a\": {\"k\": []}}");
  // indent: "," between items, a newline and the indent per level; empty containers stay [].
  EXPECT_EQ(render("{{ {'a': [1, 2], 'e': []} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"e\": []\n}");
  EXPECT_EQ(render("{{ {'a': 1, 'b': 2} | tojson(separators=(',', ':')) }}"), "{\"a\":1,\"b\":2}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(
      render("{{ 'é\x01' | tojson(ensure_ascii=true) }} {{ 'x' | tojson }} {{ 1.0 | tojson }}"),
      "\"\\u00e9\\u0001\" \"x\" 1.0");
  render_error("{{ nothing | tojson }}", json::object(), error_code::invalid_argument,
               "Object of type Undefined is not JSON serializable");
}

TEST(jinja, raise_exception_and_strftime_now) {
  render_error("{% if r != 'user' %}{{ raise_exception('bad role: ' ~ r) }}{% endif %}",
               json{{"r", "x"}}, error_code::invalid_argument, "bad role: x");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}"),
            "26 Jul 2024|2024-07-26");
  // Without a fixed date: today's.
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  localtime_r(&now, &t);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}", json::object(), {}),
            std::to_string(t.tm_year + 1900));
}

TEST(jinja, errors_as_jinja_raises_them) {
  const json d = {{"d", json::object()}, {"n", nullptr}};
  render_error("{{ n + 'a' }}", d, error_code::invalid_argument,
               "unsupported operand type(s) for +: 'NoneType' and 'str'");
  render_error("{{ 'a' + 1 }}", d, error_code::invalid_argument,
               "can only concatenate str (not \"int\") to str");
  render_error("{{ x.y }}", d, error_code::invalid_argument, "'x' is undefined");
  render_error("{{ d.missing.z }}", d, error_code::invalid_argument,
               "'dict object' has no attribute 'missing'");
  render_error("{{ nothing + 1 }}", d, error_code::invalid_argument, "'nothing' is undefined");
  render_error("{{ '</think>' in n }}", d, error_code::invalid_argument,
               "argument of type 'NoneType' is not iterable");
  render_error("{{ 1 < 'a' }}", d, error_code::invalid_argument,
               "'<' not supported between instances of 'int' and 'str'");
  render_error("{{ [1].append(2) }}", d, error_code::invalid_argument, "unsafe");
  render_error("{% for x in 3 %}{% endfor %}", d, error_code::invalid_argument,
               "'int' object is not iterable");
  render_error("{{ n | length }}", d, error_code::invalid_argument, "has no len()");
  render_error("{% set d.x = 1 %}", d, error_code::invalid_argument, "non-namespace");
  render_error("{{ 1 // 0 }}", d, error_code::invalid_argument, "by zero");
  // Names made at render time outlive their strings (ASan checks it in the sanitizer build).
  render_error("{% set u = d['a' ~ 'b'] %}{{ u.x }}", d, error_code::invalid_argument,
               "'dict object' has no attribute 'ab'");
  EXPECT_EQ(render("{{ e[('it' ~ 'ems')]() | list }}", json{{"e", {{"k", 1}}}}), "[('k', 1)]");
  // Missing attributes of a dict or None print nothing (Undefined), as in Jinja.
  EXPECT_EQ(render("[{{ d.missing }}{{ n.x }}{{ d['k'] }}]", d), "[]");
}

TEST(jinja, unsupported_constructs_and_syntax_errors_refused_at_parse_time) {
  const auto refused = [](std::string_view source, error_code code, const std::string& fragment) {
    SCOPED_TRACE(std::string(source));
    expect_error([&] { (void)jinja::template_program::parse(source); }, code, fragment);
  };
  refused("line 1\n{% include 'x.jinja' %}", error_code::unsupported, "line 2");
  refused("line 1\n{% include 'x.jinja' %}", error_code::unsupported, "include");
  refused("{% extends 'base' %}", error_code::unsupported, "extends");
  refused("{% call f() %}x{% endcall %}", error_code::unsupported, "call");
  refused("\n\n{{ x | nosuchfilter }}", error_code::unsupported,
          "line 3: the filter 'nosuchfilter'");
  refused("{% if x is nosuchtest %}{% endif %}", error_code::unsupported, "nosuchtest");
  refused("{% for x in y recursive %}{% endfor %}", error_code::unsupported, "recursive");
  refused("{{ f(*args) }}", error_code::unsupported, "*args");
  refused("{% frobnicate %}", error_code::unsupported, "frobnicate");
  refused("{% if x %}", error_code::corrupt_data, "endif");
  refused("\n{{ x + }}", error_code::corrupt_data, "line 2");
  refused("{% endfor %}", error_code::corrupt_data, "endfor");
  refused("{{ 'abc }}", error_code::corrupt_data, "string literal not closed");
  refused("{% break %}", error_code::corrupt_data, "outside a for loop");
  refused("{{ x ", error_code::corrupt_data, "'}}' missing");
}

TEST(jinja, safety_limits_give_errors_not_crashes_or_hangs) {
  jinja::render_options small = fixed_date();
  small.limits = {.max_output_bytes = 10000, .max_iterations = 10000, .max_call_depth = 32};
  const auto limited = [&](std::string_view source, const std::string& fragment) {
    SCOPED_TRACE(std::string(source));
    expect_error([&] { (void)render(source, json::object(), small); },
                 error_code::capacity_exhausted, fragment);
  };
  limited("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper than 32");
  limited("{% for i in range(1000000000) %}{% endfor %}", "range()");
  limited("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
          "loop iterations");
  limited("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", "exceeds the limit of 10000");
  limited("{{ 'x' * 10000000000000 }}", "exceeds the limit");
  limited(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "exceeds the limit");
  // Lists built inside lists, deeper than max_nesting; a namespace holding itself.
  limited(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}",
      "nested deeper than 256");
  render_error("{% set ns = namespace(a=1) %}{% set ns.b = [ns] %}{{ ns }}", json::object(),
               error_code::unsupported, "namespace holding a namespace");
  // The interpreter's own recursion.
  jinja::render_options shallow = fixed_date();
  shallow.limits.max_depth = 50;
  expect_error(
      [&] {
        std::string sum = "1";
        for (int k = 0; k < 60; ++k) sum = "1 + (" + sum + ")";
        (void)render("{{ " + sum + " }}", json::object(), shallow);
      },
      error_code::capacity_exhausted, "nested deeper than 50 while rendering");
  // The default limits hold too (recursion without a base case).
  expect_error([] { (void)render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); },
               error_code::capacity_exhausted, "nested deeper");
  // Nesting that would overflow the parser's stack is refused.
  expect_error(
      [] {
        (void)jinja::template_program::parse("{{ " + std::string(100000, '(') + "1" +
                                             std::string(100000, ')') + " }}");
      },
      error_code::capacity_exhausted, "nested deeper than 256");
  std::string blocks;
  for (int k = 0; k < 5000; ++k) blocks += "{% if true %}";
  expect_error([&] { (void)jinja::template_program::parse(blocks); },
               error_code::capacity_exhausted, "nested deeper");
  // Within the limits the same constructs run.
  EXPECT_EQ(render("{% for i in range(3) %}{{ 'x' * 2 }}{% endfor %}", json::object(), small),
            "xxxxxx");
}

// ---- hostile templates: bounded by the test process, not by trust ---------------------------

// The limits a hostile render runs under (tests/bounded.hpp), set in a forked child: RLIMIT_AS
// of 4 GiB (not under ASan, whose shadow memory reserves terabytes of address space); a stack
// of 1 MiB (a server's worker thread may have no more; ASan's frames are several times larger,
// so 8 MiB, glibc's default thread stack, there); 10 CPU seconds (RLIMIT_CPU: SIGXCPU past
// it), since the machine running the tests may be shared and its wall clock slowed; a
// wall-clock alarm of 120 s catches a child that waits instead of computing.
constexpr unsigned hostile_seconds = 10;
constexpr npullm_test::bounds hostile_bounds{
    .stack = npullm_test::under_asan ? std::size_t{8} << 20 : std::size_t{1} << 20,
    .address_space = std::size_t{4} << 30,
    .cpu_seconds = hostile_seconds,
    .wall_seconds = 120};

struct bounded_run {
  std::string outcome;  // "ok: <text>", "error: <what()>" or "other exception: <what()>"
  double seconds = 0;   // wall clock
  double cpu_seconds = 0;
  long max_rss_mib = 0;
};

// fn in a forked child under hostile_bounds. The child must exit normally (a stack overflow,
// an abort, SIGXCPU or the alarm fail the test); it reports what fn gave, its CPU time and its
// peak resident memory.
bounded_run run_bounded(const std::function<std::string()>& fn) {
  const npullm_test::bounded_outcome r = npullm_test::run_bounded(fn, hostile_bounds);
  EXPECT_TRUE(r.died.empty()) << r.died;
  bounded_run b{{}, r.seconds, r.cpu_seconds, r.max_rss_mib};
  switch (r.how) {
    case npullm_test::ended::value: b.outcome = "ok: " + r.text; break;
    case npullm_test::ended::npullm_error:
      b.outcome = std::string("error: ") + npullm::error(r.code, r.text).what();
      break;
    case npullm_test::ended::bad_alloc: b.outcome = "other exception: std::bad_alloc"; break;
    case npullm_test::ended::other_exception: b.outcome = "other exception: " + r.text; break;
  }
  return b;
}

// source parsed and rendered (default limits but the date) within the bounds; the outcome
// must start with expected_prefix and contain fragment.
void hostile(const std::string& what, const std::string& source, const std::string& expected,
             const std::string& fragment = {}, const json& vars = json::object(),
             const jinja::render_options& options = fixed_date()) {
  SCOPED_TRACE(what);
  const bounded_run r =
      run_bounded([&] { return jinja::template_program::parse(source).render(vars, options); });
  const std::string shown = r.outcome.size() > 300 ? r.outcome.substr(0, 300) + "..." : r.outcome;
  EXPECT_EQ(r.outcome.rfind(expected, 0), 0u) << shown;
  EXPECT_NE(r.outcome.find(fragment), std::string::npos) << shown;
  EXPECT_LT(r.cpu_seconds, hostile_seconds);
  std::printf("  %-44s %6.2f s (CPU %5.2f s) %5ld MiB  %s\n", what.c_str(), r.seconds,
              r.cpu_seconds, r.max_rss_mib, shown.substr(0, 140).c_str());
}

std::string repeated(std::string_view unit, std::size_t n) {
  std::string s;
  s.reserve(unit.size() * n);
  for (std::size_t k = 0; k < n; ++k) s.append(unit);
  return s;
}

const std::string too_deep = "error: npullm capacity_exhausted";

// A work budget of 64 MiB instead of 1 GiB: the same refusal, sooner (the test's time, under
// ASan above all); the default budget's own figures are those of the cases that keep it.
jinja::render_options small_budget() {
  jinja::render_options o = fixed_date();
  o.limits.max_work_bytes = std::size_t{64} << 20;
  return o;
}

TEST(jinja_hostile, operator_chains_of_200000_terms_render) {
  // One node per chain, evaluated by a loop: these work (no depth, no quadratic copying).
  hostile("~ chain of 200,000", "{{ x" + repeated(" ~ x", 199999) + " }}",
          "ok: " + std::string(200000, 'a'), {}, json{{"x", "a"}});
  hostile("+ chain of 200,000 (integers)", "{{ 1" + repeated(" + 1", 199999) + " }}", "ok: 200000");
  hostile("+ chain of 200,000 (strings)", "{{ x" + repeated(" + x", 199999) + " }}",
          "ok: " + std::string(200000, 'a'), {}, json{{"x", "a"}});
  hostile("and chain of 200,000", "{{ 1" + repeated(" and 1", 199999) + " }}", "ok: 1");
  hostile("or chain of 20,000", "{{ 0" + repeated(" or 0", 19998) + " or 7 }}", "ok: 7");
  hostile("* and - chain of 20,000", "{{ 2" + repeated(" * 1 - 0", 10000) + " }}", "ok: 2");
}

TEST(jinja_hostile, postfix_filter_and_elif_chains_are_refused_by_the_depth_budget) {
  const std::string limit = "nested deeper than 256 levels (parse_limits::max_depth";
  hostile("filter chain of 200,000", "{{ x" + repeated("|trim", 200000) + " }}", too_deep, limit,
          json{{"x", " a "}});
  hostile("test chain of 200,000", "{{ x" + repeated(" is defined", 200000) + " }}", too_deep,
          limit);
  hostile("attribute chain of 200,000", "{{ x" + repeated(".a", 200000) + " }}", too_deep, limit);
  hostile("subscript chain of 200,000", "{{ x" + repeated("[0]", 200000) + " }}", too_deep, limit);
  hostile("call chain of 200,000", "{{ x" + repeated("()", 200000) + " }}", too_deep, limit);
  hostile("conditional chain of 200,000", "{{ 1" + repeated(" if 1", 200000) + " }}", too_deep,
          limit);
  hostile("elif chain of 100,000",
          "{% if x %}a" + repeated("{% elif x %}a", 100000) + "{% endif %}", too_deep, limit);
  // Within the budget the same shapes work.
  hostile("filter chain of 100", "{{ x" + repeated("|trim", 100) + " }}", "ok: a", {},
          json{{"x", " a "}});
  hostile("elif chain of 200",
          "{% if x %}a" + repeated("{% elif x %}a", 199) + "{% else %}b{% endif %}", "ok: b", {},
          json{{"x", false}});
}

TEST(jinja_hostile, deep_nesting_is_refused) {
  const std::string limit = "nested deeper than 256 levels (parse_limits::max_depth";
  hostile("{% if %} x 100,000", repeated("{% if 1 %}", 100000), too_deep, limit);
  hostile("{% for %} x 100,000", repeated("{% for x in y %}", 100000), too_deep, limit);
  hostile("( x 100,000", "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
          too_deep, limit);
  hostile("[ x 100,000", "{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}",
          too_deep, limit);
  hostile("{ x 100,000",
          "{{ " + repeated("{'a': ", 100000) + "1" + std::string(100000, '}') + " }}", too_deep,
          limit);
  hostile("not x 100,000", "{{ " + repeated("not ", 100000) + "1 }}", too_deep, limit);
  hostile("- x 100,000", "{{ " + repeated("-", 100000) + "1 }}", too_deep, limit);
  // Deep but within the parser's budget: the interpreter's stays within the stack too.
  // (each parenthesis takes two levels: the expression inside it and its operand).
  hostile("( x 120 with filters",
          "{{ " + std::string(120, '(') + "x|trim" + std::string(120, ')') + " }}", "ok: a", {},
          json{{"x", "a"}});
  hostile("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", too_deep,
          "(render_limits)");
  // Macros whose bodies nest: the interpreter's recursion reaches render_limits::max_depth
  // (1,024) before the stack's end.
  hostile("recursion to render_limits::max_depth",
          "{% macro f(n) %}" + repeated("{% if 1 %}", 30) + "{{ f(((n + 1))|abs) }}" +
              repeated("{% endif %}", 30) + "{% endmacro %}{{ f(0) }}",
          too_deep, "nested deeper than 1024 while rendering");
}

TEST(jinja_hostile, deep_caller_json_is_refused_when_printed_or_compared) {
  // The caller's JSON (a request's messages) is not bounded by max_nesting: printing and
  // comparing it recurse at most max_print_depth (1,024) levels. Made in the child, whose
  // bounds also cover nlohmann::json's own parsing and freeing of it.
  for (const std::string expression : {"x", "x|tojson", "x == y", "x < y", "x in [y]"}) {
    SCOPED_TRACE(expression);
    const bounded_run r = run_bounded([&] {
      // Moved in, never copied: nlohmann::json's copy recurses (so does its parser for a value
      // inside an object, and ordered_json's growth: it copies its members), its parser of an
      // array and its destructor do not. Both keys first, so that the object does not grow.
      const std::string deep = std::string(100000, '[') + std::string(100000, ']');
      json vars = json{{"x", nullptr}, {"y", nullptr}};
      vars["x"] = json::parse(deep);
      vars["y"] = json::parse(deep);
      return render("{{ " + expression + " }}", vars);
    });
    EXPECT_EQ(r.outcome.rfind("error: npullm capacity_exhausted", 0), 0u) << r.outcome;
    EXPECT_NE(r.outcome.find("nested deeper than 1024 levels"), std::string::npos) << r.outcome;
    EXPECT_LT(r.cpu_seconds, hostile_seconds);
  }
  // chat_template copies the messages into its variables: their depth is checked first.
  const bounded_run r = run_bounded([] {
    const json messages = json::parse(R"([{"role": "user", "content": )" +
                                      std::string(100000, '[') + std::string(100000, ']') + "}]");
    return npullm::text::chat_template::from_jinja("{{ messages }}")
        .apply_json(messages, npullm::text::chat_options{});
  });
  EXPECT_EQ(r.outcome,
            "error: npullm capacity_exhausted: chat messages nested deeper than 1024 "
            "levels");
  EXPECT_EQ(render("{{ x == y }} {{ x|tojson }}",
                   json{{"x", json::parse("[[[1]]]")}, {"y", json::parse("[[[1]]]")}}),
            "True [[[1]]]");
}

TEST(jinja_hostile, size_bombs_are_refused_before_allocating) {
  const std::string big = "{% set s = 'x' * 1000000 %}";
  const std::string output_limit = "(render_limits::max_output_bytes)";
  const std::string refused = "error: npullm capacity_exhausted";
  hostile("s.replace('x', s), 10^6 chars", big + "{{ s.replace('x', s) }}", refused,
          "replace would make 0 + 1000000 x 1000000 bytes");
  hostile("s|replace('x', s)", big + "{{ s|replace('x', s) }}", refused, output_limit);
  hostile("s.replace('', s)", big + "{{ s.replace('', s) }}", refused, output_limit);
  hostile("doubling ~ loop",
          "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}{{ ns.s|length }}",
          refused, output_limit);
  hostile("doubling + loop",
          "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
          "{% endfor %}",
          refused, output_limit);
  hostile("doubling list loop",
          "{% set ns = namespace(xs=[1]) %}{% for i in range(64) %}{% set ns.xs = ns.xs + ns.xs %}"
          "{% endfor %}",
          refused, "(render_limits::max_items)");
  hostile("doubling set without namespace",
          "{% set s = 'x' %}" + repeated("{% set s = s ~ s %}", 64) + "{{ s|length }}", refused,
          output_limit);
  hostile("indent(1000) of 10^6 lines", "{{ ('\\n' * 1000000)|indent(1000, blank=true) }}", refused,
          "indent would make");
  hostile("indent(s) of 10^6 lines", big + "{{ ('\\n' * 1000000)|indent(s, blank=true) }}", refused,
          "indent would make");
  hostile("'x' * 10^15", "{{ 'x' * 1000000000000000 }}", refused, output_limit);
  hostile("'' * 10^18", "{{ ('' * 1000000000000000000)|length }}", "ok: 0");
  hostile("[] * 10^18", "{{ ([] * 1000000000000000000)|length }}", "ok: 0");
  hostile("[0] * 10^9", "{{ ([0] * 1000000000)|length }}", refused, "(render_limits::max_items)");
  hostile("[s] * 1000 printed", big + "{{ [s] * 1000 }}", refused, output_limit);
  hostile("([s] * 1000)|tojson", big + "{{ ([s] * 1000)|tojson }}", refused, output_limit);
  hostile("([s] * 1000)|join(s)", big + "{{ ([s] * 1000)|join(s) }}", refused, output_limit);
  hostile("s ~ [s] * 100", big + "{{ s ~ [s] * 100 }}", refused, output_limit);
  hostile("(s * 20)|e", "{{ ('<' * 10000000)|e }}", refused, output_limit);
  hostile("split into 5 x 10^6 parts", "{{ ('a,' * 5000000).split(',')|length }}", refused,
          "(render_limits::max_items)");
  hostile("rsplit into 5 x 10^6 parts", "{{ ('a,' * 5000000).rsplit(',')|length }}", refused,
          "(render_limits::max_items)");
  hostile("split on whitespace into 5 x 10^6 parts", "{{ ('a ' * 5000000).split()|length }}",
          refused, "(render_limits::max_items)");
  hostile("s|list of 10^7 characters", "{{ ('x' * 10000000)|list|length }}", refused,
          "(render_limits::max_items)");
  hostile("10^6 x s[500000] on 10^6 chars",
          big + "{% for i in range(1000000) %}{{ s[500000] }}{% endfor %}", refused,
          "(render_limits::max_work_bytes)", json::object(), small_budget());
  const std::string two = "{% set s = 'x' * 10000000 %}{% set t = 'x' * 10000000 %}";
  hostile("10^3 x (t in [s] * 1000), 10^7 chars each",
          two + "{% set xs = [s] * 1000 %}{% for i in range(1000) %}{{ t in xs }}{% endfor %}",
          refused, "(render_limits::max_work_bytes)", json::object(), small_budget());
  hostile("sort of [s, t] * 500000", two + "{{ ([s, t] * 500000)|sort|length }}", refused,
          "(render_limits::max_work_bytes)", json::object(), small_budget());
  hostile("unique of [s, t] * 500000", two + "{{ ([s, t] * 500000)|unique|length }}", refused,
          "(render_limits::max_work_bytes)", json::object(), small_budget());
  hostile("10^6 x (s == t)", two + "{% for i in range(1000000) %}{{ s == t }}{% endfor %}", refused,
          "(render_limits::max_work_bytes)");
  hostile("10^6 x copy of a 10^6-char string",
          big + "{% for i in range(1000000) %}{% set t = s|upper %}{% endfor %}", refused,
          "(render_limits::max_work_bytes)", json::object(), small_budget());
}

TEST(jinja_hostile, appending_in_a_loop_is_linear) {
  // Each + / ~ grows the namespace's value in place: linear in the length, not quadratic.
  hostile("ns.xs = ns.xs + [i], 10^6 times",
          "{% set ns = namespace(xs=[]) %}{% for i in range(1000000) %}"
          "{% set ns.xs = ns.xs + [i] %}{% endfor %}{{ ns.xs|length }} {{ ns.xs[-1] }}",
          "ok: 1000000 999999");
  hostile("ns.s = ns.s ~ 'ab', 10^6 times",
          "{% set ns = namespace(s='') %}{% for i in range(1000000) %}"
          "{% set ns.s = ns.s ~ 'a' ~ 'b' %}{% endfor %}{{ ns.s|length }}",
          "ok: 2000000");
  hostile("ns.s = ns.s + 'a', 2 x 10^5 times",
          "{% set ns = namespace(s='') %}{% for i in range(200000) %}"
          "{% set ns.s = ns.s + 'a' %}{% endfor %}{{ ns.s|length }}",
          "ok: 200000");
  // Prepending cannot be done in place: the work budget stops it.
  hostile("ns.xs = [i] + ns.xs, 10^6 times",
          "{% set ns = namespace(xs=[]) %}{% for i in range(1000000) %}"
          "{% set ns.xs = [i] + ns.xs %}{% endfor %}{{ ns.xs|length }}",
          "error: npullm capacity_exhausted", "(render_limits::max_work_bytes)", json::object(),
          small_budget());
  hostile("ns.s = 'a' ~ ns.s, 10^6 times",
          "{% set ns = namespace(s='') %}{% for i in range(1000000) %}"
          "{% set ns.s = 'a' ~ ns.s %}{% endfor %}{{ ns.s|length }}",
          "error: npullm capacity_exhausted", "(render_limits::max_work_bytes)", json::object(),
          small_budget());
  // A copy kept elsewhere is not changed by the append (the value is shared, so copied).
  EXPECT_EQ(render("{% set ns = namespace(xs=[1], s='a') %}{% set keep = ns.xs %}"
                   "{% set t = ns.s %}{% set ns.xs = ns.xs + [2] %}{% set ns.s = ns.s ~ 'b' %}"
                   "{{ keep }} {{ ns.xs }} {{ t }} {{ ns.s }}"),
            "[1] [1, 2] a ab");
  EXPECT_EQ(render("{% set s = 'a' %}{% set t = s %}{% set s = s ~ s ~ 'c' %}{{ t }} {{ s }}"),
            "a aac");
  EXPECT_EQ(render("{% set xs = [1] %}{% set ys = xs %}{% set xs = xs + xs %}{{ ys }} {{ xs }}"),
            "[1] [1, 1]");
}

TEST(jinja, a_parsed_template_renders_many_times) {
  const auto t = jinja::template_program::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render(conversation), "4");
  EXPECT_EQ(t.render(conversation), "4");  // the namespace is per render
  EXPECT_EQ(t.render(json{{"messages", json::array()}}), "0");
}

// ---- the real templates against Jinja2's renderings ------------------------------------------

const fs::path vectors = NPULLM_CHAT_TEMPLATES_DIR;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(jinja, real_templates_render_as_jinja2_does) {
  if (!fs::exists(vectors / "conversations.json")) {
    GTEST_SKIP() << vectors << " is absent: the real chat templates were not rendered";
  }
  const json tokens = json::parse(slurp(vectors / "templates" / "tokens.json"));
  const json conversations = json::parse(slurp(vectors / "conversations.json"));
  std::size_t texts = 0, errors = 0;
  for (auto t = tokens.begin(); t != tokens.end(); ++t) {
    const std::string& name = t.key();
    const auto program =
        jinja::template_program::parse(slurp(vectors / "templates" / (name + ".jinja")));
    const auto text_of = [](const json& v) {
      return v.is_null() ? std::string() : v.get<std::string>();
    };
    for (auto c = conversations.begin(); c != conversations.end(); ++c) {
      for (const bool gen : {true, false}) {
        const json& conv = c.value();
        json v = conv.contains("variables") ? conv["variables"] : json::object();
        v["messages"] = conv["messages"];
        v["add_generation_prompt"] = gen;
        v["bos_token"] = text_of(t.value()["bos_token"]);
        v["eos_token"] = text_of(t.value()["eos_token"]);
        if (conv.contains("tools")) v["tools"] = conv["tools"];
        const fs::path base = vectors / "expected" / name / (c.key() + (gen ? ".gen" : ".nogen"));
        SCOPED_TRACE(base.string());
        if (fs::exists(base.string() + ".txt")) {
          EXPECT_EQ(program.render(v, fixed_date()), slurp(base.string() + ".txt"));
          ++texts;
        } else {
          // "TemplateError: <message>\n": the same message, from the template's raise or from
          // Python's TypeError.
          std::string expected = slurp(base.string() + ".error");
          ASSERT_FALSE(expected.empty()) << "neither .txt nor .error";
          expected = expected.substr(expected.find(": ") + 2);
          while (!expected.empty() && expected.back() == '\n') expected.pop_back();
          expect_error([&] { (void)program.render(v, fixed_date()); }, error_code::invalid_argument,
                       expected);
          ++errors;
        }
      }
    }
  }
  EXPECT_EQ(texts + errors, 156u);
  EXPECT_EQ(errors, 10u);
}

// ---- the fuzz corpus ------------------------------------------------------------------------

TEST(jinja_fuzz, corpus_replays) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_JINJA_CORPUS_DIR)) {
    EXPECT_NO_THROW(npullm_fuzz_jinja::run_one(slurp(entry.path()))) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 20u);
}

// The harness's checks catch a wrong result: a real rendering (the harness's options and
// variables), then the same rendering with one byte changed, a render that failed only once,
// and a real text past the harness's output limit.
TEST(jinja_fuzz, checks_catch_a_wrong_rendering) {
  using npullm_fuzz_jinja::check_renders;
  using npullm_fuzz_jinja::violation;
  const jinja::render_options options = npullm_fuzz_jinja::fuzz_options();
  const std::size_t limit = options.limits.max_output_bytes;
  const auto program = jinja::template_program::parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}");
  const std::string good = program.render(npullm_fuzz_jinja::default_variables(), options);
  ASSERT_NE(good.find("<user>Thanks"), std::string::npos) << good;
  EXPECT_NO_THROW(check_renders(good, good, limit));
  EXPECT_NO_THROW(check_renders(std::nullopt, std::nullopt, limit));

  std::string corrupted = good;
  corrupted[corrupted.find("Thanks")] = 't';
  EXPECT_THROW(check_renders(good, corrupted, limit), violation);
  EXPECT_THROW(check_renders(good, good.substr(0, good.size() - 1), limit), violation);
  EXPECT_THROW(check_renders(good, std::nullopt, limit), violation);
  EXPECT_THROW(check_renders(std::nullopt, good, limit), violation);

  // A text the harness's limits would have refused, rendered under larger ones.
  jinja::render_options larger = options;
  larger.limits.max_output_bytes = 4 * limit;
  const std::string over =
      jinja::template_program::parse("{{ 'x' * 70000 }}").render(json::object(), larger);
  ASSERT_GT(over.size(), limit);
  EXPECT_THROW(check_renders(over, over, limit), violation);
}

}  // namespace
