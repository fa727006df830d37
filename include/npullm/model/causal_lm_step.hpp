// causal_lm_step: how causal_lm (causal_lm.hpp) runs a step, apart from its public face. One
// step: the KV positions reserved (undone if anything throws), the pyramid variant's mask, the
// head (the embedding gather), the body once per decoder layer (decoder_layer with this
// pipeline's attention: over the sequence's past as tiles of the cache, the ring or its blocks,
// the step's own K/V as the final tile, which then join the KV), and the tail (the selected rows'
// final norm and LM head, or their pre-norm hidden rows; a device_memory backend's through its
// stage). causal_lm_steps<LM> holds them as static functions over the pipeline (LM =
// causal_lm<Config>, whose friend it is): the pipeline's state stays in causal_lm.
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
struct causal_lm_steps {
  using W = typename LM::W;
  using KvT = typename LM::KvT;
  using tiles = typename LM::tiles;
  using backend_type = typename LM::backend_type;
  using kv_tile_type = typename LM::kv_tile_type;
  using table_type = typename LM::table_type;
  using slots = typename LM::slots;
  using segment = typename LM::segment;
  using step_state = typename LM::step_state;
  using body_closure = typename LM::body_closure;
  using tail_closure = typename LM::tail_closure;
  static constexpr bool blocks = LM::blocks;
  static constexpr bool pyramid = LM::pyramid;
  static constexpr std::size_t all_layers = LM::all_layers;

  template <class Body>
  static void run_step(LM& lm, std::span<const std::int32_t> ids, std::size_t token_offset, slots s,
                       const Body& bodies, step_output& out, std::size_t layers = all_layers) {
    const std::size_t n = ids.size();
    lm.check_capacity(n);
    step_state st{ids, lm.length(), s, std::vector<std::int64_t>(s.rows, 0), nullptr};
    for (std::size_t t = 0; t < n; ++t)
      st.positions[s.first + t] = static_cast<std::int64_t>(st.past + t);

    // Reserve the KV positions; undo them if anything below throws.
    if constexpr (blocks) {
      lm.table_->append(n);
    } else {
      lm.with_cache([&](auto& c) { c.append(n); });
    }
    lm.reads_.assign(lm.config_.num_hidden_layers, {});
    struct rollback {
      LM* pipeline;
      std::size_t past;
      bool done = false;
      ~rollback() {
        if (!done) pipeline->truncate(past);
      }
    } guard{&lm, st.past};

    std::optional<tensor<float, 2>> full_mask;
    std::optional<attention::pyramid_step> pstep;
    if constexpr (pyramid) {
      // The variant mask, built once for every layer of this step.
      const std::size_t max_past = lm.plan_->max_past();
      full_mask.emplace(s.rows, max_past + s.rows);
      auto m = full_mask->view();
      for (std::size_t r = 0; r < s.rows; ++r) {
        const bool real = r >= s.first && r < s.first + n;
        for (std::size_t j = 0; j < max_past + s.rows; ++j) {
          const bool visible =
              real && (j < max_past ? j < st.past : (j - max_past >= s.first && j - max_past <= r));
          m(r, j) = visible ? 0.0f : -std::numeric_limits<float>::infinity();
        }
      }
      pstep.emplace(*lm.plan_, full_mask->view(), st.past, s.rows);
      st.pyramid_step = &*pstep;
    }

    auto clock = std::chrono::steady_clock::now();
    auto lap = [&](double& bucket) {
      const auto now = std::chrono::steady_clock::now();
      bucket += std::chrono::duration<double>(now - clock).count();
      clock = now;
    };
    lm.backend_.execute(lm.head_, st, -1, lm.head_args_);
    lap(lm.timings_.head);
    for (std::size_t l = 0; l < std::min(layers, lm.layers_.size()); ++l) {
      lm.backend_.execute(bodies[lm.layer_kind_[l]], body_closure{l, &st},
                          static_cast<std::ptrdiff_t>(l), lm.layer_args_[l]);
    }
    lap(lm.timings_.body);

    // The call's selected rows that fall in this step.
    auto in_step = [&](const std::vector<std::size_t>& rows, std::vector<std::size_t>& local) {
      const auto first = std::lower_bound(rows.begin(), rows.end(), token_offset);
      local.clear();
      for (auto it = first; it != rows.end() && *it < token_offset + n; ++it)
        local.push_back(*it - token_offset);
      return static_cast<std::size_t>(first - rows.begin());
    };
    std::vector<std::size_t> logit_local, hidden_local;
    const std::size_t logit_offset = in_step(out.logit_rows, logit_local);
    const std::size_t hidden_offset = in_step(out.hidden_rows, hidden_local);
    if (!logit_local.empty() || !hidden_local.empty()) {
      const tail_closure tc{&st, logit_local, logit_offset, hidden_local, hidden_offset, &out};
      if constexpr (backend_type::device_memory) {
        // The device writes the selected rows into its own memory; they are copied out after.
        const std::size_t need = (logit_local.size() * lm.config_.vocab_size +
                                  hidden_local.size() * lm.config_.hidden_size);
        if (lm.tail_stage_.size() < need)
          lm.tail_stage_ = lm.backend_.template allocate<float>(need);
        std::vector<npu::argument> args = lm.tail_args_;
        args.push_back({lm.tail_stage_.data(), need * sizeof(float)});
        lm.backend_.execute(lm.tail_, tc, -1, args);
        const float* stage = lm.tail_stage_.data();
        const std::size_t nl = logit_local.size() * lm.config_.vocab_size;
        if (nl != 0) std::copy_n(stage, nl, &out.logits.view()(logit_offset, 0));
        if (!hidden_local.empty()) {
          std::copy_n(stage + nl, hidden_local.size() * lm.config_.hidden_size,
                      &out.hidden.view()(hidden_offset, 0));
        }
      } else {
        lm.backend_.execute(lm.tail_, tc);
      }
    }
    lm.backend_.wait();
    lap(lm.timings_.tail);
    guard.done = true;
    if constexpr (blocks) {
      if (layers >= lm.layers_.size()) lm.release_out_of_window(*lm.table_);
    }
  }

