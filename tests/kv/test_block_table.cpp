#include <gtest/gtest.h>

#include "npullm/kv/block_table.hpp"

namespace {

using namespace npullm::kv;
using npullm::error;
using npullm::error_code;

constexpr kv_shape shape{1, 1, 2};

void write(block_table<float>& t, std::size_t pos, float value) {
  auto k = t.token_kv(pos, 0, kv_part::k);  // (kv_heads, head_dim)
  auto v = t.token_kv(pos, 0, kv_part::v);
  k(0, 0) = value;
  v(0, 1) = -value;
}

float read_k(const block_table<float>& t, std::size_t pos) {
  const std::size_t bs = t.pool().block_size();
  return t.tile(0, pos / bs).k(0, pos % bs, 0);
}

TEST(BlockTable, AppendAllocatesAsNeeded) {
  block_pool<float> pool(shape, 4, 8);
  block_table<float> t(pool);
  auto r = t.append(5);
  EXPECT_EQ(r.begin, 0u);
  EXPECT_EQ(r.end, 5u);
  EXPECT_EQ(t.blocks().size(), 2u);
  r = t.append(3);
  EXPECT_EQ(r.begin, 5u);
  EXPECT_EQ(t.blocks().size(), 2u);  // fits in the partial block
  t.append(1);
  EXPECT_EQ(t.blocks().size(), 3u);
  EXPECT_EQ(pool.used_count(), 3u);
  for (std::size_t p = 0; p < 9; ++p) write(t, p, static_cast<float>(p));
  ASSERT_EQ(t.tile_count(), 3u);
  EXPECT_EQ(t.tile(0, 2).length(), 1u);  // last tile shortened to the valid length
  EXPECT_EQ(t.tile(0, 2).position, 8u);
  EXPECT_EQ(t.tile(0, 1).k(0, 3, 0), 7.0f);
  EXPECT_EQ(t.tile(0, 1).v(0, 3, 1), -7.0f);
}

TEST(BlockTable, TilesAreZeroCopyViewsOfPoolBlocks) {
  block_pool<float> pool(kv_shape{2, 2, 4}, 3, 4);
  block_table<float> t(pool);
  t.append(5);
  const auto tile = t.tile(1, 1);
  EXPECT_EQ(tile.k.data_handle(), pool.block(t.blocks()[1], 1, kv_part::k).data_handle());
  EXPECT_EQ(tile.v.data_handle(), pool.block(t.blocks()[1], 1, kv_part::v).data_handle());
  EXPECT_EQ(tile.k.stride(0), 3u * 4u);  // heads stay block_size * head_dim apart
  EXPECT_EQ(&t.token_kv(4, 1, kv_part::k)(1, 2), &tile.k(1, 1, 2));
}

TEST(BlockTable, ForkSharesAndCopiesOnWrite) {
  block_pool<float> pool(shape, 4, 8);
  block_table<float> a(pool);
  a.append(6);
  for (std::size_t p = 0; p < 6; ++p) write(a, p, static_cast<float>(p));
  block_table<float> b = a.fork();
  EXPECT_EQ(b.blocks(), a.blocks());
  EXPECT_EQ(pool.ref_count(a.blocks()[0]), 2u);
  EXPECT_EQ(pool.used_count(), 2u);
  // b writes into the shared, partially filled last block: it gets its own copy first.
  b.append(1);
  write(b, 6, 60.0f);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]);  // the full block stays shared
  EXPECT_NE(b.blocks()[1], a.blocks()[1]);
  EXPECT_EQ(pool.ref_count(a.blocks()[1]), 1u);
  EXPECT_EQ(read_k(b, 5), 5.0f);  // copied tokens
  EXPECT_EQ(read_k(b, 6), 60.0f);
  a.append(1);  // a now holds its last block alone: no copy
  write(a, 6, 600.0f);
  EXPECT_EQ(read_k(a, 6), 600.0f);
  EXPECT_EQ(read_k(b, 6), 60.0f);
}

TEST(BlockTable, TruncateReleasesAndRollsBack) {
  block_pool<float> pool(shape, 4, 8);
  block_table<float> t(pool);
  t.append(10);
  for (std::size_t p = 0; p < 10; ++p) write(t, p, static_cast<float>(p));
  t.truncate(5);
  EXPECT_EQ(t.length(), 5u);
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(pool.used_count(), 2u);
  t.append(2);  // rewrites positions 5, 6
  write(t, 5, 50.0f);
  EXPECT_EQ(read_k(t, 4), 4.0f);
  EXPECT_EQ(read_k(t, 5), 50.0f);
  try {
    t.truncate(8);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::out_of_range);
    EXPECT_EQ(t.length(), 7u);
  }
}

TEST(BlockTable, ResetAndDestructionReleaseEverything) {
  block_pool<float> pool(shape, 2, 8);
  {
    block_table<float> t(pool);
    t.append(7);
    auto u = t.fork();
    t.reset();
    EXPECT_EQ(t.length(), 0u);
    EXPECT_EQ(pool.used_count(), 4u);  // u still holds them
    block_table<float> moved = std::move(u);
    EXPECT_EQ(moved.length(), 7u);
  }
  EXPECT_EQ(pool.free_count(), 8u);
}

TEST(BlockTable, FailedAppendChangesNothing) {
  block_pool<float> pool(shape, 4, 3);
  block_table<float> a(pool);
  a.append(6);
  block_table<float> b = a.fork();  // shares 2 blocks; 1 free
  const auto blocks = b.blocks();
  // b's append needs a copy of the shared partial block and 1 new block: 2 > 1 free.
  try {
    b.append(3);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::capacity_exhausted);
    EXPECT_NE(std::string(e.what()).find("requested 2 blocks, 1 free"), std::string::npos);
  }
  EXPECT_EQ(b.blocks(), blocks);
  EXPECT_EQ(b.length(), 6u);
  EXPECT_EQ(pool.free_count(), 1u);
  EXPECT_EQ(pool.ref_count(blocks[1]), 2u);
}

TEST(BlockTable, TokenOutOfRange) {
  block_pool<float> pool(shape, 4, 2);
  block_table<float> t(pool);
  t.append(3);
  EXPECT_THROW((void)t.token_kv(3, 0, kv_part::k), error);
}

static_assert(kv_source<block_table<float>>);
static_assert(kv_source<block_table<npullm::bfloat16>>);

}  // namespace
