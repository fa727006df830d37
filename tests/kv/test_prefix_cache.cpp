#include <gtest/gtest.h>

#include <numeric>

#include "npullm/kv/prefix_cache.hpp"

namespace {

using namespace npullm::kv;

constexpr kv_shape shape{1, 1, 1};
using pool_t = block_pool<float>;
using table_t = block_table<float>;

// A table holding `tokens`, with each token's K = its id (a stand-in for its prefix's K/V).
table_t make_table(pool_t& pool, const std::vector<token_id>& tokens) {
  table_t t(pool);
  t.append(tokens.size());
  for (std::size_t p = 0; p < tokens.size(); ++p) {
    t.token_kv(p, 0, kv_part::k)(0, 0) = static_cast<float>(tokens[p]);
  }
  return t;
}

std::vector<token_id> iota_tokens(std::size_t n, token_id first = 0) {
  std::vector<token_id> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixCache, LongestPrefixOfFullBlocksNeverTheLastToken) {
  pool_t pool(shape, 4, 16);
  prefix_cache<float> cache(pool);
  const auto tokens = iota_tokens(10);
  table_t a = make_table(pool, tokens);
  EXPECT_EQ(cache.insert(a, tokens), 2u);  // blocks [0,4) and [4,8); the partial one is not
  EXPECT_EQ(cache.size(), 2u);

  table_t b(pool);
  EXPECT_EQ(cache.attach(b, tokens), 8u);
  EXPECT_EQ(b.blocks(), (std::vector<block_id>{a.blocks()[0], a.blocks()[1]}));
  EXPECT_EQ(pool.ref_count(a.blocks()[0]), 2u);
  EXPECT_EQ(b.tile(0, 1).k(0, 3, 0), 7.0f);

  // A prompt of exactly 8 tokens: the match stops before its last token (1 block).
  table_t c(pool);
  EXPECT_EQ(cache.attach(c, std::vector<token_id>(tokens.begin(), tokens.begin() + 8)), 4u);
  // A different second block: only the first matches.
  auto other = tokens;
  other[5] = 99;
  table_t d(pool);
  EXPECT_EQ(cache.attach(d, other), 4u);
  // A different first block: nothing, even though block 2 alone would match by content.
  other[0] = 99;
  table_t e(pool);
  EXPECT_EQ(cache.attach(e, other), 0u);
  EXPECT_EQ(e.length(), 0u);
}

TEST(PrefixCache, UnverifiedTokensAreNotCached) {
  pool_t pool(shape, 2, 8);
  prefix_cache<float> cache(pool);
  const auto tokens = iota_tokens(6);
  table_t a = make_table(pool, tokens);
  // Only 3 tokens verified (3 are speculative): one full block is cached.
  EXPECT_EQ(cache.insert(a, std::span<const token_id>(tokens).first(3)), 1u);
  EXPECT_TRUE(cache.contains(a.blocks()[0]));
  EXPECT_FALSE(cache.contains(a.blocks()[1]));
  table_t b(pool);
  EXPECT_EQ(cache.attach(b, tokens), 2u);
}

TEST(PrefixCache, CachedBlocksSurviveReleaseUntilEvictedLeastRecentlyUsedFirst) {
  pool_t pool(shape, 2, 4);
  prefix_cache<float> cache(pool);
  const auto x = iota_tokens(5, 10), y = iota_tokens(5, 20);
  {
    table_t a = make_table(pool, x);  // blocks 0, 1, 2
    cache.insert(a, x);               // caches 0 and 1
  }
  EXPECT_EQ(pool.free_count(), 4u);  // released, but still cached
  EXPECT_EQ(cache.size(), 2u);
  {
    table_t b(pool);
    EXPECT_EQ(cache.attach(b, x), 4u);  // reclaimed from the free queue
    EXPECT_EQ(pool.used_count(), 2u);
  }
  // Allocation takes the least recently released blocks first: 3, then 2, then the cached ones
  // in release order (table b released its last block first).
  table_t c = make_table(pool, y);  // 3 blocks
  EXPECT_EQ(pool.free_count(), 1u);
  EXPECT_EQ(cache.size(), 1u);  // one cached block evicted
  table_t probe(pool);
  // The chain's tail was evicted first (released first), so the head still matches.
  EXPECT_EQ(cache.attach(probe, x), 2u);
}

TEST(PrefixCache, EvictingAParentForgetsItsChildren) {
  pool_t pool(shape, 1, 3);
  prefix_cache<float> cache(pool);
  const std::vector<token_id> x{1, 2, 3};
  {
    table_t a = make_table(pool, x);
    cache.insert(a, x);  // a chain of 3 one-token blocks
    a.truncate(0);       // releases last first: blocks 2, 1, 0 in that order
  }
  EXPECT_EQ(cache.size(), 3u);
  table_t b(pool);
  b.append(1);  // evicts the least recently released: the chain's tail
  EXPECT_EQ(cache.size(), 2u);
  table_t c(pool);
  c.append(1);
  EXPECT_EQ(cache.size(), 1u);
  table_t d(pool);
  d.append(1);  // evicts the head
  EXPECT_EQ(cache.size(), 0u);
}

// Every key collides: matches must come from comparing tokens and parents.
struct constant_hash {
  std::uint64_t operator()(std::uint64_t, std::span<const token_id>) const noexcept { return 7; }
};

TEST(PrefixCache, HashCollisionsCompareTokens) {
  pool_t pool(shape, 2, 8);
  prefix_cache<float, npullm::aligned_allocator<float>, constant_hash> cache(pool);
  const std::vector<token_id> x{1, 2, 3, 4, 5}, y{1, 2, 9, 9, 5}, z{9, 9, 3, 4, 5};
  table_t a = make_table(pool, x), b = make_table(pool, y);
  cache.insert(a, x);
  cache.insert(b, y);
  EXPECT_EQ(cache.size(), 3u);  // [1 2] shared, [3 4] under a, [9 9] under b's chain
  table_t c(pool);
  EXPECT_EQ(cache.attach(c, y), 4u);
  EXPECT_EQ(c.tile(0, 1).k(0, 0, 0), 9.0f);  // y's block, not x's, despite equal hashes
  table_t d(pool);
  EXPECT_EQ(cache.attach(d, z), 0u);  // [9 9] exists, but not as a first block
}

TEST(PrefixCache, CachedBlocksAreCopiedBeforeWriting) {
  pool_t pool(shape, 2, 8);
  prefix_cache<float> cache(pool);
  const std::vector<token_id> x{1, 2, 3, 4};
  table_t a = make_table(pool, x);
  cache.insert(a, x);
  const block_id cached = a.blocks()[1];
  a.truncate(3);  // rollback into a cached block, then write a different token 3
  a.append(1);
  a.token_kv(3, 0, kv_part::k)(0, 0) = 77.0f;
  EXPECT_NE(a.blocks()[1], cached);
  EXPECT_EQ(pool.block(cached, 0, kv_part::k)(0, 1, 0), 4.0f);  // the cache's copy is intact
  table_t b(pool);
  EXPECT_EQ(cache.attach(b, std::vector<token_id>{1, 2, 3, 4, 5}), 4u);
  EXPECT_EQ(b.tile(0, 1).k(0, 1, 0), 4.0f);
}

TEST(PrefixCache, Errors) {
  pool_t pool(shape, 2, 4), other(shape, 2, 4);
  prefix_cache<float> cache(pool);
  table_t a = make_table(pool, {1, 2, 3});
  table_t foreign(other);
  EXPECT_THROW(cache.insert(foreign, {}), npullm::error);
  EXPECT_THROW(cache.insert(a, std::vector<token_id>{1, 2, 3, 4}), npullm::error);
  EXPECT_THROW(cache.attach(a, std::vector<token_id>{1, 2, 3}), npullm::error);  // not empty
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
