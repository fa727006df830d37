// host_backend: the backend that is always present. Buffers are 64-byte aligned host memory,
// a compiled function is the C++ callable itself, execute calls it, wait returns at once.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <utility>

#include "npullm/core/tensor.hpp"
#include "npullm/npu/backend.hpp"

namespace npullm::npu {

class host_backend : public backend_hooks {
 public:
  template <class T>
  using allocator_type = aligned_allocator<T>;
  template <class T, std::size_t Rank>
  using buffer = tensor<T, Rank, allocator_type<T>>;
  static constexpr bool device_memory = false;  // weights stay where they are (mapped files)

  template <class T>
  allocator_type<T> allocator() const noexcept {
    return {};
  }

  template <class Fn>
  struct function {
    std::string name;
    shape_desc shape;
    Fn fn;
  };

  // A (count) buffer; recorded in stats().
  template <class T>
  tensor<T, 1> allocate(std::size_t count) {
    record(count * sizeof(T));
    return tensor<T, 1>(count);
  }
  template <class T, std::size_t Rank>
  tensor<T, Rank> allocate(const std::array<std::size_t, Rank>& shape) {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    record(n * sizeof(T));
    return tensor<T, Rank>(shape);
  }

  template <class Fn>
  function<Fn> compile(std::string name, shape_desc shape, Fn fn) {
    trace({trace_event::kind::compile, name, -1});
    return {std::move(name), std::move(shape), std::move(fn)};
  }

  // args: ignored on the host (the closure reaches its buffers directly).
  template <class Fn, class Closure>
  void execute(const function<Fn>& f, Closure&& closure, std::ptrdiff_t closure_id = -1,
               arguments /*args*/ = {}) {
    trace({trace_event::kind::execute, f.name, closure_id});
    f.fn(std::forward<Closure>(closure));
  }

  void wait() noexcept {}
};

static_assert(backend<host_backend>);

}  // namespace npullm::npu
