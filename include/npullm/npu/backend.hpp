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

// A backend B also has:
//   B::allocator_type<T>             allocator policy for buffers the device reads
//   B::device_memory                 true when weights must be copied into allocate()d memory
//   b.execute(f, closure, id, args)  runs f(closure); args are the buffers it touches
template <class B>
concept backend = requires(B& b, const B& cb, std::string name, shape_desc shape, tracer t) {
  {b.compile(name, shape, [](int) {})};
  { B::device_memory } -> std::convertible_to<bool>;
  {b.template allocator<float>()};
  {b.set_tracer(t)};
  {b.wait()};
  { cb.stats() } -> std::convertible_to<allocation_stats>;
  {b.template allocate<float>(std::size_t{})};
};

}  // namespace npullm::npu
