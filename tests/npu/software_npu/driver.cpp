// The software NPU: a Level Zero driver library of npullm's own, loaded by the real Debian
// loader (libze_loader 1.8.12) through ZE_ENABLE_ALT_DRIVERS=<absolute path of this .so>.
//
// What it proves: the wrapper's and the backend's real call sequence through the loader
// (zeInit, driver and device discovery, contexts, zeMemAllocHost, queues, command lists,
// fences, the graph extension found by name and version), argument binding and error handling,
// with the real driver's rules enforced:
//   - nothing works before zeInit; destroyed or foreign handles are rejected;
//   - graph arguments are captured when the execute is appended (set-argument afterwards
//     changes nothing until the list is recorded again), must all be set, and must lie inside
//     memory this driver allocated with room for the size the graph declares;
//   - a list must be closed before it is submitted and cannot take commands once closed;
//   - a graph must be initialized (an initialize command executed) before it executes.
// What it cannot prove: NPU numerics or speed. A graph's "blob" is text naming an npullm host
// function with its argument sizes (below); executing it calls back into the process through
// the parameter block in argument 0 (npullm/npu/level_zero/host_function.hpp), so the
// arithmetic is the host's.
//
// Blob (format NATIVE):
//   npullm-software-npu 1
//   function <name>
//   argument <bytes>          one line per argument; argument 0 is the parameter block
//
// Fault injection (environment): NPULLM_SWNPU_FAIL_ALLOC=<n> makes the n-th zeMemAllocHost
// (1-based) fail with ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY; NPULLM_SWNPU_FAIL_GRAPH=1 makes graph
// creation fail with a build log; NPULLM_SWNPU_DEVICE_TYPE=gpu reports a GPU instead of an NPU.
//
// With ZE_ENABLE_LOADER_INTERCEPT=1 the loader wraps handles; extension entry points then get
// loader handles for core objects and translate them once with zelLoaderTranslateHandle.
#include <dlfcn.h>
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "npullm/npu/level_zero/graph_ext.hpp"
#include "npullm/npu/level_zero/host_function.hpp"

namespace abi = npullm::npu::level_zero::abi;

