// Pyramid attention: variant selection, equality with the full static variant and with the
// reference at every past length, zero-copy inputs, one mask per step, the decode ladder.
#include <gtest/gtest.h>

#include "support.hpp"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "npullm/attention/pyramid.hpp"
#include "npullm/attention/reference.hpp"
#include "npullm/kv/laddered_cache.hpp"

namespace {

using namespace npullm;
using namespace npullm::attention;
using npullm::kv::kv_part;
using npullm::kv::kv_shape;
using npullm::kv::kv_tile;

using npullm::testing::expect_error;

TEST(PyramidPlan, SelectsTheSmallestVariantAtEveryBoundary) {
  for (std::size_t q : {1u, 4u, 16u}) {
    const pyramid_plan plan(q, 8 * q);
    EXPECT_EQ(plan.variant_count(), 8u);
    EXPECT_EQ(plan.max_past(), 7 * q);
    EXPECT_EQ(plan.select(0, q).index, 0u);
    for (std::size_t i = 1; i < 8; ++i) {
      EXPECT_EQ(plan.select(i * q - 1, 1).index, q == 1 ? i - 1 : i) << "q " << q << " i " << i;
      EXPECT_EQ(plan.select(i * q, 1).index, i);
      EXPECT_EQ(plan.select(i * q, q).past_capacity, i * q);
      if (i < 7) {
        EXPECT_EQ(plan.select(i * q + 1, 1).index, i + 1);
      }
    }
    expect_error([&] { (void)plan.select(7 * q + 1, 1); }, error_code::capacity_exhausted,
                 "context capacity " + std::to_string(8 * q));
  }
  const pyramid_plan plan(4, 16);
  expect_error([&] { (void)plan.select(0, 0); }, error_code::invalid_argument, "present length 0");
  expect_error([&] { (void)plan.select(0, 5); }, error_code::invalid_argument, "1..4");
  expect_error([] { pyramid_plan(4, 18); }, error_code::invalid_argument,
               "multiple of the chunk 4");
}

struct setup {
  std::size_t q, capacity, slots;  // chunk, context capacity, present slots (q or 1)
  std::size_t q_heads = 4, kv_heads = 2, dim = 16;
};

// The full mask (rows = slots, P + slots): past keys < past_len visible, present causal.
tensor<float, 2> full_mask(const setup& s, std::size_t past_len, std::size_t present_len) {
  const std::size_t past_max = s.capacity - s.q;
  tensor<float, 2> m(s.slots, past_max + s.slots);
  for (std::size_t r = 0; r < s.slots; ++r) {
    for (std::size_t j = 0; j < past_max + s.slots; ++j) {
      // Rows past present_len are padding: they see nothing.
      const bool visible = r < present_len && (j < past_max ? j < past_len : j - past_max <= r);
      m.view()(r, j) = visible ? 0.0f : -INFINITY;
    }
  }
  return m;
}

void fill(float* p, std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
}

// Runs one (past, present) step three ways and compares.
void check_step(const setup& s, std::size_t past_len, std::size_t present_len, bool blocks) {
  SCOPED_TRACE("q " + std::to_string(s.q) + " slots " + std::to_string(s.slots) + " past " +
               std::to_string(past_len) + (blocks ? " blocks" : " contiguous"));
  std::mt19937 rng(static_cast<unsigned>(past_len * 131 + s.q));
  const pyramid_plan plan(s.q, s.capacity);
  const std::size_t past_max = plan.max_past();
  const kv_shape shape{1, s.kv_heads, s.dim};

  // Past KV: every slot of the buffer random (padding included: it must be masked).
  kv::contiguous_cache<float> cache(shape, std::max<std::size_t>(past_max, 1));
  cache.append(std::max<std::size_t>(past_max, 1));
  for (kv_part part : {kv_part::k, kv_part::v}) {
    auto b = cache.buffer(0, part);
    for (std::size_t h = 0; h < s.kv_heads; ++h) fill(&b(h, 0, 0), b.extent(1) * s.dim, rng);
  }
  // A static graph binds every block up to the largest past; the mask says which keys count.
  kv::block_pool<float> pool(shape, s.q, s.capacity / s.q);
  kv::block_table<float> table(pool);
  if (past_max > 0) table.append(past_max);
  for (std::size_t j = 0; j < table.blocks().size() * s.q; ++j) {  // whole blocks, padding too
    for (kv_part part : {kv_part::k, kv_part::v}) {
      auto blk = pool.block(table.blocks()[j / s.q], 0, part);
      const auto src = cache.buffer(0, part);
      for (std::size_t h = 0; h < s.kv_heads; ++h) {
        for (std::size_t d = 0; d < s.dim; ++d) blk(h, j % s.q, d) = src(h, j, d);
      }
    }
  }
  tensor<float, 3> pk(s.kv_heads, s.slots, s.dim), pv(s.kv_heads, s.slots, s.dim),
      q(s.q_heads, s.slots, s.dim);
  fill(pk.data(), pk.size(), rng);
  fill(pv.data(), pv.size(), rng);
  fill(q.data(), q.size(), rng);
  const kv_tile<float> present{pk.view(), pv.view(), 0};
  const auto mask = full_mask(s, past_len, present_len);

  auto run = [&](const pyramid_step& step) {
    tensor<float, 3> out(s.q_heads, s.slots, s.dim);
    const attention_io io{q.view(), out.view(), {}, 0.25f};
    if (blocks) {
      const auto tiles = pyramid_past(table, 0, step);
      pyramid_attention(io, std::span<const kv_tile<float>>(tiles), present, step);
    } else {
      const kv_tile<float> past = pyramid_past(cache, 0, step);
      pyramid_attention(io, std::span<const kv_tile<float>>(&past, 1), present, step);
    }
    return out;
  };
  const pyramid_step small(plan, mask.view(), past_len, present_len);
  const pyramid_step full(plan, mask.view(), past_len, present_len,
                          plan.at(plan.variant_count() - 1));
  const auto a = run(small);
  const auto b = run(full);

  // Reference over the valid keys only: past_len past keys, then the present keys, causal.
  const std::size_t total = past_len + present_len;
  tensor<float, 3> k(s.kv_heads, total, s.dim), v(s.kv_heads, total, s.dim);
  for (std::size_t h = 0; h < s.kv_heads; ++h) {
    for (std::size_t j = 0; j < total; ++j) {
      for (std::size_t d = 0; d < s.dim; ++d) {
        k.view()(h, j, d) =
            j < past_len ? cache.buffer(0, kv_part::k)(h, j, d) : pk.view()(h, j - past_len, d);
        v.view()(h, j, d) =
            j < past_len ? cache.buffer(0, kv_part::v)(h, j, d) : pv.view()(h, j - past_len, d);
      }
    }
  }
  tensor<double, 3> ref(s.q_heads, present_len, s.dim);
  reference_attention(subview(q.view(), all, range{0, present_len}, all), k.view(), v.view(),
                      causal{past_len}, 0.25, ref.view());
  for (std::size_t h = 0; h < s.q_heads; ++h) {
    for (std::size_t i = 0; i < s.slots; ++i) {
      for (std::size_t d = 0; d < s.dim; ++d) {
        ASSERT_NEAR(a.view()(h, i, d), b.view()(h, i, d), 1e-6) << h << " " << i << " " << d;
        if (i < present_len) {
          ASSERT_NEAR(a.view()(h, i, d), ref.view()(h, i, d), 1e-5);
        } else {
          ASSERT_EQ(a.view()(h, i, d), 0.0f);  // padded query rows see nothing
        }
      }
    }
  }
}

TEST(Pyramid, EqualsFullStaticAndReferenceAtEveryPastLength) {
  for (std::size_t q : {4u, 5u, 16u}) {
    const std::size_t capacity = 4 * q;
    for (bool blocks : {false, true}) {
      for (std::size_t past = 0; past <= capacity - q; ++past) {
        check_step({q, capacity, q}, past, q, blocks);             // a full prefill chunk
        check_step({q, capacity, q}, past, 1 + past % q, blocks);  // a partial one
        check_step({q, capacity, 1}, past, 1, blocks);             // decode
      }
    }
  }
}

TEST(Pyramid, InputsAreViewsIntoTheSharedBuffers) {
  const pyramid_plan plan(8, 32);
  const kv_shape shape{2, 2, 16};
  kv::contiguous_cache<float> cache(shape, plan.max_past());
  cache.append(13);
  const setup s{8, 32, 8};
  const auto mask = full_mask(s, 13, 8);
  const pyramid_step step(plan, mask.view(), 13, 8);
  EXPECT_EQ(step.variant().index, 2u);
  const auto past = pyramid_past(cache, 1, step);
  EXPECT_EQ(past.k.data_handle(), &cache.buffer(1, kv_part::k)(0, 0, 0));
  EXPECT_EQ(past.v.data_handle(), &cache.buffer(1, kv_part::v)(0, 0, 0));
  EXPECT_EQ(past.length(), 16u);

  kv::block_pool<float> pool(shape, 8, 4);
  kv::block_table<float> table(pool);
  table.append(13);
  const auto tiles = pyramid_past(table, 1, step);
  ASSERT_EQ(tiles.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(tiles[i].k.data_handle(), pool.block(table.blocks()[i], 1, kv_part::k).data_handle());
    EXPECT_EQ(tiles[i].length(), 8u);  // whole blocks: padding is masked, not cut
  }
}

TEST(Pyramid, BadInputs) {
  const pyramid_plan plan(4, 16);
  tensor<float, 2> wrong(4, 10);
  expect_error([&] { pyramid_step(plan, wrong.view(), 0, 4); }, error_code::invalid_shape,
               "full mask has 10 columns; expected 12 past + 1..4 present");
  const auto mask = full_mask({4, 16, 4}, 9, 4);
  expect_error([&] { pyramid_step(plan, mask.view(), 9, 4, plan.at(1)); },
               error_code::invalid_argument, "cannot hold a past of 9");
  const pyramid_step step(plan, mask.view(), 9, 4);
  tensor<float, 3> pk(2, 3, 16), pv(2, 3, 16), q(4, 4, 16), out(4, 4, 16);
  kv::contiguous_cache<float> cache(kv_shape{1, 2, 16}, 12);
  const kv_tile<float> past = pyramid_past(cache, 0, step);
  expect_error(
      [&] {
        pyramid_attention(attention_io{q.view(), out.view(), {}, 1.0f},
                          std::span<const kv_tile<float>>(&past, 1),
                          kv_tile<float>{pk.view(), pv.view(), 0}, step);
      },
      error_code::invalid_shape, "3 present keys");
}

TEST(LadderedCache, GrowsKeepingEveryByteAndStopsAtTheTop) {
  const auto caps = kv::doubling_capacities(4, 2, 40);
  EXPECT_EQ(caps, (std::vector<std::size_t>{6, 10, 18, 34, 40}));
  const kv_shape shape{2, 2, 4};
  kv::laddered_cache<npullm::bfloat16> c(shape, caps, 5);
  EXPECT_EQ(c.capacity(), 6u);
  auto value = [](std::size_t pos, std::size_t layer, std::size_t part, std::size_t h,
                  std::size_t d) {
    return static_cast<float>((pos * 7 + layer * 3 + part * 5 + h * 11 + d) % 200);
  };
  for (std::size_t pos = 0; pos < 40; ++pos) {
    const std::size_t rung = c.rung();
    EXPECT_EQ(c.append(1), pos);
    if (pos == 6 || pos == 10 || pos == 18 || pos == 34) {
      EXPECT_EQ(c.rung(), rung + 1) << pos;
    }
    for (std::size_t layer = 0; layer < 2; ++layer) {
      for (std::size_t part = 0; part < 2; ++part) {
        auto t = c.cache().token_kv(pos, layer, static_cast<kv_part>(part));
        for (std::size_t h = 0; h < 2; ++h) {
          for (std::size_t d = 0; d < 4; ++d)
            t(h, d) = npullm::bfloat16(value(pos, layer, part, h, d));
        }
      }
    }
    // Every token written so far reads back, whatever rung it was written on.
    for (std::size_t p = 0; p <= pos; ++p) {
      for (std::size_t layer = 0; layer < 2; ++layer) {
        for (std::size_t part = 0; part < 2; ++part) {
          auto t = c.cache().token_kv(p, layer, static_cast<kv_part>(part));
          for (std::size_t h = 0; h < 2; ++h) {
            for (std::size_t d = 0; d < 4; ++d)
              ASSERT_EQ(static_cast<float>(t(h, d)), value(p, layer, part, h, d));
          }
        }
      }
    }
  }
  EXPECT_EQ(c.capacity(), 40u);
  expect_error([&] { c.append(1); }, error_code::capacity_exhausted, "largest capacity 40");
  EXPECT_EQ(c.length(), 40u);
  kv::laddered_cache<float> big_start(shape, caps, 20);
  EXPECT_EQ(big_start.capacity(), 34u);
  expect_error([&] { kv::laddered_cache<float>(shape, caps, 41); }, error_code::capacity_exhausted,
               "40");
}

}  // namespace
