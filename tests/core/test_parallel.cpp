#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "npullm/core/parallel.hpp"

namespace {

template <class Policy>
void expect_each_index_once(const Policy& policy, std::size_t n) {
  std::vector<std::atomic<int>> hits(n);
  policy.parallel_for(n, [&](std::size_t i) { hits[i].fetch_add(1); });
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
}

TEST(Parallel, SerialVisitsEachIndexOnce) {
  for (std::size_t n : {0, 1, 17, 1000}) expect_each_index_once(npullm::serial{}, n);
}

TEST(Parallel, PoolVisitsEachIndexOnce) {
  for (std::size_t threads : {1, 2, 3, 4}) {
    npullm::thread_pool pool(threads);
    EXPECT_EQ(pool.concurrency(), threads);
    for (std::size_t n : {0, 1, 2, 17, 1000}) expect_each_index_once(pool, n);
  }
}

TEST(Parallel, PoolReusedManyTimes) {
  npullm::thread_pool pool(3);
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round) {
    pool.parallel_for(8, [&](std::size_t i) { sum.fetch_add(static_cast<long>(i)); });
  }
  EXPECT_EQ(sum.load(), 2000L * 28);
}

TEST(Parallel, UsesSeveralThreads) {
  npullm::thread_pool pool(2);
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  // Each task waits for the other to arrive (bounded), so two must run at once.
  pool.parallel_for(2, [&](std::size_t) {
    const int now = inside.fetch_add(1) + 1;
    int seen = max_inside.load();
    while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
    }
    for (int spin = 0; spin < 2'000'000 && inside.load() < 2; ++spin) std::this_thread::yield();
    inside.fetch_sub(1);
  });
  EXPECT_EQ(max_inside.load(), 2);
}

TEST(Parallel, ExceptionReachesCaller) {
  npullm::thread_pool pool(2);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](std::size_t i) {
                                   if (i == 37) throw std::runtime_error("task 37");
                                 }),
               std::runtime_error);
  expect_each_index_once(pool, 50);  // still usable
}

TEST(Parallel, NestedCallRunsSerially) {
  npullm::thread_pool pool(2);
  std::atomic<int> total{0};
  pool.parallel_for(
      4, [&](std::size_t) { pool.parallel_for(5, [&](std::size_t) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 20);
}

TEST(Parallel, ConcurrentCallersAreSerialized) {
  npullm::thread_pool pool(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        pool.parallel_for(10, [&](std::size_t) { total.fetch_add(1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 200 * 10);
}

TEST(Parallel, ZeroThreadsIsAnError) {
  EXPECT_THROW(npullm::thread_pool(0), npullm::error);
}

TEST(Parallel, ChunksCoverTheRange) {
  for (std::size_t n : {0, 1, 17, 37, 100}) {
    for (std::size_t parts : {1, 2, 3, 7}) {
      EXPECT_EQ(npullm::chunk_begin(n, parts, 0), 0u);
      EXPECT_EQ(npullm::chunk_begin(n, parts, parts), n);
      for (std::size_t k = 0; k < parts; ++k) {
        const std::size_t size =
            npullm::chunk_begin(n, parts, k + 1) - npullm::chunk_begin(n, parts, k);
        EXPECT_TRUE(size == n / parts || size == n / parts + 1);
      }
    }
  }
}

}  // namespace
