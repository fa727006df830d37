// The Level Zero wrapper and backend, run through the real Debian loader against npullm's
// software NPU (tests/npu/software_npu/driver.cpp, named by ZE_ENABLE_ALT_DRIVERS).
//
// zeInit runs once per process, so every scenario is its own ctest entry with its own
// environment (tests/CMakeLists.txt); NPULLM_L0_SCENARIO names the scenario and the other
// suites skip. What these tests prove: the call sequence, argument binding and error handling
// through the loader (plain, with loader interception, with the validation layer). What they
// cannot prove: NPU numerics or speed (the software NPU runs npullm's host functions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "npu/software_npu/blob.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/npu/level_zero/command_list.hpp"
#include "npullm/npu/level_zero/command_queue.hpp"
#include "npullm/npu/level_zero/context.hpp"
#include "npullm/npu/level_zero/fence.hpp"
#include "npullm/npu/level_zero/graph.hpp"
#include "npullm/npu/level_zero/host_memory.hpp"
#include "npullm/npu/level_zero/runtime.hpp"
#include "npullm/npu/level_zero_backend.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
namespace l0 = npullm::npu::level_zero;
using npullm::testing::expect_error;

// Skips unless this process runs the named scenario.
#define SCENARIO(name)                                                           \
  do {                                                                           \
    const char* s = std::getenv("NPULLM_L0_SCENARIO");                           \
    if (!s || std::string(s) != (name))                                          \
      GTEST_SKIP() << "scenario " << (name) << " runs in its own ctest process"; \
  } while (0)

bool in_scenario(const char* prefix) {
  const char* s = std::getenv("NPULLM_L0_SCENARIO");
  return s && std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}
#define SCENARIO_PREFIX(prefix) \
  if (!in_scenario(prefix)) GTEST_SKIP() << "runs in its own ctest process"

// ---- the wrapper -----------------------------------------------------------------------------

struct session {
  l0::npu_device npu = l0::select_npu(l0::runtime::get(), {});
  l0::context ctx{npu.driver};
  l0::command_queue queue{ctx.get(), npu.device};
  l0::fence done{queue.get()};
  l0::graph_extension ext{npu.driver};
  std::shared_ptr<l0::host_memory_registry> memory =
      std::make_shared<l0::host_memory_registry>(ctx.get());
};

// A host function for a graph: y = 2 x over the bound arguments (args[1] = x, args[2] = y).
struct doubler {
  std::size_t n = 0;
  int calls = 0;
  static int entry(void* ctx, const void* const* args, std::uint32_t nargs) {
    auto& d = *static_cast<doubler*>(ctx);
    if (nargs != 3) return 1;
    const auto* x = static_cast<const float*>(args[1]);
    auto* y = static_cast<float*>(const_cast<void*>(args[2]));
    for (std::size_t i = 0; i < d.n; ++i) y[i] = 2 * x[i];
    ++d.calls;
    return 0;
  }
};

TEST(Wrapper, FindsTheSoftwareNpuThroughTheLoader) {
  SCENARIO_PREFIX("wrapper");
  session s;
  EXPECT_EQ(s.npu.properties.type, ZE_DEVICE_TYPE_VPU);
  EXPECT_STREQ(s.npu.properties.name, "npullm software NPU");
  EXPECT_EQ(s.ext.version(), l0::abi::graph_version_1_4);
  EXPECT_TRUE(s.ext.has_build_log());
  // By UUID too; an unknown UUID or ordinal is a clear error.
  EXPECT_EQ(l0::select_npu(l0::runtime::get(), {0, s.npu.uuid()}).device, s.npu.device);
  expect_error(
      [] {
        l0::select_npu(l0::runtime::get(), {3, {}});
      },
      error_code::backend, "NPU ordinal 3 requested, 1 NPUs present");
  expect_error(
      [] {
        l0::select_npu(l0::runtime::get(), {0, l0::device_uuid{}});
      },
      error_code::backend, "no NPU with the requested UUID");
}

