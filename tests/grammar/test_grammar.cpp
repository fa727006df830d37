// The grammar layer without a vocabulary file: the GBNF parser (llama.cpp's example grammars
// from ../shared/vectors/grammars, malformed text with line and column), the byte automaton
// (partial UTF-8, classes, repetitions), the token matcher over a small made-up vocabulary
// (masks against a brute-force reference, EOG, control tokens, rollback, fork).
#include <gtest/gtest.h>

#include "bounded.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "npullm/batch/grammar_processor.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/grammar/gbnf.hpp"
#include "npullm/grammar/grammar_cache.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/grammar/token_matcher.hpp"

#define NPULLM_GRAMMAR_FUZZ_NO_ENTRY
#include "grammar/fuzz_grammar.cpp"
#define NPULLM_JSON_SCHEMA_FUZZ_NO_ENTRY
#include "grammar/fuzz_json_schema.cpp"

namespace {

using namespace npullm::grammar;
namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool matches(std::string_view gbnf, std::string_view text) {
  byte_automaton a(parse_gbnf(gbnf));
  return a.matches(text);
}

// The message of the npullm::error that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::invalid_argument) << e.what();
    return std::string(e.message());
  }
  return "";
}

TEST(gbnf, llama_cpp_example_grammars_parse_and_run) {
  const fs::path dir = fs::path(NPULLM_SHARED_DIR) / "vectors" / "grammars";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is absent: llama.cpp's example grammars";
  // One sentence each grammar must accept and one it must refuse.
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"arithmetic.gbnf", "a=(1+b *2)\nx=y\n", "a=1+2\n"},
      {"c.gbnf", "int main(){int x = 1;return x;}", "int main(){return x}"},
      {"chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n"},
      {"english.gbnf", "Hello, world!", "Hello\x01"},
      {"japanese.gbnf", "\xe3\x81\x82\xe3\x82\xa2 \xe4\xb8\x80", "abc"},
      {"json.gbnf", "{\"a\": [1, -2.5e3, \"x\\n\\u00e9\"], \"b\": {\"c\": null}}", "{\"a\": 01x}"},
      {"json_arr.gbnf", "[\n{\"a\": 1},\n\"b\"]", "{\"a\": 1}"},
      {"list.gbnf", "- one\n- two\n", "- one\r\n"},
  };
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".gbnf") continue;
    ++n;
    const std::string text = read_file(entry.path());
    EXPECT_NO_THROW((void)parse_gbnf(text)) << entry.path();
  }
  EXPECT_EQ(n, cases.size());
  for (const auto& [file, good, bad] : cases) {
    byte_automaton a(parse_gbnf(read_file(dir / file)));
    EXPECT_TRUE(a.matches(good)) << file << ": " << good;
    EXPECT_FALSE(a.matches(bad)) << file << ": " << bad;
  }
}

TEST(gbnf, syntax) {
  EXPECT_TRUE(matches(R"(root ::= "a" b+ c? d* # comment
b ::= [x-z]
c ::= "!"
d ::= "."
)",
                      "axyz!.."));
  EXPECT_TRUE(matches("root ::= [^a-c]{2,3}", "dé"));
  EXPECT_FALSE(matches("root ::= [^a-c]{2,3}", "da"));
  EXPECT_FALSE(matches("root ::= [^a-c]{2,3}", "dddd"));
  EXPECT_TRUE(matches("root ::= \"x\"{3}", "xxx"));
  EXPECT_FALSE(matches("root ::= \"x\"{3}", "xx"));
  EXPECT_TRUE(matches("root ::= \"x\"{2,}", "xxxxx"));
  EXPECT_FALSE(matches("root ::= \"x\"{2,}", "x"));
  EXPECT_TRUE(matches("root ::= \"x\"{,2}", ""));
  EXPECT_FALSE(matches("root ::= \"x\"{,2}", "xxx"));
  EXPECT_TRUE(matches("root ::= (\"ab\" | \"c\")+ .", "abcab\xe2\x82\xac"));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]")",
                      "A\xc3\xa9\xf0\x9f\x98\x80\t\n\r\\\"[]"));
  EXPECT_TRUE(matches(R"(root ::= [\x00-\x1F\]\\-]+)", "\x01]\\-"));
  EXPECT_TRUE(matches("root ::= | \"a\"", ""));
  EXPECT_TRUE(matches("root ::= (\n  \"a\" |\n  \"b\"\n)\nother ::= \"c\"", "b"));
  // Tail cycles that consume nothing are fine: (x?)* and nested stars.
  EXPECT_TRUE(matches("root ::= (\"a\"?)* \"b\"", "aab"));
  EXPECT_TRUE(matches("root ::= ((\"a\")*)* \"b\"", "b"));
}

// Counted repetition is one element whose count the matcher keeps (grammar.hpp): every
// string over {a, b, c} up to 7 characters is judged as std::regex (ECMAScript) judges the
// same pattern, for counts of classes and of groups, nullable items, x{m,}, nesting, and
// repetitions first, inside and last in their alternatives.
TEST(gbnf, counted_repetition_agrees_with_std_regex) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("a"{2,4})", "a{2,4}"},
      {R"("a"{3})", "a{3}"},
      {R"("a"{2,})", "a{2,}"},
      {R"(("ab" | "c"){2,3})", "(ab|c){2,3}"},
      {R"(("a"?){2,3} "b")", "(a?){2,3}b"},
      {R"(("a" | "b"?){0,3} "c"{2,})", "(a|b?){0,3}c{2,}"},
      {R"(("a"{1,2} "b"){2,3})", "(a{1,2}b){2,3}"},
      {R"(("a"{2}){2,3})", "(a{2}){2,3}"},
      {R"([ab]{2,5} "c"?)", "[ab]{2,5}c?"},
      {R"(("a" | "b" "c"{0,2}){3,})", "(a|bc{0,2}){3,}"},
      {R"("a"{0,2} "b"{1,3} "a"{2})", "a{0,2}b{1,3}a{2}"},
      {R"("a"{2,3} | "b"{2,3} | "c")", "a{2,3}|b{2,3}|c"},
      {R"(("a" "b"{2,3}){2})", "(ab{2,3}){2}"},
      {R"(("a"?){2,} "c")", "(a?){2,}c"},
      {R"(("a"{0,2} | "b"){2,3})", "(a{0,2}|b){2,3}"},
      {R"(("a"{0,2}){2,3} "b")", "(a{0,2}){2,3}b"},  // folded: "a"{0,6}
      {R"(("a"{1,2}){2,3})", "(a{1,2}){2,3}"},       // folded: "a"{2,6}
      {R"(("a"{2,3}){2} "b"?)", "(a{2,3}){2}b?"},    // not folded: 4-6
  };
  std::vector<std::string> texts{""};
  for (std::size_t k = 0; k < texts.size(); ++k)
    if (texts[k].size() < 7)
      for (const char c : {'a', 'b', 'c'}) texts.push_back(texts[k] + c);
  for (const auto& [gbnf_text, pattern] : cases) {
    byte_automaton a(parse_gbnf(std::string("root ::= ") + gbnf_text));
    EXPECT_LE(a.rules().rule_names.size(), 4u) << gbnf_text;
    const std::regex re(pattern);
    std::size_t accepted = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, re);
      accepted += want;
      EXPECT_EQ(a.matches(t), want) << gbnf_text << " on '" << t << "'";
    }
    EXPECT_GT(accepted, 0u) << pattern;
  }
  // A count of a rule that recurses through it (not regular): a node with up to 2 children.
  const char* tree = "root ::= \"a\" root{0,2} \"b\"";
  for (const auto& [t, want] : std::vector<std::pair<std::string, bool>>{{"ab", true},
                                                                         {"aabb", true},
                                                                         {"aababb", true},
                                                                         {"aaabbabb", true},
                                                                         {"aabababb", false},
                                                                         {"aab", false},
                                                                         {"", false}})
    EXPECT_EQ(matches(tree, t), want) << t;
  // Left recursion through a count is still found, counted items being entered with a frame.
  EXPECT_NE(
      error_of([] { (void)parse_gbnf("root ::= (root \"a\"){0,2} \"b\""); }).find("left recursive"),
      std::string::npos);
  // One element whatever the count: "a"{0,10^9} (folded from a nested count) and 100
  // different classes {0,99999} each compile to one rule (10^9 and 10^7 rules unrolled).
  EXPECT_EQ(parse_gbnf("root ::= ((\"a\"{0,1000}){0,1000}){0,1000}").rule_names.size(), 1u);
  EXPECT_TRUE(
      matches("root ::= ((\"a\"{0,1000}){0,1000}){0,1000} \"b\"", std::string(5000, 'a') + "b"));
  EXPECT_FALSE(matches("root ::= \"a\"{5000} \"b\"", std::string(4999, 'a') + "b"));
  EXPECT_TRUE(matches("root ::= \"a\"{5000} \"b\"", std::string(5000, 'a') + "b"));
}

