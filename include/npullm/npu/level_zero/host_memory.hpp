// Host memory the device can read and write (zeMemAllocHost): host_buffer owns one allocation;
// host_allocator<T> is an allocator policy over a context for npullm's tensors and the KV block
// pool, so their storage is shared with the device without copies.
//
// A host_memory_registry (shared by a backend and its allocators) records the live allocations
// so that a backend can check that every graph argument lies inside driver memory before it
// binds it (the real driver rejects other pointers).
#pragma once

#include <level_zero/ze_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "npullm/core/error.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

inline constexpr std::size_t host_alignment = 64;

// Allocates and frees host memory of one context and remembers the live ranges.
class host_memory_registry {
 public:
  // owner keeps the context alive as long as the registry (and every allocator holding it).
  explicit host_memory_registry(ze_context_handle_t ctx, std::shared_ptr<const void> owner = {})
      : ctx_(ctx), owner_(std::move(owner)) {}

  void* allocate(std::size_t bytes) {
    ze_host_mem_alloc_desc_t desc{ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr, 0};
    void* p = nullptr;
    check("zeMemAllocHost", zeMemAllocHost(ctx_, &desc, bytes == 0 ? 1 : bytes, host_alignment, &p),
          npullm::detail::concat(" (", bytes, " bytes)"));
    std::lock_guard lock(mutex_);
    live_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }
  void free(void* p) noexcept {
    if (!p) return;
    {
      std::lock_guard lock(mutex_);
      live_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    zeMemFree(ctx_, p);
  }
  // Whether [p, p + bytes) lies inside one live allocation.
  [[nodiscard]] bool contains(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + std::max<std::size_t>(it->second, 1);
  }
  [[nodiscard]] std::size_t live_allocations() const {
    std::lock_guard lock(mutex_);
    return live_.size();
  }
  [[nodiscard]] ze_context_handle_t context() const noexcept { return ctx_; }

 private:
  ze_context_handle_t ctx_;
  std::shared_ptr<const void> owner_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> live_;
};

// One host allocation.
class host_buffer {
 public:
  host_buffer() = default;
  host_buffer(std::shared_ptr<host_memory_registry> reg, std::size_t bytes)
      : reg_(std::move(reg)), bytes_(bytes) {
    data_ = reg_->allocate(bytes);
  }
  host_buffer(host_buffer&& o) noexcept
      : reg_(std::move(o.reg_)),
        data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      release();
      reg_ = std::move(o.reg_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { release(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (reg_ && data_) reg_->free(data_);
    data_ = nullptr;
  }
  std::shared_ptr<host_memory_registry> reg_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Allocator policy: storage from zeMemAllocHost of the registry's context. A default-constructed
// allocator has no context and refuses to allocate.
template <class T>
class host_allocator {
 public:
  using value_type = T;
  static constexpr std::size_t alignment = host_alignment;

  host_allocator() = default;
  explicit host_allocator(std::shared_ptr<host_memory_registry> reg) noexcept
      : reg_(std::move(reg)) {}
  template <class U>
  host_allocator(const host_allocator<U>& o) noexcept : reg_(o.registry()) {}

  T* allocate(std::size_t n) {
    if (!reg_) {
      raise(error_code::backend,
            "level_zero::host_allocator: no context (a default-constructed allocator cannot "
            "allocate ",
            n, " elements)");
    }
    if (n > std::size_t(-1) / sizeof(T))
      raise(error_code::invalid_argument, "allocation too large");
    return static_cast<T*>(reg_->allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t) noexcept {
    if (reg_) reg_->free(p);
  }
  [[nodiscard]] const std::shared_ptr<host_memory_registry>& registry() const noexcept {
    return reg_;
  }
  template <class U>
  bool operator==(const host_allocator<U>& o) const noexcept {
    return reg_ == o.registry();
  }

 private:
  std::shared_ptr<host_memory_registry> reg_;
};

}  // namespace npullm::npu::level_zero
