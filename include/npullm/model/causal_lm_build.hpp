// causal_lm_build: how causal_lm (causal_lm.hpp) is put together, apart from its public face:
// the options checked against the config and the attention policy (and the step's rows chosen),
// the pipeline's own layer table with its packed copies of the weights (options.packing: dense
// panels, quantized panels or tiles in one huge-page arena), the KV (a block pool and table, the
// pyramid's cache, a ring when every layer is windowed, or the contiguous cache) and the graph
// arguments of head, body and tail. causal_lm_build<LM> holds them as static functions over the
// pipeline (LM = causal_lm<Config>, whose friend it is).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "npullm/attention/flash.hpp"
#include "npullm/attention/mask.hpp"
#include "npullm/attention/pyramid.hpp"
#include "npullm/core/huge_page_allocator.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tokens.hpp"
#include "npullm/io/safetensors.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"
#include "npullm/kv/ring_cache.hpp"
#include "npullm/model/activations.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/decoder_layer.hpp"
#include "npullm/model/pipeline_config.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/npu/host.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/gelu_mul.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/rms_norm.hpp"
#include "npullm/ops/rope.hpp"
#include "npullm/step/output.hpp"

namespace npullm::model::detail {

template <class LM>
struct causal_lm_build {
  using W = typename LM::W;
  using kv_policy = typename LM::kv_policy;
  using attention_policy = typename LM::attention_policy;
  using backend_type = typename LM::backend_type;
  using ring_type = typename LM::ring_type;
  static constexpr bool blocks = LM::blocks;
  static constexpr bool pyramid = LM::pyramid;

  static void validate_options(LM& lm) {
    const auto& m = lm.options_.prefill;
    if (lm.options_.max_sequence == 0 || lm.options_.decode_rows == 0 ||
        (m.mode != prefill_mode::kind::dynamic && m.size == 0)) {
      raise(error_code::invalid_argument, "causal_lm: max_sequence ", lm.options_.max_sequence,
            ", decode_rows ", lm.options_.decode_rows, " and a static/chunked prefill size ",
            m.size, " must be > 0");
    }
    if (lm.config_.head_dim % simd::lanes != 0) {
      raise(error_code::unsupported, "causal_lm: head_dim ", lm.config_.head_dim,
            " is not a multiple of ", simd::lanes);
    }
    // What the family asks that this pipeline does not do (config.hpp reads it all).
    if (pyramid && lm.config_.attn_logit_softcapping > 0) {
      raise(error_code::unsupported, "causal_lm: pyramid attention with attn_logit_softcapping ",
            lm.config_.attn_logit_softcapping, " (", to_string(lm.config_.family), ")");
    }
    const bool windowed =
        std::any_of(lm.config_.layer_windows.begin(), lm.config_.layer_windows.end(),
                    [](std::size_t w) { return w != 0; });
    if (pyramid && windowed) {
      raise(error_code::unsupported, "causal_lm: pyramid attention with sliding-window layers (",
            to_string(lm.config_.family), ")");
    }
    if constexpr (pyramid) {
      if (m.mode == prefill_mode::kind::static_shape) {
        raise(error_code::invalid_argument,
              "causal_lm: pyramid attention prefills in chunks of its own; use "
              "prefill_mode::chunked or dynamic");
      }
      if (m.mode == prefill_mode::kind::chunked && m.size != attention_policy::chunk) {
        raise(error_code::invalid_argument, "causal_lm: pyramid attention prefills in chunks of ",
              attention_policy::chunk, ", its own; prefill_mode::chunked(", m.size,
              ") asks for another size");
      }
      if (lm.options_.decode_rows > attention_policy::chunk) {
        raise(error_code::invalid_argument, "causal_lm: decode_rows ", lm.options_.decode_rows,
              " exceeds the pyramid chunk ", attention_policy::chunk);
      }
    }
    switch (m.mode) {
      case prefill_mode::kind::dynamic:
        lm.prefill_rows_ = lm.options_.step_rows != 0
                               ? std::min(lm.options_.step_rows, lm.options_.max_sequence)
                               : lm.options_.max_sequence;
        break;
      case prefill_mode::kind::static_shape: lm.prefill_rows_ = m.size; break;
      case prefill_mode::kind::chunked: lm.prefill_rows_ = m.size; break;
    }
    if constexpr (pyramid) lm.prefill_rows_ = attention_policy::chunk;
    if (m.mode == prefill_mode::kind::static_shape && m.size > lm.options_.max_sequence) {
      raise(error_code::invalid_argument, "causal_lm: static prompt capacity ", m.size,
            " exceeds max_sequence ", lm.options_.max_sequence);
    }
  }