TEST(gbnf, malformed_grammars_name_line_and_column) {
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"a\"\nb ::= [a-"); }),
            "GBNF line 2, column 10: unterminated character class");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"abc"); }),
            "GBNF line 1, column 14: unterminated string literal");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= x\n"); }),
            "GBNF line 1, column 10: rule 'x' is referenced but never defined");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"\\q\""); }),
            "GBNF line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root = \"a\""); }),
            "GBNF line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= (\"a\""); }),
            "GBNF line 1, column 14: expected ')'");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"a\"{3,1}"); }),
            "GBNF line 1, column 18: repetition {3,1} has max < min");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"a\"\nroot ::= \"b\""); }),
            "GBNF line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("a ::= \"a\""); }), "GBNF: no rule named 'root'");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"\\x4\""); }),
            "GBNF line 1, column 11: escape needs 2 hex digits");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= [z-a]"); }),
            "GBNF line 1, column 14: character range end below its start");
  EXPECT_EQ(error_of([] { (void)parse_gbnf("root ::= \"a\" )"); }),
            "GBNF line 1, column 14: unexpected ')' in rule 'root'");
  // Left recursion is refused (direct and through another rule), naming the rule.
  EXPECT_NE(error_of([] {
              (void)parse_gbnf("root ::= root \"x\" | \"y\"");
            }).find("rule 'root' is left recursive"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              (void)parse_gbnf("root ::= a\na ::= b? c\nb ::= \"b\"\nc ::= a \"c\"");
            }).find("left recursive"),
            std::string::npos);
}

TEST(automaton, utf8_bytes_one_at_a_time) {
  byte_automaton a(parse_gbnf("root ::= [\xe3\x81\x81-\xe3\x82\x9f]+ \"!\""));  // hiragana
  auto s = a.start();
  const std::string text = "\xe3\x81\x82\xe3\x82\x93!";
  for (std::size_t i = 0; i < text.size(); ++i) {
    s = a.next(s, static_cast<unsigned char>(text[i]));
    ASSERT_NE(s, byte_automaton::dead) << i;
    EXPECT_EQ(a.can_end(s), i + 1 == text.size()) << i;
  }
  // A lead byte whose characters are all outside the class is dead at once.
  EXPECT_EQ(a.next(a.start(), static_cast<unsigned char>(0xE4)), byte_automaton::dead);
  // Invalid UTF-8: stray continuation, overlong, surrogate.
  byte_automaton any(parse_gbnf("root ::= .*"));
  EXPECT_EQ(any.next(any.start(), "\x80"), byte_automaton::dead);
  EXPECT_EQ(any.next(any.start(), "\xc0\x80"), byte_automaton::dead);
  EXPECT_EQ(any.next(any.start(), "\xed\xa0\x80"), byte_automaton::dead);
  EXPECT_EQ(any.next(any.start(), "\xf4\x90\x80\x80"), byte_automaton::dead);
  EXPECT_TRUE(any.matches("\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(any.can_end(any.next(any.start(), "\xe2\x82")));  // half a character
}

// fill_ascii (all 128 ASCII transitions of a state at once, grouped by the classes its stacks
// wait on) agrees with one byte at a time: an automaton whose byte budget leaves no room for
// transition rows computes every transition alone. Stacks on several overlapping classes at
// several counts, every text up to 6 bytes over an alphabet that each class takes or not.
TEST(automaton, all_ascii_transitions_at_once_agree_with_one_at_a_time) {
  const char* gbnf =
      R"(root ::= ( ("a"{2,4}){0,3} "@" | [a-c]+ "x" | [^@x]{1,3} "." | "b"{2} [abz] )+)";
  byte_automaton rows(parse_gbnf(gbnf));
  byte_automaton alone(parse_gbnf(gbnf), std::size_t{60} << 10);  // under one 64 KiB row page
  const std::string alphabet = "ab@xcz.";
  std::size_t accepted = 0, texts = 0;
  std::string t;
  const auto visit = [&](auto&& self, std::size_t len) -> void {
    const bool m = rows.matches(t);
    ASSERT_EQ(m, alone.matches(t)) << t;
    accepted += m;
    ++texts;
    if (len == 6) return;
    for (const char c : alphabet) {
      t.push_back(c);
      self(self, len + 1);
      t.pop_back();
    }
  };
  visit(visit, 0);
  EXPECT_GT(accepted, 1000u);
  EXPECT_LT(accepted, texts / 2);
  EXPECT_TRUE(rows.matches("aaaa@bbzcx"));
  EXPECT_FALSE(rows.matches("a@"));
}

// A made-up vocabulary: id 0 EOS, 1 a control token, the rest byte strings.
struct toy_vocab {
  std::vector<std::optional<std::string>> bytes = {
      std::nullopt, std::nullopt,   "a",        "b",    "ab", "ba",  "{", "}",
      "{\"",        "\"",           "\":",      " ",    "1",  "12",  "x", "\xe2",
      "\x82\xac",   "\xe2\x82\xac", "\xe2\x82", "\xac", "\n", "aaa", ","};
  std::shared_ptr<token_index> index() const {
    return std::make_shared<token_index>(bytes, std::vector<std::int32_t>{0});
  }
};

// Allowed tokens by trying every token from the state: what a mask must equal.
std::vector<std::uint64_t> brute_mask(token_grammar& g, token_grammar::state_id s) {
  std::vector<std::uint64_t> m(g.words());
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.index().size()); ++id) {
    if (g.next(s, id) != byte_automaton::dead) m[id >> 6] |= std::uint64_t{1} << (id & 63);
  }
  return m;
}

TEST(token_matcher, masks_equal_brute_force_along_a_parse) {
  toy_vocab v;
  auto g = std::make_shared<token_grammar>(
      parse_gbnf("root ::= (\"a\" | \"b\")* (\"\xe2\x82\xac\" | \"12\")? \"\\n\""), v.index());
  token_matcher m(g);
  for (const std::int32_t id : {4, 5, 2, 15, 16}) {  // "ab" "ba" "a" "\xe2" "\x82\xac"
    const auto mask = m.mask();
    EXPECT_EQ(mask, brute_mask(*g, m.state()));
    ASSERT_TRUE(mask_test(mask, id)) << id;
    EXPECT_FALSE(mask_test(mask, 0));  // cannot end before "\n"
    EXPECT_FALSE(mask_test(mask, 1));  // control: never
    ASSERT_TRUE(m.try_accept(id));
  }
  EXPECT_FALSE(m.try_accept(2));  // "a" after the euro sign
  EXPECT_EQ(m.accepted(), 5u);    // unchanged by the refusal
  EXPECT_THROW(m.accept(3), npullm::error);
  m.accept(20);  // "\n"
  EXPECT_TRUE(m.can_end());
  auto mask = m.mask();
  EXPECT_TRUE(mask_test(mask, 0));  // EOS now
  for (std::int32_t id = 1; id < 23; ++id) EXPECT_FALSE(mask_test(mask, id)) << id;
  m.accept(0);
  EXPECT_TRUE(m.finished());
  mask = m.mask();
  for (const auto w : mask) EXPECT_EQ(w, 0u);
}

TEST(token_matcher, brute_force_reference_on_json) {
  const fs::path file = fs::path(NPULLM_SHARED_DIR) / "vectors" / "grammars" / "json.gbnf";
  if (!fs::exists(file)) GTEST_SKIP() << file << " is absent";
  toy_vocab v;
  auto g = std::make_shared<token_grammar>(parse_gbnf(read_file(file)), v.index(), 0);
  token_matcher m(g);
  // {"ab": 12, "x": "\xe2\x82\xac"} in tokens, checking each mask against the reference.
  const std::vector<std::int32_t> ids = {8, 4, 10, 11, 13, 22, 11, 9, 14, 10, 11, 9, 18, 19, 9, 7};
  for (const std::int32_t id : ids) {
    const auto mask = m.mask();
    EXPECT_EQ(mask, brute_mask(*g, m.state())) << "before token " << id << " of " << m.accepted();
    ASSERT_TRUE(m.try_accept(id)) << id;
  }
  EXPECT_TRUE(m.can_end());
}

TEST(token_matcher, rollback_and_fork) {
  toy_vocab v;
  auto g = std::make_shared<token_grammar>(parse_gbnf("root ::= \"ab\" (\"a\" | \"b\")* \"}\""),
                                           v.index());
  token_matcher m(g);
  m.accept(4);  // ab
  const auto before = m.mask();
  token_matcher f = m.fork();
  m.accept(2);
  m.accept(7);
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.try_accept(2));
  m.rollback(2);
  EXPECT_EQ(m.accepted(), 1u);
  EXPECT_EQ(m.mask(), before);
  EXPECT_FALSE(m.can_end());
  EXPECT_THROW(m.rollback(2), npullm::error);
  EXPECT_EQ(m.accepted(), 1u);
  // The fork went on its own way: unaffected by m's tokens.
  f.accept(21);  // aaa
  EXPECT_EQ(f.accepted(), 2u);
  f.accept(7);
  EXPECT_TRUE(f.can_end());
  EXPECT_FALSE(m.can_end());
  // The very first token may not be "}" nor a token with an invalid UTF-8 start.
  token_matcher fresh(g);
  EXPECT_FALSE(fresh.try_accept(7));
  EXPECT_FALSE(fresh.try_accept(16));
  EXPECT_THROW((void)fresh.try_accept(23), npullm::error);  // outside the vocabulary
}

