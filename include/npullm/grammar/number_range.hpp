// number_range: expressions of the decimal texts of numbers in a range, for JSON Schema's
// minimum / maximum / exclusive* (json_schema.hpp): integers in [min, max] without leading zeros
// (digit by digit, one alternative per length and per differing leading digit), and decimal
// texts I or I.F (no exponent) whose value lies between two bounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

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

// A bound on a magnitude as decimal digits: whole part and fraction digits (no trailing
// zeros), inclusive or exclusive.
struct decimal_bound {
  std::int64_t whole = 0;
  std::string frac;
  bool exclusive = false;
};

// |d| as decimal_bound digits, from the shortest text that reads back as d (the value a
// validator compares against); nullopt past 1e15.
inline std::optional<decimal_bound> decimal_of(double d, bool exclusive) {
  d = std::fabs(d);
  if (!(d <= 1e15)) return std::nullopt;
  const std::string t = nlohmann::json(d).dump();
  const std::size_t e = t.find_first_of("eE");
  const std::string mant = t.substr(0, e);
  const int exp = e == std::string::npos ? 0 : std::stoi(t.substr(e + 1));
  const std::size_t dot = mant.find('.');
  const std::string ip = mant.substr(0, dot);
  const std::string fp = dot == std::string::npos ? "" : mant.substr(dot + 1);
  const std::string digits = ip + fp;
  const long point = static_cast<long>(ip.size()) + exp;
  std::string whole, frac;
  if (point <= 0) {
    whole = "0";
    frac = std::string(static_cast<std::size_t>(-point), '0') + digits;
  } else if (point >= static_cast<long>(digits.size())) {
    whole = digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0');
  } else {
    whole = digits.substr(0, static_cast<std::size_t>(point));
    frac = digits.substr(static_cast<std::size_t>(point));
  }
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  decimal_bound b;
  b.whole = std::stoll(whole);
  b.frac = frac;
  b.exclusive = exclusive;
  return b;
}

