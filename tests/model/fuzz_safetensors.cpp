// libFuzzer harness over the safetensors header parser: any byte string either parses or
// raises npullm::error(corrupt_data); anything else (a crash, another exception) is a bug.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "npullm/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = npullm::io::parse_safetensors_header(bytes, "fuzz");
    for (const auto& [name, t] : h.tensors) {
      if (t.end > size - h.data_offset || t.begin > t.end) __builtin_trap();  // the checks held
    }
  } catch (const npullm::error& e) {
    if (e.code() != npullm::error_code::corrupt_data) {
      std::fprintf(stderr, "unexpected code: %s\n", e.what());
      __builtin_trap();
    }
  }
  return 0;
}
