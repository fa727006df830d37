// The calling convention of host-function graphs: how npullm's Level Zero backend lets a graph
// run an npullm host function (on the software NPU of npullm's tests, which executes graphs by
// calling back into the process).
//
// Argument 0 of every graph the backend binds is a parameter block in driver memory; the backend
// writes it before each submission. A device graph (a compiled network) ignores the host fields;
// the software NPU calls `entry(context, args, n)` with the argument values it captured when
// the execute was appended (args[0] is the block itself). entry returns 0 on success; on failure
// the backend keeps the exception and rethrows it after the driver call returns.
#pragma once

#include <cstdint>

namespace npullm::npu::level_zero {

inline constexpr std::uint64_t host_function_magic = 0x6e70756c6c6d4846ull;  // "npullmHF"

extern "C" {
using host_function_entry = int (*)(void* context, const void* const* args, std::uint32_t n);
}

struct host_function_block {
  std::uint64_t magic = host_function_magic;
  host_function_entry entry = nullptr;
  void* context = nullptr;
  std::uint64_t calls = 0;  // executions the driver performed with this block (driver-written)
};

}  // namespace npullm::npu::level_zero