namespace {

enum class kind : std::uint32_t { driver = 1, device, context, queue, list, fence, graph };

// Every object starts with a tag, so a loader translation of a foreign pointer can be checked.
struct object {
  std::uint64_t tag = 0x6e70752d6f626a00ull;
  kind what;
  explicit object(kind k) : what(k) {}
  virtual ~object() = default;
};

struct graph_object;

struct command {
  graph_object* graph;
  bool initialize;
  std::vector<const void*> args;  // captured at append
};

struct list_object : object {
  list_object() : object(kind::list) {}
  std::vector<command> commands;
  bool closed = false;
};
struct fence_object : object {
  explicit fence_object(object* q) : object(kind::fence), queue(q) {}
  object* queue;
  bool signalled = false;
};
struct graph_object : object {
  graph_object() : object(kind::graph) {}
  std::string function;
  std::vector<std::size_t> sizes;
  std::vector<const void*> values;
  bool initialized = false;
};

struct driver_state {
  std::mutex mutex;
  bool initialized = false;
  object driver{kind::driver};
  object device{kind::device};
  std::set<const object*> live;                  // live objects
  std::vector<std::unique_ptr<object>> all;      // every object ever made (destroyed ones stay
                                                 // readable, so a stale handle is never freed
                                                 // memory)
  std::map<std::uintptr_t, std::size_t> memory;  // live host allocations
  std::size_t allocations = 0;
  std::string build_log;
  abi::graph_dditable graph_table{};
};

driver_state& state() {
  static driver_state s;
  return s;
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

template <class T>
T* make(driver_state& s, T* o) {
  s.all.emplace_back(o);
  s.live.insert(o);
  return o;
}

// The object behind h if it is one of ours, alive and of kind k.
template <class T>
T* find(driver_state& s, const void* h, kind k) {
  const auto* o = static_cast<const object*>(h);
  if (!h || !s.live.count(o) || o->what != k) return nullptr;
  return static_cast<T*>(const_cast<object*>(o));
}

// For extension entry points: our handle, or a loader handle translated once.
template <class T>
T* find_or_translate(driver_state& s, void* h, kind k, zel_handle_type_t type) {
  if (T* o = find<T>(s, h, k)) return o;
  if (!h) return nullptr;
  using translate_fn = ze_result_t (*)(zel_handle_type_t, void*, void**);
  static const auto translate =
      reinterpret_cast<translate_fn>(dlsym(RTLD_DEFAULT, "zelLoaderTranslateHandle"));
  if (!translate) return nullptr;
  void* out = nullptr;
  if (translate(type, h, &out) != ZE_RESULT_SUCCESS) return nullptr;
  return find<T>(s, out, k);
}

bool inside_memory(driver_state& s, const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.memory.upper_bound(a);
  if (it == s.memory.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

#define SWNPU_LOCK()             \
  auto& s = state();             \
  std::lock_guard lock(s.mutex); \
  if (!s.initialized) return ZE_RESULT_ERROR_UNINITIALIZED

// ---- global, driver, device ---------------------------------------------------------------

ze_result_t ZE_APICALL init(ze_init_flags_t) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.initialized = true;
  s.live.insert(&s.driver);
  s.live.insert(&s.device);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL driver_get(std::uint32_t* count, ze_driver_handle_t* drivers) {
  SWNPU_LOCK();
  if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (drivers && *count >= 1) drivers[0] = reinterpret_cast<ze_driver_handle_t>(&s.driver);
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL driver_api_version(ze_driver_handle_t h, ze_api_version_t* v) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!v) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *v = ZE_API_VERSION_1_4;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL driver_properties(ze_driver_handle_t h, ze_driver_properties_t* p) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!p) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::memset(&p->uuid, 0, sizeof p->uuid);
  std::memcpy(p->uuid.id, "npullm-swnpu-drv", 16);
  p->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL driver_extensions(ze_driver_handle_t h, std::uint32_t* count,
                                         ze_driver_extension_properties_t* props) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (props && *count >= 1) {
    std::memset(props[0].name, 0, sizeof props[0].name);
    std::strncpy(props[0].name, abi::graph_extension_name, sizeof props[0].name - 1);
    props[0].version = abi::graph_version_1_4;
  }
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL driver_extension_function(ze_driver_handle_t h, const char* name,
                                                 void** fn) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!name || !fn) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (std::strcmp(name, abi::graph_extension_name) != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  *fn = &s.graph_table;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL device_get(ze_driver_handle_t h, std::uint32_t* count,
                                  ze_device_handle_t* devices) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (devices && *count >= 1) devices[0] = reinterpret_cast<ze_device_handle_t>(&s.device);
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL device_properties(ze_device_handle_t h, ze_device_properties_t* p) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::device)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!p) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  void* next = p->pNext;
  const auto stype = p->stype;
  std::memset(p, 0, sizeof *p);
  p->stype = stype;
  p->pNext = next;
  p->type = env_is("NPULLM_SWNPU_DEVICE_TYPE", "gpu") ? ZE_DEVICE_TYPE_GPU : ZE_DEVICE_TYPE_VPU;
  std::memcpy(p->uuid.id, "npullm-swnpu-dev", 16);
  std::strncpy(p->name, "npullm software NPU", sizeof p->name - 1);
  p->numThreadsPerEU = 1;
  p->numEUsPerSubslice = 1;
  p->numSubslicesPerSlice = 1;
  p->numSlices = 1;
  p->maxMemAllocSize = std::uint64_t(1) << 34;
  return ZE_RESULT_SUCCESS;
}

// ---- context and memory ---------------------------------------------------------------------