  static void run_head(LM& lm, const step_state& st) {
    auto x = rows(lm.act_.x.view(), 0, st.s.rows);
    std::fill_n(x.data_handle(), x.size(), 0.0f);
    const auto real = rows(lm.act_.x.view(), st.s.first, st.s.first + st.ids.size());
    gather_rows(st.ids, lm.weights_->embed, real);  // a quantized embedding: rows dequantized
    if (lm.config_.embedding_scale != 1.0) {        // Gemma 2: embeddings times sqrt(hidden)
      const float scale = static_cast<float>(lm.config_.embedding_scale);
      for (std::size_t i = 0; i < real.size(); ++i) real.data_handle()[i] *= scale;
    }
  }

  // The mask of a layer's step whose first query is at position `past`: causal, within the
  // layer's window when it has one. Full attention is the window no key can fall out of (the
  // same classification and the same visible keys as attention::causal, one flash
  // instantiation for both kinds of layer).
  static attention::sliding_window layer_mask(const LM& lm, std::size_t layer,
                                              std::size_t past) noexcept {
    const std::size_t w = lm.config_.window(layer);
    return attention::sliding_window{w != 0 ? w : kv_capacity_positions(lm) + 1, past};
  }
  static std::size_t kv_capacity_positions(const LM& lm) noexcept {
    return std::max(lm.options_.max_sequence, lm.options_.prefill.size) + lm.options_.decode_rows;
  }

  // Tokens [0, past) of one layer as tiles of the cache: what a step attends to before its own.
  static std::vector<kv_tile_type> past_tiles(const LM& lm, std::size_t layer, std::size_t past,
                                              const table_type* seq = nullptr) {
    std::vector<kv_tile_type> tiles;
    if (past == 0) return tiles;
    if constexpr (blocks) {
      const auto& table = seq ? *seq : *lm.table_;
      for (std::size_t i = 0; i < table.tile_count(past); ++i)  // live blocks only
        tiles.push_back(table.tile(layer, i, past));
    } else if (lm.ring_) {
      const auto ring = lm.ring_->range_tiles(layer, lm.ring_->first_position(), past);
      tiles.assign(ring.span().begin(), ring.span().end());
    } else {
      tiles.push_back(lm.cache_->range_tile(layer, 0, past));
    }
    return tiles;
  }

  // A step's K/V rows [first, first + n) of (kv_heads, rows, head_dim) join `source` (a block
  // table or the cache) at positions past.. in one layer.
  template <class Source>
  static void write_kv(Source& source, std::size_t layer, std::size_t past,
                       dense_view<const float, 3> kh, dense_view<const float, 3> vh,
                       std::size_t first, std::size_t n) {
    // (decoder_layer rounded kh / vh to KvT already: quantizing them again stores the same
    // values, test_kv_quant's RoundTripStoresTheSameValues.)
    const std::size_t D = kh.extent(2);
    for (std::size_t t = 0; t < n; ++t) {
      auto ks = source.token_kv(past + t, layer, kv::k_part);  // (kv_heads, units)
      auto vs = source.token_kv(past + t, layer, kv::v_part);
      for (std::size_t hh = 0; hh < kh.extent(0); ++hh) {
        kv::quantize_row(&kh(hh, first + t, 0), D, &ks(hh, 0));
        kv::quantize_row(&vh(hh, first + t, 0), D, &vs(hh, 0));
      }
    }
  }

