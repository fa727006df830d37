// level_zero::unique_handle<H, Destroy>: owns one Level Zero handle and destroys it once; the
// RAII base of context, command_queue, command_list and fence.
#pragma once

#include <level_zero/ze_api.h>

#include <utility>

namespace npullm::npu::level_zero {

template <class H, ze_result_t (*Destroy)(H)>
class unique_handle {
 public:
  unique_handle() = default;
  unique_handle(unique_handle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  unique_handle& operator=(unique_handle&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  ~unique_handle() { reset(); }

  [[nodiscard]] H get() const noexcept { return handle_; }

 protected:
  // Where a create call writes the new handle.
  H* out() noexcept { return &handle_; }

 private:
  void reset() noexcept {
    if (handle_) Destroy(handle_);  // a destroy failure cannot be reported from here
    handle_ = nullptr;
  }
  H handle_ = nullptr;
};

}  // namespace npullm::npu::level_zero
