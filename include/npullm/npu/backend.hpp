// The backend concept: where a pipeline's functions run.
//
// A backend allocates buffers the device can read (host memory for the host backend,
// host-visible device memory for an NPU), "compiles" a function for given static or dynamic
// shapes (the host backend wraps a C++ callable; an NPU backend creates a graph), executes a
// compiled function with a bound closure (activations, KV views, one layer's weights), and
// waits. A tracer hook lets tests observe which function ran with which closure, and
// allocation statistics let them check what was allocated.
//
// Backends are chosen at compile time: a pipeline is a template over one.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace npullm::npu {

// A function's shapes: dims as the function sees them; static ones are fixed at compile time.
struct shape_desc {
  std::vector<std::size_t> dims;
  bool is_static = false;
};

struct trace_event {
  enum class kind { compile, execute };
  kind what;
  std::string function;    // the compiled function's name ("head", "body/prefill", ...)
  std::ptrdiff_t closure;  // which closure (e.g. the layer index), -1 when none
};

struct allocation_stats {
  std::size_t allocations = 0;
  std::size_t bytes = 0;    // total ever allocated
  std::size_t largest = 0;  // the largest single allocation
};

using tracer = std::function<void(const trace_event&)>;

// One buffer a function reads or writes, as a device graph's argument: activations, KV storage,
// one layer's weights. A backend that binds graph arguments needs them in memory it allocated.
struct argument {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
using arguments = std::span<const argument>;

// What every backend keeps for tests: the tracer and the allocation statistics.
class backend_hooks {
 public:
  void set_tracer(tracer t) { tracer_ = std::move(t); }
  [[nodiscard]] allocation_stats stats() const noexcept { return stats_; }

 protected:
  void trace(const trace_event& e) const {
    if (tracer_) tracer_(e);
  }
  void record(std::size_t bytes) noexcept {
    ++stats_.allocations;
    stats_.bytes += bytes;
    if (bytes > stats_.largest) stats_.largest = bytes;
  }

 private:
  tracer tracer_;
  allocation_stats stats_;
};

namespace detail {
// A closure and a callable of the kind a pipeline compiles (std::function over its closure).
struct probe_closure {};
using probe_fn = std::function<void(const probe_closure&)>;
}  // namespace detail

// Everything a pipeline calls on its backend B:
//   B::allocator_type<T>, b.allocator<T>()  allocator policy for storage the device reads (KV)
//   B::buffer<T, Rank>, b.allocate<T>(n), b.allocate<T, Rank>(shape)   activations, weights
//   B::device_memory                 true when weights must be copied into allocate()d memory
//   B::function<Fn>, b.compile(name, shape, fn)   a compiled head / body / tail
//   b.execute(f, closure, id, args)  runs f(closure); args are the buffers it touches
//   b.wait(), b.set_tracer(t), b.stats()
template <class B>
concept backend = std::movable<B> &&
    requires(B& b, const B& cb, std::string name, shape_desc shape, tracer t,
             const typename B::template function<detail::probe_fn>& f, arguments args,
             std::array<std::size_t, 2> shape2) {
  typename B::template allocator_type<float>;
  typename B::template buffer<float, 2>;
  { B::device_memory } -> std::convertible_to<bool>;
  { b.template allocator<float>() } -> std::same_as<typename B::template allocator_type<float>>;
  { b.template allocate<float>(std::size_t{}) };
  { b.template allocate<float, 2>(shape2) } -> std::convertible_to<typename B::template buffer<float, 2>>;
  {
    b.compile(name, shape, detail::probe_fn{})
    } -> std::same_as<typename B::template function<detail::probe_fn>>;
  b.execute(f, detail::probe_closure{}, std::ptrdiff_t{}, args);
  b.wait();
  b.set_tracer(t);
  { cb.stats() } -> std::convertible_to<allocation_stats>;
};

}  // namespace npullm::npu