  [[nodiscard]] static bool packs_weights(const LM& lm) noexcept {
    if constexpr (backend_type::device_memory) {
      return false;  // the device reads the weights as stored, from its own memory
    } else {
      switch (lm.options_.packing) {
        case weight_packing::on: return true;
        case weight_packing::off: return false;
        default: return ops::packing_pays<W>() || lm.options_.batch_invariant;
      }
    }
  }
  // Quantized projections are packed into panels only by weight_packing::on, repacked into
  // tiles only by automatic (why: see weight_packing).
  [[nodiscard]] static bool packs_quantized_weights(const LM& lm) noexcept {
    if constexpr (backend_type::device_memory) {
      return false;
    } else {
      return lm.options_.packing == weight_packing::on;
    }
  }
  [[nodiscard]] static bool repacks_quantized_weights(const LM& lm) noexcept {
    if constexpr (backend_type::device_memory) {
      return false;
    } else {
      return lm.options_.packing == weight_packing::automatic;
    }
  }
  // This pipeline's layer table: the shared weights' views, and its own packed copies of the
  // projections when it packs (options.packing).
  static void pack_weights(LM& lm) {
    if (lm.options_.batch_invariant && lm.options_.packing == weight_packing::off) {
      raise(error_code::invalid_argument,
            "causal_lm: batch_invariant needs packed dense weights, and packing is off");
    }
    lm.layers_ = lm.weights_->layers;
    lm.lm_head_ = lm.weights_->lm_head;
    const bool dense = packs_weights(lm), quantized = packs_quantized_weights(lm);
    const bool tiles = repacks_quantized_weights(lm);
    const auto tiled = [](const projection<W>& p) {
      return p.is_quantized() && ops::has_repacked_layout(p.quantized->format) &&
             p.quantized->cols % 32 == 0;
    };
    // The tiles and dense panels of all matrices in one arena: the small ones (attention,
    // experts) share huge pages too.
    const auto arena = tiles || dense ? std::make_shared<huge_page_arena>() : nullptr;
    if (tiles) {  // reserved: the projections point into it
      std::size_t n = tiled(lm.lm_head_) ? 1 : 0;
      for (const layer_weights<W>& l : lm.layers_)
        for_each_projection(l, [&](const projection<W>& p) { n += tiled(p) ? 1 : 0; });
      lm.repacked_.reserve(n);
      if (tiled(lm.lm_head_)) {
        lm.lm_head_.repacked = &lm.repacked_.emplace_back(
            ops::repack(*lm.lm_head_.quantized, pool_policy{lm.options_.pool}, arena));
      }
    }
    if (!dense && !quantized && !tiles) return;
    std::size_t matrices = 0;
    for (const layer_weights<W>& l : lm.layers_)
      for_each_projection(l, [&](const projection<W>&) { ++matrices; });
    lm.packed_.reserve(matrices + 1);  // + the LM head (batch_invariant); pointers stay valid
    lm.packed_quantized_.reserve(matrices);
    if (dense && lm.options_.batch_invariant && !lm.lm_head_.is_quantized())
      lm.lm_head_.packed =
          &lm.packed_.emplace_back(lm.lm_head_.w, pool_policy{lm.options_.pool}, arena);
    for (layer_weights<W>& l : lm.layers_) {
      for_each_projection(l, [&](projection<W>& p) {
        if (p.is_quantized()) {
          if (quantized) {
            p.packed_quantized = &lm.packed_quantized_.emplace_back(
                ops::pack(*p.quantized, pool_policy{lm.options_.pool}));
          } else if (tiles && tiled(p)) {
            p.repacked = &lm.repacked_.emplace_back(
                ops::repack(*p.quantized, pool_policy{lm.options_.pool}, arena));
          }
        } else if (dense) {
          p.packed = &lm.packed_.emplace_back(p.w, pool_policy{lm.options_.pool}, arena);
        }
      });
    }
  }

