// npullm's own declarations of the NPU graph extension ABI ("ZE_extension_graph").
//
// Debian ships no header for the driver extension that runs compiled networks on an Intel NPU,
// so the part npullm uses is declared here from the public ABI: enum values, struct layouts and
// the order of the function table. The layout is pinned by static_asserts below (LP64): a
// change that moved a field would break every real driver, so it must not compile.
//
// Versions only append entries to the table: 1.0 holds Create .. DeviceGetGraphProperties,
// 1.1-1.3 add argument metadata and network queries (unused here, declared as opaque
// pointers to keep the offsets), 1.4 adds BuildLogGetString. A wrapper may call an entry only
// when the driver's reported extension version has it (graph_table_entries()).
#pragma once

#include <level_zero/ze_api.h>

#include <cstddef>
#include <cstdint>

namespace npullm::npu::level_zero::abi {

inline constexpr const char* graph_extension_name = "ZE_extension_graph";
inline constexpr std::uint32_t graph_version_1_0 = ZE_MAKE_VERSION(1, 0);
inline constexpr std::uint32_t graph_version_1_4 = ZE_MAKE_VERSION(1, 4);

using graph_handle = struct _ze_graph_handle_t*;
using profiling_query_handle = struct _ze_graph_profiling_query_handle_t*;

enum graph_structure_type : std::uint32_t {
  stype_device_graph_properties = 0x1,
  stype_graph_desc = 0x2,
  stype_graph_properties = 0x3,
  stype_graph_argument_properties = 0x4,
};

enum graph_format : std::uint32_t {
  format_native = 0x1,       // a precompiled blob
  format_ngraph_lite = 0x2,  // an IR the driver's compiler builds
};

enum argument_type : std::uint32_t { argument_input = 0, argument_output = 1 };

enum argument_precision : std::uint32_t {
  precision_unknown = 0x00,
  precision_fp32 = 0x01,
  precision_fp16 = 0x02,
  precision_uint16 = 0x03,
  precision_uint8 = 0x04,
  precision_int32 = 0x05,
  precision_int16 = 0x06,
  precision_int8 = 0x07,
  precision_bin = 0x08,
};

enum argument_layout : std::uint32_t { layout_any = 0x00, layout_c = 0x60, layout_nc = 0xC1 };

inline constexpr std::size_t max_argument_name = 256;
inline constexpr std::size_t max_argument_dims = 5;

struct compiler_version {
  std::uint16_t major;
  std::uint16_t minor;
};

struct device_graph_properties {
  graph_structure_type stype;
  void* next;
  std::uint32_t graph_extension_version;
  compiler_version compiler;
  graph_format formats_supported;
  std::uint32_t max_opset_version;
};

struct graph_desc {
  graph_structure_type stype;
  const void* next;
  graph_format format;
  std::size_t input_size;
  const std::uint8_t* input;
  const char* build_flags;
};

struct graph_properties {
  graph_structure_type stype;
  void* next;
  std::uint32_t num_graph_args;
};

struct argument_properties {
  graph_structure_type stype;
  void* next;
  char name[max_argument_name];
  argument_type type;
  std::uint32_t dims[max_argument_dims];
  argument_precision network_precision;
  argument_layout network_layout;
  argument_precision device_precision;
  argument_layout device_layout;
};

extern "C" {
using pfn_graph_create = ze_result_t (*)(ze_context_handle_t, ze_device_handle_t, const graph_desc*,
                                         graph_handle*);
using pfn_graph_destroy = ze_result_t (*)(graph_handle);
using pfn_graph_get_properties = ze_result_t (*)(graph_handle, graph_properties*);
using pfn_graph_get_argument_properties = ze_result_t (*)(graph_handle, std::uint32_t,
                                                          argument_properties*);
using pfn_graph_set_argument_value = ze_result_t (*)(graph_handle, std::uint32_t, const void*);
using pfn_append_graph_initialize = ze_result_t (*)(ze_command_list_handle_t, graph_handle,
                                                    ze_event_handle_t, std::uint32_t,
                                                    ze_event_handle_t*);
using pfn_append_graph_execute = ze_result_t (*)(ze_command_list_handle_t, graph_handle,
                                                 profiling_query_handle, ze_event_handle_t,
                                                 std::uint32_t, ze_event_handle_t*);
using pfn_graph_get_native_binary = ze_result_t (*)(graph_handle, std::size_t*, std::uint8_t*);
using pfn_device_get_graph_properties = ze_result_t (*)(ze_device_handle_t,
                                                        device_graph_properties*);
using pfn_graph_build_log_get_string = ze_result_t (*)(graph_handle, std::uint32_t*, char*);
using pfn_opaque = void (*)();
}

// The function table, up to version 1.4.
struct graph_dditable {
  // 1.0
  pfn_graph_create create;
  pfn_graph_destroy destroy;
  pfn_graph_get_properties get_properties;
  pfn_graph_get_argument_properties get_argument_properties;
  pfn_graph_set_argument_value set_argument_value;
  pfn_append_graph_initialize append_graph_initialize;
  pfn_append_graph_execute append_graph_execute;
  pfn_graph_get_native_binary get_native_binary;
  pfn_device_get_graph_properties device_get_graph_properties;
  // 1.1: argument metadata, argument properties 2; 1.2: argument properties 3;
  // 1.3: query network create / destroy / supported layers (not used by npullm)
  pfn_opaque unused_1_1[2];
  pfn_opaque unused_1_2[1];
  pfn_opaque unused_1_3[3];
  // 1.4
  pfn_graph_build_log_get_string build_log_get_string;
};

// How many leading entries of graph_dditable a driver reporting `version` provides.
constexpr std::size_t graph_table_entries(std::uint32_t version) noexcept {
  const std::uint32_t major = version >> 16, minor = version & 0xffffu;
  if (major != 1) return major > 1 ? 16 : 0;
  constexpr std::size_t by_minor[] = {9, 11, 12, 15, 16};
  return minor < 5 ? by_minor[minor] : 16;
}

// ---- pinned layout (LP64) ----------------------------------------------------------------
static_assert(sizeof(void*) == 8, "npullm's graph ABI declarations assume LP64");
static_assert(sizeof(device_graph_properties) == 32);
static_assert(offsetof(device_graph_properties, graph_extension_version) == 16);
static_assert(offsetof(device_graph_properties, formats_supported) == 24);
static_assert(sizeof(graph_desc) == 48);
static_assert(offsetof(graph_desc, format) == 16);
static_assert(offsetof(graph_desc, input_size) == 24);
static_assert(offsetof(graph_desc, input) == 32);
static_assert(offsetof(graph_desc, build_flags) == 40);
static_assert(sizeof(graph_properties) == 24);
static_assert(offsetof(graph_properties, num_graph_args) == 16);
static_assert(offsetof(argument_properties, name) == 16);
static_assert(offsetof(argument_properties, type) == 272);
static_assert(offsetof(argument_properties, dims) == 276);
static_assert(offsetof(argument_properties, network_precision) == 296);
static_assert(offsetof(argument_properties, device_layout) == 308);
static_assert(sizeof(argument_properties) == 312);
static_assert(offsetof(graph_dditable, set_argument_value) == 4 * sizeof(void*));
static_assert(offsetof(graph_dditable, append_graph_execute) == 6 * sizeof(void*));
static_assert(offsetof(graph_dditable, device_get_graph_properties) == 8 * sizeof(void*));
static_assert(offsetof(graph_dditable, build_log_get_string) == 15 * sizeof(void*));
static_assert(sizeof(graph_dditable) == 16 * sizeof(void*));
static_assert(graph_table_entries(graph_version_1_0) == 9);
static_assert(graph_table_entries(graph_version_1_4) == 16);

}  // namespace npullm::npu::level_zero::abi