TEST(Wrapper, GraphRunsOnBoundHostMemoryAndCapturesArgumentsAtAppend) {
  SCENARIO_PREFIX("wrapper");
  session s;
  const std::size_t n = 37;
  l0::host_buffer block(s.memory, sizeof(l0::host_function_block));
  l0::host_buffer x(s.memory, n * sizeof(float)), y1(s.memory, n * sizeof(float)),
      y2(s.memory, n * sizeof(float));
  EXPECT_TRUE(s.memory->contains(x.data(), n * sizeof(float)));
  EXPECT_FALSE(s.memory->contains(static_cast<char*>(x.data()) + 4, n * sizeof(float)));
  auto* xs = static_cast<float*>(x.data());
  for (std::size_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i) - 3.5f;
  std::fill_n(static_cast<float*>(y1.data()), n, -7.0f);
  std::fill_n(static_cast<float*>(y2.data()), n, -7.0f);

  const auto blob = npullm::testing::software_npu_blob("double", {n * 4, n * 4});
  l0::graph g(s.ext, s.ctx.get(), s.npu.device, blob);
  ASSERT_EQ(g.arguments().size(), 3u);
  EXPECT_EQ(g.arguments()[0].name(), "parameters");
  EXPECT_EQ(g.arguments()[1].properties.dims[0], n * 4);

  doubler d{n};
  auto* b = new (block.data()) l0::host_function_block{};
  b->entry = &doubler::entry;
  b->context = &d;

  // Execute before initialize: the driver refuses.
  l0::command_list list(s.ctx.get(), s.npu.device);
  g.set_argument(0, block.data());
  g.set_argument(1, x.data());
  g.set_argument(2, y1.data());
  g.append_execute(list.get());
  // Re-binding after the append changes nothing in this recording.
  g.set_argument(2, y2.data());
  list.close();
  ze_command_list_handle_t h = list.get();
  expect_error([&] { s.queue.execute(1, &h, s.done.get()); }, error_code::backend,
               "ZE_RESULT_ERROR_UNINITIALIZED");

  l0::command_list init(s.ctx.get(), s.npu.device);
  g.append_initialize(init.get());
  init.close();
  ze_command_list_handle_t hi = init.get();
  s.queue.execute(1, &hi, s.done.get());
  s.done.wait();

  s.queue.execute(1, &h, s.done.get());
  s.done.wait();
  EXPECT_EQ(d.calls, 1);
  EXPECT_EQ(b->calls, 1u);
  const auto* y1s = static_cast<const float*>(y1.data());
  const auto* y2s = static_cast<const float*>(y2.data());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(y1s[i], 2 * xs[i]) << i;  // the captured binding
    EXPECT_EQ(y2s[i], -7.0f) << i;      // the later set_argument did not reach the recording
  }
  // Recording again picks up the new binding.
  list.clear();
  g.append_execute(list.get());
  list.close();
  s.queue.execute(1, &h, s.done.get());
  s.done.wait();
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(y2s[i], 2 * xs[i]) << i;
}

TEST(Wrapper, DriverRulesAreEnforced) {
  SCENARIO_PREFIX("wrapper");
  session s;
  const std::size_t n = 17;
  l0::host_buffer block(s.memory, sizeof(l0::host_function_block));
  l0::host_buffer x(s.memory, n * sizeof(float));
  std::vector<float> outside(n);
  l0::graph g(s.ext, s.ctx.get(), s.npu.device,
              npullm::testing::software_npu_blob("double", {n * 4, n * 4}));
  l0::command_list list(s.ctx.get(), s.npu.device);
  // An argument outside driver memory, or an unset one, fails at append.
  g.set_argument(0, block.data());
  g.set_argument(1, x.data());
  expect_error([&] { g.append_execute(list.get()); }, error_code::backend,
               "pfnAppendGraphExecute failed: ZE_RESULT_ERROR_INVALID_ARGUMENT");
  g.set_argument(2, outside.data());
  expect_error([&] { g.append_execute(list.get()); }, error_code::backend,
               "pfnAppendGraphExecute failed");
  // An argument with less room than the graph declares.
  g.set_argument(2, static_cast<char*>(x.data()) + 4);
  expect_error([&] { g.append_execute(list.get()); }, error_code::backend,
               "pfnAppendGraphExecute failed");
  expect_error([&] { g.set_argument(3, x.data()); }, error_code::out_of_range,
               "graph argument 3 of 3");
  // A list that is not closed cannot be submitted.
  ze_command_list_handle_t h = list.get();
  expect_error([&] { s.queue.execute(1, &h, s.done.get()); }, error_code::backend,
               "zeCommandQueueExecuteCommandLists failed: ZE_RESULT_ERROR_INVALID_ARGUMENT");
  // A destroyed handle is rejected. (Not under loader interception: there the handle is the
  // loader's wrapper, which the loader frees and then dereferences itself.)
  if (!std::getenv("ZE_ENABLE_LOADER_INTERCEPT")) {
    ze_command_list_handle_t dead;
    {
      l0::command_list gone(s.ctx.get(), s.npu.device);
      dead = gone.get();
    }
    EXPECT_EQ(zeCommandListClose(dead), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
  }
  // A malformed blob fails with the driver's build log.
  const std::string text = "not a blob";
  expect_error(
      [&] {
        l0::graph(s.ext, s.ctx.get(), s.npu.device,
                  std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
      },
      error_code::backend, "build log: line 1: not an npullm software NPU blob");
  expect_error(
      [&] {
        l0::graph(s.ext, s.ctx.get(), s.npu.device,
                  npullm::testing::software_npu_blob("double", {}), l0::abi::format_ngraph_lite);
      },
      error_code::backend, "only NATIVE blobs");
}

// ---- the backend under a pipeline --------------------------------------------------------------

using host_config = model::pipeline_config<model::block_kv<float, 16>, model::dynamic_attention<>,
                                           float, npu::host_backend>;
using npu_config = model::pipeline_config<model::block_kv<float, 16>, model::dynamic_attention<>,
                                          float, npu::level_zero_backend>;
using npu_contiguous =
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float,
                           npu::level_zero_backend>;

npu::level_zero_backend software_npu() {
  return npu::level_zero_backend({.device = {}, .blobs = npullm::testing::software_npu_blobs()});
}

void expect_same(const tensor<float, 2>& a, const tensor<float, 2>& b) {
  ASSERT_EQ(a.extent(0), b.extent(0));
  ASSERT_EQ(a.extent(1), b.extent(1));
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]) << i;
}

