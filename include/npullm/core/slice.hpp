// Zero-copy region-of-interest slicing, in the manner of std::submdspan.
//
//   subview(v, range{2, 5}, all, 3)   // rank 2: rows 2..4 of every column-slab, index 3 of dim 2
//   row(v, i)                         // v(i, ...): rank - 1
//   rows(v, begin, end)               // v(begin..end, ...): same rank
//
// A slice changes only the mapping and the pointer (through the accessor's offset), never the
// data. A single index drops its dimension. Slicing a layout_right view keeps layout_right when
// the result is still contiguous (leading indices, then at most one range, then `all`);
// otherwise the result is layout_stride. Bounds are checked: a bad slice throws
// npullm::error(out_of_range) naming the slice, the request and the extents.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm {

// Half-open [begin, end).
struct range {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// The whole extent.
struct all_t {
  explicit constexpr all_t() = default;
};
inline constexpr all_t all{};

namespace detail {

template <class S>
concept slice_index = std::integral<S>;
template <class S>
concept slice_spec = slice_index<S> || std::same_as<S, range> || std::same_as<S, all_t>;

template <class... S>
inline constexpr std::size_t kept_rank = ((slice_index<S> ? 0 : 1) + ... + 0);

// layout_right stays layout_right when the kept dimensions are a contiguous block: leading
// single indices, at most one range, then only `all`.
template <class... S>
constexpr bool keeps_layout_right() {
  constexpr std::array<int, sizeof...(S) + 1> kind{
      (slice_index<S> ? 0 : (std::same_as<S, range> ? 1 : 2))..., 2};
  std::size_t r = 0;
  while (r < sizeof...(S) && kind[r] == 0) ++r;  // leading indices
  if (r < sizeof...(S)) ++r;                     // one range or all
  for (; r < sizeof...(S); ++r) {
    if (kind[r] != 2) return false;
  }
  return true;
}

struct slice_bounds {
  std::size_t first;   // first index taken in this dimension
  std::size_t extent;  // how many are kept (0 when the dimension is dropped)
  bool kept;
};

// The view's extents are formatted only when a slice is out of range: slicing is on hot paths
// (a KV slot per token and layer) and builds no string when it succeeds.
template <class S, class Extents>
slice_bounds resolve_slice(const S& s, const Extents& extents, std::size_t dim) {
  const auto extent = static_cast<std::size_t>(extents.extent(dim));
  if constexpr (std::same_as<S, all_t>) {
    return {0, extent, true};
  } else if constexpr (std::same_as<S, range>) {
    if (s.begin > s.end || s.end > extent) [[unlikely]] {
      raise(error_code::out_of_range, "subview: dimension ", dim, " range [", s.begin, ", ", s.end,
            ") out of range for extent ", extent, " (view extents ", format_extents(extents), ")");
    }
    return {s.begin, s.end - s.begin, true};
  } else {
    if (std::cmp_less(s, 0) || std::cmp_greater_equal(s, extent)) [[unlikely]] {
      raise(error_code::out_of_range, "subview: dimension ", dim, " index ", s,
            " out of range for extent ", extent, " (view extents ", format_extents(extents), ")");
    }
    return {static_cast<std::size_t>(s), 0, false};
  }
}

}  // namespace detail

template <class T, class E, class L, class A, detail::slice_spec... S>
requires(sizeof...(S) == E::rank()) auto subview(const tensor_view<T, E, L, A>& view, S... slices) {
  using index_type = typename E::index_type;
  constexpr std::size_t rank = E::rank();
  constexpr std::size_t out_rank = detail::kept_rank<S...>;
  using out_extents = dextents<out_rank, index_type>;

  std::array<detail::slice_bounds, rank> bounds{};
  {
    std::size_t dim = 0;
    ((bounds[dim] = detail::resolve_slice(slices, view.extents(), dim), ++dim), ...);
  }

  std::array<index_type, out_rank> out_ext{};
  std::array<index_type, out_rank> out_stride{};
  std::size_t offset = 0;
  bool empty = false;
  for (std::size_t r = 0, k = 0; r < rank; ++r) {
    offset += bounds[r].first * static_cast<std::size_t>(view.stride(r));
    if (bounds[r].kept && k < out_rank) {  // k < out_rank always; said for -Warray-bounds
      out_ext[k] = static_cast<index_type>(bounds[r].extent);
      out_stride[k] = view.stride(r);
      empty = empty || bounds[r].extent == 0;
      ++k;
    }
  }
  // An empty result may start past the end of the data: do not move the pointer there.
  if (empty) offset = 0;

  const auto ptr = view.accessor().offset(view.data_handle(), offset);
  using accessor = typename A::offset_policy;
  if constexpr (std::same_as<L, layout_right> && detail::keeps_layout_right<S...>()) {
    using result = tensor_view<T, out_extents, layout_right, accessor>;
    return result(ptr, typename result::mapping_type(out_extents(out_ext)),
                  accessor(view.accessor()));
  } else {
    using result = tensor_view<T, out_extents, layout_stride, accessor>;
    return result(ptr, typename result::mapping_type(out_extents(out_ext), out_stride),
                  accessor(view.accessor()));
  }
}

namespace detail {
template <class V, std::size_t... I>
auto row_impl(const V& view, std::size_t i, std::index_sequence<I...>) {
  return subview(view, i, ((void)I, all)...);
}
template <class V, std::size_t... I>
auto rows_impl(const V& view, range r, std::index_sequence<I...>) {
  return subview(view, r, ((void)I, all)...);
}
}  // namespace detail

// view(i, ...): drops the leading dimension.
template <class T, class E, class L, class A>
requires(E::rank() >= 1) auto row(const tensor_view<T, E, L, A>& view, std::size_t i) {
  return detail::row_impl(view, i, std::make_index_sequence<E::rank() - 1>());
}

// view(begin..end, ...): keeps the rank.
template <class T, class E, class L, class A>
requires(E::rank() >= 1) auto rows(const tensor_view<T, E, L, A>& view, std::size_t begin,
                                   std::size_t end) {
  return detail::rows_impl(view, range{begin, end}, std::make_index_sequence<E::rank() - 1>());
}

}  // namespace npullm
