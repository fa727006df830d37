// level_zero::command_queue: owns one ze_command_queue_handle_t (synchronous mode off: the
// caller waits on a fence).
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <utility>

#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class command_queue {
 public:
  command_queue() = default;
  command_queue(ze_context_handle_t ctx, ze_device_handle_t dev, std::uint32_t ordinal = 0) {
    ze_command_queue_desc_t desc{ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                 nullptr,
                                 ordinal,
                                 0,
                                 0,
                                 ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                 ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    check("zeCommandQueueCreate", zeCommandQueueCreate(ctx, dev, &desc, &handle_));
  }
  command_queue(command_queue&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  command_queue& operator=(command_queue&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  command_queue(const command_queue&) = delete;
  command_queue& operator=(const command_queue&) = delete;
  ~command_queue() { reset(); }

  // Submits closed lists; the fence is signalled when they complete.
  void execute(std::uint32_t n, ze_command_list_handle_t* lists, ze_fence_handle_t fence) {
    check("zeCommandQueueExecuteCommandLists",
          zeCommandQueueExecuteCommandLists(handle_, n, lists, fence));
  }

  [[nodiscard]] ze_command_queue_handle_t get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_) zeCommandQueueDestroy(handle_);
    handle_ = nullptr;
  }
  ze_command_queue_handle_t handle_ = nullptr;
};

}  // namespace npullm::npu::level_zero
