#include <gtest/gtest.h>

#include <string>

#include "npullm/core/error.hpp"

namespace {

using npullm::error;
using npullm::error_code;

TEST(Error, CarriesCodeAndMessage) {
  try {
    npullm::raise(error_code::out_of_range, "row ", 7, " out of range for batch of ", 4);
    FAIL() << "raise returned";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::out_of_range);
    EXPECT_STREQ(e.what(), "npullm out_of_range: row 7 out of range for batch of 4");
  }
}

TEST(Error, MessageIsWhatWithoutThePrefix) {
  const error e(error_code::capacity_exhausted, "KV cache is full");
  EXPECT_EQ(e.message(), "KV cache is full");
  EXPECT_STREQ(e.what(), "npullm capacity_exhausted: KV cache is full");
}

// A caller that adds context re-raises with message(): the prefix appears once.
TEST(Error, ReRaisedErrorsCompose) {
  try {
    try {
      npullm::raise(error_code::out_of_range, "token 9 out of range for length 4");
    } catch (const error& inner) {
      npullm::raise(inner.code(), "batch_unroll: row 2 of 3: ", inner.message());
    }
    FAIL() << "raise returned";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::out_of_range);
    EXPECT_STREQ(
        e.what(),
        "npullm out_of_range: batch_unroll: row 2 of 3: token 9 out of range for length 4");
  }
}

TEST(Error, IsARuntimeError) {
  EXPECT_THROW(throw error(error_code::io, "x"), std::runtime_error);
}

TEST(Error, EveryCodeHasAName) {
  const error_code codes[] = {error_code::invalid_shape,
                              error_code::out_of_range,
                              error_code::capacity_exhausted,
                              error_code::unsupported,
                              error_code::invalid_argument,
                              error_code::backend,
                              error_code::io,
                              error_code::corrupt_data,
                              error_code::resource};
  const char* names[] = {
      "invalid_shape", "out_of_range", "capacity_exhausted", "unsupported", "invalid_argument",
      "backend",       "io",           "corrupt_data",       "resource"};
  for (std::size_t i = 0; i < std::size(codes); ++i) {
    EXPECT_EQ(npullm::to_string(codes[i]), names[i]);
    EXPECT_EQ(error(codes[i], "m").what(), std::string("npullm ") + names[i] + ": m");
  }
}

TEST(Error, FormatList) {
  EXPECT_EQ(npullm::detail::format_list(std::vector<int>{2, 3, 5}), "[2, 3, 5]");
  EXPECT_EQ(npullm::detail::format_list(std::vector<int>{}), "[]");
}

}  // namespace
