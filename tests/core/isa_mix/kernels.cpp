// One translation unit of test_isa_mix, compiled several times, once per ISA (-march and
// NPULLM_MIX_NAME differ): each copy runs npullm's kernels and reports which ISA's code it ran.
// Without the ISA inline namespaces the copies' kernels would share mangled names and the
// linker would keep one of them for every copy; test_isa_odr reads these objects and lists the
// inline functions outside those namespaces whose code differs between the copies.
#include <cstring>
#include <string_view>
#include <vector>

#include "mix.hpp"
#include "npullm/attention/flash.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/kv/kv_format.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"
#include "npullm/ops/rope.hpp"
#include "npullm/ops/softmax.hpp"

// The kernel headers' own helper macros end with them (core/isa.hpp's NPULLM_ISA_* are the
// interface, and stay).
#if defined(NPULLM_QUANT_VNNI512) || defined(NPULLM_QUANT_VNNI256) || defined(NPULLM_QK_AVX512) || \
    defined(NPULLM_QK_AVX2) || defined(NPULLM_QK_VNNI)
#error "a helper macro of ops/quant_linear/ or attention/quantized_keys.hpp leaked"
#endif

namespace isa_mix {
namespace {

using namespace npullm;

std::span<const std::byte> as_bytes(const bytes& b) {
  return {reinterpret_cast<const std::byte*>(b.data()), b.size()};
}

template <class T>
bytes to_bytes(const T* p, std::size_t n) {
  bytes b(n * sizeof(T));
  std::memcpy(b.data(), p, b.size());
  return b;
}

// The quantized linear of x's first m rows over w by every path: GEMV (m <= 16) or GEMM over
// the view, GEMM over packed panels, and the tiles.
std::vector<std::vector<float>> quant_linears(const mix_input& in, const ops::quantized_view& w) {
  const std::size_t k = quant_k, n = w.rows, m = in.xq.size() / k, m_gemv = 3;
  static_assert(ops::detail::quant_gemv_max_m < 37 && 3 <= ops::detail::quant_gemv_max_m);
  std::vector<std::vector<float>> out;
  auto y = [&](std::size_t rows) -> std::vector<float>& { return out.emplace_back(rows * n); };
  auto x = [&](std::size_t rows) { return dense_view<const float, 2>(in.xq.data(), rows, k); };
  auto yv = [&](std::vector<float>& v) { return dense_view<float, 2>(v.data(), v.size() / n, n); };
  ops::linear(x(m_gemv), w, yv(y(m_gemv)));
  ops::linear(x(m), w, yv(y(m)));
  const ops::packed_quantized packed = ops::pack(w);
  ops::linear(x(m), packed, yv(y(m)));
  const ops::repacked_quantized tiles = ops::repack(w);
  ops::linear(x(m_gemv), tiles, yv(y(m_gemv)));
  ops::linear(x(m), tiles, yv(y(m)));
  return out;
}

// Flash attention of in.q (the last q_rows of kv_rows positions) over kv_rows keys of format
// K / V (one past tile, no present tile), causal.
template <class K, class V>
std::vector<float> kv_attention(const mix_input& in, const K* k, const V* v) {
  const std::size_t rows = in.q_rows, len = in.kv_rows;
  std::vector<float> out(q_heads * rows * head_dim);
  const attention::attention_io io{dense_view<const float, 3>(in.q.data(), q_heads, rows, head_dim),
                                   dense_view<float, 3>(out.data(), q_heads, rows, head_dim),
                                   {},
                                   0.125f};
  const std::size_t ku = head_dim / kv::unit_elements<K>, vu = head_dim / kv::unit_elements<V>;
  const kv::kv_tile<K, V> past{kv::make_kv_view(k, kv_heads, len, ku, len * ku),
                               kv::make_kv_view(v, kv_heads, len, vu, len * vu), 0};
  attention::flash_attention(io, std::span<const kv::kv_tile<K, V>>(&past, 1),
                             static_cast<const kv::kv_tile<float>*>(nullptr),
                             attention::causal{len - rows});
  return out;
}

}  // namespace

mix_result NPULLM_MIX_NAME(const mix_input& in) {
  const std::size_t k = 64, n = in.w.size() / k, m = in.x.size() / k;
  mix_result r;
  // Called through a pointer the compiler cannot see through, so the call goes to the
  // out-of-line copy the linker kept: this TU's own only if the names differ per ISA.
  static std::string_view (*volatile name)() noexcept = &isa_name;
  r.isa = name();
  r.linear.resize(m * n);
  static void (*volatile lin)(dense_view<const float, 2>, dense_view<const float, 2>,
                              dense_view<float, 2>, std::span<const float>, const serial&) =
      &ops::linear<float, serial>;
  lin(dense_view<const float, 2>(in.x.data(), m, k), dense_view<const float, 2>(in.w.data(), n, k),
      dense_view<float, 2>(r.linear.data(), m, n), {}, serial{});
  // Attention of m queries over themselves (one head of 64): q = k = v = x.
  r.attention.resize(m * k);
  const attention::attention_io io{dense_view<const float, 3>(in.x.data(), 1, m, k),
                                   dense_view<float, 3>(r.attention.data(), 1, m, k),
                                   {},
                                   0.125f};
  const kv::kv_tile<float> present{kv::make_kv_view(in.x.data(), 1, m, k, m * k),
                                   kv::make_kv_view(in.x.data(), 1, m, k, m * k), 0};
  attention::flash_attention(io, std::span<const kv::kv_tile<float>>(), &present,
                             attention::causal{0});

  // The quantized linear: this copy's quantizers and dequantizer, then its kernels over the
  // bytes main.cpp quantized.
  const std::size_t nq = in.wq.size() / quant_k;
  for (std::size_t f = 0; f < std::size(quant_formats); ++f) {
    const ops::weight_format format = *ops::weight_format_from_string(quant_formats[f]);
    const ops::quantized_matrix mine =
        ops::quantize(dense_view<const float, 2>(in.wq.data(), nq, quant_k), format);
    r.quantized.push_back(to_bytes(mine.data().data(), mine.data().size()));
    const ops::quantized_view w(format, nq, quant_k, as_bytes(in.weights[f]));
    std::vector<float>& back = r.dequantized.emplace_back(nq * quant_k);
    ops::dequantize(w, dense_view<float, 2>(back.data(), nq, quant_k));
    for (auto& y : quant_linears(in, w)) r.quant_linear.push_back(std::move(y));
  }

  // The KV row quantizers, and attention over quantized K and V.
  const std::size_t kv_elements = in.k.size();
  std::vector<kv::q8_0> k8(kv_elements / 32);
  std::vector<kv::q4_0> k4(kv_elements / 32);
  kv::quantize_row(in.k.data(), kv_elements, k8.data());
  kv::quantize_row(in.k.data(), kv_elements, k4.data());
  r.k_q8_0 = to_bytes(k8.data(), k8.size());
  r.k_q4_0 = to_bytes(k4.data(), k4.size());
  // Units of main.cpp's quantizer (copied: the byte vectors are not aligned for the units).
  auto units = [](const bytes& b, auto unit) {
    std::vector<decltype(unit)> u(b.size() / sizeof(unit));
    std::memcpy(u.data(), b.data(), b.size());
    return u;
  };
  const auto ik8 = units(in.k_q8_0, kv::q8_0{}), iv8 = units(in.v_q8_0, kv::q8_0{});
  const auto ik4 = units(in.k_q4_0, kv::q4_0{}), iv4 = units(in.v_q4_0, kv::q4_0{});
  r.k_q8_0_back.resize(kv_elements);
  r.k_q4_0_back.resize(kv_elements);
  kv::dequantize_row(ik8.data(), kv_elements, r.k_q8_0_back.data());
  kv::dequantize_row(ik4.data(), kv_elements, r.k_q4_0_back.data());
  r.kv_attention.push_back(kv_attention(in, ik8.data(), iv8.data()));
  r.kv_attention.push_back(kv_attention(in, ik4.data(), iv4.data()));
  r.kv_attention.push_back(kv_attention(in, ik8.data(), iv4.data()));

  r.softmax = r.linear;
  ops::softmax(dense_view<float, 2>(r.softmax.data(), m, n));
  r.argmax.resize(m);
  ops::argmax(dense_view<const float, 2>(r.linear.data(), m, n), r.argmax);
  const std::int32_t ids[] = {3, 0, 3};
  std::vector<float16> w16(in.w.size());
  convert(in.w, std::span<float16>(w16));
  r.gathered.resize(std::size(ids) * (k + quant_k));
  ops::gather(ids, dense_view<const float16, 2>(w16.data(), n, k),
              dense_view<float, 2>(r.gathered.data(), std::size(ids), k));
  const ops::quantized_view table(ops::weight_format::q4_k, nq, quant_k, as_bytes(in.weights[2]));
  ops::gather(
      ids, table,
      dense_view<float, 2>(r.gathered.data() + std::size(ids) * k, std::size(ids), quant_k));
  r.rope = std::vector<float>(in.x.begin(), in.x.end());
  std::vector<std::int64_t> positions(m);
  for (std::size_t i = 0; i < m; ++i) positions[i] = static_cast<std::int64_t>(i);
  ops::apply_rope(dense_view<float, 3>(r.rope.data(), m, 1, k), positions,
                  ops::rope_table(k, 10000.0, m));
  return r;
}

}  // namespace isa_mix
