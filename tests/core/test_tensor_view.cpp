#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "npullm/core/tensor_view.hpp"

namespace {

using npullm::dextents;
using npullm::dynamic_extent;
using npullm::extents;
using npullm::layout_right;
using npullm::layout_stride;
using npullm::tensor_view;

// Stateless policies add no size: a fully static view is one pointer.
static_assert(sizeof(tensor_view<float, extents<std::size_t, 4, 8>>) == sizeof(float*));
static_assert(sizeof(tensor_view<float, extents<std::size_t, 4, dynamic_extent>>) ==
              sizeof(float*) + sizeof(std::size_t));
static_assert(sizeof(npullm::dense_view<float, 3>) == sizeof(float*) + 3 * sizeof(std::size_t));
static_assert(sizeof(npullm::float_view<npullm::float16, 2>) ==
              sizeof(void*) + 2 * sizeof(std::size_t));
static_assert(std::is_trivially_copyable_v<npullm::dense_view<float, 2>>);
static_assert(std::is_trivially_copyable_v<npullm::strided_view<float, 2>>);
static_assert(extents<std::size_t, 2, dynamic_extent, 3>::rank() == 3);
static_assert(extents<std::size_t, 2, dynamic_extent, 3>::rank_dynamic() == 1);
static_assert(std::is_empty_v<extents<int, 2, 3>>);
static_assert(std::is_empty_v<layout_right::mapping<extents<int, 2, 3>>>);

std::vector<float> iota(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

TEST(Extents, StaticAndDynamic) {
  const extents<std::size_t, 2, dynamic_extent, 3> e(5);
  EXPECT_EQ(e.extent(0), 2u);
  EXPECT_EQ(e.extent(1), 5u);
  EXPECT_EQ(e.extent(2), 3u);
  const extents<std::size_t, 2, dynamic_extent, 3> all_given(2, 5, 3);
  EXPECT_EQ(e, all_given);
  EXPECT_EQ(dextents<2>(4, 6).extent(1), 6u);
}

TEST(Extents, StaticMismatchThrowsInvalidShape) {
  using E = extents<std::size_t, 2, dynamic_extent>;
  try {
    E e(3, 4);
    FAIL() << "expected npullm::error";
  } catch (const npullm::error& err) {
    EXPECT_EQ(err.code(), npullm::error_code::invalid_shape);
    EXPECT_NE(std::string(err.what()).find("static extent is 2"), std::string::npos);
  }
  EXPECT_THROW((dextents<1, int>(-1)), npullm::error);
}

TEST(TensorView, LayoutRightIsRowMajor) {
  auto data = iota(24);
  tensor_view v(data.data(), 2, 3, 4);  // CTAD: dextents<3>
  static_assert(std::is_same_v<decltype(v), npullm::dense_view<float, 3>>);
  EXPECT_EQ(v.rank(), 3u);
  EXPECT_EQ(v.size(), 24u);
  EXPECT_EQ(v(1, 2, 3), 23.0f);
  EXPECT_EQ(v(1, 0, 2), 14.0f);
  EXPECT_EQ(v.stride(0), 12u);
  EXPECT_EQ(v.stride(1), 4u);
  EXPECT_EQ(v.stride(2), 1u);
  EXPECT_EQ((v[{1, 1, 1}]), 17.0f);
  EXPECT_TRUE(v.is_exhaustive());
  v(0, 0, 1) = -1.0f;  // writes through
  EXPECT_EQ(data[1], -1.0f);
}

TEST(TensorView, StaticExtentsView) {
  auto data = iota(32);
  tensor_view<float, extents<std::size_t, 4, 8>> v(data.data());
  EXPECT_EQ(v(3, 7), 31.0f);
  EXPECT_EQ(v.extent(0), 4u);
  npullm::dense_view<const float, 2> dynamic = v;  // static -> dynamic, T -> const T
  EXPECT_EQ(dynamic(2, 5), 21.0f);
  EXPECT_EQ(dynamic.data_handle(), data.data());
}

TEST(TensorView, LayoutStride) {
  auto data = iota(100);
  // A [3, 4] view reading every other column of a [3, 10] matrix, starting at column 1.
  using V = npullm::strided_view<float, 2>;
  V v(data.data() + 1, V::mapping_type(dextents<2>(3, 4), {10, 2}));
  EXPECT_EQ(v(0, 0), 1.0f);
  EXPECT_EQ(v(2, 3), 27.0f);
  EXPECT_FALSE(v.is_exhaustive());
  EXPECT_EQ(v.mapping().required_span_size(), 2 * 10 + 3 * 2 + 1u);
  // layout_right converts to layout_stride.
  tensor_view dense(data.data(), 5, 20);
  V as_strided = dense;
  EXPECT_EQ(as_strided(4, 19), 99.0f);
  EXPECT_TRUE(as_strided.is_exhaustive());
}

TEST(TensorView, AtChecksBounds) {
  auto data = iota(6);
  tensor_view v(data.data(), 2, 3);
  EXPECT_EQ(v.at(1, 2), 5.0f);
  try {
    (void)v.at(2, 0);
    FAIL() << "expected npullm::error";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::out_of_range);
    EXPECT_NE(std::string(e.what()).find("[2, 0]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
}

TEST(TensorView, ConvertingAccessorReadsHalfStorageAsFloat) {
  std::vector<npullm::float16> h;
  std::vector<npullm::bfloat16> b;
  for (int i = 0; i < 12; ++i) {
    h.emplace_back(0.25f * static_cast<float>(i));
    b.emplace_back(-0.5f * static_cast<float>(i));
  }
  npullm::float_view<npullm::float16, 2> hv(h.data(), 3, 4);
  npullm::float_view<npullm::bfloat16, 2> bv(b.data(), 3, 4);
  static_assert(std::is_same_v<decltype(hv(0, 0)), float>);
  EXPECT_EQ(hv(2, 3), 2.75f);
  EXPECT_EQ(bv(1, 1), -2.5f);
  EXPECT_EQ(hv.data_handle(), h.data());
}

TEST(TensorView, DefaultIsEmpty) {
  npullm::dense_view<float, 2> v;
  EXPECT_EQ(v.data_handle(), nullptr);
  EXPECT_TRUE(v.empty());
}

}  // namespace
