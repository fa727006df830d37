// libFuzzer harness: a byte string is a sequence of block-table, fork, truncate, reset and
// prefix-cache operations (see kv_model.hpp), checked after every step. Built with clang when
// it is available (target fuzz_kv_ops); its corpus also runs as a normal test.
#include <cstdint>
#include <cstdio>

#include "kv/kv_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm::kv::testing::run_bytes({data, size});
  } catch (const npullm::kv::testing::model_failure& e) {
    std::fprintf(stderr, "%s\n", e.what());
    __builtin_trap();
  }
  return 0;
}
