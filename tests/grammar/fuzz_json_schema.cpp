// libFuzzer harness over the JSON Schema compiler alone (fuzz_grammar mixes it with GBNF and
// the token matcher): the first byte of an input picks the whitespace mode, the rest is the
// schema text. For every input:
//   - compiling throws npullm::error or nothing (no other exception, no crash, no hang: a
//     tighter compile budget than the defaults keeps each run short, so that the budget's
//     refusals are exercised and size bombs end quickly);
//   - a compiled grammar never accepts the empty text, and every text it accepts is JSON: a
//     walk over the automaton, each byte chosen by the input's own bytes among those the
//     grammar allows from a JSON alphabet, checked with nlohmann's parser wherever it can end.
// Built with clang when available (target fuzz_json_schema); test_grammar replays the corpus
// (tests/grammar/corpus_json_schema) through the same checks.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/grammar/automaton.hpp"
#include "npullm/grammar/json_schema.hpp"

namespace npullm_fuzz_json_schema {

struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what, std::string_view text = {}) {
  if (!ok)
    throw violation(std::string(what) + (text.empty() ? "" : ": '") + std::string(text) +
                    (text.empty() ? "" : "'"));
}

// Whether text is JSON by its syntax alone.
struct syntax_only : nlohmann::json_sax<nlohmann::json> {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};
// nlohmann's parser refuses a number whose double is infinite (1E400, which JSON allows):
// outside strings, every exponent becomes 0 first.
inline std::string tame_exponents(const std::string& t) {
  std::string o;
  bool in_string = false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    o += c;
    if (in_string) {
      if (c == '\\' && i + 1 < t.size()) {
        o += t[++i];
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == 'e' || c == 'E') {
      std::size_t j = i + 1;
      if (j < t.size() && (t[j] == '+' || t[j] == '-')) o += t[j++];
      std::size_t k = j;
      while (k < t.size() && t[k] >= '0' && t[k] <= '9') ++k;
      if (k > j) o += '0';
      i = k - 1;
    }
  }
  return o;
}
inline bool is_json(const std::string& text) {
  syntax_only sax;
  return nlohmann::json::sax_parse(tame_exponents(text), &sax);
}

// The budget of one run: big enough for ordinary schemas, small enough that a bomb is refused
// in milliseconds.
inline npullm::grammar::grammar_limits fuzz_limits() {
  npullm::grammar::grammar_limits l;
  l.max_depth = 256;
  l.max_rules = 1u << 16;
  l.max_elements = 1u << 19;
  l.max_bytes = 32u << 20;
  l.max_schema_work = 100000;
  return l;
}

inline void run_one(std::string_view input) {
  namespace g = npullm::grammar;
  if (input.empty() || input.size() > 65536) return;
  const auto mode = static_cast<unsigned char>(input[0]);
  const std::string_view text = input.substr(1);
  g::json_schema_options opt;
  opt.whitespace = static_cast<g::json_whitespace>(mode % 3);
  opt.limits = fuzz_limits();
  std::optional<g::grammar> gr;
  try {
    gr = g::json_schema_grammar(text, opt);
  } catch (const npullm::error&) {
    return;  // refused: fine
  }
  g::byte_automaton a(std::move(*gr));
  require(!a.can_end(a.start()), "the empty text is accepted");
  static constexpr std::string_view alphabet =
      "{}[]\":, \n0123456789-+.eEtrufalsn\\/abxyzT\xc3\xa9";
  std::string out;
  auto s = a.start();
  std::size_t at = 1;
  try {
    for (int step = 0; step < 200; ++step) {
      const auto pick = static_cast<unsigned char>(input[at++ % input.size()]);
      if (a.can_end(s)) {
        require(is_json(out), "the grammar accepts a text that is not JSON", out);
        if (pick % 4 == 0) break;
      }
      std::vector<unsigned char> allowed;
      for (const char c : alphabet)
        if (a.next(s, static_cast<unsigned char>(c)) != g::byte_automaton::dead)
          allowed.push_back(static_cast<unsigned char>(c));
      if (allowed.empty()) break;
      const unsigned char b = allowed[pick % allowed.size()];
      s = a.next(s, b);
      out += static_cast<char>(b);
    }
  } catch (const npullm::error&) {
    return;  // the automaton's own bound (parse positions a step): fine
  }
  if (a.can_end(s)) require(is_json(out), "the grammar accepts a text that is not JSON", out);
}

}  // namespace npullm_fuzz_json_schema

#ifndef NPULLM_JSON_SCHEMA_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_json_schema::run_one({reinterpret_cast<const char*>(data), size});
  } catch (const npullm_fuzz_json_schema::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
