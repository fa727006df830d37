// Threading policies for kernels.
//
// A kernel takes a policy and calls `policy.parallel_for(n, fn)`: fn(i) runs once for every
// i in [0, n), possibly on several threads, and parallel_for returns when all have finished.
//   serial            runs everything on the calling thread (tests; engines that own threads)
//   thread_pool       a pool whose size the user sets; the calling thread takes part
//   pool_policy       a pool if one is given, else serial (a pipeline's option)
// Kernels must split work so that results do not depend on which thread runs which index:
// they may depend on the partition (the thread count), never on timing.
//
// Thread safety: one thread_pool runs one parallel_for at a time; concurrent callers are
// serialized. A parallel_for called from inside one of the pool's own tasks runs serially on
// that thread (no deadlock, no oversubscription). An exception thrown by fn is rethrown to the
// caller after every started index has finished; indices not yet started are skipped.
//
// Construction: a pool whose workers cannot all be started (the system refuses a thread, or a
// count no vector can hold) stops and joins the workers it started and throws npullm::error
// (resource; invalid_argument for 0 threads) naming the count asked for and how many started;
// no thread is left running and std::terminate is never reached. A thread_launcher (how each
// worker is started: a name, an affinity, a stack size) may be given; the default is
// std::thread.
#pragma once

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"

namespace npullm {

// fn(i) for i in [0, n); concurrency() says how many threads may run at once.
template <class P>
concept threading_policy = requires(const P& p, void (*fn)(std::size_t)) {
  { p.concurrency() } -> std::convertible_to<std::size_t>;
  p.parallel_for(std::size_t{}, fn);
};

struct serial {
  [[nodiscard]] static constexpr std::size_t concurrency() noexcept { return 1; }
  template <class Fn>
  static void parallel_for(std::size_t n, Fn&& fn) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
  }
};

// Starts worker `index` (1 .. threads - 1) running `body` on a new thread and returns it. It may
// throw (std::system_error, as std::thread does when the system refuses a thread) and must
// then not have started body.
using thread_launcher = std::function<std::thread(std::size_t index, std::function<void()> body)>;