// ---- JSON Schema ------------------------------------------------------------------------------

// Whether the schema's grammar accepts the text.
bool schema_accepts(std::string_view schema, std::string_view text, json_schema_options o = {}) {
  byte_automaton a(json_schema_grammar(schema, o));
  return a.matches(text);
}

struct schema_case {
  const char* schema;
  std::vector<const char*> good, bad;
};

TEST(json_schema, each_keyword_accepts_and_rejects) {
  const std::vector<schema_case> cases = {
      {R"({"type": "integer"})", {"0", "-12", "345"}, {"01", "1.0", "\"1\"", "-", "1e3"}},
      {R"({"type": "number"})", {"0", "-1.5", "2e-05", "1E+20", "3"}, {"1.", ".5", "--1", "0x1"}},
      {R"({"type": "string"})",
       {R"("")", R"("a\"b\\c\u00e9\n")", "\"\xc3\xa9\""},
       {R"("a)", "\"a\nb\"", R"("\x")", "1"}},
      {R"({"type": "boolean"})", {"true", "false"}, {"null", "1", "True"}},
      {R"({"type": "null"})", {"null"}, {"0", "\"null\""}},
      {R"({"type": ["string", "null"]})", {"null", R"("x")"}, {"1"}},
      {R"({"type": "integer", "minimum": -5, "maximum": 120})",
       {"-5", "0", "9", "99", "100", "120", "-1"},
       {"-6", "121", "200", "1000", "-10"}},
      {R"({"type": "integer", "exclusiveMinimum": 0})", {"1", "10", "123456789"}, {"0", "-1"}},
      {R"({"type": "integer", "minimum": 7, "exclusiveMaximum": 1000})",
       {"7", "999", "70"},
       {"6", "1000", "1001"}},
      {R"({"type": "integer", "minimum": 10, "maximum": 12, "exclusiveMinimum": true})",
       {"11", "12"},
       {"10", "13"}},
      {R"({"type": "string", "minLength": 2, "maxLength": 3})",
       {R"("ab")", R"("a\nb")", "\"\xc3\xa9\xc3\xa9\""},
       {R"("a")", R"("abcd")"}},
      {R"({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"})",
       {R"("ab-12")", R"("x-999")"},
       {R"("ab-1")", R"("Ab-12")", R"("ab-1234")", R"(" ab-12")"}},
      {R"({"type": "string", "pattern": "foo|^bar"})",
       {R"("xxfooyy")", R"("barz")"},
       {R"("xbar")", R"("fo")"}},
      {R"({"type": "string", "pattern": "^(a|bc)*\"?$"})", {R"("abcbc")", R"("a\"")"}, {R"("b")"}},
      // A pattern that is one group as a whole: its alternatives' anchors stand at the edges
      // (a search for "(A|B)" is a search for "A|B"), nested and non-capturing groups too.
      {R"j({"type": "string", "pattern": "(^[a-z0-9_.()-]+$)"})j",
       {R"j("a.b(c)")j", R"("x")"},
       {R"("a b")", R"("")", R"("A")"}},
      {R"j({"type": "string", "pattern": "([0-9x]+\\.[0-9x]+$|%VERSION%)"})j",
       {R"("1.2")", R"("v1.x")", R"("a%VERSION%b")"},
       {R"("1.2 ")", R"("%VERSION")"}},
      {R"j({"type": "string", "pattern": "(?:(^(?:\\S+\\s+){0,2}\\S+$))"})j",
       {R"("one two three")", R"("x")"},
       {R"("a b c d")", R"(" a")", R"("")"}},
      {R"({"type": "string", "format": "date"})",
       {R"("2024-02-29")", R"("1999-12-31")"},
       {R"("2023-02-29")", R"("1999-13-01")", R"("1999-04-31")"}},
      {R"({"type": "string", "format": "date-time"})",
       {R"("2024-01-02T03:04:05Z")", R"("2024-01-02T03:04:05.123+05:30")"},
       {R"("2024-01-02 03:04:05Z")", R"("2024-01-02T24:00:00Z")"}},
      {R"({"type": "string", "format": "time"})", {R"("23:59:59Z")"}, {R"("23:59")"}},
      // A format JSON Schema does not define is an annotation: any string (lengths apply).
      {R"({"type": "string", "format": "int32", "maxLength": 3})",
       {R"("a b")", R"("")"},
       {R"("abcd")", "1"}},
      // allOf parts that differ only in annotations and unknown names merge.
      {R"({"allOf": [{"type": "integer", "x-doc": "a", "description": "a"}, {"maximum": 3, "x-doc": "b", "description": "b"}]})",
       {"3"},
       {"4"}},
      {R"({"type": "string", "format": "uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")"}},
      {R"({"type": "string", "format": "email"})",
       {R"("a.b@example.com")"},
       {R"("ab.example.com")", R"("a@b")"}},
      {R"({"type": "string", "format": "uri"})",
       {R"("https://x.org/a?b=c#d")"},
       {R"("no scheme")", R"("http://a b")"}},
      {R"({"enum": ["red", 1, null, {"a": [true]}]})",
       {R"("red")", "1", "null", R"({"a": [true]})", R"({"a":[true]})"},
       {R"("blue")", "2", R"({"a": [false]})"}},
      {R"({"type": "string", "enum": ["a", 1]})", {R"("a")"}, {"1"}},
      {R"({"const": "x"})", {R"("x")"}, {R"("y")"}},
      {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
       {"[1]", "[1, 2, 3]", "[ 1 ,2 ]"},
       {"[]", "[1, 2, 3, 4]", "[1, \"a\"]", "[1,]"}},
      {R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
       {"[]", R"(["a"])", R"(["a", 1])"},
       {R"(["a", 1, 2])", "[1]"}},
      {R"({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "boolean"}, "minItems": 2})",
       {R"(["a", true])", R"(["a", true, false])"},
       {R"(["a"])", R"(["a", 1])"}},
      {R"({"type": "array"})", {"[]", R"([1, "a", {"b": null}])"}, {"[", "{}"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"], "additionalProperties": false})",
       {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({ "a" : 1 , "b" : "x" })"},
       {"{}", R"({"a": 1})", R"({"b": "x", "c": 1})", R"({"b": 1})",
        R"({"a": 1, "a": 2, "b": "x"})"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}})",
       {"{}", R"({"a": 1})", R"({"a": 1, "z": [1]})", R"({"zz": "any"})"},
       {R"({"a": "x"})", R"({"z": 1, "a": "x"})", "[]"}},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {R"({"x": 1, "y": 2})", "{}"},
       {R"({"x": "1"})"}},
      {R"({"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}})",
       {R"({"id": "a", "n": "b"})"},
       {R"({"id": 1})", "{}"}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})",
       {"1", R"("a")"},
       {R"("ab")", "null"}},
      {R"({"oneOf": [{"type": "integer"}, {"type": "string"}]})", {"1", R"("a")"}, {"null"}},
      {R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})",
       {R"({"a": 1, "b": "x"})"},
       {R"({"a": 1})", R"({"b": "x"})", R"({"a": "1", "b": "x"})"}},
      {R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]})",
       {"0", "5"},
       {"-1", "6"}},
      {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"], "additionalProperties": false}}, "$ref": "#/$defs/node"})",
       {R"({"v": 1, "next": {"v": 2, "next": null}})"},
       {R"({"v": 1, "next": {"v": 2}})", R"({"v": 1, "next": {"v": "2", "next": null}})"}},
      {R"({"definitions": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/definitions/pos"}})",
       {"[1, 2]"},
       {"[0]"}},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "boolean"}}})",
       {R"({"a": true})"},
       {R"({"a": 1})"}},
      {"true", {"1", R"({"a": [null]})"}, {"", "{"}},
      // not: of a type, of one required name, of a not.
      {R"({"not": {"type": ["string", "object"]}})", {"1", "null", "[]"}, {R"("a")", "{}"}},
      {R"({"type": "object", "not": {"required": ["x"]}})", {"{}", R"({"y": 1})"}, {R"({"x": 1})"}},
      {R"({"not": {"not": {"type": "integer"}}})", {"3"}, {"3.5", R"("3")"}},
      // Number bounds that are whole numbers (no exponent then).
      {R"({"type": "number", "minimum": 0, "maximum": 10})",
       {"0", "0.5", "10", "10.0", "9.99"},
       {"-0.5", "10.01", "11", "1e1"}},
      {R"({"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 3})",
       {"-1.99", "-1", "0", "2.999"},
       {"-2", "-2.0", "3", "3.0", "-2.5"}},
      {R"({"type": "number", "minimum": 5})", {"5", "5.1", "123"}, {"4.99", "-5"}},
      // oneOf made disjoint by narrowing: the discriminator required, or the other's
      // required property forbidden.
      {R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "x": {}}}, {"type": "object", "properties": {"k": {"const": "b"}}}]})",
       {R"({"k": "a", "x": 1})", R"({"k": "b"})"},
       {"{}", R"({"k": "c"})"}},
      {R"({"oneOf": [{"type": "object", "required": ["r"]}, {"type": "object", "required": ["l", "w"]}]})",
       {R"({"r": 1})", R"({"l": 1, "w": 2})"},
       {R"({"r": 1, "l": 1, "w": 2})", "{}"}},
      // Each alternative excludes every other as written: a value with both is in neither.
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})",
       {R"({"a": 1})", R"({"b": 2})"},
       {R"({"a": 1, "b": 2})", "{}"}},
      // enum beside other keywords: the values that satisfy them.
      {R"({"enum": ["a", "abc", 5, 50], "maxLength": 2, "maximum": 10})",
       {R"("a")", "5"},
       {R"("abc")", "50"}},
      {R"({"type": "object", "properties": {"x": false}})", {"{}", R"({"y": 1})"}, {R"({"x": 1})"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.schema);
    byte_automaton a(json_schema_grammar(c.schema));
    for (const char* t : c.good) EXPECT_TRUE(a.matches(t)) << "should accept " << t;
    for (const char* t : c.bad) EXPECT_FALSE(a.matches(t)) << "should refuse " << t;
  }
}