  static void create_kv(LM& lm) {
    const kv::kv_shape shape{lm.config_.num_hidden_layers, lm.config_.num_key_value_heads,
                             lm.config_.head_dim};
    if constexpr (blocks) {
      constexpr std::size_t bs = kv_policy::block_size;
      const std::size_t tokens =
          lm.options_.kv_capacity != 0 ? lm.options_.kv_capacity : lm.options_.max_sequence;
      lm.pool_.emplace(shape, bs, (tokens + bs - 1) / bs, lm.kv_alloc());
      lm.table_.emplace(*lm.pool_);
    } else if constexpr (pyramid) {
      // Variants of past i * q up to the largest past that holds max_sequence.
      constexpr std::size_t q = attention_policy::chunk;
      lm.plan_.emplace(q, ((lm.options_.max_sequence + q - 1) / q + 1) * q);
      lm.cache_.emplace(shape, lm.plan_->max_past(), lm.kv_alloc());
    } else if (const std::size_t w = lm.every_layer_window();
               w != 0 &&
               ring_type::capacity_for(w, lm.max_step_rows()) < lm.options_.max_sequence) {
      // Every layer is windowed: keep only what the windows still see (memory flat in the
      // sequence length; the positions stay absolute).
      lm.ring_.emplace(shape, w, lm.max_step_rows(), lm.kv_alloc());
    } else {
      lm.cache_.emplace(shape, lm.options_.max_sequence, lm.kv_alloc());
    }
  }

  // The buffers each function touches, as graph arguments: head (activations, embeddings),
  // body (activations, the KV storage, one layer's weights), tail (head's, the final norm and
  // the LM head; each call adds its rows' stage).
  static void bind_arguments(LM& lm) {
    auto warg = [](const auto& v) { return npu::argument{v.data_handle(), v.size() * sizeof(W)}; };
    // A matrix: its dense values, or a quantized one's blocks (and scales).
    auto marg = [&](std::vector<npu::argument>& a, const projection<W>& p) {
      if (!p.quantized) {
        a.push_back(warg(p.w));
        return;
      }
      a.push_back({p.quantized->data.data(), p.quantized->data.size()});
      if (!p.quantized->scales.empty())
        a.push_back({p.quantized->scales.data(), p.quantized->scales.size()});
    };
    const std::vector<npu::argument> activations = lm.act_.arguments();
    lm.head_args_ = activations;
    marg(lm.head_args_, lm.weights_->embed);
    lm.tail_args_ = lm.head_args_;
    lm.tail_args_.push_back(warg(lm.weights_->final_norm));
    if (lm.weights_->lm_head.identity() != lm.weights_->embed.identity())
      marg(lm.tail_args_, lm.weights_->lm_head);
    npu::argument kv_storage{};
    if constexpr (blocks) {
      kv_storage = {lm.pool_->data(), lm.pool_->storage_bytes()};
    } else {
      kv_storage = lm.with_cache([](const auto& c) {
        return npu::argument{c.data(), c.storage_bytes()};
      });
    }
    lm.layer_args_.clear();
    for (const auto& w : lm.layers_) {
      std::vector<npu::argument> a = activations;
      a.push_back(kv_storage);
      for (const auto* m : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down}) marg(a, *m);
      a.push_back(warg(w.input_norm));
      a.push_back(warg(w.post_norm));
      for (const auto* b : {&w.q_bias, &w.k_bias, &w.v_bias}) {
        if (!b->empty()) a.push_back({b->data(), b->size() * sizeof(float)});
      }
      lm.layer_args_.push_back(std::move(a));
    }
  }
};

}  // namespace npullm::model::detail
