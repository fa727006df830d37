// The Level Zero runtime of a process, and the choice of an NPU.
//
// zeInit may run once per process: a failed zeInit cannot be retried, and after a zeInit that
// a driver rejected, further loader calls can crash. runtime::get() calls it once, remembers
// the result, and makes no loader call after a failure: every later get() throws the same
// error. select_npu() walks the drivers' devices and picks a VPU (what an Intel NPU reports)
// by ordinal among the NPUs found or by UUID.
//
//   const auto& rt = level_zero::runtime::get();        // throws error(backend) without a driver
//   level_zero::npu_device npu = level_zero::select_npu(rt, {});   // the first NPU
#pragma once

#include <level_zero/ze_api.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class runtime {
 public:
  // The process's runtime; zeInit runs on the first call only. Throws error(backend) when
  // initialization failed (now or on the first call) or no driver is present.
  static const runtime& get() {
    static const state s = initialize();
    if (!s.error.empty()) raise(error_code::backend, s.error);
    static const runtime rt(s.drivers);
    return rt;
  }

  [[nodiscard]] const std::vector<ze_driver_handle_t>& drivers() const noexcept { return drivers_; }

 private:
  struct state {
    std::vector<ze_driver_handle_t> drivers;
    std::string error;
  };
  static state initialize() {
    state s;
    const ze_result_t r = zeInit(0);
    if (r != ZE_RESULT_SUCCESS) {
      s.error = "no Level Zero driver found: zeInit returned " + result_name(r) +
                " (set ZE_ENABLE_ALT_DRIVERS to a driver's absolute path to name one)";
      return s;
    }
    std::uint32_t n = 0;
    if (const ze_result_t g = zeDriverGet(&n, nullptr); g != ZE_RESULT_SUCCESS || n == 0) {
      s.error = "no Level Zero driver found: zeDriverGet reported " + std::to_string(n) +
                " drivers (" + result_name(g) + ")";
      return s;
    }
    s.drivers.resize(n);
    if (const ze_result_t g = zeDriverGet(&n, s.drivers.data()); g != ZE_RESULT_SUCCESS) {
      s.error = "zeDriverGet failed: " + result_name(g);
      s.drivers.clear();
    }
    s.drivers.resize(n);
    return s;
  }
  explicit runtime(std::vector<ze_driver_handle_t> d) : drivers_(std::move(d)) {}

  std::vector<ze_driver_handle_t> drivers_;
};

using device_uuid = std::array<std::uint8_t, ZE_MAX_DEVICE_UUID_SIZE>;

// Which NPU: the ordinal-th among the NPUs found, or the one with this UUID.
struct device_selector {
  std::uint32_t ordinal = 0;
  std::optional<device_uuid> uuid;
};

struct npu_device {
  ze_driver_handle_t driver = nullptr;
  ze_device_handle_t device = nullptr;
  ze_device_properties_t properties{};
  [[nodiscard]] device_uuid uuid() const {
    device_uuid u{};
    for (std::size_t i = 0; i < u.size(); ++i) u[i] = properties.uuid.id[i];
    return u;
  }
};

inline const char* device_type_name(ze_device_type_t t) {
  switch (t) {
    case ZE_DEVICE_TYPE_GPU: return "gpu";
    case ZE_DEVICE_TYPE_CPU: return "cpu";
    case ZE_DEVICE_TYPE_FPGA: return "fpga";
    case ZE_DEVICE_TYPE_MCA: return "mca";
    case ZE_DEVICE_TYPE_VPU: return "npu";
    default: return "unknown";
  }
}

// The selected NPU. Throws error(backend) "no NPU among N devices [gpu, ...]" when none
// matches.
inline npu_device select_npu(const runtime& rt, const device_selector& sel) {
  std::vector<npu_device> npus;
  std::vector<std::string> seen;
  for (ze_driver_handle_t drv : rt.drivers()) {
    std::uint32_t n = 0;
    check("zeDeviceGet", zeDeviceGet(drv, &n, nullptr));
    std::vector<ze_device_handle_t> devices(n);
    check("zeDeviceGet", zeDeviceGet(drv, &n, devices.data()));
    for (std::uint32_t i = 0; i < n; ++i) {
      npu_device d{drv, devices[i], {}};
      d.properties.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
      check("zeDeviceGetProperties", zeDeviceGetProperties(devices[i], &d.properties));
      seen.emplace_back(device_type_name(d.properties.type));
      if (d.properties.type == ZE_DEVICE_TYPE_VPU) npus.push_back(d);
    }
  }
  if (npus.empty()) {
    raise(error_code::backend, "no NPU among ", seen.size(), " devices",
          seen.empty() ? std::string() : " " + npullm::detail::format_list(seen));
  }
  if (sel.uuid) {
    for (const auto& d : npus)
      if (d.uuid() == *sel.uuid) return d;
    raise(error_code::backend, "no NPU with the requested UUID among ", npus.size(), " NPUs");
  }
  if (sel.ordinal >= npus.size()) {
    raise(error_code::backend, "NPU ordinal ", sel.ordinal, " requested, ", npus.size(),
          " NPUs present");
  }
  return npus[sel.ordinal];
}

}  // namespace npullm::npu::level_zero
