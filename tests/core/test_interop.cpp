// Eigen and xtensor see the same memory as npullm views: pointer identity and round trips.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "npullm/core/interop.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"

namespace {

using npullm::all;
using npullm::range;

TEST(Eigen, MapOfDenseView) {
  npullm::tensor<float, 2> t(3, 4);
  std::iota(t.data(), t.data() + t.size(), 0.0f);
  auto m = npullm::to_eigen(t.view());
  EXPECT_EQ(m.data(), t.data());
  EXPECT_EQ(m.rows(), 3);
  EXPECT_EQ(m.cols(), 4);
  EXPECT_EQ(m(2, 1), 9.0f);
  m(0, 3) = -1.0f;  // writes land in the tensor
  EXPECT_EQ(t.view()(0, 3), -1.0f);
}

TEST(Eigen, MapOfStridedSubview) {
  npullm::tensor<float, 2> t(5, 6);
  std::iota(t.data(), t.data() + t.size(), 0.0f);
  auto s = npullm::subview(t.view(), range{1, 4}, range{2, 5});  // [3, 3]
  auto m = npullm::to_eigen(s);
  EXPECT_EQ(m.data(), &t.view()(1, 2));
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(m(i, j), s(i, j));
  }
  auto col = npullm::subview(t.view(), all, 1);  // [5], stride 6
  auto v = npullm::to_eigen(col);
  EXPECT_EQ(v.data(), t.data() + 1);
  EXPECT_EQ(v.sum(), 1 + 7 + 13 + 19 + 25);
}

TEST(Eigen, GemmOnViews) {
  npullm::tensor<float, 2> a(2, 3), b(3, 2), c(2, 2);
  std::iota(a.data(), a.data() + 6, 1.0f);
  std::iota(b.data(), b.data() + 6, 1.0f);
  npullm::to_eigen(c.view()).noalias() = npullm::to_eigen(a.view()) * npullm::to_eigen(b.view());
  // [1 2 3; 4 5 6] * [1 2; 3 4; 5 6] = [22 28; 49 64]
  EXPECT_EQ(c.view()(0, 0), 22.0f);
  EXPECT_EQ(c.view()(1, 1), 64.0f);
}

TEST(Eigen, ViewOfMatrix) {
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rm(2, 3);
  Eigen::MatrixXf cm(2, 3);  // column-major
  rm << 1, 2, 3, 4, 5, 6;
  cm << 1, 2, 3, 4, 5, 6;
  auto rv = npullm::view_of(rm);
  auto cv = npullm::view_of(cm);
  EXPECT_EQ(rv.data_handle(), rm.data());
  EXPECT_EQ(cv.data_handle(), cm.data());
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(rv(i, j), rm(i, j));
      EXPECT_EQ(cv(i, j), cm(i, j));
    }
  }
  cv(1, 2) = 9.0f;
  EXPECT_EQ(cm(1, 2), 9.0f);
  // Round trip: view -> Eigen -> same memory.
  EXPECT_EQ(npullm::to_eigen(cv).data(), cm.data());
  EXPECT_EQ(npullm::to_eigen(cv)(1, 0), 4.0f);
}

TEST(Xtensor, AdaptOfView) {
  npullm::tensor<float, 3> t(2, 3, 4);
  std::iota(t.data(), t.data() + t.size(), 0.0f);
  auto x = npullm::to_xtensor(t.view());
  EXPECT_EQ(x.data(), t.data());
  EXPECT_EQ(x(1, 2, 3), 23.0f);
  x(0, 0, 0) = 42.0f;
  EXPECT_EQ(t.data()[0], 42.0f);

  auto s = npullm::subview(t.view(), all, range{1, 3}, 2);  // [2, 2], strided
  auto xs = npullm::to_xtensor(s);
  EXPECT_EQ(xs.data() + xs.data_offset(), &t.view()(0, 1, 2));
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t j = 0; j < 2; ++j) EXPECT_EQ(xs(i, j), s(i, j));
  }
}

TEST(Xtensor, ViewOfContainer) {
  xt::xtensor<float, 2> a = {{1, 2, 3}, {4, 5, 6}};
  auto v = npullm::view_of(a);
  EXPECT_EQ(v.data_handle(), a.data());
  EXPECT_EQ(v(1, 2), 6.0f);
  v(0, 1) = -2.0f;
  EXPECT_EQ(a(0, 1), -2.0f);
  // Round trip: xtensor -> view -> xtensor adaptor over the same memory.
  auto back = npullm::to_xtensor(v);
  EXPECT_EQ(back.data(), a.data());
  EXPECT_EQ(back(1, 0), 4.0f);

  xt::xarray<float> dyn = {{1, 2}, {3, 4}};
  auto dv = npullm::view_of<2>(dyn);
  EXPECT_EQ(dv(1, 1), 4.0f);
  EXPECT_THROW((void)npullm::view_of<3>(dyn), npullm::error);
}

}  // namespace
