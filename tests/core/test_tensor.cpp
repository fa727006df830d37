#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "npullm/core/huge_page_allocator.hpp"
#include "npullm/core/tensor.hpp"

namespace {

using npullm::tensor;

static_assert(!std::is_copy_constructible_v<tensor<float, 2>>);
static_assert(!std::is_copy_assignable_v<tensor<float, 2>>);
static_assert(std::is_nothrow_move_constructible_v<tensor<float, 2>>);

TEST(Tensor, AlignedAndZeroed) {
  for (std::size_t n : {1, 17, 37, 1000}) {
    tensor<float, 2> t(n, 3);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
    EXPECT_EQ(t.size(), n * 3);
    for (std::size_t i = 0; i < t.size(); ++i) ASSERT_EQ(t.data()[i], 0.0f);
  }
  tensor<npullm::bfloat16, 1> b(5);
  EXPECT_EQ(b.data()[4].bits(), 0);
}

TEST(Tensor, ViewSeesStorage) {
  tensor<float, 3> t(2, 3, 4);
  auto v = t.view();
  EXPECT_EQ(v.data_handle(), t.data());
  EXPECT_EQ(v.extent(2), 4u);
  v(1, 2, 3) = 5.0f;
  EXPECT_EQ(t.data()[23], 5.0f);
  const auto& ct = t;
  static_assert(std::is_same_v<decltype(ct.view()), npullm::dense_view<const float, 3>>);
}

TEST(Tensor, MoveTransfersOwnership) {
  tensor<float, 1> a(8);
  float* p = a.data();
  tensor<float, 1> b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT: moved-from state is specified: empty
  EXPECT_TRUE(a.empty());
  tensor<float, 1> c(2);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 8u);
}

TEST(Tensor, CloneIsDeep) {
  tensor<float, 2> a(3, 3);
  a.data()[4] = 2.0f;
  auto b = a.clone();
  EXPECT_NE(b.data(), a.data());
  EXPECT_EQ(b.data()[4], 2.0f);
  EXPECT_EQ(b.shape(), a.shape());
  b.data()[4] = 3.0f;
  EXPECT_EQ(a.data()[4], 2.0f);
}

TEST(Tensor, OverflowingShapeThrows) {
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2;
  try {
    tensor<float, 2> t(huge, 4);
    FAIL() << "expected npullm::error";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::invalid_shape);
  }
  EXPECT_THROW((tensor<float, 1>(-3)), npullm::error);
}

TEST(Tensor, EmptyShapeAllocatesNothing) {
  tensor<float, 2> t(0, 5);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_TRUE(t.view().empty());
}

// The allocator is a policy: a counting one sees every allocation and deallocation.
struct counts {
  int allocations = 0;
  int deallocations = 0;
};
counts g_counts;

template <class T>
struct counting_allocator : npullm::aligned_allocator<T> {
  using value_type = T;
  T* allocate(std::size_t n) {
    ++g_counts.allocations;
    return npullm::aligned_allocator<T>::allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ++g_counts.deallocations;
    npullm::aligned_allocator<T>::deallocate(p, n);
  }
};

TEST(Tensor, AllocatorPolicy) {
  g_counts = {};
  {
    tensor<float, 1, counting_allocator<float>> t(10);
    auto u = t.clone();
    EXPECT_EQ(g_counts.allocations, 2);
  }
  EXPECT_EQ(g_counts.deallocations, 2);
}

