#include <gtest/gtest.h>

#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"

namespace {

using namespace npullm::kv;

static_assert(kv_source<contiguous_cache<float>>);
static_assert(kv_source<contiguous_cache<npullm::float16>::block_split>);

TEST(ContiguousCache, AppendUntilFull) {
  contiguous_cache<float> c(kv_shape{2, 2, 4}, 10);
  EXPECT_EQ(c.append(6), 0u);
  EXPECT_EQ(c.append(4), 6u);
  try {
    c.append(1);
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), npullm::error_code::capacity_exhausted);
    EXPECT_NE(std::string(e.what()).find("KV cache is full: capacity 10"), std::string::npos);
  }
  EXPECT_EQ(c.length(), 10u);
  c.truncate(3);
  EXPECT_EQ(c.length(), 3u);
  c.reset();
  EXPECT_EQ(c.tile_count(), 0u);
}

TEST(ContiguousCache, SplitIntoBlocksIsZeroCopyWithAShorterTail) {
  contiguous_cache<float> c(kv_shape{2, 2, 4}, 32);
  c.append(11);
  for (std::size_t p = 0; p < 11; ++p) {
    c.token_kv(p, 1, kv_part::k)(1, 2) = static_cast<float>(p);
    c.token_kv(p, 1, kv_part::v)(0, 0) = -static_cast<float>(p);
  }
  const auto split = c.split_into_blocks(4);
  ASSERT_EQ(split.tile_count(), 3u);
  EXPECT_EQ(split.tile(1, 2).length(), 3u);  // tail
  EXPECT_EQ(split.tile(1, 2).position, 8u);
  auto buf = c.buffer(1, kv_part::k);  // (kv_heads, capacity, head_dim)
  for (std::size_t i = 0; i < 3; ++i) {
    const auto t = split.tile(1, i);
    EXPECT_EQ(t.k.data_handle(), &buf(0, 4 * i, 0));  // points into the contiguous buffer
    EXPECT_EQ(t.k.stride(0), 32u * 4u);               // heads stay capacity * head_dim apart
    for (std::size_t j = 0; j < t.length(); ++j) {
      EXPECT_EQ(t.k(1, j, 2), static_cast<float>(4 * i + j));
      EXPECT_EQ(t.v(0, j, 0), -static_cast<float>(4 * i + j));
    }
  }
  EXPECT_THROW((void)c.split_into_blocks(0), npullm::error);
}

TEST(ContiguousCache, SameTilesAsABlockTable) {
  const kv_shape shape{1, 2, 4};
  contiguous_cache<npullm::bfloat16> c(shape, 64);
  block_pool<npullm::bfloat16> pool(shape, 16, 4);
  block_table<npullm::bfloat16> t(pool);
  c.append(37);
  t.append(37);
  for (std::size_t p = 0; p < 37; ++p) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t d = 0; d < 4; ++d) {
        const npullm::bfloat16 value(static_cast<float>(p * 8 + h * 4 + d));
        c.token_kv(p, 0, kv_part::v)(h, d) = value;
        t.token_kv(p, 0, kv_part::v)(h, d) = value;
      }
    }
  }
  const auto split = c.split_into_blocks(16);
  ASSERT_EQ(split.tile_count(), t.tile_count());
  for (std::size_t i = 0; i < t.tile_count(); ++i) {
    const auto a = split.tile(0, i), b = t.tile(0, i);
    ASSERT_EQ(a.length(), b.length());
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t j = 0; j < a.length(); ++j) {
        for (std::size_t d = 0; d < 4; ++d) {
          EXPECT_EQ(static_cast<float>(a.v(h, j, d)), static_cast<float>(b.v(h, j, d)));
        }
      }
    }
  }
}

}  // namespace
