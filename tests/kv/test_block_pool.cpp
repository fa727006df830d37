#include <gtest/gtest.h>

#include "support.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "npullm/kv/block_pool.hpp"

// Counts the bytes this binary allocates, so a test can measure what a pool's bookkeeping
// really takes (the members as they are, not a hand-written sum).
namespace {
std::atomic<std::size_t> heap_bytes{0};
}  // namespace

__attribute__((noinline)) void* operator new(std::size_t n) {
  heap_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void* operator new(std::size_t n, std::align_val_t a) {
  heap_bytes.fetch_add(n, std::memory_order_relaxed);
  const auto al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {

using namespace npullm::kv;
using npullm::error;
using npullm::error_code;

block_pool<float> make_pool(std::size_t blocks = 4) {
  return {kv_shape{2, 2, 8}, 16, blocks};
}

using npullm::testing::expect_error;

TEST(BlockPool, AllocateIsAllOrNothing) {
  auto pool = make_pool(4);
  auto a = pool.allocate(3);
  EXPECT_EQ(a, (std::vector<block_id>{0, 1, 2}));
  EXPECT_EQ(pool.free_count(), 1u);
  EXPECT_EQ(pool.used_count(), 3u);
  const auto free_before = pool.free_blocks();
  expect_error([&] { (void)pool.allocate(2); }, error_code::capacity_exhausted,
               "requested 2 blocks, 1 free of 4");
  EXPECT_EQ(pool.free_blocks(), free_before);
  EXPECT_EQ(pool.used_count(), 3u);
  EXPECT_TRUE(pool.allocate(0).empty());
}

TEST(BlockPool, ReferenceCountsAndLeastRecentlyReleasedFirst) {
  auto pool = make_pool(4);
  auto a = pool.allocate(4);
  pool.retain(a[1]);
  EXPECT_EQ(pool.ref_count(a[1]), 2u);
  pool.release(a[1]);
  EXPECT_EQ(pool.free_count(), 0u);
  pool.release(a[2]);
  pool.release(a[0]);
  EXPECT_EQ(pool.free_blocks(), (std::vector<block_id>{2, 0}));
  EXPECT_EQ(pool.allocate(1), std::vector<block_id>{2});  // released first, reused first
}

TEST(BlockPool, ReleasingAFreeBlockIsAnError) {
  auto pool = make_pool(2);
  expect_error([&] { pool.release(1); }, error_code::invalid_argument, "block 1 which is not held");
  expect_error([&] { pool.retain(0); }, error_code::invalid_argument, "not held");
  expect_error([&] { pool.release(7); }, error_code::out_of_range, "pool has 2 blocks");
  expect_error([&] { pool.reclaim(0); }, error_code::invalid_argument, "not a free cached block");
  EXPECT_EQ(pool.free_count(), 2u);
}

// The observers check their argument too: a block id past the pool is out_of_range, not a read
// past the end of the reference counts.
TEST(BlockPool, ObserversCheckTheBlockId) {
  auto pool = make_pool(2);
  EXPECT_EQ(pool.ref_count(1), 0u);
  EXPECT_FALSE(pool.is_cached(1));
  expect_error([&] { (void)pool.ref_count(2); }, error_code::out_of_range,
               "ref_count of block 2, pool has 2 blocks");
  expect_error([&] { (void)pool.is_cached(9); }, error_code::out_of_range,
               "is_cached of block 9, pool has 2 blocks");
}

TEST(BlockPool, BlockViewsAreZeroCopyIntoStorage) {
  auto pool = make_pool(3);
  const auto s = pool.shape();
  auto k = pool.block(2, 1, kv_part::k);  // (kv_heads, block_size, head_dim)
  auto v = pool.block(2, 1, kv_part::v);
  EXPECT_EQ(k.extent(0), 2u);
  EXPECT_EQ(k.extent(1), 16u);
  EXPECT_EQ(k.extent(2), 8u);
  const std::size_t block_elems = s.kv_heads * 16 * s.head_dim;
  EXPECT_EQ(k.data_handle(), pool.data() + ((1 * 2 + 0) * 3 + 2) * block_elems);
  EXPECT_EQ(v.data_handle(), pool.data() + ((1 * 2 + 1) * 3 + 2) * block_elems);
  k(1, 3, 4) = 5.0f;
  EXPECT_EQ(pool.data()[(1 * 2 * 3 + 2) * block_elems + (1 * 16 + 3) * 8 + 4], 5.0f);
}

TEST(BlockPool, CopyBlockCopiesEveryLayerAndPart) {
  auto pool = make_pool(2);
  for (std::size_t layer = 0; layer < 2; ++layer) {
    pool.block(0, layer, kv_part::k)(1, 2, 3) = 1.0f + static_cast<float>(layer);
    pool.block(0, layer, kv_part::v)(0, 4, 0) = 9.0f;  // token 4: beyond the copied 3
  }
  pool.copy_block(0, 1, 3);
  EXPECT_EQ(pool.block(1, 1, kv_part::k)(1, 2, 3), 2.0f);
  EXPECT_EQ(pool.block(1, 0, kv_part::v)(0, 4, 0), 0.0f);
}

TEST(BlockPool, BadConstructionArguments) {
  expect_error(
      [] {
        block_pool<float>(kv_shape{0, 2, 8}, 16, 4);
      },
      error_code::invalid_shape, "layers, kv_heads and head_dim");
  expect_error(
      [] {
        block_pool<float>(kv_shape{1, 2, 8}, 0, 4);
      },
      error_code::invalid_argument, "block_size 0");
}

// What a pool allocates besides its KV storage, per block, measured: it must be what
// metadata_bytes_per_block() reports (the figure bench_kv prints), and small.
TEST(BlockPool, MetadataIsWhatTheMembersAllocate) {
  constexpr std::size_t blocks = 100000;
  const std::size_t before = heap_bytes.load();
  const block_pool<float> pool(kv_shape{1, 1, 8}, 1, blocks);
  const std::size_t bookkeeping = heap_bytes.load() - before - pool.storage_bytes();
  const double per_block = static_cast<double>(bookkeeping) / blocks;
  EXPECT_NEAR(per_block, static_cast<double>(block_pool<float>::metadata_bytes_per_block()), 0.01);
  EXPECT_LE(per_block, 16.0);
}

}  // namespace