  // One layer of a step: decoder_layer with this pipeline's attention. A segment attends to
  // its own sequence's past (none for an independent sequence; the pyramid variant; the
  // padded static prompt; or the KV as it is) with its own K/V as the final tile, which then
  // join that sequence's KV.
  static void run_layer(LM& lm, const body_closure& c) {
    const step_state& st = *c.step;
    const std::size_t S = st.s.rows, n = st.ids.size();
    const pool_policy policy{lm.options_.pool};
    const std::vector<segment> whole{{0, S}};
    const std::vector<segment>& segments = st.packed.empty() ? whole : st.packed;
    auto attend = [&](const segment& g, const attention::attention_io& step_io,
                      dense_view<float, 3> kh, dense_view<float, 3> vh) {
      attention::attention_io io = step_io;
      if (c.layer < lm.reads_.size()) io.stats = &lm.reads_[c.layer];
      if (!st.packed.empty()) {
        if (g.table == nullptr) {  // an independent sequence: its own K/V only, causal
          const kv::kv_tile<float> present{kh, vh, 0};
          attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(), &present,
                                            layer_mask(lm, c.layer, 0), policy);
          return;
        }
        if constexpr (blocks) {  // one of several sequences: its own blocks, then its K/V join them
          const kv::kv_tile<float> present{kh, vh, g.past};
          const auto past = past_tiles(lm, c.layer, g.past, g.table);
          attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(past), &present,
                                            layer_mask(lm, c.layer, g.past), policy);
          write_kv(*g.table, c.layer, g.past, kh, vh, 0, g.rows);
        }
        return;
      }
      const kv::kv_tile<float> present{kh, vh, st.past};
      const auto past = past_tiles(lm, c.layer, st.past);
      if constexpr (pyramid) {
        const kv_tile_type ptile = attention::pyramid_past(*lm.cache_, c.layer, *st.pyramid_step);
        attention::pyramid_attention<tiles>(io, std::span<const kv_tile_type>(&ptile, 1), present,
                                            *st.pyramid_step, policy);
      } else if (st.s.first > 0) {  // static prefill (empty past): left padding is masked
        attention::flash_attention<tiles>(
            io, std::span<const kv_tile_type>(past), &present,
            attention::all_of<attention::sliding_window, attention::padding>{
                layer_mask(lm, c.layer, st.past), attention::padding::left(st.s.first, S)},
            policy);
      } else {
        attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(past), &present,
                                          layer_mask(lm, c.layer, st.past), policy);
      }
      // The step's real K/V join the cache.
      if constexpr (blocks) {
        write_kv(*lm.table_, c.layer, st.past, kh, vh, st.s.first, n);
      } else {
        lm.with_cache(
            [&](auto& cache) { write_kv(cache, c.layer, st.past, kh, vh, st.s.first, n); });
      }
    };
    decoder_layer<KvT>(lm.layers_[c.layer], lm.act_, lm.config_, lm.rope_, st.positions, S,
                       std::span<const segment>(segments), policy, attend);
  }

  // Writes the selected rows into the call's output, or (device_memory backends) into the
  // stage: logit rows (vocab each) then hidden rows (hidden_size each).
  static void run_tail(LM& lm, const tail_closure& t) {
    const auto& cfg = lm.config_;
    const step_state& st = *t.step;
    const std::size_t nl = t.logit_rows.size(), nh = t.hidden_rows.size();
    dense_view<float, 2> logits, hidden;
    if constexpr (backend_type::device_memory) {
      logits = dense_view<float, 2>(lm.tail_stage_.data(), nl, cfg.vocab_size);
      hidden =
          dense_view<float, 2>(lm.tail_stage_.data() + nl * cfg.vocab_size, nh, cfg.hidden_size);
    } else {
      logits = rows(t.out->logits.view(), t.logit_offset, t.logit_offset + nl);
      if (nh != 0) hidden = rows(t.out->hidden.view(), t.hidden_offset, t.hidden_offset + nh);
    }
    // Pre-norm hidden rows, copied out as they are.
    for (std::size_t i = 0; i < nh; ++i) {
      std::copy_n(&lm.act_.x.view()(st.s.first + t.hidden_rows[i], 0), cfg.hidden_size,
                  &hidden(i, 0));
    }
    if (nl == 0) return;
    std::vector<std::size_t> step_rows(nl);
    for (std::size_t i = 0; i < nl; ++i) step_rows[i] = st.s.first + t.logit_rows[i];
    run_lm_head(lm, step_rows, logits);
  }

  // The selected step rows of x gathered, final-normed and through the LM head into out.
  static void run_lm_head(LM& lm, const std::vector<std::size_t>& step_rows,
                          dense_view<float, 2> out) {
    const auto& cfg = lm.config_;
    const std::size_t m = step_rows.size();
    if (m == 0) return;
    auto sel = rows(lm.act_.h.view(), 0, m);
    for (std::size_t i = 0; i < m; ++i)
      std::copy_n(&lm.act_.x.view()(step_rows[i], 0), cfg.hidden_size, &sel(i, 0));
    ops::rms_norm<W>(sel, lm.weights_->final_norm, static_cast<float>(cfg.rms_norm_eps), sel,
                     cfg.norm_unit_offset ? 1.0f : 0.0f);
    project(sel, lm.lm_head_, out, {}, pool_policy{lm.options_.pool});  // W's, quantized or tiles
    if (cfg.final_logit_softcapping > 0) {  // Gemma 2: logits = c tanh(logits / c)
      ops::softcap(std::span<float>(out.data_handle(), out.size()),
                   static_cast<float>(cfg.final_logit_softcapping));
    }
  }
};

}  // namespace npullm::model::detail