class thread_pool {
 public:
  // threads == total threads taking part, the caller included (threads - 1 workers).
  explicit thread_pool(std::size_t threads)
      : thread_pool(threads, [](std::size_t, std::function<void()> body) {
          return std::thread(std::move(body));
        }) {}
  // Each worker started by launch (see thread_launcher).
  thread_pool(std::size_t threads, const thread_launcher& launch) {
    if (threads == 0) raise(error_code::invalid_argument, "thread_pool: 0 threads");
    if (!launch) raise(error_code::invalid_argument, "thread_pool: an empty thread_launcher");
    // The destructor does not run for a constructor that throws: each failure below stops and
    // joins the workers already started first, or their std::thread destructors would call
    // std::terminate.
    try {
      workers_.reserve(threads - 1);
      for (std::size_t t = 1; t < threads; ++t) {
        std::thread w = launch(t, [this] { worker_loop(); });
        if (!w.joinable()) {
          raise(error_code::invalid_argument, "thread_pool: the launcher returned no thread for ",
                "worker ", t, " of ", threads - 1, " (", t - 1, " started before; stopped again)");
        }
        workers_.push_back(std::move(w));  // reserved: cannot throw
      }
    } catch (const std::system_error& e) {
      refuse(threads, e.what());
    } catch (const std::length_error& e) {
      refuse(threads, e.what());
    } catch (...) {
      stop_workers();  // std::bad_alloc, npullm::error (the launcher's or the one above), or
      throw;           // whatever else the launcher throws goes on as it is
    }
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() { stop_workers(); }

  [[nodiscard]] std::size_t concurrency() const noexcept { return workers_.size() + 1; }

  template <class Fn>
  void parallel_for(std::size_t n, Fn&& fn) const {
    if (n == 0) return;
    if (n == 1 || workers_.empty() || current_pool() == this) {
      for (std::size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    std::lock_guard lock(run_mutex_);
    using F = std::remove_reference_t<Fn>;
    job_.fn = const_cast<void*>(static_cast<const void*>(&fn));
    job_.call = [](void* f, std::size_t i) { (*static_cast<F*>(f))(i); };
    job_.n = n;
    job_.next.store(0, std::memory_order_relaxed);
    job_.failed.store(false, std::memory_order_relaxed);
    job_.error = nullptr;
    pending_.store(workers_.size(), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);  // publishes job_
    generation_.notify_all();

    run_job();
    // Wait until every worker has left the job, so job_ and fn may go out of scope.
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin > spin_limit) {
        const std::size_t p = pending_.load(std::memory_order_acquire);
        if (p != 0) pending_.wait(p, std::memory_order_acquire);
      }
    }
    if (job_.error) std::rethrow_exception(job_.error);
  }

 private:
  static constexpr int spin_limit = 1 << 14;

  struct job {
    void* fn = nullptr;
    void (*call)(void*, std::size_t) = nullptr;
    std::size_t n = 0;
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::exception_ptr error;
  };

  // Wakes every worker to leave its loop and joins them all (nothing else runs then).
  void stop_workers() noexcept {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  [[noreturn]] void refuse(std::size_t threads, const char* why) {
    const std::size_t started = workers_.size();
    stop_workers();
    raise(error_code::resource, "thread_pool: ", threads, " threads requested (", threads - 1,
          " workers besides the caller); ", started,
          " workers had started when starting the next failed (stopped and joined again): ", why);
  }

  static const thread_pool*& current_pool() noexcept {
    thread_local const thread_pool* pool = nullptr;
    return pool;
  }

  // Takes indices one at a time until none are left (dynamic: a slow thread takes fewer).
  void run_job() const {
    const thread_pool* outer = std::exchange(current_pool(), this);
    for (;;) {
      const std::size_t i = job_.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= job_.n || job_.failed.load(std::memory_order_relaxed)) break;
      try {
        job_.call(job_.fn, i);
      } catch (...) {
        std::lock_guard lock(job_.error_mutex);
        if (!job_.error) job_.error = std::current_exception();
        job_.failed.store(true, std::memory_order_relaxed);
      }
    }
    current_pool() = outer;
  }

  void worker_loop() const {
    // Generation 0 is the one before any job: a worker that starts late must still see the
    // first job as new.
    std::uint64_t seen = 0;
    for (;;) {
      for (int spin = 0; generation_.load(std::memory_order_acquire) == seen; ++spin) {
        if (spin > spin_limit) generation_.wait(seen, std::memory_order_acquire);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      run_job();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  mutable std::mutex run_mutex_;
  mutable job job_;
  mutable std::atomic<std::uint64_t> generation_{0};
  mutable std::atomic<std::size_t> pending_{0};
  std::atomic<bool> stop_{false};
};

// A threading policy over an optional pool: the pool's threads, or serial when there is none
// (what a pipeline holds: its options name a pool or nullptr).
struct pool_policy {
  const thread_pool* pool = nullptr;
  [[nodiscard]] std::size_t concurrency() const noexcept { return pool ? pool->concurrency() : 1; }
  template <class Fn>
  void parallel_for(std::size_t n, Fn&& fn) const {
    if (pool)
      pool->parallel_for(n, std::forward<Fn>(fn));
    else
      serial::parallel_for(n, fn);
  }
};

static_assert(threading_policy<serial>);
static_assert(threading_policy<thread_pool>);
static_assert(threading_policy<pool_policy>);

// Splits [0, n) into `parts` contiguous chunks of near-equal size; chunk k is
// [chunk_begin(n, parts, k), chunk_begin(n, parts, k + 1)). Deterministic for given n, parts.
constexpr std::size_t chunk_begin(std::size_t n, std::size_t parts, std::size_t k) noexcept {
  return n / parts * k + (k < n % parts ? k : n % parts);
}

}  // namespace npullm