template <class NpuConfig, class HostConfig = host_config>
void pipeline_matches_host(const std::string& preset) {
  const auto& dir = npullm::testing::generated_model(preset, 7);
  model::pipeline_options opt{.max_sequence = 64, .decode_rows = 4};
  // A device-memory backend reads the weights as stored (never packed): so does the host here,
  // for bit-identical results.
  auto host_opt = opt;
  host_opt.packing = model::weight_packing::off;
  model::causal_lm<HostConfig> host(dir, host_opt);
  model::causal_lm<NpuConfig> npu(dir, opt, software_npu());

  std::vector<npu::trace_event> events;
  npu.backend().set_tracer([&](const npu::trace_event& e) { events.push_back(e); });

  const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
  auto sel = batch::output_selection::none();
  sel.logits_for({0, 8, 16}).hidden_for({16});
  auto a = host.prefill(prompt, sel);
  auto b = npu.prefill(prompt, sel);
  expect_same(a.logits, b.logits);
  expect_same(a.hidden, b.hidden);
  for (int step = 0; step < 5; ++step) {
    const std::array<std::int32_t, 2> next = {static_cast<std::int32_t>(step + 1), 11};
    auto da = host.decode(next, batch::output_selection::all_rows());
    auto db = npu.decode(next, batch::output_selection::all_rows());
    expect_same(da.logits, db.logits);
  }
  EXPECT_EQ(npu.length(), host.length());

  // Every body call was a graph execute on the NPU backend, one per layer per step.
  std::size_t body_runs = 0;
  for (const auto& e : events)
    if (e.what == npu::trace_event::kind::execute && e.function.rfind("body/", 0) == 0) ++body_runs;
  EXPECT_EQ(body_runs, 6 * npu.config().num_hidden_layers);
}

TEST(Pipeline, SameLogitsAsTheHostBackendWithKvBlocksInLevelZeroMemory) {
  SCENARIO_PREFIX("pipeline");
  pipeline_matches_host<npu_config>("tiny");
  // Qwen2-style attention biases are bound as arguments too.
  pipeline_matches_host<npu_config>("tiny-llama");

  model::causal_lm<npu_config> lm(npullm::testing::generated_model("tiny", 7), {.max_sequence = 64},
                                  software_npu());
  const auto& pool = lm.kv_pool();
  EXPECT_TRUE(lm.backend().owns(pool.data(), pool.storage_bytes()));
  EXPECT_GT(lm.backend().live_allocations(), 10u);
}

// A quantized KV in Level Zero host memory: what the host backend gives. K and V in different
// formats (q8_0 K, q4_0 V: the pool's storage is bytes, each part in its own units), so the
// typed-unit case (one format, as bf16) and the byte layout both run from device memory.
TEST(Pipeline, QuantizedKvBlocksInLevelZeroMemory) {
  SCENARIO_PREFIX("pipeline");
  using k8v4 = kv::mixed<kv::q8_0, kv::q4_0>;
  using host_q = model::pipeline_config<model::block_kv<k8v4, 16>, model::dynamic_attention<>,
                                        float, npu::host_backend>;
  using npu_q = model::pipeline_config<model::block_kv<k8v4, 16>, model::dynamic_attention<>, float,
                                       npu::level_zero_backend>;
  pipeline_matches_host<npu_q, host_q>("tiny");
}

