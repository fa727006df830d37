// Zero-copy slicing: pointer identity, writes through the slice, layouts kept, bounds errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "npullm/core/slice.hpp"

// Counts this binary's heap allocations, so a test can show that a successful slice makes none
// (no error message is formatted unless the slice fails).
namespace {
std::atomic<std::size_t> allocations{0};
}  // namespace

__attribute__((noinline)) void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using npullm::all;
using npullm::range;
using npullm::tensor_view;

std::vector<float> iota(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

TEST(Subview, RangeAllIndexIsZeroCopy) {
  auto data = iota(2 * 5 * 6);
  tensor_view v(data.data(), 2, 5, 6);                       // [2, 5, 6]
  auto s = npullm::subview(v, 1, range{1, 4}, range{2, 5});  // [3, 3]
  static_assert(decltype(s)::rank() == 2);
  EXPECT_EQ(s.extent(0), 3u);
  EXPECT_EQ(s.extent(1), 3u);
  EXPECT_EQ(s.data_handle(), &v(1, 1, 2));  // pointer identity: no copy
  EXPECT_EQ(s.stride(0), 6u);
  EXPECT_EQ(s.stride(1), 1u);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) EXPECT_EQ(&s(i, j), &v(1, 1 + i, 2 + j));
  }
  s(2, 2) = -7.0f;  // writes land in the parent
  EXPECT_EQ(v(1, 3, 4), -7.0f);
}

TEST(Subview, KeepsLayoutRightWhenContiguous) {
  auto data = iota(4 * 3 * 2);
  tensor_view v(data.data(), 4, 3, 2);
  using right = npullm::layout_right;
  using stride = npullm::layout_stride;
  static_assert(std::is_same_v<decltype(npullm::subview(v, 1, all, all))::layout_type, right>);
  static_assert(
      std::is_same_v<decltype(npullm::subview(v, range{1, 3}, all, all))::layout_type, right>);
  static_assert(
      std::is_same_v<decltype(npullm::subview(v, 1, range{0, 2}, all))::layout_type, right>);
  static_assert(
      std::is_same_v<decltype(npullm::subview(v, 1, 2, range{0, 1}))::layout_type, right>);
  static_assert(std::is_same_v<decltype(npullm::subview(v, all, 1, all))::layout_type, stride>);
  static_assert(
      std::is_same_v<decltype(npullm::subview(v, range{0, 2}, range{0, 2}, all))::layout_type,
                     stride>);
  auto r = npullm::rows(v, 1, 3);  // [2, 3, 2]
  EXPECT_EQ(r.data_handle(), data.data() + 6);
  EXPECT_EQ(r(1, 2, 1), v(2, 2, 1));
}

TEST(Subview, RowAndRows) {
  auto data = iota(12);
  tensor_view v(data.data(), 3, 4);
  auto r = npullm::row(v, 2);  // [4]
  static_assert(decltype(r)::rank() == 1);
  EXPECT_EQ(r.data_handle(), data.data() + 8);
  EXPECT_EQ(r(3), 11.0f);
  auto rs = npullm::rows(v, 0, 2);  // [2, 4]
  EXPECT_EQ(rs.extent(0), 2u);
  EXPECT_EQ(rs.data_handle(), data.data());
  auto scalar = npullm::row(r, 1);  // rank 0
  EXPECT_EQ(scalar(), 9.0f);
}

TEST(Subview, OfAStridedView) {
  auto data = iota(4 * 6);
  tensor_view v(data.data(), 4, 6);
  auto col = npullm::subview(v, all, 3);  // [4], stride 6
  EXPECT_EQ(col.stride(0), 6u);
  auto part = npullm::subview(col, range{1, 3});  // [2]
  EXPECT_EQ(part.data_handle(), &v(1, 3));
  EXPECT_EQ(part(1), v(2, 3));
}

TEST(Subview, OfAConvertingView) {
  std::vector<npullm::bfloat16> b;
  for (int i = 0; i < 12; ++i) b.emplace_back(static_cast<float>(i));
  npullm::float_view<npullm::bfloat16, 2> v(b.data(), 3, 4);
  auto r = npullm::row(v, 1);
  EXPECT_EQ(r.data_handle(), b.data() + 4);
  EXPECT_EQ(r(2), 6.0f);
}

TEST(Subview, EmptyRangesAreValid) {
  auto data = iota(12);
  tensor_view v(data.data(), 3, 4);
  auto e = npullm::subview(v, range{3, 3}, range{4, 4});
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.data_handle(), data.data());  // never moved past the end
  EXPECT_TRUE(npullm::rows(v, 1, 1).empty());
}

void expect_out_of_range(auto&& fn, const std::string& fragment) {
  try {
    fn();
    FAIL() << "expected npullm::error";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::out_of_range);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// Slicing sits on hot paths (a KV slot per token and layer): it must not build the error
// message, or allocate at all, when the slice is in range.
TEST(Subview, InRangeSliceAllocatesNothing) {
  auto data = iota(2 * 5 * 6);
  // Extents whose text ("[100000, 5, 600000]") is too long for a short-string buffer: formatting
  // it would allocate. Only slices at offset 0 are taken, so the pointer stays inside `data`.
  tensor_view v(data.data(), 100000, 5, 600000);
  const std::size_t before = allocations.load();
  float sum = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    sum += npullm::subview(v, all, 0, all).extent(1);
    sum += npullm::subview(v, range{0, 1}, range{0, i}, all).extent(0);
    sum += npullm::row(v, 0).extent(1);
  }
  EXPECT_EQ(allocations.load(), before);
  EXPECT_GT(sum, 0.0f);
  EXPECT_THROW((void)npullm::subview(v, all, 5, all), npullm::error);
  EXPECT_GT(allocations.load(), before);  // the failing branch does format
}

TEST(Subview, OutOfRangeNamesExtentAndRequest) {
  auto data = iota(12);
  tensor_view v(data.data(), 3, 4);
  expect_out_of_range(
      [&] {
        (void)npullm::subview(v, range{1, 5}, all);
      },
      "dimension 0 range [1, 5) out of range for extent 3 (view extents [3, 4])");
  expect_out_of_range([&] { (void)npullm::subview(v, all, 4); },
                      "dimension 1 index 4 out of range for extent 4");
  expect_out_of_range([&] { (void)npullm::subview(v, range{2, 1}, all); }, "range [2, 1)");
  expect_out_of_range([&] { (void)npullm::row(v, 3); }, "index 3");
  expect_out_of_range([&] { (void)npullm::rows(v, 0, 4); }, "range [0, 4)");
  expect_out_of_range([&] { (void)npullm::subview(v, -1, all); }, "index -1");
}

}  // namespace