// Keywords real schemas use most (issue 57): patternProperties, propertyNames and
// minProperties / maxProperties, each exact (an invalid instance is never accepted).
TEST(json_schema, real_schema_keywords_accept_and_reject) {
  const std::vector<schema_case> cases = {
      // One pattern, no other keys: keys are the pattern's (re.search), values its schema.
      {R"({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
           "additionalProperties": false})",
       {"{}", R"({"ab": 1})", R"({"ab": 1, "c": 2})"},
       {R"({"Ab": 1})", R"({"ab": "x"})", R"({"": 1})", R"({"a1": 1})"}},
      // Unanchored, other keys allowed: a key that matches takes the pattern's schema, any
      // other key any value.
      {R"({"type": "object", "patternProperties": {"^x-": {"type": "string"}}})",
       {"{}", R"({"x-a": "s"})", R"({"y": 1, "x-": "t"})", R"({"ax-": 3})"},
       {R"({"x-a": 1})", R"({"y": 1, "x-b": null})"}},
      // Named properties that match a pattern take both schemas; other keys as the pattern
      // or additionalProperties say.
      {R"({"type": "object", "properties": {"aa": {"type": "integer", "minimum": 5}},
           "patternProperties": {"^a": {"type": "integer", "maximum": 10}},
           "additionalProperties": {"type": "boolean"}})",
       {R"({"aa": 7})", R"({"aa": 5, "ab": 1, "z": true})", R"({"b": false})"},
       {R"({"aa": 11})", R"({"aa": 4})", R"({"ab": true})", R"({"z": 1})"}},
      // Two overlapping patterns: a key matching both satisfies both.
      {R"({"type": "object", "patternProperties": {"a": {"type": "integer"},
                                                    "b": {"minimum": 3}},
           "additionalProperties": false})",
       {R"({"a": 1, "b": 5, "ab": 4})"},
       {R"({"ab": 2})", R"({"ab": "s"})", R"({"c": 1})", R"({"b": 1})"}},
      // propertyNames constrains every key, named ones included.
      {R"({"type": "object", "properties": {"Bad": {}, "ok": {}},
           "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}})",
       {"{}", R"({"ok": 1, "abc": 2})"},
       {R"({"Bad": 1})", R"({"abcd": 1})", R"({"A": 1})"}},
      // Objects whose names share suffixes share the rules of "a key no name completes":
      // each object still tells its own names from other keys (named ones in the schema's
      // order, the others after them).
      {R"({"type": "object", "properties": {
           "a": {"type": "object", "properties": {"apiVersion": {"type": "string"},
                 "kind": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
           "b": {"type": "object", "properties": {"apiVersion": {"type": "string"},
                 "kinds": {"type": "string"}, "xkind": {"type": "string"}},
                 "additionalProperties": {"type": "integer"}}}})",
       {R"({"a": {"kind": "x", "kinds": 1, "apiVersio": 2}})",
        R"({"b": {"apiVersion": "v", "kinds": "x", "xkind": "y", "kind": 1}})"},
       {R"({"a": {"kind": 1}})", R"({"a": {"kinds": "x"}})", R"({"b": {"kinds": 1}})",
        R"({"b": {"kind": "x"}})", R"({"b": {"xkind": 1}})", R"({"b": {"apiVersion": 1}})"}},
      // pattern (or format) with minLength / maxLength: the pattern's strings counted.
      {R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3})",
       {R"("ab")", R"("abc")"},
       {R"("a")", R"("abcd")", R"("aB")", R"("")"}},
      // A loop state (the .* of ^/.*, the [a-z]* after one letter) ends the count's chain: one
      // counted repetition of its characters, escapes and non-ASCII included, to the bounds.
      {R"({"type": "string", "pattern": "^/.*", "maxLength": 5})",
       {R"("/")", R"("/abcd")", R"("/\t\u0001\/x")", "\"/\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""},
       {R"("/abcde")", R"("/\t\u0001\/xy")", R"("a")", R"("")", "\"/\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""}},
      {R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 3})",
       {R"("abc")", R"("abcdefghijklmnopqrstuvwxyz")"},
       {R"("ab")", R"("abC")", R"("")"}},
      {R"({"type": "string", "pattern": "^a[b-d]*$", "minLength": 2, "maxLength": 4})",
       {R"("ab")", R"("abcd")"},
       {R"("a")", R"("abcdb")", R"("ba")"}},
      {R"({"type": "string", "pattern": "x", "maxLength": 3})",
       {R"("x")", R"("axb")", R"("\nx")", "\"\xc3\xa9x\""},
       {R"("abcx")", R"("ab")", R"("xxxx")"}},
      {R"({"type": "string", "format": "ipv4", "maxLength": 8})",
       {R"("1.2.3.4")", R"("10.2.3.4")"},
       {R"("10.20.3.4")", R"("1.2.3")"}},
      {R"({"type": "string", "format": "email", "minLength": 6})", {R"("ab@c.d")"}, {R"("a@b.c")"}},
      // Non-integer bounds on numbers: decimal texts compared digit by digit.
      {R"({"type": "number", "minimum": 0.5, "maximum": 99.99})",
       {"0.5", "0.50", "0.7", "1", "42.123", "99.99", "99.9", "99.990", "99"},
       {"0.4", "0.49999", "0", "99.991", "100", "-1", "0.05"}},
      {R"({"type": "number", "exclusiveMinimum": -1.25, "exclusiveMaximum": 0})",
       {"-1.2", "-1.249", "-0.001", "-1"},
       {"-1.25", "-1.250", "-1.3", "0", "0.0", "-2", "1"}},
      {R"({"type": "number", "minimum": 0.001, "maximum": 0.001})",
       {"0.001", "0.0010"},
       {"0.0011", "0.0009", "0", "0.01"}},
      {R"({"type": "number", "minimum": 1e-05})", {"0.00001", "0.1", "3"}, {"0.000009", "0", "-1"}},
      // dependencies / dependentRequired: a name present requires others, either order.
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
           "dependencies": {"a": ["c"], "c": {"required": ["b"]}}})",
       {"{}", R"({"b": 1})", R"({"b": 1, "c": 2})", R"({"a": 1, "b": 2, "c": 3})"},
       {R"({"a": 1})", R"({"c": 1})", R"({"a": 1, "c": 2})", R"({"a": 1, "b": 2})"}},
      {R"({"type": "object", "properties": {"card": {}},
           "dependentRequired": {"card": ["billing"]}})",
       {"{}", R"({"card": 1, "billing": 2})", R"({"x": 1})", R"({"billing": 2})"},
       {R"({"card": 1})", R"({"card": 1, "x": 2})"}},
      {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false,
           "dependencies": {"a": ["b"]}})",
       {"{}"},
       {R"({"a": 1})", R"({"a": 1, "b": 2})"}},
      // multipleOf on integers: listed in a bounded range, else digits read modulo the step.
      {R"({"type": "integer", "multipleOf": 7})",
       {"0", "7", "-14", "700", "1001", "-9999997"},
       {"1", "8", "-15", "1000", "07"}},
      {R"({"type": "integer", "multipleOf": 5, "minimum": 1})",
       {"5", "10", "95"},
       {"0", "-5", "6"}},
      {R"({"type": "integer", "multipleOf": 3, "minimum": -4, "maximum": 10})",
       {"-3", "0", "3", "9"},
       {"-6", "12", "1", "-4"}},
      {R"({"type": "number", "multipleOf": 2, "maximum": 6, "minimum": 0.5})",
       {"2", "4", "6"},
       {"0", "8", "3", "2.5"}},
      // oneOf of overlapping string schemas: strings exactly one alternative accepts.
      {R"({"oneOf": [{"type": "string", "pattern": "a"}, {"type": "string", "pattern": "b"},
                     {"type": "string", "enum": ["c", "ab"]}]})",
       {R"("a")", R"("xbx")", R"("c")"},
       {R"("ab")", R"("ba")", R"("x")", R"("")"}},
      // uniqueItems over a few constants.
      {R"({"type": "array", "items": {"enum": ["a", "b", 3]}, "uniqueItems": true, "minItems": 1})",
       {R"(["a"])", R"([3, "a"])", R"(["b", 3, "a"])"},
       {"[]", R"(["a", "a"])", R"([3, "b", 3])", R"(["c"])"}},
      {R"({"type": "array", "items": {"type": "boolean"}, "uniqueItems": true})",
       {"[]", "[true]", "[false, true]"},
       {"[true, true]", "[false, true, false]"}},
      // minProperties / maxProperties counted.
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1,
           "additionalProperties": false})",
       {R"({"a": 1})", R"({"b": 1})", R"({"a": 1, "b": 2})"},
       {"{}", R"({"c": 1})"}},
      {R"({"type": "object", "minProperties": 2, "maxProperties": 3})",
       {R"({"a": 1, "b": 2})", R"({"a": 1, "b": 2, "c": 3})"},
       {"{}", R"({"a": 1})", R"({"a": 1, "b": 2, "c": 3, "d": 4})"}},
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["a"],
           "maxProperties": 2})",
       {R"({"a": 1})", R"({"a": 1, "c": 2})", R"({"a": 1, "x": 2})"},
       {"{}", R"({"a": 1, "b": 2, "c": 3})", R"({"a": 1, "b": 2, "x": 3})"}},
  };
  for (const auto& c : cases) {
    byte_automaton a(json_schema_grammar(c.schema));
    for (const char* t : c.good) EXPECT_TRUE(a.matches(t)) << c.schema << " should accept " << t;
    for (const char* t : c.bad) EXPECT_FALSE(a.matches(t)) << c.schema << " should reject " << t;
  }
}

