// level_zero::command_list: owns one ze_command_list_handle_t. Commands are appended (graph
// commands through the graph extension, graph.hpp), then the list is closed and may be submitted
// any number of times.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <utility>

#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class command_list {
 public:
  command_list() = default;
  command_list(ze_context_handle_t ctx, ze_device_handle_t dev, std::uint32_t ordinal = 0) {
    ze_command_list_desc_t desc{ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, nullptr, ordinal, 0};
    check("zeCommandListCreate", zeCommandListCreate(ctx, dev, &desc, &handle_));
  }
  command_list(command_list&& o) noexcept
      : handle_(std::exchange(o.handle_, nullptr)), closed_(o.closed_) {}
  command_list& operator=(command_list&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
      closed_ = o.closed_;
    }
    return *this;
  }
  command_list(const command_list&) = delete;
  command_list& operator=(const command_list&) = delete;
  ~command_list() { reset(); }

  void close() {
    check("zeCommandListClose", zeCommandListClose(handle_));
    closed_ = true;
  }
  // Empties the list for recording again.
  void clear() {
    check("zeCommandListReset", zeCommandListReset(handle_));
    closed_ = false;
  }
  [[nodiscard]] bool closed() const noexcept { return closed_; }
  [[nodiscard]] ze_command_list_handle_t get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_) zeCommandListDestroy(handle_);
    handle_ = nullptr;
  }
  ze_command_list_handle_t handle_ = nullptr;
  bool closed_ = false;
};

}  // namespace npullm::npu::level_zero