// The VmFlags of the mapping that holds p, from /proc/self/smaps ("" where unknown).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HugePageAllocator, LargeBlocksAlignedAndAdvisedSmallOnesAsBefore) {
  npullm::huge_page_allocator<std::byte> alloc;
  // small: 64-byte aligned, no advice needed
  for (std::size_t n : {1, 17, 37, 4096}) {
    std::byte* p = alloc.allocate(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
    std::memset(p, 1, n);
    alloc.deallocate(p, n);
  }
  // large: aligned to the huge page, every byte usable (the tail past the last whole 2 MiB too)
  const std::size_t n = 2 * npullm::huge_page_bytes + 37;
  std::byte* p = alloc.allocate(n);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % npullm::huge_page_bytes, 0u);
  std::memset(p, 7, n);
  EXPECT_EQ(p[n - 1], std::byte{7});
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    // madvise(MADV_HUGEPAGE) marks the mapping "hg", whatever the system setting
    EXPECT_NE(vm_flags_of(p).find(" hg"), std::string::npos) << vm_flags_of(p);
  }
  alloc.deallocate(p, n);
  // a vector of it, as repacked weights hold theirs
  std::vector<float, npullm::huge_page_allocator<float>> v(npullm::huge_page_bytes, 1.0f);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % npullm::huge_page_bytes, 0u);
  EXPECT_EQ(v.back(), 1.0f);
  EXPECT_THROW((void)npullm::huge_page_allocator<double>().allocate(
                   std::numeric_limits<std::size_t>::max() / 4),
               npullm::error);
}

TEST(HugePageAllocator, AnArenaSharesItsChunksAndFreesThemWithTheLastHolder) {
  const std::size_t chunk = 2 * npullm::huge_page_bytes;
  auto arena = std::make_shared<npullm::huge_page_arena>(chunk);
  std::weak_ptr<npullm::huge_page_arena> alive = arena;
  npullm::huge_page_allocator<std::byte> alloc(arena);
  EXPECT_EQ(alloc, npullm::huge_page_allocator<std::byte>(arena));
  EXPECT_NE(alloc, npullm::huge_page_allocator<std::byte>());
  {
    // small blocks one after the other in one chunk, 64-byte aligned, disjoint
    std::vector<std::byte, npullm::huge_page_allocator<std::byte>> a(1000, std::byte{1}, alloc);
    std::vector<std::byte, npullm::huge_page_allocator<std::byte>> b(37, std::byte{2}, alloc);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % npullm::huge_page_bytes, 0u);
    EXPECT_EQ(b.data(), a.data() + 1024);
    EXPECT_EQ(arena->reserved_bytes(), chunk);
    // half a chunk or more: a chunk of its own, the open chunk still taking small ones
    std::vector<float, npullm::huge_page_allocator<float>> big(chunk / 4, 3.0f, alloc);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % npullm::huge_page_bytes, 0u);
    EXPECT_EQ(arena->reserved_bytes(), 2 * chunk);
    std::vector<std::byte, npullm::huge_page_allocator<std::byte>> c(17, std::byte{4}, alloc);
    EXPECT_EQ(c.data(), b.data() + 64);
    // a block that does not fit what is left opens a new chunk
    std::vector<std::byte, npullm::huge_page_allocator<std::byte>> e(chunk / 2 - 64, std::byte{6},
                                                                     alloc);
    EXPECT_EQ(arena->reserved_bytes(), 2 * chunk);
    std::vector<std::byte, npullm::huge_page_allocator<std::byte>> d(chunk / 2 - 64, std::byte{5},
                                                                     alloc);
    EXPECT_EQ(arena->reserved_bytes(), 3 * chunk);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d.data()) % npullm::huge_page_bytes, 0u);
    EXPECT_EQ(e.back(), std::byte{6});
    EXPECT_EQ(a.back(), std::byte{1});
    EXPECT_EQ(b.back(), std::byte{2});
    EXPECT_EQ(big.back(), 3.0f);
    EXPECT_EQ(c.back(), std::byte{4});
    EXPECT_EQ(d.back(), std::byte{5});
    // moved containers keep their arena (and so their memory)
    auto moved = std::move(a);
    EXPECT_EQ(moved.get_allocator(), alloc);
    arena.reset();
    alloc = {};
    EXPECT_FALSE(alive.expired());  // the containers still hold it
  }
  EXPECT_TRUE(alive.expired());  // freed with the last of them
}

}  // namespace
