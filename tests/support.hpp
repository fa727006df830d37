// Helpers shared by npullm's tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>

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

// This test process's folder for the files it writes: npullm_test_<pid> in the temporary
// directory, removed with everything in it when the process ends (at static destruction, so
// a run that passes or fails leaves nothing behind; one killed midway leaves this one folder).
inline const std::filesystem::path& scratch_root() {
  struct folder {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("npullm_test_" + std::to_string(::getpid()));
    folder() { std::filesystem::create_directories(path); }
    ~folder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
    folder(const folder&) = delete;
    folder& operator=(const folder&) = delete;
  };
  static const folder f;
  return f.path;
}

// A generated f32 model of a preset, written once per test process under scratch_root().
inline const std::filesystem::path& generated_model(const std::string& preset, std::uint64_t seed) {
  static std::map<std::string, std::filesystem::path> dirs;
  auto& d = dirs[preset + "/" + std::to_string(seed)];
  if (d.empty()) {
    d = scratch_root() / ("model_" + preset + "_" + std::to_string(seed));
    model::write_model(d, model::preset(preset, npullm::dtype::f32, seed));
  }
  return d;
}

}  // namespace npullm::testing
