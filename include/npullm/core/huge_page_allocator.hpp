// huge_page_allocator<T>: host memory for large read-mostly buffers (repacked weight tiles)
// that a decode step streams through once per token; huge_page_arena: one run of huge pages
// that many such buffers, each under 2 MiB, share (a layer's attention matrices, a mixture's
// experts).
//
// Why: a decode step reads every weight once, hundreds of MB in 4 KiB pages, so it walks the
// page tables once per 4 KiB (Qwen2-0.5B at Q8_0: ~130k walks a token) and the hardware
// prefetchers stop at every page boundary. Blocks of at least `huge_page_bytes` are aligned to
// it and, on Linux, marked MADV_HUGEPAGE (transparent huge pages: this works where the system
// setting is `madvise` or `always`, and changes nothing where it is `never`), so that their
// aligned whole 2 MiB pieces can be backed by huge pages. The tail past the last whole piece
// stays in small pages: no memory is added. Smaller blocks are 64-byte aligned as
// aligned_allocator's. The advice is a hint: a failing madvise is ignored (the memory is the
// same, only its page size differs).
//
// An allocator made with an arena (huge_page_allocator<T>(arena)) takes its blocks from it:
// 64-byte aligned, one after the other in chunks of `chunk_bytes` (2 MiB-aligned, advised as
// above), or a chunk of its own for a block of at least half a chunk. Its deallocate does
// nothing: the arena frees its chunks when the last allocator (and so the last container)
// holding it is gone, so it suits buffers allocated once, at load, and kept (a container that
// grows would leave its old blocks in the arena until then). Thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

#include "npullm/core/error.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace npullm {

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;  // x86-64's 2 MiB pages

namespace detail {

inline std::size_t huge_page_alignment(std::size_t bytes) noexcept {
  return bytes >= huge_page_bytes ? huge_page_bytes : std::size_t{64};
}

// madvise(p, bytes, MADV_HUGEPAGE): 0, or -1 where the kernel refuses (built without
// transparent huge pages: EINVAL).
inline int advise_huge_pages_system(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return ::madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
  return -1;
#endif
}
// The advice allocate_huge gives. A test replaces it (before any allocation it checks, from
// one thread) to play a kernel that refuses, and puts it back.
inline int (*advise_huge_pages)(void*, std::size_t) noexcept = advise_huge_pages_system;

// `bytes` aligned to the huge page where it holds one (advised), else to 64 bytes.
inline void* allocate_huge(std::size_t bytes) {
  void* p = ::operator new (bytes, std::align_val_t{huge_page_alignment(bytes)});
  if (bytes >= huge_page_bytes) {
    (void)advise_huge_pages(p, bytes / huge_page_bytes * huge_page_bytes);  // a hint: see above
  }
  return p;
}

inline void free_huge(void* p, std::size_t bytes) noexcept {
  ::operator delete (p, std::align_val_t{huge_page_alignment(bytes)});
}

}  // namespace detail

class huge_page_arena {
 public:
  explicit huge_page_arena(std::size_t chunk_bytes = 16 * huge_page_bytes)
      : chunk_bytes_(std::max(chunk_bytes, huge_page_bytes)) {}
  huge_page_arena(const huge_page_arena&) = delete;
  huge_page_arena& operator=(const huge_page_arena&) = delete;
  ~huge_page_arena() {
    for (const chunk& c : chunks_) detail::free_huge(c.data, c.bytes);
  }

  // 64-byte aligned, never freed before the arena.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    bytes = std::max<std::size_t>((bytes + 63) / 64 * 64, 64);
    if (bytes >= chunk_bytes_ / 2) return add_chunk(bytes);  // (the current chunk stays open)
    if (open_ == nullptr || used_ + bytes > chunk_bytes_) {
      open_ = static_cast<std::byte*>(add_chunk(chunk_bytes_));
      used_ = 0;
    }
    void* p = open_ + used_;
    used_ += bytes;
    return p;
  }

  // Bytes of all chunks (what the arena holds, used or not).
  [[nodiscard]] std::size_t reserved_bytes() const {
    const std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const chunk& c : chunks_) n += c.bytes;
    return n;
  }

 private:
  struct chunk {
    void* data;
    std::size_t bytes;
  };
  void* add_chunk(std::size_t bytes) {
    chunks_.reserve(chunks_.size() + 1);  // (so that push_back cannot throw and leak)
    void* p = detail::allocate_huge(bytes);
    chunks_.push_back({p, bytes});
    return p;
  }

  mutable std::mutex mutex_;
  std::size_t chunk_bytes_;
  std::vector<chunk> chunks_;
  std::byte* open_ = nullptr;
  std::size_t used_ = 0;
};

template <class T>
struct huge_page_allocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  template <class U>
  struct rebind {
    using other = huge_page_allocator<U>;
  };

  huge_page_allocator() = default;
  explicit huge_page_allocator(std::shared_ptr<huge_page_arena> a) noexcept : arena(std::move(a)) {}
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>& o) noexcept : arena(o.arena) {}  // NOLINT

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      raise(error_code::invalid_shape, "huge_page_allocator: ", n, " elements of ", sizeof(T),
            " bytes overflow the address space");
    }
    const std::size_t bytes = n * sizeof(T);
    return static_cast<T*>(arena ? arena->allocate(bytes) : detail::allocate_huge(bytes));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (!arena) detail::free_huge(p, n * sizeof(T));
  }

  friend bool operator==(const huge_page_allocator& a, const huge_page_allocator& b) noexcept {
    return a.arena == b.arena;
  }

  std::shared_ptr<huge_page_arena> arena;  // null: each block its own
};

}  // namespace npullm
