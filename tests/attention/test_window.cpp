// Sliding-window attention reads only the window (attention_io::stats counts the keys flash
// loads), gives the double reference's results at odd sizes, and gives bit for bit what a walk
// over the whole past gives; KV that forgets what left the window (a ring cache, a block table
// with release_before) gives the same results as KV that keeps everything.
#include <gtest/gtest.h>

#include "support.hpp"

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "npullm/attention/flash.hpp"
#include "npullm/attention/reference.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"
#include "npullm/kv/ring_cache.hpp"

namespace {

using namespace npullm;
using namespace npullm::attention;
using npullm::kv::kv_part;
using npullm::kv::kv_shape;
using npullm::kv::kv_tile;

// A mask without first_visible_key: flash walks every tile from the start, as it did before
// the hint existed. Results must be the same bit for bit.
template <class M>
struct without_hint {
  M m;
  bool visible(std::size_t i, std::size_t j) const { return m.visible(i, j); }
  tile_visibility classify(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const {
    return m.classify(i0, i1, j0, j1);
  }
  std::size_t required_kv_length(std::size_t q_len) const { return m.required_kv_length(q_len); }
};

// Random q (q_heads, T, D) and K/V (kv_heads, total, D) for queries at positions
// [total - T, total): the last T keys are the present chunk.
struct problem {
  std::size_t q_heads, kv_heads, dim, T, total;
  tensor<float, 3> q, k, v;

  problem(std::size_t qh, std::size_t kvh, std::size_t d, std::size_t t, std::size_t n,
          std::uint64_t seed)
      : q_heads(qh),
        kv_heads(kvh),
        dim(d),
        T(t),
        total(n),
        q(qh, t, d),
        k(kvh, n, d),
        v(kvh, n, d) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto* x : {&q, &k, &v}) {
      for (std::size_t i = 0; i < x->size(); ++i) x->data()[i] = u(rng);
    }
  }
  std::size_t past() const { return total - T; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(dim)); }
  // The present chunk's K/V: keys [past, total), f32.
  kv_tile<float> present() const {
    const std::size_t stride = total * dim;
    return {kv::make_kv_view<const float>(k.data() + past() * dim, kv_heads, T, dim, stride),
            kv::make_kv_view<const float>(v.data() + past() * dim, kv_heads, T, dim, stride),
            past()};
  }
  // Writes keys [first, end) into a KV store with token_kv.
  template <class Store>
  void write(Store& s, std::size_t first, std::size_t end) const {
    for (std::size_t j = first; j < end; ++j) {
      auto kk = s.token_kv(j, 0, kv_part::k);  // (kv_heads, D)
      auto vv = s.token_kv(j, 0, kv_part::v);
      for (std::size_t h = 0; h < kv_heads; ++h) {
        for (std::size_t d = 0; d < dim; ++d) {
          kk(h, d) = from_float<typename Store::value_type>(k.view()(h, j, d));
          vv(h, d) = from_float<typename Store::value_type>(v.view()(h, j, d));
        }
      }
    }
  }
  template <class Mask>
  tensor<double, 3> reference(const Mask& mask) const {
    tensor<double, 3> out(q_heads, T, dim);
    reference_attention(q.view(), k.view(), v.view(), mask, static_cast<double>(scale()),
                        out.view());
    return out;
  }
};

