// libFuzzer harness over the grammar front ends and the matcher: the first byte of an input
// picks GBNF (even) or JSON Schema (odd, its low bits the whitespace mode); the rest is the
// grammar or schema text. For every input:
//   - parsing / compiling throws npullm::error or nothing (no other exception, no crash);
//   - matching throws nothing but capacity_exhausted (a grammar too ambiguous for the matcher's
//     budgets, e.g. a nullable chain of counted repetitions: refused at match time);
//   - a compiled grammar runs over a made-up vocabulary of 40 byte strings: each mask equals
//     the brute-force reference (every token tried byte by byte), a token in the mask is
//     accepted and one outside it is refused leaving the matcher unchanged, EOS is in the mask
//     exactly when can_end, rollback returns to the earlier mask.
// The tokens followed are the lowest allowed ids chosen by the input's own bytes, for at most
// 24 steps. Built with clang when available (target fuzz_grammar); test_grammar replays the
// corpus (tests/grammar/corpus_grammar) through the same checks.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/grammar/gbnf.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/grammar/token_matcher.hpp"

namespace npullm_fuzz_grammar {

struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what) {
  if (!ok) throw violation(what);
}

// Id 0: EOS; the rest: bytes a JSON text or a small grammar is made of, some multi-byte and
// some half a UTF-8 character.
inline std::shared_ptr<const npullm::grammar::token_index> toy_index() {
  static const auto index = [] {
    std::vector<std::optional<std::string>> t = {std::nullopt, "{",        "}",
                                                 "[",          "]",        "\"",
                                                 ":",          ",",        " ",
                                                 "\n",         "a",        "b",
                                                 "ab",         "0",        "1",
                                                 "12",         "-",        ".",
                                                 "e",          "true",     "null",
                                                 "\"a\"",      "\":",      "\", \"",
                                                 "{\"",        "}]",       "x",
                                                 "yes",        "no",       "\xc3",
                                                 "\xa9",       "\xc3\xa9", "\xe6\x97\xa5",
                                                 "\\",         "\\n",      "2024-",
                                                 "01",         "T",        "Z",
                                                 "@"};
    return std::make_shared<const npullm::grammar::token_index>(std::move(t),
                                                                std::vector<std::int32_t>{0});
  }();
  return index;
}

// The checks on one mask of a matcher in state `state`: each token is in it exactly when the
// brute-force reference (the token's bytes walked one by one) takes it, and EOS exactly when
// the matcher can end. Returns the allowed ids; a difference throws violation.
inline std::vector<std::int32_t> check_mask(npullm::grammar::token_grammar& tg,
                                            npullm::grammar::token_grammar::state_id state,
                                            const std::vector<std::uint64_t>& mask, bool can_end) {
  namespace g = npullm::grammar;
  const auto n = static_cast<std::int32_t>(tg.index().size());
  std::vector<std::int32_t> allowed;
  for (std::int32_t id = 0; id < n; ++id) {
    const bool in = g::mask_test(mask, id);
    require(in == (tg.next(state, id) != g::byte_automaton::dead),
            "mask differs from the brute-force reference");
    if (in) allowed.push_back(id);
  }
  require(g::mask_test(mask, 0) == can_end, "EOS in the mask differs from can_end");
  return allowed;
}

inline void match(npullm::grammar::grammar gr, std::string_view input);

inline void run_one(std::string_view input) {
  namespace g = npullm::grammar;
  if (input.empty() || input.size() > 4096) return;
  const auto mode = static_cast<unsigned char>(input[0]);
  const std::string_view text = input.substr(1);
  std::optional<g::grammar> gr;
  try {
    if (mode % 2 == 0) {
      gr = g::parse_gbnf(text);
    } else {
      const auto ws = static_cast<g::json_whitespace>((mode >> 1) % 3);
      gr = g::json_schema_grammar(text, {.whitespace = ws});
    }
  } catch (const npullm::error&) {
    return;  // refused: fine
  }
  try {
    match(std::move(*gr), input);
  } catch (const npullm::error& e) {
    // A grammar the matcher gives up on after a character (more parse positions or automaton
    // bytes than its budget): refused at match time, by design. Any other error is a finding.
    if (e.code() != npullm::error_code::capacity_exhausted) throw violation(e.what());
  }
}

inline void match(npullm::grammar::grammar gr, std::string_view input) {
  namespace g = npullm::grammar;
  auto tg = std::make_shared<g::token_grammar>(std::move(gr), toy_index());
  g::token_matcher m(tg);
  const auto n = static_cast<std::int32_t>(tg->index().size());
  std::vector<std::vector<std::uint64_t>> masks;
  for (std::size_t step = 0; step < 24 && !m.finished(); ++step) {
    const auto mask = m.mask();
    masks.push_back(mask);
    const std::vector<std::int32_t> allowed = check_mask(*tg, m.state(), mask, m.can_end());
    for (std::int32_t id = 0; id < n; ++id) {
      if (g::mask_test(mask, id)) continue;
      const auto before = m.accepted();
      require(!m.try_accept(id), "a token outside the mask was accepted");
      require(m.accepted() == before, "a refused token changed the matcher");
      break;
    }
    if (allowed.empty()) break;
    const auto pick = static_cast<unsigned char>(input[1 + step % (input.size() - 1)]);
    require(m.try_accept(allowed[pick % allowed.size()]), "a token in the mask was refused");
  }
  // Rollback: each earlier mask comes back.
  while (m.accepted() > 0) {
    m.rollback(1);
    require(m.mask() == masks[m.accepted()], "rollback did not restore the earlier mask");
  }
}

}  // namespace npullm_fuzz_grammar

#ifndef NPULLM_GRAMMAR_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_grammar::run_one({reinterpret_cast<const char*>(data), size});
  } catch (const npullm_fuzz_grammar::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
