// Zero-copy interop with Eigen and xtensor: each side sees the same memory.
//
//   to_eigen(v)        rank-1 or rank-2 view -> Eigen::Map (with the view's strides)
//   to_xtensor(v)      any-rank view -> xt::adapt adaptor (with the view's strides)
//   view_of(m)         Eigen dense matrix / xtensor container -> strided tensor_view
// Only default_accessor views convert (a converting f16/bf16 view has no float storage).
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include <Eigen/Core>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "npullm/core/tensor_view.hpp"

namespace npullm {

namespace detail {
template <class A>
inline constexpr bool is_default_accessor_v = false;
template <class T>
inline constexpr bool is_default_accessor_v<default_accessor<T>> = true;
}  // namespace detail

// [rows, cols] view -> row-major Eigen::Map with outer stride = stride(0), inner = stride(1).
template <class T, class E, class L, class A>
requires(E::rank() == 2 &&
         detail::is_default_accessor_v<A>) auto to_eigen(const tensor_view<T, E, L, A>& v) {
  using scalar = std::remove_const_t<T>;
  using matrix = Eigen::Matrix<scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using map_matrix = std::conditional_t<std::is_const_v<T>, const matrix, matrix>;
  using stride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  return Eigen::Map<map_matrix, Eigen::Unaligned, stride>(
      v.data_handle(), static_cast<Eigen::Index>(v.extent(0)),
      static_cast<Eigen::Index>(v.extent(1)),
      stride(static_cast<Eigen::Index>(v.stride(0)), static_cast<Eigen::Index>(v.stride(1))));
}

// [n] view -> Eigen column vector Map with the view's stride.
template <class T, class E, class L, class A>
requires(E::rank() == 1 &&
         detail::is_default_accessor_v<A>) auto to_eigen(const tensor_view<T, E, L, A>& v) {
  using scalar = std::remove_const_t<T>;
  using vector = Eigen::Matrix<scalar, Eigen::Dynamic, 1>;
  using map_vector = std::conditional_t<std::is_const_v<T>, const vector, vector>;
  using stride = Eigen::InnerStride<Eigen::Dynamic>;
  return Eigen::Map<map_vector, Eigen::Unaligned, stride>(
      v.data_handle(), static_cast<Eigen::Index>(v.extent(0)),
      stride(static_cast<Eigen::Index>(v.stride(0))));
}

// Any-rank view -> xtensor adaptor (no ownership) with the view's shape and strides.
template <class T, class E, class L, class A>
requires(detail::is_default_accessor_v<A>) auto to_xtensor(const tensor_view<T, E, L, A>& v) {
  constexpr std::size_t rank = E::rank();
  std::array<std::size_t, rank> shape{};
  std::array<std::ptrdiff_t, rank> strides{};
  for (std::size_t r = 0; r < rank; ++r) {
    shape[r] = static_cast<std::size_t>(v.extent(r));
    strides[r] = static_cast<std::ptrdiff_t>(v.stride(r));
  }
  // xtensor wants the element count (not the span): it addresses elements through the strides.
  return xt::adapt(v.data_handle(), static_cast<std::size_t>(v.size()), xt::no_ownership(), shape,
                   strides);
}

// Eigen dense matrix (either storage order) -> [rows, cols] strided view of its memory.
template <class Derived>
requires std::is_base_of_v<Eigen::PlainObjectBase<std::remove_const_t<Derived>>,
                           std::remove_const_t<Derived>>
auto view_of(Derived& m) {
  using scalar = std::conditional_t<std::is_const_v<Derived>,
                                    const typename std::remove_const_t<Derived>::Scalar,
                                    typename std::remove_const_t<Derived>::Scalar>;
  using view = strided_view<scalar, 2>;
  const auto rows = static_cast<std::size_t>(m.rows());
  const auto cols = static_cast<std::size_t>(m.cols());
  const std::array<std::size_t, 2> strides =
      std::remove_const_t<Derived>::IsRowMajor
          ? std::array<std::size_t, 2>{static_cast<std::size_t>(m.outerStride()), 1}
          : std::array<std::size_t, 2>{1, static_cast<std::size_t>(m.outerStride())};
  return view(m.data(), typename view::mapping_type(dextents<2>(rows, cols), strides));
}

// xtensor container (xt::xtensor<T, N> or xt::xarray<T> with a static rank given) ->
// strided view of its memory.
template <std::size_t Rank, class Container>
auto view_of(Container& c) {
  using scalar = std::conditional_t<std::is_const_v<Container>,
                                    const typename std::remove_const_t<Container>::value_type,
                                    typename std::remove_const_t<Container>::value_type>;
  using view = strided_view<scalar, Rank>;
  if (c.dimension() != Rank) {
    raise(error_code::invalid_shape, "view_of: container has rank ", c.dimension(),
          ", the view asks for rank ", Rank);
  }
  std::array<std::size_t, Rank> shape{};
  std::array<std::size_t, Rank> strides{};
  for (std::size_t r = 0; r < Rank; ++r) {
    shape[r] = c.shape()[r];
    if (c.strides()[r] < 0) {
      raise(error_code::unsupported, "view_of: negative stride ", c.strides()[r], " in dimension ",
            r);
    }
    // xtensor reports stride 0 for extents of 1; any stride is valid there.
    strides[r] = static_cast<std::size_t>(c.strides()[r]);
  }
  return view(c.data(), typename view::mapping_type(dextents<Rank>(shape), strides));
}

template <class T, std::size_t N, xt::layout_type L>
auto view_of(xt::xtensor<T, N, L>& c) {
  return view_of<N>(c);
}
template <class T, std::size_t N, xt::layout_type L>
auto view_of(const xt::xtensor<T, N, L>& c) {
  return view_of<N>(c);
}

}  // namespace npullm
