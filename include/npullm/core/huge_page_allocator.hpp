// huge_page_allocator<T>: host memory for large read-mostly buffers (repacked weight tiles)
// that a decode step streams through once per token.
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
#pragma once

#include <cstddef>
#include <limits>
#include <new>

#include "npullm/core/error.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace npullm {

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;  // x86-64's 2 MiB pages

template <class T>
struct huge_page_allocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = huge_page_allocator<U>;
  };

  huge_page_allocator() = default;
  template <class U>
  constexpr huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      raise(error_code::invalid_shape, "huge_page_allocator: ", n, " elements of ", sizeof(T),
            " bytes overflow the address space");
    }
    const std::size_t bytes = n * sizeof(T);
    void* p = ::operator new(bytes, std::align_val_t{alignment(bytes)});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= huge_page_bytes) {
      (void)::madvise(p, bytes / huge_page_bytes * huge_page_bytes, MADV_HUGEPAGE);
    }
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete(p, std::align_val_t{alignment(n * sizeof(T))});
  }

  friend constexpr bool operator==(const huge_page_allocator&,
                                   const huge_page_allocator&) noexcept {
    return true;
  }

 private:
  static constexpr std::size_t alignment(std::size_t bytes) noexcept {
    return bytes >= huge_page_bytes ? huge_page_bytes : std::size_t{64};
  }
};

}  // namespace npullm
