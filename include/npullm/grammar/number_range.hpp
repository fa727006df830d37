// number_range: expressions of the decimal texts of numbers in a range, for JSON Schema's
// minimum / maximum / exclusive* (json_schema.hpp): integers in [min, max] without leading zeros
// (digit by digit, one alternative per length and per differing leading digit), and decimal
// texts I or I.F (no exponent) whose value lies between two bounds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "npullm/grammar/grammar.hpp"
#include "npullm/grammar/schema_common.hpp"

namespace npullm::grammar {

namespace detail {

// Digit strings of one length in [lo, hi].
inline expr same_length(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return expr::sequence();
  const std::size_t rest = lo.size() - 1;
  if (lo[0] == hi[0])
    return expr::sequence({digit(lo[0], lo[0]), same_length(lo.substr(1), hi.substr(1))});
  const bool lo_zeros = lo.substr(1) == std::string(rest, '0');
  const bool hi_nines = hi.substr(1) == std::string(rest, '9');
  std::vector<expr> out;
  char first = lo[0], last = hi[0];
  if (!lo_zeros) {
    out.push_back(
        expr::sequence({digit(lo[0], lo[0]), same_length(lo.substr(1), std::string(rest, '9'))}));
    ++first;
  }
  if (!hi_nines) --last;
  if (first <= last)
    out.push_back(expr::sequence(
        {digit(first, last), expr::repeat(digit('0', '9'), static_cast<std::uint32_t>(rest),
                                          static_cast<std::uint32_t>(rest))}));
  if (!hi_nines)
    out.push_back(
        expr::sequence({digit(hi[0], hi[0]), same_length(std::string(rest, '0'), hi.substr(1))}));
  return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
}

// Decimal numbers in [a, b] (b open when absent), a >= 0.
inline expr nonneg_range(std::int64_t a, std::optional<std::int64_t> b) {
  const std::string sa = std::to_string(a);
  std::vector<expr> out;
  const std::size_t la = sa.size();
  const std::size_t lb = b ? std::to_string(*b).size() : la;
  for (std::size_t len = la; len <= lb; ++len) {
    std::string lo(len, '0');  // the smallest of len digits, or a
    lo[0] = '1';
    if (len == la) lo = sa;
    std::string hi = (b && len == lb) ? std::to_string(*b) : std::string(len, '9');
    out.push_back(same_length(lo, hi));
  }
  if (!b) {
    // More digits than a: any.
    out.push_back(expr::sequence(
        {digit('1', '9'),
         expr::repeat(digit('0', '9'), static_cast<std::uint32_t>(la), expr::unbounded)}));
  }
  return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
}
// Integers in [min, max] (either side open), without leading zeros.
inline expr int_range(std::optional<std::int64_t> min, std::optional<std::int64_t> max) {
  std::vector<expr> out;
  // Negative part: -[max(1, -max) .. -min].
  if (!min || *min < 0) {
    const std::int64_t a = max ? std::max<std::int64_t>(1, -*max) : 1;
    const std::optional<std::int64_t> b = min ? std::optional<std::int64_t>(-*min) : std::nullopt;
    if (!b || a <= *b) out.push_back(expr::sequence({lit("-"), nonneg_range(a, b)}));
  }
  if (!max || *max >= 0) {
    const std::int64_t a = min ? std::max<std::int64_t>(0, *min) : 0;
    if (!max || a <= *max) out.push_back(nonneg_range(a, max));
  }
  if (out.empty()) return never();
  return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
}

// Decimal texts I or I.F (no exponent) whose value m is in [lo, hi] (each side inclusive or
// exclusive; hi open when absent), lo >= 0; nullopt when none.
template <class Bound>
std::optional<expr> magnitude(Bound lo, std::optional<Bound> hi) {
  const expr digits = plus(digit('0', '9'));
  const expr any_frac = expr::optional(expr::sequence({lit("."), digits}));
  const expr zero_frac = expr::optional(expr::sequence({lit("."), plus(digit('0', '0'))}));
  const expr nonzero_frac =
      expr::sequence({lit("."), star(digit('0', '9')), digit('1', '9'), star(digit('0', '9'))});
  std::vector<expr> out;
  if (hi && (hi->v < lo.v || (hi->v == lo.v && (lo.exclusive || hi->exclusive))))
    return std::nullopt;
  if (hi && hi->v == lo.v) return expr::sequence({int_range(lo.v, lo.v), zero_frac});
  // Whole part strictly between: any fraction.
  if (!hi || hi->v - lo.v >= 2)
    out.push_back(expr::sequence(
        {int_range(lo.v + 1, hi ? std::optional<std::int64_t>(hi->v - 1) : std::nullopt),
         any_frac}));
  out.push_back(expr::sequence({int_range(lo.v, lo.v), lo.exclusive ? nonzero_frac : any_frac}));
  if (hi && !hi->exclusive) out.push_back(expr::sequence({int_range(hi->v, hi->v), zero_frac}));
  return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
}

}  // namespace detail

}  // namespace npullm::grammar