// Fraction digits (after the point, at least one) whose value 0.D is >= 0.lo (> when
// exclusive; none: no lower bound) and <= 0.hi (<; none: no upper bound): a digit automaton
// per bound (tight at a position, free, dead), their product made into rules. nullopt when
// no digits fit; `bare` says whether no fraction at all (value 0) fits.
inline std::optional<expr> fraction_between(const std::optional<decimal_bound>& lo,
                                            const std::optional<decimal_bound>& hi,
                                            grammar_builder& b, bool& bare) {
  constexpr int free_state = -1, dead = -2;
  const auto ge_step = [&](int i, int d) {
    if (!lo || i == free_state) return free_state;
    const int k = static_cast<int>(lo->frac.size());
    if (i == k) return d > 0 ? free_state : k;
    const int bd = lo->frac[static_cast<std::size_t>(i)] - '0';
    return d > bd ? free_state : d == bd ? i + 1 : dead;
  };
  const auto ge_ok = [&](int i) {
    if (!lo || i == free_state) return true;
    return i == static_cast<int>(lo->frac.size()) && !lo->exclusive;
  };
  const auto le_step = [&](int j, int d) {
    if (!hi || j == free_state) return free_state;
    const int k = static_cast<int>(hi->frac.size());
    if (j == k) return d == 0 ? k : dead;
    const int bd = hi->frac[static_cast<std::size_t>(j)] - '0';
    return d < bd ? free_state : d == bd ? j + 1 : dead;
  };
  const auto le_ok = [&](int j) {
    if (!hi || j == free_state) return true;
    return j < static_cast<int>(hi->frac.size()) || !hi->exclusive;
  };
  std::map<std::pair<int, int>, std::uint32_t> ids;
  std::vector<std::pair<int, int>> st;
  std::vector<std::vector<std::pair<int, std::uint32_t>>> edges;  // digit -> state
  const auto intern = [&](std::pair<int, int> x) {
    const auto it = ids.find(x);
    if (it != ids.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(st.size());
    ids.emplace(x, id);
    st.push_back(x);
    edges.emplace_back();
    return id;
  };
  constexpr int start = -3;  // the start, apart from a return to (0, 0) after digits
  intern({start, start});
  for (std::uint32_t a = 0; a < st.size(); ++a) {
    const int i = st[a].first == start ? 0 : st[a].first;
    const int j = st[a].second == start ? 0 : st[a].second;
    for (int d = 0; d <= 9; ++d) {
      const int ni = ge_step(i, d), nj = le_step(j, d);
      if (ni == dead || nj == dead) continue;
      const std::uint32_t to = intern({ni, nj});  // may grow `edges`: before indexing it
      edges[a].emplace_back(d, to);
    }
  }
  const auto ok = [&](std::uint32_t a) {
    const int i = st[a].first == start ? 0 : st[a].first;
    const int j = st[a].second == start ? 0 : st[a].second;
    return ge_ok(i) && le_ok(j);
  };
  bare = ok(0);
  // States that reach an accepting one after at least one digit.
  std::vector<char> live(st.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::uint32_t a = 0; a < st.size(); ++a) {
      if (live[a]) continue;
      for (const auto& [d, to] : edges[a])
        if (ok(to) || live[to]) live[a] = 1;
      changed = changed || live[a];
    }
  }
  if (!live[0]) return std::nullopt;
  std::vector<std::uint32_t> rule(st.size(), 0);
  for (std::uint32_t a = 0; a < st.size(); ++a)
    if (live[a] || ok(a)) rule[a] = b.fresh("frac");
  for (std::uint32_t a = 0; a < st.size(); ++a) {
    if (!live[a] && !ok(a)) continue;
    std::vector<expr> alts;
    if (a != 0 && ok(a)) alts.push_back(expr::sequence());
    std::map<std::uint32_t, std::vector<std::pair<char32_t, char32_t>>> by;
    for (const auto& [d, to] : edges[a])
      if (live[to] || ok(to))
        by[to].emplace_back(static_cast<char32_t>('0' + d), static_cast<char32_t>('0' + d));
    for (auto& [to, r] : by)
      alts.push_back(expr::sequence({chars(std::move(r)), expr::call(rule[to])}));
    b.define(rule[a], alts.size() == 1 ? alts[0] : expr::choice(std::move(alts)));
  }
  return expr::sequence({lit("."), expr::call(rule[0])});
}

// Decimal texts I or I.F (no exponent) whose value m is in [lo, hi] (each side inclusive or
// exclusive; hi open when absent), lo >= 0; nullopt when none.
inline std::optional<expr> decimal_magnitude(const decimal_bound& lo,
                                             const std::optional<decimal_bound>& hi,
                                             grammar_builder& b) {
  const expr any_frac = expr::optional(expr::sequence({lit("."), plus(digit('0', '9'))}));
  std::vector<expr> out;
  // Whole part w with the fraction between the bounds that apply at w.
  const auto at = [&](std::int64_t w, const std::optional<decimal_bound>& l,
                      const std::optional<decimal_bound>& h) {
    bool bare = false;
    auto f = fraction_between(l, h, b, bare);
    if (!f && !bare) return;
    if (!f) {
      out.push_back(int_range(w, w));
    } else {
      out.push_back(expr::sequence({int_range(w, w), bare ? expr::optional(*f) : *f}));
    }
  };
  if (hi && hi->whole < lo.whole) return std::nullopt;
  if (hi && hi->whole == lo.whole) {
    at(lo.whole, lo, hi);
  } else {
    if (!hi || hi->whole - lo.whole >= 2)
      out.push_back(expr::sequence(
          {int_range(lo.whole + 1, hi ? std::optional<std::int64_t>(hi->whole - 1) : std::nullopt),
           any_frac}));
    at(lo.whole, lo, std::nullopt);
    if (hi) at(hi->whole, std::nullopt, hi);
  }
  if (out.empty()) return std::nullopt;
  return out.size() == 1 ? std::move(out[0]) : expr::choice(std::move(out));
}

}  // namespace detail

}  // namespace npullm::grammar
