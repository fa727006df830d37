// npullm demo: what the foundation gives an engine today. Views over owned storage, zero-copy
// region-of-interest slicing, Eigen/xtensor seeing the same memory, f16/bf16 storage read as
// float, and this machine's measured limits (the yardstick of every benchmark).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include "machine_limits.hpp"
#include "npullm/npullm.hpp"

int main() {
  std::puts("npullm demo\n");

  // A [layers=2, kv_heads=2, tokens=8, head_dim=4] buffer, like a small KV cache.
  npullm::tensor<float, 4> kv(2, 2, 8, 4);
  std::iota(kv.data(), kv.data() + kv.size(), 0.0f);
  auto v = kv.view();

  // Tokens 3..5 of layer 1, head 0: a [3, 4] view into the same memory.
  auto roi = npullm::subview(v, 1, 0, npullm::range{3, 6}, npullm::all);
  std::printf("region of interest: [%zu, %zu], first element %.0f at offset %td (no copy)\n",
              roi.extent(0), roi.extent(1), roi(0, 0), roi.data_handle() - kv.data());
  roi(0, 0) = -1.0f;
  std::printf("written through the view, seen in the tensor: %.0f\n", v(1, 0, 3, 0));

  // Eigen sees the same memory: a GEMV on the region, no copy.
  auto m = npullm::to_eigen(roi);
  Eigen::Vector4f x(1, 0, 0, 1);
  const Eigen::Vector3f y = m * x;
  std::printf("Eigen::Map over the view (same pointer: %s): y = [%.0f, %.0f, %.0f]\n",
              m.data() == roi.data_handle() ? "yes" : "no", y(0), y(1), y(2));
  auto xt = npullm::to_xtensor(roi);
  std::printf("xtensor adaptor over the view: sum = %.0f\n", static_cast<float>(xt::sum(xt)()));

  // bf16 storage read as float through a converting accessor.
  npullm::tensor<npullm::bfloat16, 1> half(4);
  for (std::size_t i = 0; i < 4; ++i)
    half.data()[i] = npullm::bfloat16(0.1f * static_cast<float>(i + 1));
  npullm::float_view<npullm::bfloat16, 1> hv(half.data(), 4);
  std::printf("bf16 storage read as float: %.6f %.6f %.6f %.6f\n\n", hv(0), hv(1), hv(2), hv(3));

  // Bad input is a clear error, not a crash.
  try {
    (void)npullm::rows(v, 1, 3);
  } catch (const npullm::error& e) {
    std::printf("bad slice -> %s\n\n", e.what());
  }

  std::puts("this machine's limits (measured now; benchmarks report % of these):");
  std::printf("%8s %12s %12s %14s %14s\n", "threads", "read GB/s", "triad GB/s", "fp32 FMA GF/s",
              "bf16 dot GF/s");
  const std::size_t all = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t threads = 1; threads <= all; threads = threads == all ? all + 1 : all) {
    const auto lim = npullm::bench::measure_machine_limits(threads, 3);
    std::printf("%8zu %12.1f %12.1f %14.1f %14.1f\n", lim.threads, lim.read_gbps, lim.triad_gbps,
                lim.fma_gflops, lim.bf16_gflops);
  }
  return 0;
}
