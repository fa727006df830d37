// Command-line values of the programs in examples/ (npullm_run, npullm_server, npullm_bench,
// npullm_quantize, npullm_tokenize, npullm_apply_template, npullm_make_model, npullm_maskbench):
// not a library header, the programs' own (tools/: namespace npullm_tools, see tools/README.md).
//
// A number must be the whole value, in decimal, inside the range its flag allows; anything
// else is refused with npullm::error (invalid_argument) whose message names the flag and the
// value as given, and the range, so that a program prints "error: " + message():
//   -t 100000000: threads must be an integer in 1..1024
//   -n 40x: n_predict must be an integer >= 0
//   --top-p 1.5: top_p must be a number in (0, 1]
// (std::stoul, which these programs used, takes "40x" as 40 and "-5" as 2^64 - 5, and its
// std::invalid_argument names neither the flag nor the value.)
//   integer<T>(flag, value, what, min, max)   an integer of type T in [min, max]: digits, and a
//                                             leading '-' for a signed T; no sign otherwise, no
//                                             '+', no spaces, no suffix
//   number(flag, value, what, range)          a finite float in range (decimal or scientific,
//                                             as std::from_chars reads it; nan, inf refused)
//   value(argc, argv, i)                      the value after flag argv[i] (i moves to it), or
//                                             "FLAG needs a value"
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "npullm/core/error.hpp"

namespace npullm_tools::cli {

// The most threads a program takes: more than any host these programs run on has, few enough
// that a typo (-t 100000000) is refused before a thread pool tries to start them.
inline constexpr std::size_t max_threads = 1024;

// The value as an error message shows it: quoted when empty or when it has spaces.
inline std::string shown(std::string_view value) {
  if (!value.empty() && value.find_first_of(" \t") == std::string_view::npos)
    return std::string(value);
  // Appended rather than "'" + std::string(value) + "'": GCC 12 warns (-Wrestrict, a false
  // positive) on operator+(const char*, std::string&&) inlined at -O3.
  std::string quoted;
  quoted.reserve(value.size() + 2);
  quoted.push_back('\'');
  quoted.append(value);
  quoted.push_back('\'');
  return quoted;
}

// Throws npullm::error(invalid_argument, "<flag> <value>: <why...>").
template <class... Why>
[[noreturn]] void refuse(std::string_view flag, std::string_view value, const Why&... why) {
  npullm::raise(npullm::error_code::invalid_argument, flag, " ", shown(value), ": ", why...);
}

// The whole of text as a T, or nothing (not a number, a sign T does not have, a suffix, or a
// value T cannot hold).
template <std::integral T>
std::optional<T> parse_integer(std::string_view text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);  // no '+', no spaces
  if (text.empty() || ec != std::errc{} || ptr != end) return std::nullopt;
  return v;
}

// The whole of text as a finite float, or nothing.
inline std::optional<float> parse_float(std::string_view text) {
  float v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc{} || ptr != end || !std::isfinite(v)) return std::nullopt;
  return v;
}

template <std::integral T>
T integer(std::string_view flag, std::string_view value, std::string_view what, T min,
          T max = std::numeric_limits<T>::max()) {
  const std::optional<T> v = parse_integer<T>(value);
  if (!v || *v < min || *v > max) {
    // Print through long long / unsigned long long: a char-sized T would print as a character.
    using wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    if (max == std::numeric_limits<T>::max()) {
      refuse(flag, value, what, " must be an integer >= ", static_cast<wide>(min));
    }
    refuse(flag, value, what, " must be an integer in ", static_cast<wide>(min), "..",
           static_cast<wide>(max));
  }
  return *v;
}

// Where a float flag's value may lie: [lo, hi] with either end open or absent.
struct range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  static range any() { return {}; }
  static range at_least(double lo) { return {.lo = lo}; }
  static range above(double lo) { return {.lo = lo, .lo_open = true}; }
  static range closed(double lo, double hi) { return {.lo = lo, .hi = hi}; }
  static range above_to(double lo, double hi) { return {.lo = lo, .hi = hi, .lo_open = true}; }

  [[nodiscard]] bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  // " >= 0", " in (0, 1]", ... ("" for any finite number).
  [[nodiscard]] std::string text() const {
    const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
    std::ostringstream out;
    if (has_lo && has_hi) {
      out << " in " << (lo_open ? '(' : '[') << lo << ", " << hi << (hi_open ? ')' : ']');
    } else if (has_lo) {
      out << (lo_open ? " > " : " >= ") << lo;
    } else if (has_hi) {
      out << (hi_open ? " < " : " <= ") << hi;
    }
    return out.str();
  }
};

inline float number(std::string_view flag, std::string_view value, std::string_view what,
                    const range& allowed) {
  const std::optional<float> v = parse_float(value);
  if (!v || !allowed.contains(*v)) {
    refuse(flag, value, what, " must be a",
           std::isfinite(allowed.lo) || std::isfinite(allowed.hi) ? "" : " finite", " number",
           allowed.text());
  }
  return *v;
}

// argv[i + 1], moving i to it; "<flag> needs a value" when argv ends at the flag.
inline std::string_view value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) npullm::raise(npullm::error_code::invalid_argument, argv[i], " needs a value");
  return argv[++i];
}

}  // namespace npullm_tools::cli