TEST(json_schema, whitespace_and_compact_mode) {
  const char* s = R"({"type": "object", "properties": {"a": {"type": "array"}}})";
  EXPECT_TRUE(schema_accepts(s, "{\n\t\"a\" :\r[ 1 , 2 ]\n}"));
  EXPECT_FALSE(schema_accepts(s, " {}"));  // nothing before the value, nor after it
  EXPECT_FALSE(schema_accepts(s, "{} "));
  EXPECT_TRUE(schema_accepts(s, R"({"a":[1,2]})", {.whitespace = json_whitespace::compact}));
  EXPECT_FALSE(schema_accepts(s, R"({"a": [1, 2]})", {.whitespace = json_whitespace::compact}));
  const json_schema_options dumps{.whitespace = json_whitespace::separators};
  EXPECT_TRUE(schema_accepts(s, R"({"a": [1, 2]})", dumps));
  EXPECT_TRUE(schema_accepts(s, R"({"a": []})", dumps));
  EXPECT_FALSE(schema_accepts(s, R"({"a":[1,2]})", dumps));
  EXPECT_FALSE(schema_accepts(s, R"({ "a": [1, 2]})", dumps));
}

TEST(json_schema, property_order_is_the_schemas) {
  const char* s =
      R"({"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}, "additionalProperties": false})";
  EXPECT_TRUE(schema_accepts(s, R"({"z": 1, "a": 2})"));
  EXPECT_FALSE(schema_accepts(s, R"({"a": 2, "z": 1})"));  // narrowing, never widening
}

TEST(json_schema, unsupported_keywords_are_refused_by_name) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"not": {"enum": [1, 2]}})", "'not'"},
      {R"({"type": "object", "patternProperties": {"[\u00e0-\u00ff]": {"type": "integer"}}})",
       "'patternProperties'"},
      {R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "'if'"},
      {R"({"type": "array", "uniqueItems": true})", "'uniqueItems'"},
      {R"({"type": "array", "items": {"enum": [1, 1.0]}, "uniqueItems": true})", "'uniqueItems'"},
      {R"({"type": "array", "contains": {"type": "integer"}})", "'contains'"},
      {R"({"type": "number", "minimum": 1e300})", "'minimum'"},
      {R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})",
       "'oneOf'"},
      {R"({"type": "integer", "multipleOf": 0.5})", "'multipleOf'"},
      {R"({"type": "integer", "multipleOf": 3, "maximum": 1e9})", "'multipleOf'"},
      {R"({"type": "string", "pattern": "(?=a)b"})", "'pattern'"},
      // An anchor inside a group that is not the whole pattern, or followed by a count.
      {R"j({"type": "string", "pattern": "(^a)b"})j", "'pattern'"},
      {R"j({"type": "string", "pattern": "(^a$)+"})j", "'pattern'"},
      {R"({"type": "string", "format": "hostname"})", "'format'"},
      {R"({"type": "string", "pattern": "\\bword"})", "'pattern'"},
      {R"({"type": "string", "pattern": "[\u00e0-\u00ff]", "maxLength": 3})", "'pattern'"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "'oneOf'"},
      {R"({"$ref": "http://example.com/schema"})", "'$ref'"},
      {R"({"type": "object", "minProperties": 200000})", "'minProperties'"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "propertyNames": {}}}, "dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}}})",
       "'dependentSchemas'"},
      {R"({"type": "object", "dependencies": {"a": {"properties": {"b": {"type": "integer"}}}}})",
       "'dependencies'"},
  };
  for (const auto& [schema, keyword] : cases) {
    try {
      (void)json_schema_grammar(schema);
      ADD_FAILURE() << "accepted " << schema;
    } catch (const npullm::error& e) {
      EXPECT_EQ(e.code(), npullm::error_code::unsupported) << schema;
      EXPECT_NE(std::string(e.message()).find(keyword), std::string::npos) << e.message();
    }
  }
  // Malformed schemas are invalid_argument, naming the place.
  try {
    (void)json_schema_grammar(R"({"properties": {"a": {"type": "strng"}}})");
    ADD_FAILURE();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::invalid_argument);
    EXPECT_NE(std::string(e.message()).find("#/properties/a"), std::string::npos) << e.message();
  }
  // A keyword of the wrong type met while merging (fuzz_json_schema: "$ref": [...] in an allOf
  // part reached through a $ref escaped as nlohmann's type_error): invalid_argument too.
  try {
    (void)json_schema_grammar(
        R"({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}, {"type": "object"}]}, "b": {"allOf": [{"$ref": ["x"]}]}}, "$ref": "#/$defs/a"})");
    ADD_FAILURE();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::invalid_argument);
    EXPECT_NE(std::string(e.message()).find("'$ref' must be a string"), std::string::npos)
        << e.message();
  }
  EXPECT_THROW((void)json_schema_grammar("{"), npullm::error);
  // A schema no value satisfies is refused rather than compiled to an empty grammar.
  EXPECT_THROW((void)json_schema_grammar(R"({"type": "integer", "minimum": 3, "maximum": 2})"),
               npullm::error);
  EXPECT_THROW((void)json_schema_grammar(R"({"$ref": "#/nowhere"})"), npullm::error);
}

// The sampler with the grammar as its processor: greedy and sampled choices stay inside the
// grammar whatever the logits say; the processor follows the context (rollback included).
TEST(grammar_processor, sampler_chooses_only_allowed_tokens) {
  toy_vocab v;
  auto g = std::make_shared<token_grammar>(parse_gbnf("root ::= \"ab\" \"a\"* \"}\""), v.index());
  const std::vector<std::int32_t> prompt = {14, 14};  // anything: not checked
  npullm::batch::grammar_processor p(g, prompt.size());
  std::vector<float> row(30, 0.0f);  // a row wider than the vocabulary (padded embedding)
  row[3] = 9.0f;                     // "b": forbidden first
  row[25] = 10.0f;                   // past the vocabulary
  row[4] = 1.0f;                     // "ab"
  npullm::batch::sampler greedy({.temperature = 0.0f, .processor = p}, 1);
  std::vector<std::int32_t> context = prompt;
  EXPECT_EQ(greedy.sample(row, context), 4);
  context.push_back(4);
  row[7] = 2.0f;  // "}" beats "a" (1.0 at id 2... set below)
  row[2] = 1.5f;
  EXPECT_EQ(greedy.sample(row, context), 7);
  context.push_back(7);
  EXPECT_EQ(greedy.sample(row, context), 0);  // only EOS is left
  EXPECT_TRUE(p.matcher().can_end());
  // Back to an earlier context: the processor rolls back.
  context.resize(prompt.size() + 1);
  row[7] = -1.0f;
  EXPECT_EQ(greedy.sample(row, context), 2);
  // Sampled, many draws: never a forbidden token.
  npullm::batch::sampler hot({.temperature = 2.0f, .processor = p}, 7);
  std::vector<float> flat(22, 0.0f);
  for (int k = 0; k < 200; ++k) {
    const std::int32_t t = hot.sample(flat, context);
    EXPECT_TRUE(t == 2 || t == 7 || t == 21) << t;  // "a", "}", "aaa"
  }
  // A context the grammar does not allow leaves only EOS (a draft's row to discard).
  std::vector<std::int32_t> bad = prompt;
  bad.push_back(3);
  EXPECT_EQ(greedy.sample(row, bad), 0);
  EXPECT_THROW(greedy.sample(row, std::vector<std::int32_t>{14}), npullm::error);
}

// The prefetch hook (sampler_config::prefetch): the mask computed on another thread for the
// context that comes next changes nothing in the rows; a context other than the one prefetched
// is computed when asked; a processor destroyed with a prefetch in flight waits for it.
TEST(grammar_processor, prefetch_changes_nothing_but_when) {
  toy_vocab v;
  auto g = std::make_shared<token_grammar>(parse_gbnf("root ::= \"ab\" \"a\"* \"}\""), v.index());
  const npullm::batch::grammar_processor plain(g, 2), pre(g, 2);  // one grammar, two threads
  const auto hook = pre.prefetcher();
  const std::vector<std::vector<std::int32_t>> contexts = {
      {14, 14}, {14, 14, 4}, {14, 14, 4, 2}, {14, 14, 4, 2, 21}, {14, 14, 4, 7}, {14, 14, 3}};
  for (std::size_t k = 0; k < contexts.size(); ++k) {
    for (const std::size_t asked : {k, (k + 2) % contexts.size()}) {  // as prefetched, or not
      hook(contexts[k]);
      std::vector<float> a(24, 1.0f), b(24, 1.0f);
      plain(contexts[asked], a);
      pre(contexts[asked], b);
      EXPECT_EQ(a, b) << k << " " << asked;
    }
  }
  // Through a sampler: the same choices with and without the hook.
  npullm::batch::sampler with({.temperature = 1.0f, .processor = pre, .prefetch = hook}, 3);
  npullm::batch::sampler without({.temperature = 1.0f, .processor = plain}, 3);
  std::vector<std::int32_t> context = {14, 14};
  const std::vector<float> flat(22, 0.0f);
  for (int k = 0; k < 6; ++k) {
    with.prefetch(context);
    const std::int32_t t = with.sample(flat, context);
    EXPECT_EQ(without.sample(flat, context), t) << k;
    if (t == 0) break;
    context.push_back(t);
  }
  hook(std::vector<std::int32_t>{14});  // shorter than the prompt: the call raises, not the hook
  std::vector<float> row(22, 0.0f);
  EXPECT_THROW(pre(std::vector<std::int32_t>{14}, row), npullm::error);
  {
    const npullm::batch::grammar_processor q(g, 2);
    q.prefetcher()(contexts[3]);
  }  // waits for its job
}

// Compiled grammars kept by text: the same text gives the same grammar, its kind and options
// are part of the key, the least recently used leaves first, a failed compilation raises each
// time and is not kept.
TEST(grammar_cache, shares_compiled_grammars_by_text) {
  toy_vocab v;
  grammar_cache cache(v.index(), 2);
  const auto a = cache.gbnf("root ::= \"a\"+");
  EXPECT_EQ(cache.gbnf("root ::= \"a\"+"), a);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 1u);
  const std::string schema = R"({"type": "integer"})";
  const auto flexible = cache.json_schema(schema);
  const auto compact = cache.json_schema(schema, {json_whitespace::compact});
  EXPECT_NE(flexible, compact);
  EXPECT_EQ(cache.size(), 2u);                  // capacity 2: the GBNF grammar (least recent) left
  EXPECT_NE(cache.gbnf("root ::= \"a\"+"), a);  // compiled again
  EXPECT_EQ(cache.misses(), 4u);
  token_matcher m(a);  // a grammar that left stays usable
  EXPECT_TRUE(m.try_accept(2));
  // Errors: raised each time, nothing kept, the rest unchanged.
  EXPECT_THROW((void)cache.json_schema(R"({"type": "strnig"})"), npullm::error);
  EXPECT_THROW((void)cache.json_schema(R"({"type": "strnig"})"), npullm::error);
  EXPECT_THROW((void)cache.gbnf("root ::= (\"a\""), npullm::error);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.json_schema(schema, {json_whitespace::compact}), compact);
  EXPECT_THROW(grammar_cache(nullptr), npullm::error);
  EXPECT_THROW(grammar_cache(v.index(), 0), npullm::error);
}

