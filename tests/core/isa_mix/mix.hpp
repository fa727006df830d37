// test_isa_mix: what each ISA's copy of kernels.cpp computed.
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace isa_mix {

struct mix_result {
  std::string_view isa;
  std::vector<float> linear, attention;
};

mix_result run_native(std::span<const float> x, std::span<const float> w);
mix_result run_avx2(std::span<const float> x, std::span<const float> w);
mix_result run_baseline(std::span<const float> x, std::span<const float> w);

}  // namespace isa_mix
