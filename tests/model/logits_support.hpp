// Helpers of the tests that compare logits with llama.cpp's files (test_gguf_archs, test_moe):
// the token list and float32 logits files of ../shared/vectors, and their comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "npullm/ops/argmax.hpp"

namespace npullm::testing {

// A comma-separated list of token ids (tokens.txt).
inline std::vector<std::int32_t> read_token_list(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::int32_t> ids;
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

// Little-endian float32 values (the *.logits.f32 files).
inline std::vector<float> read_f32(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> v(std::filesystem::file_size(path) / 4);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// Rows of n logits whose argmax agrees.
inline std::size_t argmax_agreement(const std::vector<float>& a, const std::vector<float>& b,
                                    std::size_t n) {
  std::size_t same = 0;
  for (std::size_t r = 0; r < a.size() / n; ++r) {
    same += npullm::ops::argmax(std::span<const float>(a).subspan(r * n, n)) ==
            npullm::ops::argmax(std::span<const float>(b).subspan(r * n, n));
  }
  return same;
}

}  // namespace npullm::testing
