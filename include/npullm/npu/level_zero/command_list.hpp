// level_zero::command_list: owns one ze_command_list_handle_t. Commands are appended (graph
// commands through the graph extension, graph.hpp), then the list is closed and may be submitted
// any number of times.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>

#include "npullm/npu/level_zero/handle.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class command_list : public unique_handle<ze_command_list_handle_t, zeCommandListDestroy> {
 public:
  command_list() = default;
  command_list(ze_context_handle_t ctx, ze_device_handle_t dev, std::uint32_t ordinal = 0) {
    ze_command_list_desc_t desc{ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, nullptr, ordinal, 0};
    check("zeCommandListCreate", zeCommandListCreate(ctx, dev, &desc, out()));
  }

  void close() { check("zeCommandListClose", zeCommandListClose(get())); }
  // Empties the list for recording again.
  void clear() { check("zeCommandListReset", zeCommandListReset(get())); }
};

}  // namespace npullm::npu::level_zero
