// The compile-time configuration of a pipeline and its run-time options.
//
//   using config = pipeline_config<block_kv<bfloat16, 16>,   // Kv: where K/V live, their type
//                                  dynamic_attention<>,       // Attention: how steps attend
//                                  bfloat16,                  // Weights: as the files store them
//                                  npu::host_backend>;        // Backend: where functions run
//
// Each parameter is checked by a concept with a one-sentence failure.
#pragma once

#include <concepts>
#include <cstddef>

#include "npullm/attention/flash.hpp"
#include "npullm/core/dtype.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/npu/backend.hpp"
#include "npullm/npu/host.hpp"

namespace npullm::model {

// KV in one static-capacity contiguous cache of element format T: float, float16, bfloat16, or
// a quantized KV format, kv::q8_0 or kv::q4_0 (kv/kv_format.hpp: head_dim a multiple of 32),
// or K and V in two of these, kv::mixed<K, V> (e.g. kv::mixed<kv::q8_0, kv::q4_0>).
template <kv::kv_format T>
struct contiguous_kv {
  using value_type = T;
};
// KV in blocks of BlockSize tokens from a block pool, element format T (as above).
template <kv::kv_format T, std::size_t BlockSize>
struct block_kv {
  static_assert(BlockSize > 0);
  using value_type = T;
  static constexpr std::size_t block_size = BlockSize;
};

// Attention over the whole past as it is (the fast host path).
template <class Tiles = attention::flash<>>
struct dynamic_attention {
  using tiles = Tiles;
};
// Static shapes: chunks of Chunk queries and decode steps run the smallest pyramid variant.
template <std::size_t Chunk, class Tiles = attention::flash<>>
struct pyramid_attention_policy {
  static_assert(Chunk > 0);
  using tiles = Tiles;
  static constexpr std::size_t chunk = Chunk;
};

// What each parameter of pipeline_config must be. A wrong one fails with the sentence below,
// not inside the pipeline.
template <class K>
concept kv_policy = requires { typename K::value_type; } && kv::kv_format<typename K::value_type>;
template <class K>
concept block_kv_policy = kv_policy<K> && requires {
  { K::block_size } -> std::convertible_to<std::size_t>;
};
template <class A>
concept attention_policy = requires { typename A::tiles; };
template <class A>
concept pyramid_policy = attention_policy<A> && requires {
  { A::chunk } -> std::convertible_to<std::size_t>;
};

template <class Kv, class Attention, class Weights, class Backend = npu::host_backend>
struct pipeline_config {
  static_assert(kv_policy<Kv>,
                "pipeline_config: Kv must be model::contiguous_kv<T> or model::block_kv<T, "
                "BlockSize> with T float, float16, bfloat16, kv::q8_0, kv::q4_0 or "
                "kv::mixed<K, V> of two of them");
  static_assert(attention_policy<Attention>,
                "pipeline_config: Attention must be model::dynamic_attention<Tiles> or "
                "model::pyramid_attention_policy<Chunk, Tiles>");
  static_assert(!(pyramid_policy<Attention> && block_kv_policy<Kv>),
                "pipeline_config: pyramid attention runs over contiguous KV (model::contiguous_kv)");
  static_assert(storage_type<Weights>,
                "pipeline_config: Weights must be float, float16 or bfloat16 (how the model "
                "directory stores its weights)");
  static_assert(npu::backend<Backend>,
                "pipeline_config: Backend must satisfy npu::backend (npu/backend.hpp), e.g. "
                "npu::host_backend or npu::level_zero_backend");
  using kv = Kv;
  using attention_policy = Attention;
  using weight_type = Weights;
  using backend_type = Backend;
};

// What causal_lm takes: a pipeline_config (or a type with the same four members).
template <class C>
concept pipeline_configuration = requires {
  typename C::kv;
  typename C::attention_policy;
  typename C::weight_type;
  typename C::backend_type;
} && kv_policy<typename C::kv> && attention_policy<typename C::attention_policy> &&
    storage_type<typename C::weight_type> && npu::backend<typename C::backend_type>;

struct prefill_mode {
  enum class kind { dynamic, static_shape, chunked };
  kind mode = kind::dynamic;
  std::size_t size = 0;  // P for static_shape, q for chunked

  static prefill_mode dynamic() { return {}; }
  static prefill_mode static_prompt(std::size_t capacity) { return {kind::static_shape, capacity}; }
  static prefill_mode chunked(std::size_t chunk) { return {kind::chunked, chunk}; }
};

// Whether the decoder layers' projection weights are repacked once at load into the layout the
// linear micro-kernel reads (ops::packed_weights): no per-call packing, and small steps (decode
// batches, a speculative verify pass, short prefill chunks) stream each weight once. automatic:
// where it pays, i.e. on a host backend unless the bf16 dot-product path (AVX-512 BF16, which
// reads W in place) serves these weights. Costs a second copy of the layer weights in memory
// (in the pipeline's huge-page arena, with the tiles; the file's mapping stays, its pages
// reclaimable); the LM head and embeddings are not packed.
// Quantized projections and a quantized LM head: automatic repacks those of a format with a
// tiled layout (ops::repack: q4_0, q8_0, q4_k, q6_k; the file's bytes, q4_k + 2.8%) into tiles
// that every step reads (decode at the memory's pace; logits equal the stored blocks' within f32
// reassociation); `on` packs them into int8 panels instead (ops::pack: about 1.75 bytes per
// weight beside the blocks, which steps of up to 16 rows keep reading; logits bit for bit the
// stored blocks'), `off` reads them as stored.
enum class weight_packing { automatic, off, on };

struct pipeline_options {
  std::size_t max_sequence = 2048;  // longest sequence
  std::size_t kv_capacity = 0;      // KV tokens in the pool (block KV); 0: max_sequence
  prefill_mode prefill = prefill_mode::dynamic();
  std::size_t decode_rows = 8;        // the decode shape: up to this many tokens a step
  const thread_pool* pool = nullptr;  // nullptr: serial
  weight_packing packing = weight_packing::automatic;
  // The rows of a dynamic prefill step and of step_sequences / score, which size every
  // activation buffer; 0: max_sequence (one step takes any prompt). A longer prompt runs in
  // steps of this many tokens. Static and chunked prefill steps have their own size.
  std::size_t step_rows = 0;
  // Each row's logits the same bits whatever the other rows of its step (a server's output
  // independent of its load; prefill and decode of the same tokens equal): dense projections
  // are packed whatever `packing` says (the panels' micro-kernel sums K in one order for any
  // number of rows, where the in-place GEMV and GEMM, and the bf16 dot product's rounded x,
  // differ), and a dense LM head is packed too (a second copy of it). Quantized matrices are
  // computed row by row already (tiles, panels). Costs the head's copy, and for bf16 weights
  // on AVX-512 BF16 the dot-product path.
  bool batch_invariant = false;
};

}  // namespace npullm::model
