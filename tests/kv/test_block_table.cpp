#include <gtest/gtest.h>

#include "support.hpp"

#include "npullm/kv/block_table.hpp"
#include "npullm/kv/prefix_cache.hpp"

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
  return t.tile(0, t.tile_index(pos)).k(0, pos % bs, 0);
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

// A sliding window forgets whole blocks that end before a position; positions stay absolute.
TEST(BlockTable, ReleaseBeforeGivesBackWholeBlocksOnly) {
  block_pool<float> pool(shape, 4, 8);
  block_table<float> t(pool);
  t.append(11);
  for (std::size_t p = 0; p < 11; ++p) write(t, p, static_cast<float>(p));
  const block_id second = t.blocks()[1];
  EXPECT_EQ(t.release_before(3), 0u);  // block 0 still holds 3
  EXPECT_EQ(t.release_before(4), 1u);  // block 0 ends at 4
  EXPECT_EQ(t.release_before(7), 0u);
  EXPECT_EQ(t.length(), 11u);
  EXPECT_EQ(t.first_position(), 4u);
  EXPECT_EQ(t.released_blocks(), 1u);
  EXPECT_EQ(pool.used_count(), 2u);
  ASSERT_EQ(t.tile_count(), 2u);
  EXPECT_EQ(t.blocks()[0], second);
  EXPECT_EQ(t.tile(0, 0).position, 4u);  // live tiles at their absolute positions
  EXPECT_EQ(t.tile(0, 1).position, 8u);
  EXPECT_EQ(t.tile(0, 1).length(), 3u);
  EXPECT_EQ(t.tile_count(9), 2u);
  EXPECT_EQ(t.tile(0, 1, 9).length(), 1u);
  EXPECT_EQ(t.tile_index(9), 1u);
  EXPECT_EQ(read_k(t, 4), 4.0f);
  EXPECT_EQ(read_k(t, 10), 10.0f);
  t.append(6);  // positions 11..16: blocks for 12..15 and 16
  write(t, 16, 16.0f);
  EXPECT_EQ(t.tile_count(), 4u);
  EXPECT_EQ(read_k(t, 16), 16.0f);
  t.truncate(8);  // down to the block boundary: fine
  EXPECT_EQ(t.tile_count(), 1u);
  t.truncate(4);  // nothing live left
  EXPECT_EQ(t.tile_count(), 0u);
  EXPECT_EQ(pool.used_count(), 0u);
  t.append(2);
  write(t, 5, 5.5f);
  EXPECT_EQ(read_k(t, 5), 5.5f);
  EXPECT_EQ(t.release_before(6), 0u);  // block [4, 8) still holds 4 and 5
  t.append(2);
  EXPECT_EQ(t.release_before(8), 1u);  // every block: no live tile, positions go on from 8
  EXPECT_EQ(t.tile_count(), 0u);
  EXPECT_EQ(t.first_position(), 8u);
  EXPECT_EQ(pool.used_count(), 0u);
  t.append(1);
  write(t, 8, 8.5f);
  EXPECT_EQ(t.tile(0, 0).position, 8u);
  EXPECT_EQ(read_k(t, 8), 8.5f);
}

TEST(BlockTable, ReleaseBeforeErrorsChangeNothing) {
  block_pool<float> pool(shape, 4, 8);
  block_table<float> t(pool);
  t.append(10);
  t.release_before(9);
  const auto blocks = t.blocks();
  npullm::testing::expect_error([&] { t.release_before(11); }, error_code::out_of_range,
                                "release_before(11) past the length 10");
  npullm::testing::expect_error([&] { t.truncate(7); }, error_code::out_of_range,
                                "truncate to 7 tokens, but the tokens before 8 were released");
  npullm::testing::expect_error([&] { (void)t.token_kv(7, 0, kv_part::k); },
                                error_code::out_of_range,
                                "token 7 was released (tokens before 8 are gone)");
  EXPECT_EQ(t.blocks(), blocks);
  EXPECT_EQ(t.length(), 10u);
  EXPECT_EQ(t.first_position(), 8u);
  EXPECT_EQ(pool.used_count(), 1u);
  t.reset();
  EXPECT_EQ(t.first_position(), 0u);
  t.append(3);
  EXPECT_EQ(t.tile(0, 0).position, 0u);
}

// A fork keeps the blocks its parent released, a copy on write still happens after a
// release, and a prefix cache keeps (and can hand out again) released cached blocks.
TEST(BlockTable, ReleaseBeforeRespectsSharedAndCachedBlocks) {
  block_pool<float> pool(shape, 4, 8);
  prefix_cache<float> cache(pool);
  block_table<float> a(pool);
  a.append(10);
  for (std::size_t p = 0; p < 10; ++p) write(a, p, static_cast<float>(p));
  const std::vector<token_id> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(cache.insert(a, tokens), 2u);
  block_table<float> b = a.fork();
  const block_id first = a.blocks()[0];
  EXPECT_EQ(a.release_before(8), 2u);
  EXPECT_EQ(pool.ref_count(first), 1u);  // b's
  EXPECT_EQ(read_k(b, 1), 1.0f);
  block_table<float> c = a.fork();  // a fork of a released table is released alike
  EXPECT_EQ(c.first_position(), 8u);
  c.append(1);  // the shared partial block is copied before the write
  write(c, 10, 100.0f);
  EXPECT_NE(c.blocks().back(), a.blocks().back());
  EXPECT_EQ(read_k(a, 9), 9.0f);
  EXPECT_EQ(read_k(c, 9), 9.0f);
  b.reset();
  EXPECT_EQ(pool.ref_count(first), 0u);
  EXPECT_TRUE(pool.is_cached(first));  // unreferenced, still cached: a hit can reuse it
  block_table<float> d(pool);
  EXPECT_EQ(cache.attach(d, tokens), 8u);
  EXPECT_EQ(d.blocks()[0], first);
  EXPECT_EQ(read_k(d, 2), 2.0f);
  // insert through a released prefix: chains on the cached blocks, registers the rest.
  a.append(2);  // 10, 11: block 2 full
  EXPECT_EQ(cache.insert(a, std::vector<token_id>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), 1u);
  EXPECT_EQ(cache.match(std::vector<token_id>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}).size(),
            3u);
}

static_assert(kv_source<block_table<float>>);
static_assert(kv_source<block_table<npullm::bfloat16>>);

}  // namespace
