// One translation unit of test_isa_mix, compiled several times, once per ISA (-march and
// NPULLM_MIX_NAME differ): each copy runs npullm's kernels and reports which ISA's code it ran.
// Without the ISA inline namespaces the copies' kernels would share mangled names and the
// linker would keep one of them for every copy.
#include <string_view>
#include <vector>

#include "mix.hpp"
#include "npullm/attention/flash.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/ops/linear.hpp"

namespace isa_mix {

mix_result NPULLM_MIX_NAME(std::span<const float> x, std::span<const float> w) {
  using namespace npullm;
  const std::size_t k = 64, n = w.size() / k, m = x.size() / k;
  mix_result r;
  // Called through a pointer the compiler cannot see through, so the call goes to the
  // out-of-line copy the linker kept: this TU's own only if the names differ per ISA.
  static std::string_view (*volatile name)() noexcept = &isa_name;
  r.isa = name();
  r.linear.resize(m * n);
  static void (*volatile lin)(dense_view<const float, 2>, dense_view<const float, 2>,
                              dense_view<float, 2>, std::span<const float>, const serial&) =
      &ops::linear<float, serial>;
  lin(dense_view<const float, 2>(x.data(), m, k), dense_view<const float, 2>(w.data(), n, k),
      dense_view<float, 2>(r.linear.data(), m, n), {}, serial{});
  // Attention of m queries over themselves (one head of 64): q = k = v = x.
  r.attention.resize(m * k);
  const attention::attention_io io{dense_view<const float, 3>(x.data(), 1, m, k),
                                   dense_view<float, 3>(r.attention.data(), 1, m, k), {}, 0.125f};
  const kv::kv_tile<float> present{kv::make_kv_view(x.data(), 1, m, k, m * k),
                                   kv::make_kv_view(x.data(), 1, m, k, m * k), 0};
  attention::flash_attention(io, std::span<const kv::kv_tile<float>>(), &present,
                             attention::causal{0});
  return r;
}

}  // namespace isa_mix
