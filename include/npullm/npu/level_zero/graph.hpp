// The NPU graph extension: graph_extension finds "ZE_extension_graph" on a driver (name and
// version from zeDriverGetExtensionProperties, the table from
// zeDriverGetExtensionFunctionAddress) and exposes only the entries that version has; graph owns
// one graph created from a blob, with its arguments' properties.
//
// The driver captures a graph's argument values when an execute is *appended* to a command
// list: set_argument() after recording changes nothing until the list is recorded again.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/npu/level_zero/graph_ext.hpp"
#include "npullm/npu/level_zero/result.hpp"

namespace npullm::npu::level_zero {

class graph_extension {
 public:
  graph_extension() = default;
  // Throws error(backend) when the driver lacks the extension.
  explicit graph_extension(ze_driver_handle_t driver) {
    std::uint32_t n = 0;
    check("zeDriverGetExtensionProperties", zeDriverGetExtensionProperties(driver, &n, nullptr));
    std::vector<ze_driver_extension_properties_t> props(n);
    check("zeDriverGetExtensionProperties",
          zeDriverGetExtensionProperties(driver, &n, props.data()));
    bool found = false;
    for (const auto& p : props) {
      if (std::strncmp(p.name, abi::graph_extension_name, ZE_MAX_EXTENSION_NAME) == 0) {
        version_ = p.version;
        found = true;
      }
    }
    if (!found) {
      raise(error_code::backend, "the Level Zero driver has no ", abi::graph_extension_name,
            " extension among its ", n, " extensions");
    }
    entries_ = abi::graph_table_entries(version_);
    if (entries_ == 0) {
      raise(error_code::backend, abi::graph_extension_name, " version ", version_ >> 16, ".",
            (version_ & 0xffffu), " is older than 1.0");
    }
    void* table = nullptr;
    check("zeDriverGetExtensionFunctionAddress",
          zeDriverGetExtensionFunctionAddress(driver, abi::graph_extension_name, &table));
    if (!table) raise(error_code::backend, "the driver returned no graph extension table");
    // Copy the entries this version has; the rest stay null.
    std::memcpy(&table_, table, entries_ * sizeof(void*));
  }

  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] const abi::graph_dditable& table() const noexcept { return table_; }
  [[nodiscard]] bool has_build_log() const noexcept {
    return entries_ > 15 && table_.build_log_get_string != nullptr;
  }

 private:
  std::uint32_t version_ = 0;
  std::size_t entries_ = 0;
  abi::graph_dditable table_{};
};

struct graph_argument {
  abi::argument_properties properties{};
  [[nodiscard]] std::string name() const {
    return std::string(properties.name, strnlen(properties.name, abi::max_argument_name));
  }
};

class graph {
 public:
  graph() = default;
  // Creates a graph from a blob of the given format. On failure the error carries the driver's
  // build log when it provides one.
  graph(const graph_extension& ext, ze_context_handle_t ctx, ze_device_handle_t dev,
        std::span<const std::uint8_t> blob, abi::graph_format format = abi::format_native)
      : ext_(&ext) {
    abi::graph_desc desc{abi::stype_graph_desc, nullptr, format, blob.size(), blob.data(), ""};
    const ze_result_t r = ext.table().create(ctx, dev, &desc, &handle_);
    if (r != ZE_RESULT_SUCCESS) {
      handle_ = nullptr;
      check("pfnCreate (graph)", r, build_log_suffix(ext, nullptr));
    }
    abi::graph_properties props{abi::stype_graph_properties, nullptr, 0};
    try {
      check("pfnGetProperties (graph)", ext.table().get_properties(handle_, &props));
      arguments_.resize(props.num_graph_args);
      for (std::uint32_t i = 0; i < props.num_graph_args; ++i) {
        arguments_[i].properties.stype = abi::stype_graph_argument_properties;
        check("pfnGetArgumentProperties",
              ext.table().get_argument_properties(handle_, i, &arguments_[i].properties));
      }
    } catch (...) {
      ext.table().destroy(handle_);
      throw;
    }
  }
  graph(graph&& o) noexcept
      : ext_(o.ext_),
        handle_(std::exchange(o.handle_, nullptr)),
        arguments_(std::move(o.arguments_)) {}
  graph& operator=(graph&& o) noexcept {
    if (this != &o) {
      reset();
      ext_ = o.ext_;
      handle_ = std::exchange(o.handle_, nullptr);
      arguments_ = std::move(o.arguments_);
    }
    return *this;
  }
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  ~graph() { reset(); }

  [[nodiscard]] const std::vector<graph_argument>& arguments() const noexcept { return arguments_; }
  void set_argument(std::uint32_t index, const void* value) {
    if (index >= arguments_.size()) {
      raise(error_code::out_of_range, "graph argument ", index, " of ", arguments_.size());
    }
    check("pfnSetArgumentValue", ext_->table().set_argument_value(handle_, index, value),
          npullm::detail::concat(" (argument ", index, ")"));
  }
  void append_initialize(ze_command_list_handle_t list) {
    check("pfnAppendGraphInitialize",
          ext_->table().append_graph_initialize(list, handle_, nullptr, 0, nullptr));
  }
  void append_execute(ze_command_list_handle_t list) {
    check("pfnAppendGraphExecute",
          ext_->table().append_graph_execute(list, handle_, nullptr, nullptr, 0, nullptr));
  }
  [[nodiscard]] abi::graph_handle get() const noexcept { return handle_; }

 private:
  // "; build log: ..." when the driver has a log for the failed creation.
  static std::string build_log_suffix(const graph_extension& ext, abi::graph_handle h) {
    if (!ext.has_build_log()) return {};
    std::uint32_t size = 0;
    if (ext.table().build_log_get_string(h, &size, nullptr) != ZE_RESULT_SUCCESS || size == 0)
      return {};
    std::string log(size, '\0');
    if (ext.table().build_log_get_string(h, &size, log.data()) != ZE_RESULT_SUCCESS) return {};
    log.resize(strnlen(log.c_str(), log.size()));
    return log.empty() ? std::string() : "; build log: " + log;
  }
  void reset() noexcept {
    if (handle_ && ext_) ext_->table().destroy(handle_);
    handle_ = nullptr;
  }

  const graph_extension* ext_ = nullptr;
  abi::graph_handle handle_ = nullptr;
  std::vector<graph_argument> arguments_;
};

}  // namespace npullm::npu::level_zero
