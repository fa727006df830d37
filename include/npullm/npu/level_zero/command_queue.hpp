// level_zero::command_queue: owns one ze_command_queue_handle_t (asynchronous mode: the caller
// waits on a fence).
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>

#include "npullm/npu/level_zero/handle.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class command_queue : public unique_handle<ze_command_queue_handle_t, zeCommandQueueDestroy> {
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
    check("zeCommandQueueCreate", zeCommandQueueCreate(ctx, dev, &desc, out()));
  }

  // Submits closed lists; the fence is signalled when they complete.
  void execute(std::uint32_t n, ze_command_list_handle_t* lists, ze_fence_handle_t fence) {
    check("zeCommandQueueExecuteCommandLists",
          zeCommandQueueExecuteCommandLists(get(), n, lists, fence));
  }
};

}  // namespace npullm::npu::level_zero
