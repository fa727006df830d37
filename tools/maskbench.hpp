// MaskBench's method (../shared/vectors/maskbench/README.md) for npullm's grammars: the
// programs' own (npullm_maskbench, and the sample test in tests/grammar), not a library header
// (tools/: namespace npullm_tools, see tools/README.md).
//
// Per file: compile the schema (json_schema_grammar + token_grammar: TTFM); a compile error
// counts against the file. Per test: its `text` tokenized without BOS; for each token, compute
// the mask and, if the token is in it, commit it (one TBM sample: mask + commit); stop at the
// first token the mask forbids. Then, if every token was allowed, one more mask: the
// end-of-sequence token must be in it for the text to count as accepted (a whole JSON value;
// MaskBench asks the engine whether it accepts there). A valid test must be accepted
// (otherwise a validation error), an invalid one must not (otherwise an invalidation error).
// A file passes when it compiles and every test is right.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/grammar/token_matcher.hpp"
#include "npullm/text/tokenizer.hpp"

namespace npullm_tools::maskbench {

struct file_result {
  std::string name, split;
  bool compiled = false;
  std::string error;  // the compile error's message
  std::size_t tests = 0, validation_errors = 0, invalidation_errors = 0;
  double ttfm_us = 0;
  std::vector<double> tbm_us;  // one per mask
  double seconds = 0;          // compile and every test
  std::string first_failure;   // the first wrong test: its text and where it stopped
  [[nodiscard]] bool passing() const {
    return compiled && validation_errors == 0 && invalidation_errors == 0;
  }
};

// The split of a MaskBench file name: "Github_easy---o1.json" -> Github_easy,
// "BFCL_simple_10.json" -> BFCL.
inline std::string split_of(const std::string& name) {
  if (name.rfind("BFCL", 0) == 0) return "BFCL";
  const std::size_t dash = name.find("---");
  if (dash != std::string::npos) return name.substr(0, dash);
  std::size_t end = name.rfind('.');
  if (end == std::string::npos) end = name.size();
  std::size_t us = name.rfind('_', end);
  if (us != std::string::npos && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(us) + 1,
                                             name.begin() + static_cast<std::ptrdiff_t>(end),
                                             [](char c) { return c >= '0' && c <= '9'; }))
    return name.substr(0, us);
  return name.substr(0, end);
}

inline file_result run_file(const std::filesystem::path& path, const npullm::text::tokenizer& tok,
                            const std::shared_ptr<const npullm::grammar::token_index>& index) {
  using clock = std::chrono::steady_clock;
  const auto us = [](clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  };
  file_result r;
  r.name = path.filename().string();
  r.split = split_of(r.name);
  std::ifstream in(path, std::ios::binary);
  if (!in) npullm::raise(npullm::error_code::io, "cannot read ", path.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    npullm::raise(npullm::error_code::corrupt_data, path.string(), ": not JSON: ", e.what());
  }
  if (!doc.contains("schema") || !doc.contains("tests"))
    npullm::raise(npullm::error_code::corrupt_data, path.string(), ": no 'schema' or 'tests'");
  const auto start = clock::now();
  std::shared_ptr<npullm::grammar::token_grammar> g;
  try {
    g = std::make_shared<npullm::grammar::token_grammar>(
        npullm::grammar::json_schema_grammar(doc["schema"]), index);
    r.compiled = true;
  } catch (const npullm::error& e) {
    r.error = std::string(e.message());
  }
  r.ttfm_us = us(clock::now() - start);
  std::vector<std::uint64_t> mask(npullm::grammar::mask_words(index->size()));
  // The end token that closes each text: a vocabulary may have no EOS id (eos = -1, which
  // mask_test would read out of the mask): its first end-of-generation id then, or none (the
  // end is then checked by can_end).
  const auto& eog = tok.vocab().eog;
  const std::int32_t eos = tok.vocab().eos >= 0 ? tok.vocab().eos : eog.empty() ? -1 : eog.front();
  for (const auto& t : doc["tests"]) {
    ++r.tests;
    if (!r.compiled) continue;
    const bool valid = t.at("valid").get<bool>();
    const std::string s = t.contains("text") ? t["text"].get<std::string>() : t["data"].dump();
    auto ids = tok.encode(s, {.add_special = false});
    if (eos >= 0) ids.push_back(eos);
    npullm::grammar::token_matcher m(g);
    bool accepted = true;
    std::string prefix;
    for (const std::int32_t id : ids) {
      const auto t0 = clock::now();
      m.fill_mask(mask);
      const bool ok = npullm::grammar::mask_test(mask, id);
      if (ok) m.accept(id);
      r.tbm_us.push_back(us(clock::now() - t0));
      if (!ok) {
        accepted = false;
        break;
      }
      prefix += tok.piece(id);
    }
    if (eos < 0 && accepted && !m.can_end()) accepted = false;
    if (valid != accepted && r.first_failure.empty())
      r.first_failure = (valid ? "valid text refused after '" : "invalid text accepted: '") +
                        prefix + "' of '" + s + "'";
    if (valid && !accepted) ++r.validation_errors;
    if (!valid && accepted) ++r.invalidation_errors;
  }
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace npullm_tools::maskbench
