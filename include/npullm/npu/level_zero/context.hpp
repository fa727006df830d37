// level_zero::context: owns one ze_context_handle_t of a driver.
#pragma once

#include <level_zero/ze_api.h>

#include "npullm/npu/level_zero/handle.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class context : public unique_handle<ze_context_handle_t, zeContextDestroy> {
 public:
  context() = default;
  explicit context(ze_driver_handle_t driver) {
    ze_context_desc_t desc{ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
    check("zeContextCreate", zeContextCreate(driver, &desc, out()));
  }
};

}  // namespace npullm::npu::level_zero
