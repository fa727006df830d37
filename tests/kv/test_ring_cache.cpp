// ring_cache: a sliding-window layer's KV in window-sized memory. Positions stay absolute,
// writes wrap, tiles (at most two) carry absolute positions; errors name the values.
// (Attention over a ring against a contiguous cache: tests/attention/test_window.cpp.)
#include <gtest/gtest.h>

#include "support.hpp"

#include "npullm/kv/ring_cache.hpp"

namespace {

using namespace npullm::kv;
using npullm::error_code;
using npullm::testing::expect_error;

static_assert(kv_source<ring_cache<npullm::bfloat16>>);

constexpr kv_shape shape{2, 2, 4};

float value(std::size_t pos, std::size_t layer, std::size_t h) {
  return static_cast<float>(pos * 8 + layer * 2 + h);
}

void write(ring_cache<float>& r, std::size_t first, std::size_t end) {
  for (std::size_t p = first; p < end; ++p) {
    for (std::size_t layer = 0; layer < shape.layers; ++layer) {
      auto k = r.token_kv(p, layer, kv_part::k);  // (kv_heads, head_dim)
      auto v = r.token_kv(p, layer, kv_part::v);
      for (std::size_t h = 0; h < shape.kv_heads; ++h) {
        k(h, 1) = value(p, layer, h);
        v(h, 3) = -value(p, layer, h);
      }
    }
  }
}

// Every held position reads back through the tiles, in order, at its absolute position.
void check_tiles(const ring_cache<float>& r) {
  for (std::size_t layer = 0; layer < shape.layers; ++layer) {
    std::size_t pos = r.first_position();
    for (std::size_t i = 0; i < r.tile_count(); ++i) {
      const kv_tile<float> t = r.tile(layer, i);
      ASSERT_EQ(t.position, pos);
      for (std::size_t j = 0; j < t.length(); ++j, ++pos) {
        for (std::size_t h = 0; h < shape.kv_heads; ++h) {
          ASSERT_EQ(t.k(h, j, 1), value(pos, layer, h)) << "position " << pos;
          ASSERT_EQ(t.v(h, j, 3), -value(pos, layer, h));
        }
      }
    }
    ASSERT_EQ(pos, r.length());
  }
}

TEST(RingCache, CapacityIsTheWindowPlusAStepOnTheSixteenGrid) {
  ring_cache<float> r(shape, 37, 17);
  EXPECT_EQ(r.capacity(), 80u);  // round_up(37 + 17, 16) + 16
  EXPECT_EQ(ring_cache<float>::capacity_for(4096, 1), 4128u);
  EXPECT_EQ(r.storage_bytes(), shape.layers * 2 * shape.kv_heads * 80 * 4 * sizeof(float));
  EXPECT_EQ(r.window(), 37u);
  EXPECT_EQ(r.max_step(), 17u);
  EXPECT_EQ(r.tile_count(), 0u);
}

TEST(RingCache, WritesWrapAndTilesStayAbsolute) {
  ring_cache<float> r(shape, 37, 17);  // capacity 80
  std::size_t steps = 0;
  while (r.length() < 1000) {
    const std::size_t n = 1 + (steps * 7) % 17;
    const std::size_t first = r.append(n);
    EXPECT_EQ(first + n, r.length());
    write(r, first, first + n);
    check_tiles(r);
    // Held: the newest step's rows and the window before its first row, at most the capacity.
    if (r.first_position() > 0) {
      EXPECT_LE(r.first_position() + 37 + n, r.length() + 1);
    }
    EXPECT_LE(r.length() - r.first_position(), r.capacity());
    EXPECT_EQ(r.first_position() % 16, 0u);
    EXPECT_LE(r.tile_count(), 2u);
    ++steps;
  }
  // Two tiles once the held positions cross a multiple of the capacity.
  bool saw_two = false;
  for (std::size_t n = 0; n < 80 && !saw_two; ++n) {
    r.append(1);
    write(r, r.length() - 1, r.length());
    saw_two = r.tile_count() == 2;
    check_tiles(r);
  }
  EXPECT_TRUE(saw_two);
  const auto t = r.range_tiles(1, r.length() - 40, r.length());
  std::size_t covered = 0;
  for (const auto& tile : t.span()) {
    EXPECT_EQ(tile.position, r.length() - 40 + covered);
    covered += tile.length();
  }
  EXPECT_EQ(covered, 40u);
}

TEST(RingCache, TruncateBackWithinWhatItHolds) {
  ring_cache<float> r(shape, 20, 4);  // capacity 48
  for (std::size_t i = 0; i < 30; ++i) {
    const std::size_t first = r.append(4);
    write(r, first, first + 4);
  }
  const std::size_t first = r.first_position();
  EXPECT_EQ(first, 80u);  // 120 - 48 = 72, rounded up to 80
  r.truncate(100);        // speculative rollback
  EXPECT_EQ(r.length(), 100u);
  EXPECT_EQ(r.first_position(), first);
  check_tiles(r);
  const std::size_t again = r.append(3);  // overwrite 100..102 again
  write(r, again, again + 3);
  check_tiles(r);
  expect_error([&] { r.truncate(79); }, error_code::out_of_range,
               "truncate to 79 tokens, but the ring holds only positions from 80 (window 20, "
               "capacity 48)");
  expect_error([&] { r.truncate(104); }, error_code::out_of_range,
               "truncate to 104 tokens, length is 103");
  EXPECT_EQ(r.length(), 103u);
  expect_error([&] { (void)r.append(5); }, error_code::capacity_exhausted,
               "a step of 5 tokens, the ring holds steps of at most 4");
  EXPECT_EQ(r.length(), 103u);
  expect_error([&] { (void)r.token_kv(79, 0, kv_part::k); }, error_code::out_of_range,
               "token 79 out of range: the ring holds [80, 103)");
  expect_error([&] { (void)r.token_kv(103, 0, kv_part::k); }, error_code::out_of_range,
               "token 103");
  expect_error([&] { (void)r.range_tiles(0, 70, 90); }, error_code::out_of_range,
               "positions [70, 90) out of range");
  r.reset();
  EXPECT_EQ(r.length(), 0u);
  EXPECT_EQ(r.first_position(), 0u);
  EXPECT_EQ(r.tile_count(), 0u);
  expect_error([] { ring_cache<float> bad(shape, 0, 4); }, error_code::invalid_argument,
               "window 0 and max_step 4 must be > 0");
}

TEST(RingCache, BufferIsTheSlotsAsADeviceBindsThem) {
  ring_cache<float> r(kv_shape{1, 2, 4}, 10, 6);  // capacity 32
  for (std::size_t i = 0; i < 10; ++i) r.append(6);
  auto buf = r.buffer(0, kv_part::v);  // (kv_heads, capacity, head_dim)
  EXPECT_EQ(buf.extent(1), 32u);
  EXPECT_EQ(&r.token_kv(59, 0, kv_part::v)(1, 2), &buf(1, 59 % 32, 2));
}

}  // namespace
