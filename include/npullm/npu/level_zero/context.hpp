// level_zero::context: owns one ze_context_handle_t of a driver.
#pragma once

#include <level_zero/ze_api.h>

#include <utility>

#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class context {
 public:
  context() = default;
  explicit context(ze_driver_handle_t driver) {
    ze_context_desc_t desc{ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
    check("zeContextCreate", zeContextCreate(driver, &desc, &handle_));
  }
  context(context&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  context& operator=(context&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() { reset(); }

  [[nodiscard]] ze_context_handle_t get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_) zeContextDestroy(handle_);
    handle_ = nullptr;
  }
  ze_context_handle_t handle_ = nullptr;
};

}  // namespace npullm::npu::level_zero
