// The grammar layer without a vocabulary file: the GBNF parser (llama.cpp's example grammars
// from ../shared/vectors/grammars, malformed text with line and column), the byte automaton
// (partial UTF-8, classes, repetitions), the token matcher over a small made-up vocabulary
// (masks against a brute-force reference, EOG, control tokens, rollback, fork).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "npullm/grammar/gbnf.hpp"
#include "npullm/grammar/token_matcher.hpp"

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

}  // namespace
