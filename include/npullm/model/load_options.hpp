// load_options: how model_weights (weights.hpp) loads a model: load_options (quantization at
// load, metadata keys accepted unread), the quantization of a matrix at load
// (detail::quantize_matrix, in chunks of rows), and stored_weight_type: the element type W a
// model directory or GGUF file stores its weights in (what to instantiate a pipeline for).
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/io/quantized_safetensors.hpp"
#include "npullm/io/safetensors.hpp"
#include "npullm/ops/quant.hpp"

namespace npullm::model {

// How a matrix is quantized at load (ops::quantize, round to nearest).
struct quantization {
  ops::weight_format format = ops::weight_format::int4_sym;  // q8_0, q4_0, int8_sym, int4_sym
  std::size_t group = 128;  // *_sym: 32, 64, 128, or 0 = one group per output channel (K)
  npullm::dtype scale_type = npullm::dtype::f16;  // *_sym: f16 or f32
};

// Which dense matrices (f32 / f16 / bf16) model_weights copies at load into transparent huge
// pages (model/dense_huge_pages.hpp) instead of reading them in place from the file mapping,
// 4 KiB pages, where a decode step walks the page tables once per 4 KiB of weights and the
// hardware prefetchers stop at every page boundary. Measured on a 2-vCPU Zen 4 guest
// (docs/performance.md): Qwen2-0.5B bf16 decode +11 % tokens/s at 1 thread, +17 % at 2. The
// copy is anonymous memory the size of the matrices copied (the mapping's pages of each are
// dropped from the process after its copy, MADV_DONTNEED: the file's pages stay in the page
// cache, reclaimable): the resident set is the same, but it can no longer be reclaimed by
// dropping clean file pages under memory pressure (only swapped), and the load takes longer
// (about 1 s a GB). The advice is a hint: where the kernel gives no huge pages (`never`, no
// THP) the copy stays in 4 KiB pages, the logits the same bits (set `off` there); where the
// copy's memory cannot be allocated the matrices stay mapped, as with `off`.
//   automatic: the matrices a pipeline with weight_packing::automatic reads in place every
//              decode step: the LM head (the embedding when tied), and the layer projections
//              where that pipeline does not pack them (ops::packing_pays<W>() false: bf16 with
//              AVX-512 BF16, whose dot-product path reads W as stored); f32 / f16 projections
//              and bf16 ones elsewhere are packed by the pipeline into a copy of its own, so
//              copying them too would only add memory. An untied embedding (a gather of a
//              step's rows) stays mapped.
//   off:       none: every dense matrix a zero-copy view of the mapping (no memory added).
//   on:        every dense matrix, the untied embedding included.
// Quantized matrices are not concerned (the pipeline repacks them into huge-page tiles).
enum class huge_page_copy { automatic, off, on };

// Options of model_weights::load. Quantization belongs to the weights (every pipeline over
// them runs the same quantized matrices), so it is chosen here, not per pipeline. A matrix the
// files already store quantized (npullm_quantize's safetensors) is used as stored.
struct load_options {
  // Every layer's q/k/v/o/gate/up/down (the Intel NPU recipe: int4_sym, group 128).
  std::optional<quantization> projections = std::nullopt;
  // The token embedding and the LM head (once when tied): the NPU recipe keeps them int8
  // (int8_sym, per channel). The gather dequantizes the rows it reads.
  std::optional<quantization> embedding_and_head = std::nullopt;
  // Keys of config.json or GGUF metadata to accept unread: names, or prefixes ending in '*'
  // ("_*"). Both readers refuse a key nobody has classified (it might change the math), and
  // tools add their own to fine-tuned checkpoints (`unsloth_version`, provenance keys starting
  // with `_`): list here those you know cannot change the forward pass.
  std::vector<std::string> accept_keys = {};
  // Dense matrices copied into transparent huge pages at load (see huge_page_copy).
  huge_page_copy dense_huge_pages = huge_page_copy::automatic;
};

namespace detail {

// Bytes owned by the weights: a matrix quantized or row-permuted at load, or a converted vector.
struct owned_bytes {
  std::vector<std::byte> data, scales;
};

// w (N, K) quantized as q asks, in chunks of rows (a bf16 embedding is not converted to f32
// whole). The view points into *out.
template <storage_type W>
ops::quantized_view quantize_matrix(dense_view<const W, 2> w, const quantization& q,
                                    owned_bytes& out) {
  const std::size_t n = w.extent(0), k = w.extent(1);
  const std::size_t group = q.group == 0 ? k : q.group;
  constexpr std::size_t chunk = 256;
  tensor<float, 2> f(std::min(chunk, std::max<std::size_t>(n, 1)), k);
  out.data.clear();
  out.scales.clear();
  for (std::size_t r0 = 0; r0 < n; r0 += chunk) {
    const std::size_t r1 = std::min(n, r0 + chunk);
    const W* src = w.data_handle() + r0 * k;
    float* dst = f.data();
    for (std::size_t i = 0; i < (r1 - r0) * k; ++i) dst[i] = to_float(src[i]);
    const auto m =
        ops::quantize(dense_view<const float, 2>(dst, r1 - r0, k), q.format, group, q.scale_type);
    out.data.insert(out.data.end(), m.data().begin(), m.data().end());
    out.scales.insert(out.scales.end(), m.scales().begin(), m.scales().end());
  }
  if (ops::is_block_format(q.format)) return ops::quantized_view(q.format, n, k, out.data);
  return ops::quantized_view(q.format, n, k, out.data, out.scales, group, q.scale_type);
}

}  // namespace detail

// The element type W that model_weights<W>::load_gguf needs for a GGUF file: that of its dense
// matrices (2-D F32 / F16 / BF16 tensors, which load_gguf requires stored as W), or f32 when
// every matrix is quantized (W is then only the norms' type; llama.cpp stores them F32, so they
// are read zero-copy).
inline npullm::dtype stored_weight_type(const io::gguf_file& file) {
  for (const io::gguf_tensor_info& t : file.tensors()) {
    if (t.n_dims < 2) continue;
    if (const auto d = io::ggml_storage(t.type)) return *d;
  }
  return npullm::dtype::f32;
}

// The element type a model stores its weights in: what to instantiate a pipeline for. `path` is
// a model directory (config.json + safetensors: the type of its embedding matrix, which load()
// checks every other matrix against; a quantized model's W is that of its norms) or a GGUF file
// (see the overload above).
inline npullm::dtype stored_weight_type(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) return stored_weight_type(*io::gguf_file::open(path));
  const io::safetensors_model file = io::safetensors_model::open(path);
  // A quantized embedding (npullm_quantize): the final norm's type is W.
  const bool quantized =
      file.file_of("model.embed_tokens.weight")
          .header()
          .metadata.contains(io::quantized_metadata_key("model.embed_tokens.weight"));
  const io::tensor_info& info =
      file.info(quantized ? "model.norm.weight" : "model.embed_tokens.weight");
  const auto d = info.storage();
  if (!d) {
    raise(error_code::unsupported, "model ", path.string(), ": ", info.name, " is stored as ",
          info.dtype, " (npullm reads F32, F16 and BF16)");
  }
  return *d;
}

}  // namespace npullm::model
