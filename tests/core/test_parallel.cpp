// thread_pool and the other threading policies: every index once, reuse, several threads at
// once, exceptions, nesting, concurrent callers; and construction that fails part way (a
// launcher that refuses the k-th worker, a count no vector holds, the system refusing threads
// under RLIMIT_NPROC) leaves no thread running and throws npullm::error, never terminates.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "npullm/core/parallel.hpp"
#include "support.hpp"

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

// ---- construction that fails part way ---------------------------------------------------------

using npullm::error_code;
using npullm::testing::expect_error;

// The threads of this process, from /proc/self/task (Linux). A joined thread's entry may
// linger for a moment after join returns (the kernel reaps it just after waking the joiner), so
// settled_threads waits, bounded, for the count to come down to `want`.
std::size_t threads_now() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}
std::size_t settled_threads(std::size_t want) {
  std::size_t n = threads_now();
  for (int i = 0; i < 2000 && n != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = threads_now();
  }
  return n;
}

// A launcher that starts workers through std::thread, counting the bodies that began and
// returned, and fails worker `fail_at` the way `fail` says.
struct counting_launcher {
  std::atomic<int> began{0}, returned{0};
  std::vector<std::size_t> asked;
  npullm::thread_launcher with(std::size_t fail_at, auto fail) {
    return [this, fail_at, fail](std::size_t index, std::function<void()> body) {
      asked.push_back(index);
      if (index == fail_at) return fail();
      return std::thread([this, body = std::move(body)] {
        began.fetch_add(1);
        body();
        returned.fetch_add(1);
      });
    };
  }
};

TEST(ParallelConstruction, TheLauncherStartsEachWorker) {
  counting_launcher l;
  {
    npullm::thread_pool pool(4, l.with(0, [] { return std::thread(); }));
    EXPECT_EQ(pool.concurrency(), 4u);
    expect_each_index_once(pool, 100);
    EXPECT_EQ(l.asked, (std::vector<std::size_t>{1, 2, 3}));
  }
  EXPECT_EQ(l.began.load(), 3);
  EXPECT_EQ(l.returned.load(), 3);
}

// The system refuses worker 3 of 7 (std::thread throws std::system_error): the two started are
// stopped and joined, and the error says how many were asked for and how many had started.
TEST(ParallelConstruction, AWorkerTheSystemRefusesStopsTheStartedOnes) {
  const std::size_t before = threads_now();
  counting_launcher l;
  const auto refuse = []() -> std::thread {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "test: no more threads");
  };
  expect_error([&] { npullm::thread_pool pool(8, l.with(3, refuse)); }, error_code::resource,
               "thread_pool: 8 threads requested (7 workers besides the caller); 2 workers had "
               "started when starting the next failed (stopped and joined again): test: no more "
               "threads");
  EXPECT_EQ(l.asked, (std::vector<std::size_t>{1, 2, 3}));
  // Joined: both bodies ran to their end; none is running.
  EXPECT_EQ(l.began.load(), 2);
  EXPECT_EQ(l.returned.load(), 2);
  EXPECT_EQ(settled_threads(before), before);
  // The first worker refused: nothing started, nothing to stop.
  counting_launcher first;
  expect_error([&] { npullm::thread_pool pool(3, first.with(1, refuse)); }, error_code::resource,
               "3 threads requested (2 workers besides the caller); 0 workers had started");
  EXPECT_EQ(first.began.load(), 0);
}

// A launcher that returns no thread, or throws something else: the started workers are
// stopped too, and the exception is the launcher's (or invalid_argument for no thread).
TEST(ParallelConstruction, OtherLauncherFailuresStopTheStartedOnes) {
  const std::size_t before = threads_now();
  counting_launcher none;
  expect_error([&] { npullm::thread_pool pool(5, none.with(2, [] { return std::thread(); })); },
               error_code::invalid_argument,
               "the launcher returned no thread for worker 2 of 4 (1 started before");
  EXPECT_EQ(none.returned.load(), 1);
  counting_launcher oom;
  EXPECT_THROW(npullm::thread_pool(5, oom.with(4, []() -> std::thread { throw std::bad_alloc(); })),
               std::bad_alloc);
  EXPECT_EQ(oom.began.load(), 3);
  EXPECT_EQ(oom.returned.load(), 3);
  EXPECT_EQ(settled_threads(before), before);
  expect_error([] { npullm::thread_pool pool(2, npullm::thread_launcher{}); },
               error_code::invalid_argument, "an empty thread_launcher");
}

// A count no vector of threads can hold (what `npullm_run -t -1` once asked for): refused with
// the count, not a bare std::length_error from vector::reserve.
TEST(ParallelConstruction, AnImpossibleCountIsAResourceError) {
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  expect_error([&] { npullm::thread_pool pool(huge); }, error_code::resource,
               std::to_string(huge) + " threads requested (" + std::to_string(huge - 1) +
                   " workers besides the caller); 0 workers had started");
}

// The real thing: std::thread itself failing. RLIMIT_NPROC 1 makes the system refuse every new
// thread of a user that already runs a process, deterministically, but root ignores it, so
// the child process gives up root (becomes nobody, 65534) first; where it cannot, the test is
// skipped. Run in a child so the limit and the identity stay there.
TEST(ParallelConstruction, TheSystemRefusingThreadsIsAResourceError) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit one{1, 1};
    if (::setrlimit(RLIMIT_NPROC, &one) != 0) ::_exit(10);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(77);
    try {
      npullm::thread_pool pool(4);
      std::fprintf(stderr, "thread_pool(4) started %zu threads under RLIMIT_NPROC 1\n",
                   pool.concurrency());
      ::_exit(11);
    } catch (const npullm::error& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "child: %s\n", what.c_str());
      if (e.code() != error_code::resource) ::_exit(12);
      if (what.find("4 threads requested (3 workers besides the caller); 0 workers had started") ==
          std::string::npos)
        ::_exit(13);
      if (threads_now() != 1) ::_exit(14);
      ::_exit(0);
    } catch (...) {
      ::_exit(15);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died (std::terminate?), status " << status;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot leave root, which RLIMIT_NPROC spares";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's line above; 11: no refusal, 12: wrong "
                                       "code, 13: wrong message, 14: a thread still running";
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
