// A made-up vocabulary for constrained generation with the tiny test models (512 token ids):
// id 0 the end of generation, 1 a control token, every other id a byte string over "ab{}x."
// (its base-6 digits), so that the models' logits meet a grammar over those bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "npullm/grammar/token_index.hpp"

namespace npullm::testing {

inline std::shared_ptr<const grammar::token_index> toy_token_index(std::size_t n = 512) {
  std::vector<std::optional<std::string>> bytes(n);
  const std::string alphabet = "ab{}x.";
  for (std::size_t id = 2; id < n; ++id) {
    std::string t;
    for (std::size_t k = id; k > 0; k /= 6) t += alphabet[k % 6];
    bytes[id] = t;
  }
  return std::make_shared<const grammar::token_index>(bytes, std::vector<std::int32_t>{0});
}

}  // namespace npullm::testing
