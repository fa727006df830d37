// level_zero::fence: owns one ze_fence_handle_t of a queue; wait() blocks until the submitted
// work is done and resets the fence for the next submission.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class fence {
 public:
  fence() = default;
  explicit fence(ze_command_queue_handle_t queue) {
    ze_fence_desc_t desc{ZE_STRUCTURE_TYPE_FENCE_DESC, nullptr, 0};
    check("zeFenceCreate", zeFenceCreate(queue, &desc, &handle_));
  }
  fence(fence&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  fence& operator=(fence&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  fence(const fence&) = delete;
  fence& operator=(const fence&) = delete;
  ~fence() { reset(); }

  // Waits for the signal (no timeout), then resets.
  void wait() {
    check("zeFenceHostSynchronize",
          zeFenceHostSynchronize(handle_, std::numeric_limits<std::uint64_t>::max()));
    check("zeFenceReset", zeFenceReset(handle_));
  }
  [[nodiscard]] ze_fence_handle_t get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_) zeFenceDestroy(handle_);
    handle_ = nullptr;
  }
  ze_fence_handle_t handle_ = nullptr;
};

}  // namespace npullm::npu::level_zero
