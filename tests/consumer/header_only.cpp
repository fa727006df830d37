// Built against an installed npullm without npullm::kernels: the umbrella header compiles on
// its own in a user's project, and a view, a slice and Eigen interop work.
#include <npullm/npullm.hpp>

#include <cstdio>

int main() {
  npullm::tensor<float, 2> t(3, 4);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);
  const auto r = npullm::row(t.view(), 2);  // [4]
  const float sum = npullm::to_eigen(r).sum();
  if (r.data_handle() != t.data() + 8 || sum != 8 + 9 + 10 + 11) {
    std::puts("npullm header-only consumer: wrong result");
    return 1;
  }
  std::puts("npullm header-only consumer: ok");
  return 0;
}