double max_abs_diff(const tensor<float, 3>& a, const tensor<double, 3>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a.data()[i] - b.data()[i]));
  return m;
}
bool same_bits(const tensor<float, 3>& a, const tensor<float, 3>& b) {
  return std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

enum class source { contiguous, block16, block5 };

// Flash over the problem's past held in `src` (whole past) plus the present tile.
template <class Mask>
tensor<float, 3> run(const problem& p, source src, const Mask& mask, flash_stats* stats = nullptr) {
  tensor<float, 3> out(p.q_heads, p.T, p.dim);
  const attention_io io{p.q.view(), out.view(), {}, p.scale(), stats};
  const kv_tile<float> present = p.present();
  const kv_shape shape{1, p.kv_heads, p.dim};
  if (src == source::contiguous) {
    kv::contiguous_cache<float> cache(shape, std::max<std::size_t>(p.past(), 1));
    cache.append(p.past());
    p.write(cache, 0, p.past());
    flash_attention(io, cache, 0, &present, mask);
  } else {
    const std::size_t bs = src == source::block16 ? 16 : 5;
    kv::block_pool<float> pool(shape, bs, p.past() / bs + 2);
    kv::block_table<float> table(pool);
    table.append(p.past());
    p.write(table, 0, p.past());
    flash_attention(io, table, 0, &present, mask);
  }
  return out;
}

// Decode at position 8192 (and 8191) with window 4096, Qwen2-0.5B heads: flash reads the
// window's keys (rounded down to the 16-key grid: at most 15 more), per KV head, not the
// context's; results match the reference and the whole-past walk bit for bit.
TEST(Window, DecodeAt8kReadsOnlyTheWindow) {
  constexpr std::size_t window = 4096;
  for (std::size_t position : {8192u, 8191u}) {
    const problem p(14, 2, 64, 1, position + 1, position);
    const sliding_window mask{window, position};
    const auto ref = p.reference(mask);
    for (source src : {source::contiguous, source::block16}) {
      SCOPED_TRACE(::testing::Message()
                   << "position " << position << " source " << static_cast<int>(src));
      flash_stats stats;
      const auto out = run(p, src, mask, &stats);
      EXPECT_LE(max_abs_diff(out, ref), 1e-5);
      // Keys [first visible rounded down to 16, position]: 4097 at 8192 (first visible 4097),
      // exactly the window's 4096 at 8191 (first visible 4096).
      const std::size_t first = position + 1 - window;
      EXPECT_EQ(stats.keys_read, p.kv_heads * (position + 1 - first / 16 * 16));
      if (position == 8191) {
        EXPECT_EQ(stats.keys_read, p.kv_heads * window);
      }
      EXPECT_EQ(stats.calls, 1u);
      // The same mask without the hint reads nothing more (the skipped sub-tiles were hidden
      // anyway) and gives the same bits; a causal mask reads the whole context.
      flash_stats full;
      EXPECT_TRUE(same_bits(out, run(p, src, without_hint<sliding_window>{mask}, &full)));
      EXPECT_EQ(full.keys_read, stats.keys_read);
      flash_stats causal_stats;
      (void)run(p, src, causal{position}, &causal_stats);
      EXPECT_EQ(causal_stats.keys_read, p.kv_heads * (position + 1));
    }
  }
}

// Mistral heads (32/8, D 128), decode: the keys read stay flat as the context grows.
TEST(Window, DecodeReadsStayFlatAsTheContextGrows) {
  std::optional<std::size_t> first_reads;
  for (std::size_t position : {1024u + 3, 4096u + 3, 16384u + 3}) {
    const problem p(32, 8, 128, 1, position + 1, 3);
    flash_stats stats;
    (void)run(p, source::block16, sliding_window{512, position}, &stats);
    if (!first_reads) first_reads = stats.keys_read;
    EXPECT_EQ(stats.keys_read, *first_reads) << position;
  }
  EXPECT_LE(*first_reads, 8u * (512 + 15));
}

// Windows 1, 17, 37 x chunks T = 1, 17, 37 over pasts of several lengths and every source:
// the double reference's results, the whole-past walk's bits, and reads bounded by the
// window (each query tile of 16 rows reads at most window + 16 + 15 keys per KV head).
TEST(Window, OddSizesMatchTheReference) {
  std::uint64_t seed = 1;
  for (std::size_t window : {1u, 17u, 37u}) {
    for (std::size_t T : {1u, 17u, 37u}) {
      for (std::size_t past : {0u, 5u, 100u, 700u}) {
        const problem p(14, 2, 64, T, past + T, seed++);
        const sliding_window mask{window, past};
        const auto ref = p.reference(mask);
        for (source src : {source::contiguous, source::block16, source::block5}) {
          SCOPED_TRACE(::testing::Message() << "window " << window << " T " << T << " past " << past
                                            << " source " << static_cast<int>(src));
          flash_stats stats;
          const auto out = run(p, src, mask, &stats);
          EXPECT_LE(max_abs_diff(out, ref), 1e-5);
          EXPECT_TRUE(same_bits(out, run(p, src, without_hint<sliding_window>{mask})));
          const std::size_t q_tiles = (T + 15) / 16;
          const std::size_t grid = src == source::block5 ? 5 : 16;  // sub-tiles restart per tile
          EXPECT_LE(stats.keys_read, p.kv_heads * q_tiles * (window + 16 + 15 + grid));
        }
      }
    }
  }
}

// With padding or a window in all_of, the latest first key of the parts applies.
TEST(Window, MasksGiveTheirFirstVisibleKey) {
  static_assert(first_visible_key(sliding_window{4, 10}, 0) == 7);
  static_assert(first_visible_key(sliding_window{4, 10}, 3) == 10);
  static_assert(first_visible_key(sliding_window{40, 10}, 0) == 0);
  static_assert(first_visible_key(causal{9}, 5) == 0);
  static_assert(first_visible_key(padding::left(3, 9), 0) == 3);
  static_assert(
      first_visible_key(
          all_of<sliding_window, padding>{sliding_window{4, 10}, padding::left(8, 20)}, 0) == 8);
  static_assert(first_visible_key(without_hint<causal>{causal{3}}, 2) == 0);
  static_assert(first_visible_key(no_mask{}, 2) == 0);
}

// KV that starts after position 0 is fine when the mask hides what is gone, and an error
// naming both positions when it does not; a window of 1 needs only the present tile.
TEST(Window, KvStartingLaterNeedsAMaskThatHidesTheRest) {
  const problem p(4, 2, 64, 3, 103, 5);
  kv::contiguous_cache<float> cache(kv_shape{1, 2, 64}, 100);
  cache.append(100);
  p.write(cache, 0, 100);
  const kv_tile<float> present = p.present();
  const kv_tile<float> late = cache.range_tile(0, 64, 36);  // keys [64, 100) only
  tensor<float, 3> out(4, 3, 64);
  const attention_io io{p.q.view(), out.view(), {}, p.scale()};
  const sliding_window mask{37, 100};  // row 0 sees keys from 64
  flash_attention(io, std::span<const kv_tile<float>>(&late, 1), &present, mask);
  EXPECT_LE(max_abs_diff(out, p.reference(mask)), 1e-5);
  npullm::testing::expect_error(
      [&] {
        flash_attention(io, std::span<const kv_tile<float>>(&late, 1), &present, causal{100});
      },
      error_code::invalid_argument,
      "the KV starts at position 64 (the keys before it are gone) but the mask lets query 0 see "
      "keys from 0");
  npullm::testing::expect_error(
      [&] {
        flash_attention(io, std::span<const kv_tile<float>>(&late, 1), &present,
                        sliding_window{38, 100});
      },
      error_code::invalid_argument, "see keys from 63");
  // Window 1: each row sees only itself, so the present tile alone is the whole KV.
  flash_attention(io, std::span<const kv_tile<float>>(), &present, sliding_window{1, 100});
  EXPECT_LE(max_abs_diff(out, p.reference(sliding_window{1, 100})), 1e-5);
}

// A ring of window + step positions gives bit for bit what a contiguous cache of the whole
// sequence gives with the same window mask: decode far beyond the window and prefill chunks
// that cross the wrap, both ways a step may use it (own K/V as a present tile, or written
// into the ring first and read back from it).
TEST(Window, RingEqualsContiguousWithAWindowMask) {
  for (std::size_t window : {1u, 17u, 37u, 100u}) {
    constexpr std::size_t max_step = 37, total = 700;
    const problem all(8, 2, 64, 1, total, window);  // K/V of every position
    const kv_shape shape{1, 2, 64};
    kv::ring_cache<float> ring(shape, window, max_step);
    kv::contiguous_cache<float> full(shape, total);
    EXPECT_LE(ring.capacity(), window + max_step + 31);
    EXPECT_EQ(ring.storage_bytes(), 2 * 2 * ring.capacity() * 64 * sizeof(float));
    std::mt19937_64 rng(window);
    std::size_t pos = 0, steps = 0;
    while (pos < total) {
      // Chunks of 1..max_step rows (crossing the wrap at various offsets), then decode.
      const std::size_t n = std::min(total - pos, pos < 400 ? 1 + rng() % max_step : 1);
      problem step(8, 2, 64, n, pos + n, 1000 + pos);
      for (std::size_t h = 0; h < 2; ++h) {  // this step's K/V are the sequence's
        for (std::size_t j = 0; j < pos + n; ++j) {
          for (std::size_t d = 0; d < 64; ++d) {
            step.k.view()(h, j, d) = all.k.view()(h, j, d);
            step.v.view()(h, j, d) = all.v.view()(h, j, d);
          }
        }
      }
      const sliding_window mask{window, pos};
      const kv_tile<float> present = step.present();
      tensor<float, 3> want(8, n, 64), got(8, n, 64), got_written(8, n, 64);
      const auto past_full = full.range_tile(0, 0, pos);
      flash_attention(attention_io{step.q.view(), want.view(), {}, step.scale()},
                      std::span<const kv_tile<float>>(&past_full, pos > 0 ? 1 : 0), &present, mask);
      // Own K/V as the present tile: the past is the ring's [first_position, pos).
      const auto past_ring = ring.range_tiles(0, ring.first_position(), pos);
      flash_attention(attention_io{step.q.view(), got.view(), {}, step.scale()}, past_ring.span(),
                      &present, mask);
      ASSERT_TRUE(same_bits(want, got)) << "window " << window << " at " << pos << " n " << n;
      // Written first, read back from the ring (no present tile).
      ring.append(n);
      full.append(n);
      step.write(ring, pos, pos + n);
      step.write(full, pos, pos + n);
      tensor<float, 3> want_written(8, n, 64);
      flash_attention(attention_io{step.q.view(), want_written.view(), {}, step.scale()}, full, 0,
                      static_cast<const kv_tile<float>*>(nullptr), mask);
      flash_attention(attention_io{step.q.view(), got_written.view(), {}, step.scale()}, ring, 0,
                      static_cast<const kv_tile<float>*>(nullptr), mask);
      ASSERT_TRUE(same_bits(want_written, got_written)) << "window " << window << " at " << pos;
      if (pos > 200) {
        EXPECT_LE(max_abs_diff(got, step.reference(mask)), 1e-5);
      }
      pos += n;
      ++steps;
    }
    EXPECT_EQ(ring.length(), total);
    EXPECT_GE(ring.first_position(), total - ring.capacity());
    EXPECT_GT(steps, 250u);  // many of them decode steps past 400
  }
}

// A long generation over a block table that releases what left the window: the pool holds
// at most window / block_size + 2 blocks, and every step's output is bit for bit what the
// table that keeps everything gives.
TEST(Window, ReleasedBlocksGiveTheSameResultsWithBoundedMemory) {
  for (std::size_t bs : {16u, 5u, 1u}) {
    constexpr std::size_t window = 37, total = 600;
    const problem all(8, 2, 64, 1, total, bs);
    const kv_shape shape{1, 2, 64};
    kv::block_pool<float> small(shape, bs, window / bs + 2), big(shape, bs, total / bs + 1);
    kv::block_table<float> forgetting(small), keeping(big);
    std::size_t most = 0;
    for (std::size_t pos = 0; pos < total; ++pos) {
      forgetting.append(1);
      keeping.append(1);
      all.write(forgetting, pos, pos + 1);
      all.write(keeping, pos, pos + 1);
      problem step(8, 2, 64, 1, 1, pos);  // a fresh query per step
      const sliding_window mask{window, pos};
      tensor<float, 3> a(8, 1, 64), b(8, 1, 64);
      flash_stats reads;
      flash_attention(attention_io{step.q.view(), a.view(), {}, 0.125f, &reads}, forgetting, 0,
                      static_cast<const kv_tile<float>*>(nullptr), mask);
      flash_attention(attention_io{step.q.view(), b.view(), {}, 0.125f}, keeping, 0,
                      static_cast<const kv_tile<float>*>(nullptr), mask);
      ASSERT_TRUE(same_bits(a, b)) << "block " << bs << " position " << pos;
      ASSERT_LE(reads.keys_read, 2 * (window + 15));
      // The next query (pos + 1) sees keys from pos + 2 - window on.
      if (pos + 2 > window) forgetting.release_before(pos + 2 - window);
      most = std::max(most, small.used_count());
      ASSERT_EQ(forgetting.length(), pos + 1);
    }
    EXPECT_LE(most, window / bs + 2) << "block " << bs;
    EXPECT_EQ(keeping.tile_count(), (total + bs - 1) / bs);
    EXPECT_EQ(forgetting.first_position(), (total + 1 - window) / bs * bs);
  }
}

}  // namespace
