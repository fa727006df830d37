// Blobs for the software NPU (tests/npu/software_npu/driver.cpp): a text naming the function and
// the size of each argument, argument 0 being the parameter block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npullm/npu/level_zero/host_function.hpp"
#include "npullm/npu/level_zero_backend.hpp"

namespace npullm::testing {

inline std::vector<std::uint8_t> software_npu_blob(const std::string& function,
                                                   const std::vector<std::size_t>& bytes) {
  std::string text = "npullm-software-npu 1\nfunction " + function + "\nargument " +
                     std::to_string(sizeof(npu::level_zero::host_function_block)) + "\n";
  for (std::size_t b : bytes) text += "argument " + std::to_string(b) + "\n";
  return {text.begin(), text.end()};
}

// The blob provider a pipeline on the software NPU uses.
inline npu::blob_provider software_npu_blobs() {
  return
      [](const npu::graph_request& r) { return software_npu_blob(r.function, r.argument_bytes); };
}

}  // namespace npullm::testing