TEST(Pipeline, ContiguousKvAndGenerationThroughTheNpu) {
  SCENARIO_PREFIX("pipeline");
  const auto& dir = npullm::testing::generated_model("tiny", 7);
  model::causal_lm<npu_contiguous> npu(dir, {.max_sequence = 64}, software_npu());
  model::causal_lm<host_config> host(
      dir, {.max_sequence = 64, .packing = model::weight_packing::off});  // as the NPU reads them
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5};
  auto a = host.prefill(prompt);
  auto b = npu.prefill(prompt);
  expect_same(a.logits, b.logits);
  // Rollback works as on the host.
  npu.truncate(3);
  host.truncate(3);
  expect_same(host.decode(std::array{7}).logits, npu.decode(std::array{7}).logits);
}

TEST(Pipeline, ArgumentsOutsideBackendMemoryAreRefused) {
  SCENARIO_PREFIX("pipeline");
  auto be = software_npu();
  auto fn = be.compile("probe", {{1}, true}, [](int) {});
  std::vector<float> host_memory(16);
  const npu::argument arg{host_memory.data(), 64};
  expect_error([&] { be.execute(fn, 0, -1, std::span(&arg, 1)); }, error_code::invalid_argument,
               "argument 1 of 'probe' (64 bytes) is not in this backend's Level Zero host memory");
  // A closure that throws: the error reaches the caller through the driver.
  auto buf = be.allocate<float>(16);
  const npu::argument ok{buf.data(), 64};
  auto thrower = be.compile("thrower", {{1}, true}, [](int v) {
    raise(error_code::invalid_argument, "host function saw ", v);
  });
  expect_error([&] { be.execute(thrower, 42, -1, std::span(&ok, 1)); },
               error_code::invalid_argument, "host function saw 42");
  // A later call still works (the failure left nothing behind).
  int seen = 0;
  auto probe = be.compile("probe2", {{1}, true}, [&](int v) { seen = v; });
  be.execute(probe, 5, -1, std::span(&ok, 1));
  EXPECT_EQ(seen, 5);
}

// ---- start-up errors and injected faults --------------------------------------------------------

TEST(NoDriver, ClearErrorAtStartUpEveryTime) {
  SCENARIO("no_driver");
  for (int i = 0; i < 2; ++i) {  // the remembered result: no second zeInit, no crash
    expect_error([] { software_npu(); }, error_code::backend,
                 "no Level Zero driver found: zeInit returned ZE_RESULT_ERROR_UNINITIALIZED");
  }
}

TEST(NotAnNpu, ClearErrorAtStartUp) {
  SCENARIO("not_an_npu");
  expect_error([] { software_npu(); }, error_code::backend, "no NPU among 1 devices [gpu]");
}

TEST(FaultAlloc, ClearErrorNothingLeaked) {
  SCENARIO("fault_alloc");
  // The 5th zeMemAllocHost fails: inside the pipeline's construction (KV pool, buffers).
  expect_error(
      [] {
        model::causal_lm<npu_config> lm(npullm::testing::generated_model("tiny", 7),
                                        {.max_sequence = 64}, software_npu());
      },
      error_code::backend, "zeMemAllocHost failed: ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY");
}

TEST(FaultGraph, ClearErrorWithBuildLogAndStateUnchanged) {
  SCENARIO("fault_graph");
  model::causal_lm<npu_config> lm(npullm::testing::generated_model("tiny", 7), {.max_sequence = 64},
                                  software_npu());
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  expect_error([&] { lm.prefill(prompt); }, error_code::backend,
               "build log: injected fault (NPULLM_SWNPU_FAIL_GRAPH=1)");
  EXPECT_EQ(lm.length(), 0u);
  EXPECT_EQ(lm.kv_pool().free_count(), lm.kv_pool().total_count());
}

// ---- a real NPU ---------------------------------------------------------------------------------

TEST(Hardware, RealNpuWhenPresent) {
  SCENARIO("hardware");
  l0::npu_device npu;
  try {
    npu = l0::select_npu(l0::runtime::get(), {});
  } catch (const error& e) {
    GTEST_SKIP() << "no NPU on this machine: " << e.what();
  }
  // A real driver: the wrapper's objects and host memory work.
  l0::context ctx(npu.driver);
  l0::command_queue queue(ctx.get(), npu.device);
  l0::fence done(queue.get());
  l0::graph_extension ext(npu.driver);
  auto memory = std::make_shared<l0::host_memory_registry>(ctx.get());
  l0::host_buffer b(memory, 4096);
  EXPECT_TRUE(memory->contains(b.data(), 4096));
  EXPECT_GE(ext.version(), l0::abi::graph_version_1_0);
}

}  // namespace
