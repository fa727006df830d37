// level_zero_backend: a pipeline's functions run as graphs on an Intel NPU through Level Zero.
//
// Satisfies the backend concept of backend.hpp (selected at compile time: a pipeline's Backend
// template parameter, or -DNPULLM_BACKEND=level_zero for npu::default_backend).
//
// Start-up (the constructor): the process's runtime (zeInit once), the NPU (by ordinal or
// UUID), a context, a command queue with its fence, and the graph extension. Without a driver
// or an NPU it throws error(backend) ("no Level Zero driver found: ...", "no NPU among N
// devices [...]") and calls nothing further.
//
// Buffers (allocate, allocator<T>) come from zeMemAllocHost, so activations, KV blocks (the
// block pool's allocator policy) and weights (device_memory: the pipeline copies them in) are
// shared with the device without copies at run time.
//
// compile(name, shape, fn) keeps the function; its graph is created on the first execute, when
// the arguments are known, from the blob the caller's blob_provider returns for
// {name, shape, argument sizes} (a compiled network for that function's shapes), and
// initialized once. A function called with another argument signature (a dynamic shape) gets
// a graph per signature.
//
// execute(f, closure, id, args) binds argument 0 to the function's parameter block and
// arguments 1..n to args (each must lie in memory of this backend), records set-arguments +
// execute into a command list once per binding (the driver captures arguments at append, so a
// binding is recorded once and replayed: one list per layer for a body function), submits the
// list with the fence and waits on it. The parameter block lets a host-function graph (the
// software NPU of the tests) call fn(closure); see level_zero/host_function.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/npu/backend.hpp"
#include "npullm/npu/level_zero/command_list.hpp"
#include "npullm/npu/level_zero/command_queue.hpp"
#include "npullm/npu/level_zero/context.hpp"
#include "npullm/npu/level_zero/fence.hpp"
#include "npullm/npu/level_zero/graph.hpp"
#include "npullm/npu/level_zero/host_function.hpp"
#include "npullm/npu/level_zero/host_memory.hpp"
#include "npullm/npu/level_zero/runtime.hpp"

namespace npullm::npu {

// What a blob must implement: one pipeline function for these shapes and arguments.
struct graph_request {
  std::string function;                     // "head", "body/decode", "tail", ...
  shape_desc shape;                         // as given to compile()
  std::vector<std::size_t> argument_bytes;  // arguments 1..n (argument 0: parameter block)
};
using blob_provider = std::function<std::vector<std::uint8_t>(const graph_request&)>;

struct level_zero_options {
  level_zero::device_selector device;
  blob_provider blobs;               // required
  std::size_t max_recordings = 256;  // recorded bindings kept per graph (then recorded anew)
};

class level_zero_backend : public backend_hooks {
  // Everything with a Level Zero handle, destroyed after the last graph and buffer using it.
  struct session {
    level_zero::npu_device npu;
    level_zero::context ctx;
    level_zero::command_queue queue;
    level_zero::fence done;
    level_zero::graph_extension ext;
  };

  struct graph_entry {
    std::shared_ptr<session> keep;  // destroyed last: the context and extension table outlive us
    level_zero::graph graph;
    level_zero::host_buffer params;  // the parameter block (argument 0)
    std::map<std::vector<const void*>, level_zero::command_list> recordings;
  };
  struct compiled {
    std::map<std::vector<std::size_t>, std::unique_ptr<graph_entry>> graphs;  // by signature
  };

 public:
  template <class T>
  using allocator_type = level_zero::host_allocator<T>;
  template <class T, std::size_t Rank>
  using buffer = tensor<T, Rank, allocator_type<T>>;
  static constexpr bool device_memory = true;

  template <class Fn>
  struct function {
    std::string name;
    shape_desc shape;
    Fn fn;
    std::shared_ptr<compiled> state;
  };

  // Throws error(backend) without a driver, an NPU, or the graph extension; invalid_argument
  // without a blob provider.
  explicit level_zero_backend(level_zero_options options) : options_(std::move(options)) {
    if (!options_.blobs) {
      raise(error_code::invalid_argument, "level_zero_backend: no blob provider given");
    }
    const auto& rt = level_zero::runtime::get();
    auto s = std::make_shared<session>();
    s->npu = level_zero::select_npu(rt, options_.device);
    s->ctx = level_zero::context(s->npu.driver);
    s->queue = level_zero::command_queue(s->ctx.get(), s->npu.device);
    s->done = level_zero::fence(s->queue.get());
    s->ext = level_zero::graph_extension(s->npu.driver);
    memory_ = std::make_shared<level_zero::host_memory_registry>(s->ctx.get(), s);
    session_ = std::move(s);
  }

  template <class T>
  allocator_type<T> allocator() const noexcept {
    return allocator_type<T>(memory_);
  }
  template <class T>
  buffer<T, 1> allocate(std::size_t count) {
    return allocate<T, 1>({count});
  }
  template <class T, std::size_t Rank>
  buffer<T, Rank> allocate(const std::array<std::size_t, Rank>& shape) {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    buffer<T, Rank> b(shape, allocator<T>());
    record(n * sizeof(T));
    return b;
  }

  template <class Fn>
  function<Fn> compile(std::string name, shape_desc shape, Fn fn) {
    trace({trace_event::kind::compile, name, -1});
    return {std::move(name), std::move(shape), std::move(fn), std::make_shared<compiled>()};
  }