// One grammar shared by threads (a cached grammar serving several sequences): compiled once
// when the threads ask for it together, and each thread's masks equal those of one thread alone.
TEST(grammar_cache, one_grammar_serves_several_threads) {
  toy_vocab v;
  const std::string text = "root ::= (\"a\" | \"b\" | \"ab\")* (\"12\" | \"1\")+ \"\\n\"";
  const std::vector<std::int32_t> path = {4, 5, 2, 21, 3, 12, 13, 20};  // ab ba a aaa b 1 12 \n
  // The reference: a grammar of its own, one thread.
  std::vector<std::vector<std::uint64_t>> expected;
  {
    token_matcher m(std::make_shared<token_grammar>(parse_gbnf(text), v.index()));
    for (const std::int32_t id : path) {
      expected.push_back(m.mask());
      m.accept(id);
    }
    expected.push_back(m.mask());
  }
  grammar_cache cache(v.index());
  constexpr int threads = 4;
  std::vector<std::shared_ptr<token_grammar>> got(threads);
  std::vector<int> wrong(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      got[t] = cache.gbnf(text);
      for (int round = 0; round < 50; ++round) {
        token_matcher m(got[t]);
        for (std::size_t k = 0; k <= path.size(); ++k) {
          wrong[t] += m.mask() != expected[k];
          if (k < path.size() && !m.try_accept(path[k])) ++wrong[t];
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(got[t], got[0]) << t;
    EXPECT_EQ(wrong[t], 0) << t;
  }
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(cache.hits(), static_cast<std::size_t>(threads - 1));
}

// ---- Hostile inputs: bounded in time, memory and stack ------------------------------------

// What f did, run in a forked child under a 4 GiB address-space limit (not under ASan, whose
// shadow memory needs more) and a 10 s alarm, on a thread with `stack` bytes of stack: "ok "
// and f's text, "error <code>: <message>" for an npullm::error, or how the child died
// (a signal: SIGALRM is the time limit, SIGSEGV the stack; "bad_alloc" the memory limit).
struct bounded {
  std::string what;
  double seconds = 0;
};
using npullm_test::under_asan;

bounded run_bounded(const std::function<std::string()>& f, std::size_t stack = 4u << 20) {
  const npullm_test::bounded_outcome r =
      npullm_test::run_bounded(f, {.stack = under_asan ? stack * 4 : stack,  // ASan's frames
                                   .address_space = std::size_t{4} << 30,
                                   .cpu_seconds = 0,
                                   .wall_seconds = 10});
  if (!r.died.empty()) return {r.died, r.seconds};
  switch (r.how) {
    case npullm_test::ended::value: return {"ok " + r.text, r.seconds};
    case npullm_test::ended::npullm_error:
      return {"error " + std::string(npullm::to_string(r.code)) + ": " + r.text, r.seconds};
    case npullm_test::ended::bad_alloc: return {"bad_alloc", r.seconds};
    case npullm_test::ended::other_exception: return {"other exception: " + r.text, r.seconds};
  }
  return {"unknown outcome", r.seconds};
}

std::string repeat_text(std::string_view s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t k = 0; k < n; ++k) out += s;
  return out;
}

// A GBNF grammar compiled (and run on `text` when given): "ok <rules> rules[ match|no match]".
std::function<std::string()> gbnf_job(std::string grammar_text,
                                      std::optional<std::string> text = {}) {
  return [g = std::move(grammar_text), text] {
    grammar gr = parse_gbnf(g);
    std::string out = std::to_string(gr.rule_names.size()) + " rules";
    if (text) out += byte_automaton(std::move(gr)).matches(*text) ? " match" : " no match";
    return out;
  };
}
std::function<std::string()> schema_job(std::string schema,
                                        std::vector<std::pair<std::string, bool>> texts = {}) {
  return [s = std::move(schema), texts] {
    byte_automaton a(json_schema_grammar(s));
    std::string out = std::to_string(a.rules().rule_names.size()) + " rules";
    for (const auto& [t, want] : texts)
      if (a.matches(t) != want) out += " WRONG on '" + t.substr(0, 40) + "'";
    return out;
  };
}

// Each hostile shape gets what is stated, within the 10 s alarm (and a tighter bound where
// the point is that the size is checked before anything is expanded).
void expect_bounded(const char* name, const std::function<std::string()>& job,
                    std::string_view expected_prefix, std::string_view expected_part = {},
                    double max_seconds = 10) {
  const bounded r = run_bounded(job);
  std::printf("  %-34s %6.3f s  %.150s\n", name, r.seconds, r.what.c_str());
  EXPECT_EQ(r.what.substr(0, expected_prefix.size()), expected_prefix) << name << ": " << r.what;
  EXPECT_NE(r.what.find(expected_part), std::string::npos) << name << ": " << r.what;
  EXPECT_EQ(r.what.find("WRONG"), std::string::npos) << name << ": " << r.what;
  EXPECT_LT(r.seconds, max_seconds) << name;
}

TEST(hostile, gbnf_shapes) {
  // Groups nested 100,000 deep: refused by the depth budget while parsing (the parser
  // recurses once per group), on a 4 MiB stack.
  expect_bounded(
      "gbnf groups 100000 deep",
      gbnf_job("root ::= " + repeat_text("(", 100000) + "\"a\"" + repeat_text(")", 100000)),
      "error capacity_exhausted", "max_depth", 2);
  // Within the budget: 300 groups compile.
  expect_bounded(
      "gbnf groups 300 deep",
      gbnf_job("root ::= " + repeat_text("(", 300) + "\"a\"" + repeat_text(")", 300), "a"), "ok",
      "match");
  // 100,000 repetition operators on one item: one level each.
  expect_bounded("gbnf \"a\"{2}{2}... x100000",
                 gbnf_job("root ::= \"a\"" + repeat_text("{2}", 100000)),
                 "error capacity_exhausted", "max_depth", 2);
  // 10^5 rules, each referring to the next at its left edge: linear left-recursion check.
  {
    std::string g = "root ::= r1 \"x\"\n";
    for (int k = 1; k < 100000; ++k)
      g.append("r")
          .append(std::to_string(k))
          .append(" ::= r")
          .append(std::to_string(k + 1))
          .append(" \"x\"\n");
    g += "r100000 ::= \"b\"\n";
    expect_bounded("gbnf 10^5 rules chained", gbnf_job(g, "b" + std::string(100000, 'x')), "ok",
                   "100001 rules match", 5);
    // The same closed into a cycle: left recursion, found as fast.
    g.replace(g.find("r100000 ::= \"b\""), 16, "r100000 ::= root \"x\" | \"b\"");
    expect_bounded("gbnf 10^5 rules left recursive", gbnf_job(g), "error invalid_argument",
                   "left recursive", 5);
  }
  // {0,99999} written 100 times: one shared chain, compiled.
  expect_bounded("gbnf \"a\"{0,99999} x100",
                 gbnf_job("root ::= " + repeat_text("\"a\"{0,99999} ", 100), "aaaa"), "ok", "match",
                 5);
  // ... over 100 different elements: 100 counted elements in one rule (10^7 rules when
  // counts were unrolled into chains).
  {
    std::string g = "root ::=";
    for (int k = 0; k < 100; ++k) {
      g.append(" [\\x").push_back("0123456789"[k / 10]);
      g.append(1, "0123456789"[k % 10]).append("]{0,99999}");
    }
    expect_bounded("gbnf 100 classes {0,99999}", gbnf_job(g, std::string(3, '\x01')), "ok",
                   "1 rules match", 1);
  }
  // Nested counted repetition: x{0,10^9} after folding, one element (it grew to 24 GB when
  // unrolled, then was refused by the rule budget). Run over 10^6 characters: a state per
  // count, until the automaton's byte budget (64 MiB, twice for states without rows) ends it
  // by name.
  expect_bounded("gbnf ((\"a\"{0,1000}){0,1000}){0,1000}",
                 gbnf_job("root ::= ((\"a\"{0,1000}){0,1000}){0,1000}", std::string(10000, 'a')),
                 "ok", "1 rules match", 1);
  expect_bounded("gbnf \"a\"{0,10^9} over 10^6 a's",
                 gbnf_job("root ::= ((\"a\"{0,1000}){0,1000}){0,1000}", std::string(1000000, 'a')),
                 "error capacity_exhausted", "budget", 9);
  expect_bounded("gbnf ((\"a\"{99999}){99999}){99999}",
                 gbnf_job("root ::= ((\"a\"{99999}){99999}){99999}"), "ok", "rules", 5);
  expect_bounded("gbnf ((\"a\"{1,99999}){2,99999})",
                 gbnf_job("root ::= ((\"a\"{1,99999}){2,99999})", "aaa"), "ok", "match", 5);
}

TEST(hostile, json_schema_shapes) {
  // Nested 100,000 deep (properties, a const of arrays): refused by the document's depth.
  {
    std::string s;
    for (int k = 0; k < 100000; ++k) s += R"({"properties": {"a": )";
    s += "{}";
    for (int k = 0; k < 100000; ++k) s += "}}";
    expect_bounded("schema properties 100000 deep", schema_job(s), "error capacity_exhausted",
                   "max_depth", 3);
    expect_bounded(
        "schema const [[[...]]] 100000 deep",
        schema_job(R"({"const": )" + repeat_text("[", 100000) + repeat_text("]", 100000) + "}"),
        "error capacity_exhausted", "max_depth", 3);
  }
  // 500 levels, within the budget: compiled, the recursion on a 4 MiB stack.
  {
    std::string s, good = "1";
    for (int k = 0; k < 500; ++k) s += R"({"type": "object", "properties": {"a": )";
    s += R"({"type": "integer"})";
    for (int k = 0; k < 500; ++k) {
      s += "}}";
      good.insert(0, "{\"a\": ").append("}");
    }
    expect_bounded("schema properties 500 deep", schema_job(s, {{good, true}}), "ok", "rules");
  }
  // A chain of 2,000 references, deeper than the document: the subschema depth budget.
  {
    std::string s = R"({"$defs": {)";
    for (int k = 0; k < 2000; ++k)
      s.append("\"d")
          .append(std::to_string(k))
          .append(R"(": {"type": "array", "items": {"$ref": "#/$defs/d)")
          .append(std::to_string(k + 1))
          .append("\"}},");
    s += R"("d2000": {"type": "integer"}}, "$ref": "#/$defs/d0"})";
    expect_bounded("schema $ref chain 2000", schema_job(s), "error capacity_exhausted", "max_depth",
                   3);
  }
  // allOf fan-out: d_i is allOf of two references to d_{i-1}, 40 levels (2^40 merges).
  {
    std::string s =
        R"({"$defs": {"d0": {"type": "object", "properties": {"a": {"type": "integer"}}},)";
    for (int k = 1; k <= 40; ++k)
      s.append("\"d")
          .append(std::to_string(k))
          .append(R"(": {"allOf": [{"$ref": "#/$defs/d)")
          .append(std::to_string(k - 1))
          .append(R"("}, {"$ref": "#/$defs/d)")
          .append(std::to_string(k - 1))
          .append("\"}]}")
          .append(k < 40 ? "," : "");
    s += R"(}, "$ref": "#/$defs/d40"})";
    // Merged as met: each level's two parts are equal (one merge a level, not 2^40).
    expect_bounded("schema allOf fan-out 2^40",
                   schema_job(s, {{R"({"a": 1})", true}, {R"({"a": "x"})", false}}), "ok", "rules",
                   2);
    // Parts that differ at each level (a property whose schema is the level below): refused
    // by a budget, not after 2^40 steps.
    std::string t = R"({"$defs": {"d0": {"type": "object"},)";
    for (int k = 1; k <= 40; ++k) {
      const std::string prev = std::to_string(k - 1);
      t.append("\"d").append(std::to_string(k)).append(R"(": {"allOf": [{"$ref": "#/$defs/d)");
      t.append(prev).append(R"("}, {"properties": {"p": {"$ref": "#/$defs/d)").append(prev);
      t.append("\"}}}]}").append(k < 40 ? "," : "");
    }
    t += R"(}, "$ref": "#/$defs/d40"})";
    expect_bounded("schema allOf fan-out, distinct parts", schema_job(t), "error", "", 5);
  }
  // Reference cycles: through $ref alone (no value derives), through allOf.
  expect_bounded(
      "schema $ref cycle",
      schema_job(
          R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
      "error invalid_argument", "matches no text", 1);
  expect_bounded(
      "schema allOf cycle",
      schema_job(
          R"({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}, {"type": "object"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}, {"required": ["x"]}]}}, "$ref": "#/$defs/a"})"),
      "error", "", 2);
  expect_bounded(
      "schema self $ref, productive",
      schema_job(
          R"({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"})",
          {{R"({"next": {"next": {}}})", true}, {R"({"next": 1})", false}}),
      "ok", "rules", 2);
  // 100,000 optional properties: compiled in about 1.4 s (19.5 s before; the bound leaves room
  // for a loaded machine). Under ASan 30,000 (its allocator is several times slower).
  {
    const int n = under_asan ? 30000 : 100000;
    std::string s = R"({"type": "object", "properties": {)";
    for (int k = 0; k < n; ++k)
      s.append(k ? ",\"p" : "\"p").append(std::to_string(k)).append(R"(": {"type": "integer"})");
    s += "}}";
    expect_bounded("schema 100000 optional properties", schema_job(s), "ok", "rules", 9);
    // Its matcher: the first step meets every possible member, over the automaton's bound on
    // parse positions a step (200,000): refused by name.
    if (!under_asan)
      expect_bounded("schema 100000 optional properties, run",
                     schema_job(s, {{R"({"p5": 1, "p99999": 2})", true}}),
                     "error capacity_exhausted", "parse positions", 9);
  }
  // maxLength / maxItems of 100,000 in many places: one shared chain of string characters.
  {
    std::string s = R"({"type": "object", "properties": {)";
    for (int k = 0; k < 1000; ++k)
      s.append(k ? ",\"s" : "\"s")
          .append(std::to_string(k))
          .append(R"(": {"type": "string", "maxLength": 100000})");
    s +=
        R"(, "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 100000, "minItems": 3}}})";
    expect_bounded(
        "schema maxLength 100000 x1000",
        schema_job(s, {{R"({"s1": "abc", "a": [1, 2, 3]})", true}, {R"({"a": [1, 2]})", false}}),
        "ok", "rules", 5);
  }
  // A pattern's nested counted repetition: the product (10^15) folded into one count, capped
  // at 2^32 - 2 (narrower only past 4 GiB of text): one counted element.
  expect_bounded(
      "schema pattern ((a{0,99999}){0,99999}){0,99999}",
      schema_job(R"({"type": "string", "pattern": "^((a{0,99999}){0,99999}){0,99999}$"})",
                 {{R"("aaa")", true}, {R"("ab")", false}}),
      "ok", "rules", 1);
  // A count of a group of optional parts cannot fold: each count the group may pass
  // empty is a parse position of the first step, past the automaton's bound, refused by name.
  expect_bounded("schema pattern (a{0,99999}b{0,99999}){0,99999}",
                 schema_job(R"({"type": "string", "pattern": "^(a{0,99999}b{0,99999}){0,99999}$"})",
                            {{R"("aab")", true}}),
                 "error capacity_exhausted", "parse positions", 2);
  // A pattern of a long chain of states with a length bound: its minimization would need a
  // round per state (13 s at 5,000); past its budget the states stay as they are.
  expect_bounded("schema pattern x{5000} maxLength 5010",
                 schema_job(R"({"type": "string", "pattern": "^x{5000}$", "maxLength": 5010})",
                            {{"\"" + std::string(5000, 'x') + "\"", true},
                             {"\"" + std::string(4999, 'x') + "\"", false}}),
                 "ok", "rules", 3);
  // Folded into one repetition of 10^8: one counted element.
  expect_bounded("schema pattern ((a{0,9999}){0,9999})",
                 schema_job(R"({"type": "string", "pattern": "^((a{0,9999}){0,9999})$"})",
                            {{R"("aaa")", true}, {R"("ab")", false}}),
                 "ok", "rules", 1);
}

// A pattern whose language ends in a loop, with a large maxLength (JsonSchemaStore's
// vercel.json: "^/.*" up to 512 characters, plain strings up to 4,096): a handful of rules,
// not a rule per count, and exact at the bound.
TEST(json_schema, pattern_with_a_large_max_length_is_one_repetition) {
  byte_automaton a(
      json_schema_grammar(R"({"type": "string", "pattern": "^/.*", "maxLength": 1000})"));
  EXPECT_LT(a.rules().rule_names.size(), 20u);
  EXPECT_TRUE(a.matches("\"/" + std::string(999, 'x') + "\""));
  EXPECT_FALSE(a.matches("\"/" + std::string(1000, 'x') + "\""));
  EXPECT_FALSE(a.matches("\"x" + std::string(10, 'x') + "\""));
}

// A pattern with length bounds is exactly the pattern's strings of those lengths: every string
// up to 5 characters over an alphabet (non-ASCII and an escape included), against the
// pattern alone and a count. Search patterns (whose automata keep states apart that the
// minimization joins), anchored ones, loops after a prefix, a loop between two parts.
TEST(json_schema, pattern_with_length_bounds_is_the_pattern_counted) {
  const std::vector<std::string> alphabet = {"a", "b", "/", "\xc3\xa9", "\\n"};
  for (const char* p : {"^/.*", "a", "^a[ab]*$", "b.*a", "^(ab)+$", "^[^a]*a?$", "[^/]$"}) {
    const std::string pj = nlohmann::json(p).dump();
    byte_automaton alone(json_schema_grammar(R"({"type": "string", "pattern": )" + pj + "}"));
    for (const auto& [lo, hi] : {std::pair<int, int>{0, 3}, {2, 4}, {1, -1}, {4, -1}, {0, 0}}) {
      std::string schema = R"({"type": "string", "pattern": )" + pj +
                           R"(, "minLength": )" + std::to_string(lo);
      if (hi >= 0) schema += R"(, "maxLength": )" + std::to_string(hi);
      std::optional<byte_automaton> counted;
      try {
        counted.emplace(json_schema_grammar(schema + "}"));
      } catch (const npullm::error& e) {  // "accepts no value": then no text may match
        EXPECT_NE(std::string(e.what()).find("accepts no value"), std::string::npos) << schema;
      }
      std::vector<std::string> texts = {""};
      for (int len = 0; len <= 5; ++len) {
        std::vector<std::string> longer;
        for (const auto& t : texts) {
          const std::string q = "\"" + t + "\"";
          const bool want = alone.matches(q) && len >= lo && (hi < 0 || len <= hi);
          ASSERT_EQ(counted && counted->matches(q), want) << schema << " on " << q;
          if (len < 5)
            for (const auto& c : alphabet) longer.push_back(t + c);
        }
        texts = std::move(longer);
      }
    }
  }
}

// The heap-use-after-free of schema_compiler::merge (two `type`s with no common type inserted
// `enum` into the merged object while a reference into it was held): an Atom-feed-like schema
// whose definitions refer to each other through oneOf ($ref -> value -> object -> value ->
// $ref). ASan reported it at 97c4bfb; now compiled, and exact on these instances.
TEST(json_schema, definitions_referring_to_each_other_through_one_of) {
  const char* schema = R"({"definitions": {
    "text": {"type": "string"},
    "link": {"type": "object", "properties": {"href": {"type": "string"}}, "required": ["href"]},
    "value": {"type": "object",
              "properties": {"type": {"enum": ["text", "html"]},
                             "content": {"$ref": "#/definitions/content"}},
              "oneOf": [{"$ref": "#/definitions/text"}, {"required": ["type"]}]},
    "content": {"oneOf": [{"$ref": "#/definitions/text"}, {"$ref": "#/definitions/value"}]},
    "entry": {"type": "object", "properties": {"title": {"$ref": "#/definitions/content"},
              "link": {"$ref": "#/definitions/link"}}, "required": ["title"]}},
    "type": "object",
    "properties": {"title": {"$ref": "#/definitions/content"},
                   "entry": {"type": "array", "items": {"$ref": "#/definitions/entry"}}},
    "required": ["title"]})";
  byte_automaton a(json_schema_grammar(schema));
  EXPECT_TRUE(a.matches(R"({"title": "x"})"));
  EXPECT_TRUE(a.matches(
      R"({"title": {"type": "html", "content": {"type": "text"}}, "entry": [{"title": "z", "link": {"href": "h"}}]})"));
  EXPECT_FALSE(a.matches(R"({"title": 1})"));
  EXPECT_FALSE(a.matches(R"({"title": {"content": "y"}})"));
  EXPECT_FALSE(a.matches(R"({"entry": []})"));
  // The merge itself: allOf of two disjoint types is refused as accepting nothing.
  EXPECT_THROW((void)json_schema_grammar(R"({"allOf": [{"type": "object"}, {"type": "string"}]})"),
               npullm::error);
}

// The fuzz corpus (tests/grammar/corpus_grammar) through fuzz_grammar.cpp's checks.
TEST(grammar_fuzz, corpus_replays) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_GRAMMAR_CORPUS_DIR)) {
    const std::string bytes = read_file(entry.path());
    EXPECT_NO_THROW(npullm_fuzz_grammar::run_one(bytes)) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 20u);
}

// fuzz_json_schema's corpus (tests/grammar/corpus_json_schema, size bombs included) through
// its checks, each input within a second.
TEST(grammar_fuzz, json_schema_corpus_replays) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_JSON_SCHEMA_CORPUS_DIR)) {
    const std::string bytes = read_file(entry.path());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(npullm_fuzz_json_schema::run_one(bytes)) << entry.path();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, under_asan ? 5.0 : 1.0) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 20u);
}

