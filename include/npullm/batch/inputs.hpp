// Batch inputs for scoring: ids [N, L], an optional attention mask [N, L] (1 = token, 0 =
// padding, left or right) and optional positions [N, L]. An input whose leading dimension is 1
// is shared by every row. Each row's tokens must be one contiguous run of mask 1 (left or right
// padding); positions, when given, must count 0, 1, ... over that run (the pipelines number
// positions themselves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::batch {

struct batch_inputs {
  dense_view<const std::int32_t, 2> ids;          // (N or 1, L)
  dense_view<const std::int32_t, 2> mask{};       // (N or 1, L), optional
  dense_view<const std::int64_t, 2> positions{};  // (N or 1, L), optional
};

// One row's tokens: a zero-copy span into the ids.
struct batch_row {
  std::span<const std::int32_t> tokens;
  std::size_t first;  // column of its first token
};

// Validates the shapes and returns each row's tokens (views into `ids`).
inline std::vector<batch_row> resolve_rows(const batch_inputs& in) {
  const bool has_mask = in.mask.data_handle() != nullptr;
  const bool has_pos = in.positions.data_handle() != nullptr;
  std::size_t n = in.ids.extent(0);
  if (has_mask) n = std::max<std::size_t>(n, in.mask.extent(0));
  if (has_pos) n = std::max<std::size_t>(n, in.positions.extent(0));
  const std::size_t len = in.ids.extent(1);
  auto shape_error = [&] {
    raise(error_code::invalid_shape, "batch inputs: ids ",
          npullm::detail::format_extents(in.ids.extents()),
          has_mask ? ", mask " + npullm::detail::format_extents(in.mask.extents()) : std::string(),
          has_pos ? ", positions " + npullm::detail::format_extents(in.positions.extents())
                  : std::string(),
          " (want [N, L] with N > 0, L > 0; a leading 1 is shared by every row)");
  };
  if (n == 0 || len == 0) shape_error();
  auto fits = [&](std::size_t rows, std::size_t cols) {
    return (rows == n || rows == 1) && cols == len;
  };
  if (!fits(in.ids.extent(0), len) || (has_mask && !fits(in.mask.extent(0), in.mask.extent(1))) ||
      (has_pos && !fits(in.positions.extent(0), in.positions.extent(1)))) {
    shape_error();
  }
  std::vector<batch_row> rows(n);
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t ir = in.ids.extent(0) == 1 ? 0 : r;
    std::size_t first = 0, last = len;  // [first, last): the row's tokens
    if (has_mask) {
      const std::size_t mr = in.mask.extent(0) == 1 ? 0 : r;
      first = len;
      last = 0;
      for (std::size_t c = 0; c < len; ++c) {
        if (in.mask(mr, c) != 0) {
          first = std::min(first, c);
          last = c + 1;
        }
      }
      if (first >= last)
        raise(error_code::invalid_argument, "batch inputs: row ", r, " has no tokens (mask all 0)");
      for (std::size_t c = first; c < last; ++c) {
        if (in.mask(mr, c) == 0) {
          raise(error_code::invalid_argument, "batch inputs: row ", r, " has a gap at column ", c,
                " (tokens must be one run: left or right padding)");
        }
      }
    }
    if (has_pos) {
      const std::size_t pr = in.positions.extent(0) == 1 ? 0 : r;
      for (std::size_t c = first; c < last; ++c) {
        if (in.positions(pr, c) != static_cast<std::int64_t>(c - first)) {
          raise(error_code::unsupported, "batch inputs: row ", r, " position ", in.positions(pr, c),
                " at column ", c, " (positions must count from 0 over the row's tokens)");
        }
      }
    }
    rows[r] = {std::span<const std::int32_t>(&in.ids(ir, first), last - first), first};
  }
  return rows;
}

}  // namespace npullm::batch