ze_result_t ZE_APICALL context_create(ze_driver_handle_t h, const ze_context_desc_t* desc,
                                      ze_context_handle_t* out) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::driver)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *out = reinterpret_cast<ze_context_handle_t>(make(s, new object(kind::context)));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL context_destroy(ze_context_handle_t h) {
  SWNPU_LOCK();
  auto* o = find<object>(s, h, kind::context);
  if (!o) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  s.live.erase(o);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL mem_alloc_host(ze_context_handle_t h, const ze_host_mem_alloc_desc_t* desc,
                                      std::size_t size, std::size_t alignment, void** out) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::context)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  ++s.allocations;
  if (const char* n = std::getenv("NPULLM_SWNPU_FAIL_ALLOC");
      n && std::strtoull(n, nullptr, 10) == s.allocations) {
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  const std::size_t align = alignment < 64 ? 64 : alignment;
  void* p = std::aligned_alloc(align, (size + align - 1) / align * align);
  if (!p) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  s.memory[reinterpret_cast<std::uintptr_t>(p)] = size;
  *out = p;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL mem_free(ze_context_handle_t h, void* p) {
  SWNPU_LOCK();
  if (!find<object>(s, h, kind::context)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  auto it = s.memory.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.memory.end()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  s.memory.erase(it);
  std::free(p);
  return ZE_RESULT_SUCCESS;
}

// ---- queues, lists, fences ------------------------------------------------------------------

ze_result_t ZE_APICALL queue_create(ze_context_handle_t c, ze_device_handle_t d,
                                    const ze_command_queue_desc_t* desc,
                                    ze_command_queue_handle_t* out) {
  SWNPU_LOCK();
  if (!find<object>(s, c, kind::context) || !find<object>(s, d, kind::device))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *out = reinterpret_cast<ze_command_queue_handle_t>(make(s, new object(kind::queue)));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL queue_destroy(ze_command_queue_handle_t h) {
  SWNPU_LOCK();
  auto* o = find<object>(s, h, kind::queue);
  if (!o) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  s.live.erase(o);
  return ZE_RESULT_SUCCESS;
}

ze_result_t run_commands(driver_state& s, list_object& l) {
  for (auto& c : l.commands) {
    graph_object* g = c.graph;
    if (!s.live.count(g)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // graph destroyed since
    if (c.initialize) {
      g->initialized = true;
      continue;
    }
    if (!g->initialized) return ZE_RESULT_ERROR_UNINITIALIZED;
    for (std::size_t i = 0; i < c.args.size(); ++i) {
      if (!inside_memory(s, c.args[i], g->sizes[i])) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    auto* block =
        static_cast<npullm::npu::level_zero::host_function_block*>(const_cast<void*>(c.args[0]));
    if (block->magic != npullm::npu::level_zero::host_function_magic || !block->entry ||
        !block->context) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    ++block->calls;
    // The host function runs without the driver lock (it may allocate through the driver).
    s.mutex.unlock();
    const int rc =
        block->entry(block->context, c.args.data(), static_cast<std::uint32_t>(c.args.size()));
    s.mutex.lock();
    if (rc != 0) return ZE_RESULT_ERROR_UNKNOWN;
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL queue_execute(ze_command_queue_handle_t q, std::uint32_t n,
                                     ze_command_list_handle_t* lists, ze_fence_handle_t f) {
  SWNPU_LOCK();
  auto* queue = find<object>(s, q, kind::queue);
  if (!queue) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (n == 0 || !lists) return ZE_RESULT_ERROR_INVALID_SIZE;
  fence_object* fence = nullptr;
  if (f) {
    fence = find<fence_object>(s, f, kind::fence);
    if (!fence || fence->queue != queue) return ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT;
  }
  std::vector<list_object*> ls(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    ls[i] = find<list_object>(s, lists[i], kind::list);
    if (!ls[i]) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!ls[i]->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // lists are closed first
  }
  for (auto* l : ls) {
    if (const ze_result_t r = run_commands(s, *l); r != ZE_RESULT_SUCCESS) return r;
  }
  if (fence) fence->signalled = true;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL queue_synchronize(ze_command_queue_handle_t q, std::uint64_t) {
  SWNPU_LOCK();
  return find<object>(s, q, kind::queue) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

ze_result_t ZE_APICALL list_create(ze_context_handle_t c, ze_device_handle_t d,
                                   const ze_command_list_desc_t* desc,
                                   ze_command_list_handle_t* out) {
  SWNPU_LOCK();
  if (!find<object>(s, c, kind::context) || !find<object>(s, d, kind::device))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *out = reinterpret_cast<ze_command_list_handle_t>(make(s, new list_object()));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL list_destroy(ze_command_list_handle_t h) {
  SWNPU_LOCK();
  auto* l = find<list_object>(s, h, kind::list);
  if (!l) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  l->commands.clear();
  s.live.erase(l);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL list_close(ze_command_list_handle_t h) {
  SWNPU_LOCK();
  auto* l = find<list_object>(s, h, kind::list);
  if (!l) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  l->closed = true;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL list_reset(ze_command_list_handle_t h) {
  SWNPU_LOCK();
  auto* l = find<list_object>(s, h, kind::list);
  if (!l) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  l->commands.clear();
  l->closed = false;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fence_create(ze_command_queue_handle_t q, const ze_fence_desc_t* desc,
                                    ze_fence_handle_t* out) {
  SWNPU_LOCK();
  auto* queue = find<object>(s, q, kind::queue);
  if (!queue) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *out = reinterpret_cast<ze_fence_handle_t>(make(s, new fence_object(queue)));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fence_destroy(ze_fence_handle_t h) {
  SWNPU_LOCK();
  auto* f = find<fence_object>(s, h, kind::fence);
  if (!f) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  s.live.erase(f);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fence_synchronize(ze_fence_handle_t h, std::uint64_t) {
  SWNPU_LOCK();
  auto* f = find<fence_object>(s, h, kind::fence);
  if (!f) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  // Work runs at submission, so an unsignalled fence would never be signalled: report it
  // rather than hang.
  return f->signalled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

ze_result_t ZE_APICALL fence_query(ze_fence_handle_t h) {
  SWNPU_LOCK();
  auto* f = find<fence_object>(s, h, kind::fence);
  if (!f) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return f->signalled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

ze_result_t ZE_APICALL fence_reset(ze_fence_handle_t h) {
  SWNPU_LOCK();
  auto* f = find<fence_object>(s, h, kind::fence);
  if (!f) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  f->signalled = false;
  return ZE_RESULT_SUCCESS;
}

// ---- the graph extension --------------------------------------------------------------------

bool parse_blob(const std::uint8_t* data, std::size_t size, graph_object& g, std::string& log) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (n == 1) {
      int version = 0;
      if (key != "npullm-software-npu" || !(words >> version) || version != 1) {
        log = "line 1: not an npullm software NPU blob (expected 'npullm-software-npu 1')";
        return false;
      }
    } else if (key == "function") {
      words >> g.function;
    } else if (key == "argument") {
      std::size_t bytes = 0;
      if (!(words >> bytes) || bytes == 0) {
        log = "line " + std::to_string(n) + ": an argument needs a size in bytes";
        return false;
      }
      g.sizes.push_back(bytes);
    } else {
      log = "line " + std::to_string(n) + ": unknown directive '" + key + "'";
      return false;
    }
  }
  if (n == 0) {
    log = "empty blob";
    return false;
  }
  if (g.function.empty()) {
    log = "the blob names no function";
    return false;
  }
  if (g.sizes.empty() || g.sizes[0] < sizeof(npullm::npu::level_zero::host_function_block)) {
    log = "argument 0 must be a parameter block of at least " +
          std::to_string(sizeof(npullm::npu::level_zero::host_function_block)) + " bytes";
    return false;
  }
  return true;
}

ze_result_t ZE_APICALL graph_create(ze_context_handle_t c, ze_device_handle_t d,
                                    const abi::graph_desc* desc, abi::graph_handle* out) {
  SWNPU_LOCK();
  if (!find_or_translate<object>(s, c, kind::context, ZEL_HANDLE_CONTEXT) ||
      !find_or_translate<object>(s, d, kind::device, ZEL_HANDLE_DEVICE))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc || !out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  s.build_log.clear();
  if (desc->stype != abi::stype_graph_desc) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (desc->format != abi::format_native) {
    s.build_log = "the software NPU compiles nothing: only NATIVE blobs are accepted";
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  if (env_is("NPULLM_SWNPU_FAIL_GRAPH", "1")) {
    s.build_log = "injected fault (NPULLM_SWNPU_FAIL_GRAPH=1): graph creation refused";
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  if (!desc->input || desc->input_size == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
  auto g = std::make_unique<graph_object>();
  if (!parse_blob(desc->input, desc->input_size, *g, s.build_log))
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  g->values.assign(g->sizes.size(), nullptr);
  *out = reinterpret_cast<abi::graph_handle>(make(s, g.release()));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL graph_destroy(abi::graph_handle h) {
  SWNPU_LOCK();
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  s.live.erase(g);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL graph_properties(abi::graph_handle h, abi::graph_properties* p) {
  SWNPU_LOCK();
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!p) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->num_graph_args = static_cast<std::uint32_t>(g->sizes.size());
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL graph_argument_properties(abi::graph_handle h, std::uint32_t i,
                                                 abi::argument_properties* p) {
  SWNPU_LOCK();
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!p) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (i >= g->sizes.size()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  const auto stype = p->stype;
  void* next = p->next;
  std::memset(p, 0, sizeof *p);
  p->stype = stype;
  p->next = next;
  std::snprintf(p->name, sizeof p->name, "%s",
                i == 0 ? "parameters" : ("arg" + std::to_string(i)).c_str());
  p->type = abi::argument_input;
  for (auto& d : p->dims) d = 1;
  p->dims[0] = static_cast<std::uint32_t>(g->sizes[i]);
  p->network_precision = p->device_precision = abi::precision_uint8;
  p->network_layout = p->device_layout = abi::layout_c;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL graph_set_argument(abi::graph_handle h, std::uint32_t i, const void* v) {
  SWNPU_LOCK();
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (i >= g->sizes.size()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (!v) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  g->values[i] = v;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL append_initialize(ze_command_list_handle_t lh, abi::graph_handle h,
                                         ze_event_handle_t, std::uint32_t, ze_event_handle_t*) {
  SWNPU_LOCK();
  auto* l = find_or_translate<list_object>(s, lh, kind::list, ZEL_HANDLE_COMMAND_LIST);
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!l || !g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  l->commands.push_back({g, true, {}});
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL append_execute(ze_command_list_handle_t lh, abi::graph_handle h,
                                      abi::profiling_query_handle, ze_event_handle_t, std::uint32_t,
                                      ze_event_handle_t*) {
  SWNPU_LOCK();
  auto* l = find_or_translate<list_object>(s, lh, kind::list, ZEL_HANDLE_COMMAND_LIST);
  auto* g = find<graph_object>(s, h, kind::graph);
  if (!l || !g) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  for (std::size_t i = 0; i < g->values.size(); ++i) {
    if (!g->values[i]) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // every argument set
    if (!inside_memory(s, g->values[i], g->sizes[i])) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  l->commands.push_back({g, false, g->values});  // captured now
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL graph_native_binary(abi::graph_handle h, std::size_t* size, std::uint8_t*) {
  SWNPU_LOCK();
  if (!find<graph_object>(s, h, kind::graph)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!size) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *size = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL device_graph_properties(ze_device_handle_t d,
                                               abi::device_graph_properties* p) {
  SWNPU_LOCK();
  if (!find_or_translate<object>(s, d, kind::device, ZEL_HANDLE_DEVICE))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!p) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->graph_extension_version = abi::graph_version_1_4;
  p->compiler = {0, 0};
  p->formats_supported = abi::format_native;
  p->max_opset_version = 0;
  return ZE_RESULT_SUCCESS;
}

// The log of the last failed creation (any graph handle, or null).
ze_result_t ZE_APICALL build_log(abi::graph_handle, std::uint32_t* size, char* log) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (!size) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const auto need = static_cast<std::uint32_t>(s.build_log.size() + 1);
  if (!log) {
    *size = need;
    return ZE_RESULT_SUCCESS;
  }
  const std::uint32_t n = *size < need ? *size : need;
  if (n == 0) return ZE_RESULT_SUCCESS;
  std::memcpy(log, s.build_log.c_str(), n - 1);
  log[n - 1] = '\0';
  return ZE_RESULT_SUCCESS;
}

struct table_setup {
  table_setup() {
    auto& t = state().graph_table;
    t.create = graph_create;
    t.destroy = graph_destroy;
    t.get_properties = graph_properties;
    t.get_argument_properties = graph_argument_properties;
    t.set_argument_value = graph_set_argument;
    t.append_graph_initialize = append_initialize;
    t.append_graph_execute = append_execute;
    t.get_native_binary = graph_native_binary;
    t.device_get_graph_properties = device_graph_properties;
    t.build_log_get_string = build_log;
  }
} const setup_graph_table;

// ---- the tables the loader asks for -------------------------------------------------------

template <class Table>
ze_result_t fill(ze_api_version_t version, Table* t) {
  if (!t) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ZE_MAJOR_VERSION(version) != 1) return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
  *t = {};
  return ZE_RESULT_SUCCESS;
}

}  // namespace

#define SWNPU_EXPORT extern "C" __attribute__((visibility("default"))) ze_result_t ZE_APICALL

SWNPU_EXPORT zeGetGlobalProcAddrTable(ze_api_version_t v, ze_global_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnInit = init;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetDriverProcAddrTable(ze_api_version_t v, ze_driver_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnGet = driver_get;
  t->pfnGetApiVersion = driver_api_version;
  t->pfnGetProperties = driver_properties;
  t->pfnGetExtensionProperties = driver_extensions;
  t->pfnGetExtensionFunctionAddress = driver_extension_function;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetDeviceProcAddrTable(ze_api_version_t v, ze_device_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnGet = device_get;
  t->pfnGetProperties = device_properties;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetContextProcAddrTable(ze_api_version_t v, ze_context_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnCreate = context_create;
  t->pfnDestroy = context_destroy;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetMemProcAddrTable(ze_api_version_t v, ze_mem_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnAllocHost = mem_alloc_host;
  t->pfnFree = mem_free;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetCommandQueueProcAddrTable(ze_api_version_t v, ze_command_queue_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnCreate = queue_create;
  t->pfnDestroy = queue_destroy;
  t->pfnExecuteCommandLists = queue_execute;
  t->pfnSynchronize = queue_synchronize;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetCommandListProcAddrTable(ze_api_version_t v, ze_command_list_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnCreate = list_create;
  t->pfnDestroy = list_destroy;
  t->pfnClose = list_close;
  t->pfnReset = list_reset;
  return ZE_RESULT_SUCCESS;
}
SWNPU_EXPORT zeGetFenceProcAddrTable(ze_api_version_t v, ze_fence_dditable_t* t) {
  if (const ze_result_t r = fill(v, t); r != ZE_RESULT_SUCCESS) return r;
  t->pfnCreate = fence_create;
  t->pfnDestroy = fence_destroy;
  t->pfnHostSynchronize = fence_synchronize;
  t->pfnQueryStatus = fence_query;
  t->pfnReset = fence_reset;
  return ZE_RESULT_SUCCESS;
}

// The tables the loader requires but npullm does not use: left empty (null entries).
#define SWNPU_EMPTY_TABLE(getter, table)              \
  SWNPU_EXPORT getter(ze_api_version_t v, table* t) { \
    return fill(v, t);                                \
  }

SWNPU_EMPTY_TABLE(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)
SWNPU_EMPTY_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
SWNPU_EMPTY_TABLE(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)
SWNPU_EMPTY_TABLE(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
SWNPU_EMPTY_TABLE(zeGetEventProcAddrTable, ze_event_dditable_t)
SWNPU_EMPTY_TABLE(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)
SWNPU_EMPTY_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
SWNPU_EMPTY_TABLE(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
SWNPU_EMPTY_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
SWNPU_EMPTY_TABLE(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)
SWNPU_EMPTY_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
SWNPU_EMPTY_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
SWNPU_EMPTY_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)
SWNPU_EMPTY_TABLE(zeGetFabricVertexExpProcAddrTable, ze_fabric_vertex_exp_dditable_t)
SWNPU_EMPTY_TABLE(zeGetFabricEdgeExpProcAddrTable, ze_fabric_edge_exp_dditable_t)
SWNPU_EMPTY_TABLE(zetGetDeviceProcAddrTable, zet_device_dditable_t)
SWNPU_EMPTY_TABLE(zetGetContextProcAddrTable, zet_context_dditable_t)
SWNPU_EMPTY_TABLE(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
SWNPU_EMPTY_TABLE(zetGetModuleProcAddrTable, zet_module_dditable_t)
SWNPU_EMPTY_TABLE(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricGroupExpProcAddrTable, zet_metric_group_exp_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricProcAddrTable, zet_metric_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
SWNPU_EMPTY_TABLE(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
SWNPU_EMPTY_TABLE(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)
SWNPU_EMPTY_TABLE(zetGetDebugProcAddrTable, zet_debug_dditable_t)
SWNPU_EMPTY_TABLE(zesGetDriverProcAddrTable, zes_driver_dditable_t)
SWNPU_EMPTY_TABLE(zesGetDeviceProcAddrTable, zes_device_dditable_t)
SWNPU_EMPTY_TABLE(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
SWNPU_EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
SWNPU_EMPTY_TABLE(zesGetPowerProcAddrTable, zes_power_dditable_t)
SWNPU_EMPTY_TABLE(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
SWNPU_EMPTY_TABLE(zesGetEngineProcAddrTable, zes_engine_dditable_t)
SWNPU_EMPTY_TABLE(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
SWNPU_EMPTY_TABLE(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
SWNPU_EMPTY_TABLE(zesGetMemoryProcAddrTable, zes_memory_dditable_t)
SWNPU_EMPTY_TABLE(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
SWNPU_EMPTY_TABLE(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
SWNPU_EMPTY_TABLE(zesGetPsuProcAddrTable, zes_psu_dditable_t)
SWNPU_EMPTY_TABLE(zesGetFanProcAddrTable, zes_fan_dditable_t)
SWNPU_EMPTY_TABLE(zesGetLedProcAddrTable, zes_led_dditable_t)
SWNPU_EMPTY_TABLE(zesGetRasProcAddrTable, zes_ras_dditable_t)
SWNPU_EMPTY_TABLE(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