// The checks can fail.
// The harness's mask check catches a wrong mask: a real mask passes it; the same mask with one
// token added (a token the grammar cannot take there) or one allowed token taken away, and a
// wrong can_end, each throw.
TEST(grammar_fuzz, checks_catch_a_violation) {
  namespace f = npullm_fuzz_grammar;
  auto tg = std::make_shared<token_grammar>(parse_gbnf(R"(root ::= "{" "a"* "}")"), f::toy_index());
  token_matcher m(tg);
  const auto mask = m.mask();
  const auto allowed = f::check_mask(*tg, m.state(), mask, m.can_end());
  ASSERT_EQ(allowed, std::vector<std::int32_t>({1}));  // "{" alone ("{\"" cannot)
  auto wrong = mask;
  wrong[0] |= std::uint64_t{1} << 2;  // "}" cannot come first
  EXPECT_THROW(f::check_mask(*tg, m.state(), wrong, m.can_end()), f::violation);
  wrong = mask;
  wrong[0] &= ~(std::uint64_t{1} << 1);  // "{" can
  EXPECT_THROW(f::check_mask(*tg, m.state(), wrong, m.can_end()), f::violation);
  EXPECT_THROW(f::check_mask(*tg, m.state(), mask, true), f::violation);
}

}  // namespace