  template <class Fn, class Closure>
  void execute(const function<Fn>& f, Closure&& closure, std::ptrdiff_t closure_id = -1,
               arguments args = {}) {
    trace({trace_event::kind::execute, f.name, closure_id});
    if (!f.state)
      raise(error_code::invalid_argument, "level_zero_backend: ", f.name, " not compiled");
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (!memory_->contains(args[i].data, args[i].bytes)) {
        raise(error_code::invalid_argument, "level_zero_backend: argument ", i + 1, " of '", f.name,
              "' (", args[i].bytes,
              " bytes) is not in this backend's Level Zero host memory; allocate it through the "
              "backend");
      }
    }
    graph_entry& g = graph_for(f, args);
    auto& list = recording(g, args);

    using closure_type = std::remove_reference_t<Closure>;
    call_context<Fn, closure_type> call{&f.fn, &closure, args, nullptr};
    auto* block = static_cast<level_zero::host_function_block*>(g.params.data());
    block->magic = level_zero::host_function_magic;
    block->entry = &call_context<Fn, closure_type>::entry;
    block->context = &call;

    ze_command_list_handle_t h = list.get();
    try {
      session_->queue.execute(1, &h, session_->done.get());
      session_->done.wait();
    } catch (...) {
      block->context = nullptr;
      if (call.error) std::rethrow_exception(call.error);
      throw;
    }
    block->context = nullptr;
    if (call.error) std::rethrow_exception(call.error);
  }

  void wait() noexcept {}  // execute() already waited on the fence

  [[nodiscard]] const level_zero::npu_device& device() const noexcept { return session_->npu; }
  [[nodiscard]] std::uint32_t graph_extension_version() const noexcept {
    return session_->ext.version();
  }
  // Whether [p, p + bytes) lies in memory this backend allocated.
  [[nodiscard]] bool owns(const void* p, std::size_t bytes) const {
    return memory_->contains(p, bytes);
  }
  // Live zeMemAllocHost allocations of this backend (buffers, pool storage, parameter blocks).
  [[nodiscard]] std::size_t live_allocations() const { return memory_->live_allocations(); }

 private:
  // What the parameter block points the software NPU at: fn, the closure, the bound arguments.
  template <class Fn, class Closure>
  struct call_context {
    const Fn* fn;
    const Closure* closure;
    arguments expected;
    std::exception_ptr error;

    static int entry(void* ctx, const void* const* args, std::uint32_t n) {
      auto& c = *static_cast<call_context*>(ctx);
      try {
        if (n != c.expected.size() + 1) {
          raise(error_code::backend, "graph ran with ", n, " arguments, ", c.expected.size() + 1,
                " bound");
        }
        for (std::size_t i = 0; i < c.expected.size(); ++i) {
          if (args[i + 1] != c.expected[i].data) {
            raise(error_code::backend, "graph argument ", i + 1,
                  " is not the buffer this call bound (a stale recording)");
          }
        }
        (*c.fn)(*c.closure);
        return 0;
      } catch (...) {
        c.error = std::current_exception();
        return 1;
      }
    }
  };

  template <class Fn>
  graph_entry& graph_for(const function<Fn>& f, arguments args) {
    std::vector<std::size_t> signature(args.size());
    for (std::size_t i = 0; i < args.size(); ++i) signature[i] = args[i].bytes;
    auto& slot = f.state->graphs[signature];
    if (slot) return *slot;
    try {
      const auto blob = options_.blobs(graph_request{f.name, f.shape, signature});
      auto e = std::make_unique<graph_entry>();
      e->keep = session_;
      e->graph = level_zero::graph(session_->ext, session_->ctx.get(), session_->npu.device, blob);
      if (e->graph.arguments().size() != args.size() + 1) {
        raise(error_code::backend, "level_zero_backend: the graph for '", f.name, "' has ",
              e->graph.arguments().size(), " arguments, the function binds ", args.size() + 1,
              " (a parameter block and ", args.size(), " buffers)");
      }
      e->params = level_zero::host_buffer(memory_, sizeof(level_zero::host_function_block));
      new (e->params.data()) level_zero::host_function_block{};
      // Initialize once, before any execute.
      level_zero::command_list init(session_->ctx.get(), session_->npu.device);
      e->graph.append_initialize(init.get());
      init.close();
      ze_command_list_handle_t h = init.get();
      session_->queue.execute(1, &h, session_->done.get());
      session_->done.wait();
      slot = std::move(e);
    } catch (...) {
      f.state->graphs.erase(signature);
      throw;
    }
    return *slot;
  }

  level_zero::command_list& recording(graph_entry& g, arguments args) {
    std::vector<const void*> key(args.size());
    for (std::size_t i = 0; i < args.size(); ++i) key[i] = args[i].data;
    if (auto it = g.recordings.find(key); it != g.recordings.end()) return it->second;
    if (g.recordings.size() >= options_.max_recordings) g.recordings.clear();
    level_zero::command_list list(session_->ctx.get(), session_->npu.device);
    g.graph.set_argument(0, g.params.data());
    for (std::size_t i = 0; i < args.size(); ++i)
      g.graph.set_argument(static_cast<std::uint32_t>(i + 1), args[i].data);
    g.graph.append_execute(list.get());
    list.close();
    return g.recordings.emplace(std::move(key), std::move(list)).first->second;
  }

  level_zero_options options_;
  std::shared_ptr<session> session_;
  std::shared_ptr<level_zero::host_memory_registry> memory_;
};

static_assert(backend<level_zero_backend>);

}  // namespace npullm::npu
