// level_zero::fence: owns one ze_fence_handle_t of a queue; wait() blocks until the submitted
// work is done and resets the fence for the next submission.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <limits>

#include "npullm/npu/level_zero/handle.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class fence : public unique_handle<ze_fence_handle_t, zeFenceDestroy> {
 public:
  fence() = default;
  explicit fence(ze_command_queue_handle_t queue) {
    ze_fence_desc_t desc{ZE_STRUCTURE_TYPE_FENCE_DESC, nullptr, 0};
    check("zeFenceCreate", zeFenceCreate(queue, &desc, out()));
  }

  // Waits for the signal (no timeout), then resets.
  void wait() {
    check("zeFenceHostSynchronize",
          zeFenceHostSynchronize(get(), std::numeric_limits<std::uint64_t>::max()));
    check("zeFenceReset", zeFenceReset(get()));
  }
};

}  // namespace npullm::npu::level_zero
