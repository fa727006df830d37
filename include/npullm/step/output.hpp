// What a step asks for and what it returns: which rows of a step need logits, and, separately,
// which need the pre-final-norm hidden state (for a multi-token-prediction or draft head).
//
// This sits below both batch/ (which asks) and model/ (whose pipelines answer), so neither
// includes the other.
//
// Rows are indices into the step's tokens (0 .. n-1); `last()` means the step's last token.
// A pipeline gathers the selected rows before the final norm and the LM head, so logits cost
// [rows selected, vocab], and a [n, vocab] buffer exists only when every row is asked for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"

namespace npullm {

class output_selection {
 public:
  // Logits for the last row only, no hidden rows (the default).
  static output_selection last() { return output_selection().logits_last(); }
  // Logits for every row.
  static output_selection all_rows() {
    output_selection s;
    s.all_logits_ = true;
    return s;
  }
  static output_selection none() { return {}; }

  output_selection& logits_last() {
    last_logits_ = true;
    return *this;
  }
  output_selection& logits_for(std::vector<std::size_t> rows) {
    logit_rows_ = std::move(rows);
    return *this;
  }
  output_selection& hidden_for(std::vector<std::size_t> rows) {
    hidden_rows_ = std::move(rows);
    return *this;
  }
  output_selection& hidden_last() {
    last_hidden_ = true;
    return *this;
  }

  // The sorted, unique rows of a step of n tokens; out_of_range naming a row >= n.
  [[nodiscard]] std::vector<std::size_t> logit_rows(std::size_t n) const {
    if (all_logits_) {
      std::vector<std::size_t> r(n);
      for (std::size_t i = 0; i < n; ++i) r[i] = i;
      return r;
    }
    return resolve(logit_rows_, last_logits_, n, "logits");
  }
  [[nodiscard]] std::vector<std::size_t> hidden_rows(std::size_t n) const {
    return resolve(hidden_rows_, last_hidden_, n, "hidden");
  }

 private:
  static std::vector<std::size_t> resolve(std::vector<std::size_t> rows, bool last, std::size_t n,
                                          const char* what) {
    if (last && n > 0) rows.push_back(n - 1);
    for (std::size_t r : rows) {
      if (r >= n) {
        raise(error_code::out_of_range, "output_selection: ", what, " row ", r,
              " out of range for a step of ", n, " tokens");
      }
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    return rows;
  }

  std::vector<std::size_t> logit_rows_, hidden_rows_;
  bool last_logits_ = false, last_hidden_ = false, all_logits_ = false;
};

// What a step returns: logits of the selected rows and pre-norm hidden rows.
struct step_output {
  std::vector<std::size_t> logit_rows;   // step rows that have logits, ascending
  tensor<float, 2> logits;               // (logit_rows.size(), vocab)
  std::vector<std::size_t> hidden_rows;  // step rows that have hidden states, ascending
  tensor<float, 2> hidden;               // (hidden_rows.size(), hidden_size), before the final norm

  // The logits of step row r; invalid_argument if r was not selected.
  [[nodiscard]] std::span<const float> logits_of(std::size_t r) const {
    return row_of(logit_rows, logits, r, "logits");
  }
  [[nodiscard]] std::span<const float> hidden_of(std::size_t r) const {
    return row_of(hidden_rows, hidden, r, "hidden state");
  }

 private:
  static std::span<const float> row_of(const std::vector<std::size_t>& rows,
                                       const tensor<float, 2>& t, std::size_t r, const char* what) {
    const auto it = std::lower_bound(rows.begin(), rows.end(), r);
    if (it == rows.end() || *it != r) {
      raise(error_code::invalid_argument, "step_output: no ", what, " for row ", r,
            " (it was not selected; selected: ", npullm::detail::format_list(rows), ")");
    }
    const auto i = static_cast<std::size_t>(it - rows.begin());
    return {t.data() + i * t.extent(1), t.extent(1)};
  }
};

}  // namespace npullm

// batch:: spelled these before they moved below batch and model; callers keep compiling.
namespace npullm::batch {
using npullm::output_selection;
using npullm::step_output;
}  // namespace npullm::batch
