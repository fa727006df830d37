// Helpers shared by npullm's tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "npullm/core/error.hpp"
#include "npullm/model/synthetic.hpp"

namespace npullm::testing {

// fn() must throw npullm::error with this code and a message containing fragment.
template <class Fn>
void expect_error(Fn&& fn, error_code code, const std::string& fragment) {
  try {
    fn();
    FAIL() << "expected npullm::error containing: " << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// A generated f32 model of a preset, written once per test process to a temporary directory.
inline const std::filesystem::path& generated_model(const std::string& preset, std::uint64_t seed) {
  static std::map<std::string, std::filesystem::path> dirs;
  auto& d = dirs[preset + "/" + std::to_string(seed)];
  if (d.empty()) {
    d = std::filesystem::temp_directory_path() /
        ("npullm_test_" + preset + "_" + std::to_string(seed) + "_" + std::to_string(::getpid()));
    model::write_model(d, model::preset(preset, npullm::dtype::f32, seed));
  }
  return d;
}

}  // namespace npullm::testing
