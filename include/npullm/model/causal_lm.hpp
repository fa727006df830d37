// causal_lm: a Qwen2 / Llama family decoder built from a model directory (config.json +
// safetensors), composed as head / body / tail on a backend.
//
//   head   embedding gather of the step's tokens
//   body   one decoder layer: rms_norm, q/k/v projections (+ Qwen2 biases), RoPE, attention
//          over the KV cache with the step's own K/V as the final tile, o projection,
//          residual, rms_norm, SwiGLU MLP, residual. Compiled once per phase (prefill shape,
//          decode shape) and executed once per layer with that layer's weights as the closure.
//   tail   the selected rows only: gathered before the final norm, then the LM head
//
// Configured at compile time (the policies below) while the model's shapes come from
// config.json at run time:
//
//   using config = pipeline_config<block_kv<bfloat16, 16>, dynamic_attention<>, bfloat16>;
//   causal_lm<config> lm("models/qwen2-0.5b", {.max_sequence = 4096});
//   auto out = lm.prefill(prompt);           // logits of the last prompt token
//   auto next = lm.decode(std::array{token});
//
// Activations are sized from the largest step (pipeline_options::step_rows, or the static /
// chunked prefill size, or decode_rows), not from max_sequence unless step_rows is left 0.
//
// Prefill modes (pipeline_options::prefill): dynamic (any length, in steps of up to step_rows
// tokens; one step by default), static (prompt
// capacity P: the prompt right-aligned in P slots, padded slots masked; the static shape a
// device graph has) and chunked (chunks of q, each chunk's K/V joining the past). All three
// give the same logits. With pyramid_attention_policy<q> (contiguous KV) chunks and decode
// steps run the smallest pyramid variant, with static shapes.
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

namespace npullm::model {

template <class Config>
class causal_lm {
  static_assert(pipeline_configuration<Config>,
                "causal_lm<Config>: Config must be a model::pipeline_config<Kv, Attention, "
                "Weights, Backend> (model/pipeline_config.hpp)");

 public:
  using W = typename Config::weight_type;
  using kv_policy = typename Config::kv;
  using KvT = typename kv_policy::value_type;
  using attention_policy = typename Config::attention_policy;
  using tiles = typename attention_policy::tiles;
  using backend_type = typename Config::backend_type;
  // Storage the backend's device can read: KV (pool or cache), activations, weights on a
  // device_memory backend.
  using kv_allocator = typename backend_type::template allocator_type<kv::storage_unit_t<KvT>>;
  using kv_tile_type = kv::format_tile<KvT>;
  using table_type = kv::block_table<KvT, kv_allocator>;
  using pool_type = kv::block_pool<KvT, kv_allocator>;
  template <class T, std::size_t Rank>
  using buffer = typename backend_type::template buffer<T, Rank>;
  static constexpr bool blocks = block_kv_policy<kv_policy>;
  static constexpr bool pyramid = pyramid_policy<attention_policy>;

  struct timings {
    double head = 0, body = 0, tail = 0;  // seconds
  };

  // Loads the model directory's weights for this pipeline alone.
  causal_lm(const std::filesystem::path& dir, pipeline_options options = {},
            backend_type backend = {})
      : causal_lm(model_weights<W>::load(dir), options, std::move(backend)) {}

  // Over weights loaded once (model_weights<W>::load, or another pipeline's weights()): any
  // number of pipelines and drafts share them. A device_memory backend copies them into its
  // own memory.
  causal_lm(std::shared_ptr<const model_weights<W>> weights, pipeline_options options = {},
            backend_type backend = {})
      : host_weights_(checked(std::move(weights))),
        config_(host_weights_->config()),
        options_(options),
        backend_(std::move(backend)),
        rope_(make_rope_table(config_, std::max(options.max_sequence, options.prefill.size) + 1)) {
    validate_options();
    if constexpr (backend_type::device_memory) {
      device_weights_ = host_weights_->copied_into(backend_);
      weights_ = device_weights_.get();
    } else {
      weights_ = host_weights_.get();
    }
    pack_weights();
    create_kv();
    act_ = activations<backend_type>::allocate(backend_, config_,
                                               std::max(prefill_rows_, options_.decode_rows));
    bind_arguments();
    const body_fn body = [this](const body_closure& c) { run_layer(c); };
    head_ = backend_.compile("head", {{0, config_.hidden_size}, false},
                             head_fn([this](const step_state& s) { run_head(s); }));
    // One body per distinct layer kind (full attention, or a window of W keys: Gemma 2
    // alternates two), each compiled for the prefill and the decode shape and invoked per layer
    // with that layer's weights.
    for (std::size_t l = 0; l < config_.num_hidden_layers; ++l) {
      const std::size_t w = config_.window(l);
      const auto it = std::find(kind_windows_.begin(), kind_windows_.end(), w);
      layer_kind_.push_back(static_cast<std::size_t>(it - kind_windows_.begin()));
      if (it == kind_windows_.end()) kind_windows_.push_back(w);
    }
    for (const std::size_t w : kind_windows_) {
      const std::string kind = w == 0 ? "" : "/window" + std::to_string(w);
      body_prefill_.push_back(backend_.compile(
          "body/prefill" + kind, {{prefill_rows_, config_.hidden_size}, static_prefill()}, body));
      body_decode_.push_back(backend_.compile(
          "body/decode" + kind, {{options_.decode_rows, config_.hidden_size}, pyramid}, body));
    }
    tail_ = backend_.compile("tail", {{0, config_.vocab_size}, false},
                             tail_fn([this](const tail_closure& t) { run_tail(t); }));
  }

  // Runs a prompt (appended to the current sequence; static prefill needs an empty one).
  step_output prefill(std::span<const std::int32_t> ids,
                      const output_selection& sel = output_selection::last()) {
    check_ids(ids);
    const std::size_t n = ids.size();
    auto out = make_output(sel, n);
    const auto& mode = options_.prefill;
    if (mode.mode == prefill_mode::kind::static_shape) {
      if (length() != 0) {
        raise(error_code::invalid_argument,
              "causal_lm: static prefill needs an empty sequence (length ", length(),
              "); call reset() first");
      }
      if (n > mode.size) {
        raise(error_code::capacity_exhausted, "causal_lm: prompt of ", n,
              " tokens exceeds the static prompt capacity ", mode.size);
      }
      run_step(ids, 0, slots{mode.size, mode.size - n}, body_prefill_, out);
    } else if (mode.mode == prefill_mode::kind::chunked || pyramid || n > prefill_rows_) {
      const std::size_t q = chunk_size();
      check_capacity(n);
      for (std::size_t t0 = 0; t0 < n; t0 += q) {
        const std::size_t len = std::min(q, n - t0);
        run_step(ids.subspan(t0, len), t0, slots{pyramid ? q : len, 0}, body_prefill_, out);
      }
    } else {
      run_step(ids, 0, slots{n, 0}, body_prefill_, out);
    }
    return out;
  }

  // One or a few tokens after the current sequence (decode_rows at most).
  //
  // layers < num_hidden_layers is an early exit (self-speculation's draft): only the first
  // `layers` decoder layers run, then the final norm and LM head. The step's positions are
  // appended with K/V written for those layers only; the layers above keep stale values there,
  // so the caller truncates them away and a full pass rewrites them (the first layers' K/V of
  // a token do not depend on the layers above, so they equal the full model's).
  step_output decode(std::span<const std::int32_t> ids,
                     const output_selection& sel = output_selection::last(),
                     std::size_t layers = all_layers) {
    check_ids(ids);
    check_layers(layers);
    if (ids.size() > options_.decode_rows) {
      raise(error_code::capacity_exhausted, "causal_lm: decode of ", ids.size(),
            " tokens exceeds the decode shape of ", options_.decode_rows, " rows");
    }
    auto out = make_output(sel, ids.size());
    run_step(ids, 0, slots{ids.size(), 0}, body_decode_, out, layers);
    return out;
  }

  // Scores independent sequences in packed passes (no padding; one GEMM per projection over
  // all their tokens; attention per sequence with its own causal mask): the logits of each
  // sequence's last token, (N, vocab). Keeps no KV and leaves the current sequence as it was.
  tensor<float, 2> score(std::span<const std::span<const std::int32_t>> sequences) {
    const std::size_t capacity = prefill_rows_;
    for (std::size_t i = 0; i < sequences.size(); ++i) {
      check_ids(sequences[i]);
      if (sequences[i].size() > capacity) {
        raise(error_code::capacity_exhausted, "causal_lm: score: sequence ", i, " has ",
              sequences[i].size(), " tokens, more than the ", capacity, " rows of a prefill step");
      }
    }
    tensor<float, 2> out = host_output({sequences.size(), config_.vocab_size});
    std::vector<std::int32_t> ids;
    for (std::size_t first = 0; first < sequences.size();) {
      // As many whole sequences as fit in one step.
      step_state st{{}, 0, {0, 0}, {}, nullptr, {}};
      ids.clear();
      std::size_t last = first;
      while (last < sequences.size() && ids.size() + sequences[last].size() <= capacity) {
        st.packed.push_back({ids.size(), sequences[last].size()});
        for (std::size_t t = 0; t < sequences[last].size(); ++t)
          st.positions.push_back(static_cast<std::int64_t>(t));
        ids.insert(ids.end(), sequences[last].begin(), sequences[last].end());
        ++last;
      }
      st.ids = ids;
      st.s = {ids.size(), 0};
      backend_.execute(head_, st, -1, head_args_);
      for (std::size_t l = 0; l < layers_.size(); ++l) {
        backend_.execute(body_prefill_[layer_kind_[l]], body_closure{l, &st},
                         static_cast<std::ptrdiff_t>(l), layer_args_[l]);
      }
      std::vector<std::size_t> rows_last;
      for (const segment& g : st.packed) rows_last.push_back(g.begin + g.rows - 1);
      run_lm_head(rows_last, rows(out.view(), first, last));
      backend_.wait();
      first = last;
    }
    return out;
  }

  // ---- several sequences at once (block KV): each sequence owns a block table from this
  // pipeline's pool; a step appends tokens to any number of them in one packed pass (one GEMM
  // per projection over all their rows, attention per sequence over its own blocks).
  struct sequence_input {
    table_type* table;                  // from new_sequence()
    std::span<const std::int32_t> ids;  // tokens to append
  };

  [[nodiscard]] table_type new_sequence() requires blocks { return table_type(*pool_); }
  [[nodiscard]] pool_type& kv_pool() requires blocks { return *pool_; }

  // Appends each input's tokens to its sequence; returns the logits of each input's last token,
  // (inputs, vocab). All or nothing: if the pool cannot hold every input's tokens, it throws
  // capacity_exhausted naming the input and no sequence changes.
  tensor<float, 2> step_sequences(std::span<const sequence_input> inputs) requires blocks {
    std::vector<std::size_t> last_rows;
    std::size_t end = 0;
    for (const sequence_input& in : inputs) last_rows.push_back((end += in.ids.size()) - 1);
    return step_sequences(inputs, output_selection().logits_for(std::move(last_rows))).logits;
  }

  // The same step with any rows: `sel` indexes the packed step (input 0's tokens, then input
  // 1's, ...) for logits and, separately, for pre-norm hidden rows; `layers` is decode()'s
  // early exit. Speculative verification asks for every row of each input (and the hidden rows
  // a draft head needs); a self-speculation draft step for each input's last row.
  step_output step_sequences(std::span<const sequence_input> inputs, const output_selection& sel,
                             std::size_t layers = all_layers) requires blocks {
    std::size_t total = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      check_ids(inputs[i].ids);
      total += inputs[i].ids.size();
    }
    check_layers(layers);
    if (total > prefill_rows_) {
      raise(error_code::capacity_exhausted, "causal_lm: step of ", total, " tokens exceeds the ",
            prefill_rows_, " rows of a step");
    }
    auto out = make_output(sel, total);  // checks the rows before any sequence changes
    step_state st{{}, 0, {total, 0}, {}, nullptr, {}};
    std::vector<std::int32_t> ids;
    ids.reserve(total);
    std::size_t reserved = 0;
    try {
      for (; reserved < inputs.size(); ++reserved) {
        auto* table = inputs[reserved].table;
        const std::size_t past = table->length();
        if (past + inputs[reserved].ids.size() > options_.max_sequence) {
          raise(error_code::capacity_exhausted, "causal_lm: sequence ", reserved, " would reach ",
                past + inputs[reserved].ids.size(), " tokens, past max_sequence ",
                options_.max_sequence);
        }
        table->append(inputs[reserved].ids.size());
        st.packed.push_back({ids.size(), inputs[reserved].ids.size(), past, table});
        for (std::size_t t = 0; t < inputs[reserved].ids.size(); ++t) {
          st.positions.push_back(static_cast<std::int64_t>(past + t));
        }
        ids.insert(ids.end(), inputs[reserved].ids.begin(), inputs[reserved].ids.end());
      }
    } catch (const error& e) {
      for (std::size_t i = 0; i < reserved; ++i) {
        inputs[i].table->truncate(st.packed[i].past);
      }
      raise(e.code(), "causal_lm: step_sequences: input ", reserved, " of ", inputs.size(), ": ",
            e.message());
    }
    st.ids = ids;
    reads_.assign(config_.num_hidden_layers, {});
    backend_.execute(head_, st, -1, head_args_);
    for (std::size_t l = 0; l < std::min(layers, layers_.size()); ++l) {
      const auto& bodies = total <= options_.decode_rows ? body_decode_ : body_prefill_;
      backend_.execute(bodies[layer_kind_[l]], body_closure{l, &st}, static_cast<std::ptrdiff_t>(l),
                       layer_args_[l]);
    }
    for (std::size_t i = 0; i < out.hidden_rows.size(); ++i) {  // pre-norm, as they are
      std::copy_n(&act_.x.view()(out.hidden_rows[i], 0), config_.hidden_size,
                  &out.hidden.view()(i, 0));
    }
    run_lm_head(out.logit_rows, out.logits.view());
    backend_.wait();
    if (layers >= layers_.size()) {  // a whole step (not a self-draft's first layers)
      for (const sequence_input& in : inputs) release_out_of_window(*in.table);
    }
    return out;
  }

  // Clears the sequence (returns its blocks / empties the cache) to serve the next.
  void reset() noexcept {
    if constexpr (blocks) {
      table_->reset();
    } else {
      with_cache([](auto& c) { c.reset(); });
    }
  }
  // Rolls the sequence back to its first n tokens (speculative decoding).
  void truncate(std::size_t n) {
    if constexpr (blocks) {
      table_->truncate(n);
    } else {
      with_cache([&](auto& c) { c.truncate(n); });
    }
  }

  [[nodiscard]] std::size_t length() const noexcept {
    if constexpr (blocks) {
      return table_->length();
    } else {
      return with_cache([](const auto& c) { return c.length(); });
    }
  }
  [[nodiscard]] const model_config& config() const noexcept { return config_; }
  // The weights this pipeline was built over (host memory), to build another over them.
  [[nodiscard]] const std::shared_ptr<const model_weights<W>>& weights() const noexcept {
    return host_weights_;
  }
  // Bytes of this pipeline's packed copies of the weights (options.packing): dense panels,
  // quantized matrices' int8 panels or tiles (the LM head's too). 0 when it reads the weights as
  // they are.
  [[nodiscard]] std::size_t packed_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& p : packed_) n += p.bytes();
    for (const auto& p : packed_quantized_) n += p.bytes();
    for (const auto& p : repacked_) n += p.bytes();
    return n;
  }
  // The KV of the single-sequence API (contiguous layout): for inspection and tests.
  // (A pipeline whose every layer is windowed keeps a ring instead: ring_kv_cache().)
  [[nodiscard]] const kv::contiguous_cache<KvT, kv_allocator>& kv_cache() const requires(!blocks) {
    if (!cache_) {
      raise(error_code::unsupported, "causal_lm: kv_cache(): every layer is windowed, the KV is a ",
            "ring of ", ring_->capacity(), " positions (ring_kv_cache())");
    }
    return *cache_;
  }
  [[nodiscard]] const kv::ring_cache<KvT, kv_allocator>* ring_kv_cache() const noexcept
      requires(!blocks) {
    return ring_ ? &*ring_ : nullptr;
  }
  // The KV positions each layer's attention read in the last step (flash_stats::keys_read:
  // keys times KV heads, summed over the step's work items): a windowed layer reads its window.
  [[nodiscard]] const std::vector<attention::flash_stats>& attention_reads() const noexcept {
    return reads_;
  }
  // A mixture of experts' routing: with record_routing(true), every MoE layer's choice of each
  // step from then on (moe::routing per layer call, in call order; record_routing clears them).
  void record_routing(bool on) {
    act_.moe.record = on;
    act_.moe.records.clear();
  }
  [[nodiscard]] const std::vector<moe::routing>& routing_records() const noexcept {
    return act_.moe.records;
  }
  [[nodiscard]] backend_type& backend() noexcept { return backend_; }
  [[nodiscard]] const timings& time_spent() const noexcept { return timings_; }
  void reset_timings() noexcept { timings_ = {}; }
  [[nodiscard]] std::size_t capacity() const noexcept { return options_.max_sequence; }
  // The most tokens one decode() takes, and one step_sequences() call.
  [[nodiscard]] std::size_t decode_rows() const noexcept { return options_.decode_rows; }
  [[nodiscard]] std::size_t step_rows() const noexcept { return prefill_rows_; }
  // decode()'s default: every decoder layer.
  static constexpr std::size_t all_layers = std::numeric_limits<std::size_t>::max();

 private:
  // Where the KV lives: the backend's memory, in the storage units of the KV format.
  kv_allocator kv_alloc() const { return backend_.template allocator<kv::storage_unit_t<KvT>>(); }

  // Where a step's n tokens sit in its S static rows: token t in row first + t.
  struct slots {
    std::size_t rows;   // S
    std::size_t first;  // leading padding rows (static prefill pads on the left)
  };

  // A packed step's independent sequence: rows [begin, begin + rows), positions from 0, no
  // past, no KV kept.
  struct segment {
    std::size_t begin, rows;
    std::size_t past = 0;         // keys before the segment (0 for an independent sequence)
    table_type* table = nullptr;  // its block table (block KV), or none: nothing stored
  };
  struct step_state {
    std::span<const std::int32_t> ids;
    std::size_t past;  // KV length before the step
    slots s;
    std::vector<std::int64_t> positions;  // per row (padding rows: 0)
    const attention::pyramid_step* pyramid_step = nullptr;
    std::vector<segment> packed{};  // non-empty: independent sequences, nothing stored
  };
  struct body_closure {
    std::size_t layer;
    const step_state* step;
  };
  struct tail_closure {
    const step_state* step;
    std::span<const std::size_t> logit_rows;  // step-local token indices
    std::size_t logit_offset;                 // first output row they fill
    std::span<const std::size_t> hidden_rows;
    std::size_t hidden_offset;
    step_output* out;
  };

  // ---- construction ----------------------------------------------------------------------

  bool static_prefill() const noexcept {
    return options_.prefill.mode == prefill_mode::kind::static_shape || pyramid;
  }
  // Tokens per step of a prefill that takes several: the pyramid chunk, the chunked mode's
  // size, or a dynamic step's rows (options.step_rows) for a longer prompt.
  std::size_t chunk_size() const noexcept {
    if constexpr (pyramid) return attention_policy::chunk;
    if (options_.prefill.mode == prefill_mode::kind::chunked) return options_.prefill.size;
    return prefill_rows_;
  }

  void validate_options() {
    const auto& m = options_.prefill;
    if (options_.max_sequence == 0 || options_.decode_rows == 0 ||
        (m.mode != prefill_mode::kind::dynamic && m.size == 0)) {
      raise(error_code::invalid_argument, "causal_lm: max_sequence ", options_.max_sequence,
            ", decode_rows ", options_.decode_rows, " and a static/chunked prefill size ", m.size,
            " must be > 0");
    }
    if (config_.head_dim % simd::lanes != 0) {
      raise(error_code::unsupported, "causal_lm: head_dim ", config_.head_dim,
            " is not a multiple of ", simd::lanes);
    }
    // What the family asks that this pipeline does not do (config.hpp reads it all).
    if (pyramid && config_.attn_logit_softcapping > 0) {
      raise(error_code::unsupported, "causal_lm: pyramid attention with attn_logit_softcapping ",
            config_.attn_logit_softcapping, " (", to_string(config_.family), ")");
    }
    const bool windowed = std::any_of(config_.layer_windows.begin(), config_.layer_windows.end(),
                                      [](std::size_t w) { return w != 0; });
    if (pyramid && windowed) {
      raise(error_code::unsupported, "causal_lm: pyramid attention with sliding-window layers (",
            to_string(config_.family), ")");
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
      if (options_.decode_rows > attention_policy::chunk) {
        raise(error_code::invalid_argument, "causal_lm: decode_rows ", options_.decode_rows,
              " exceeds the pyramid chunk ", attention_policy::chunk);
      }
    }
    switch (m.mode) {
      case prefill_mode::kind::dynamic:
        prefill_rows_ = options_.step_rows != 0
                            ? std::min(options_.step_rows, options_.max_sequence)
                            : options_.max_sequence;
        break;
      case prefill_mode::kind::static_shape: prefill_rows_ = m.size; break;
      case prefill_mode::kind::chunked: prefill_rows_ = m.size; break;
    }
    if constexpr (pyramid) prefill_rows_ = attention_policy::chunk;
    if (m.mode == prefill_mode::kind::static_shape && m.size > options_.max_sequence) {
      raise(error_code::invalid_argument, "causal_lm: static prompt capacity ", m.size,
            " exceeds max_sequence ", options_.max_sequence);
    }
  }

  static std::shared_ptr<const model_weights<W>> checked(
      std::shared_ptr<const model_weights<W>> w) {
    if (!w) raise(error_code::invalid_argument, "causal_lm: no weights");
    return w;
  }

  [[nodiscard]] bool packs_weights() const noexcept {
    if constexpr (backend_type::device_memory) {
      return false;  // the device reads the weights as stored, from its own memory
    } else {
      switch (options_.packing) {
        case weight_packing::on: return true;
        case weight_packing::off: return false;
        default: return ops::packing_pays<W>() || options_.batch_invariant;
      }
    }
  }
  // Quantized projections are packed into panels only by weight_packing::on, repacked into
  // tiles only by automatic (why: see weight_packing).
  [[nodiscard]] bool packs_quantized_weights() const noexcept {
    if constexpr (backend_type::device_memory) {
      return false;
    } else {
      return options_.packing == weight_packing::on;
    }
  }
  [[nodiscard]] bool repacks_quantized_weights() const noexcept {
    if constexpr (backend_type::device_memory) {
      return false;
    } else {
      return options_.packing == weight_packing::automatic;
    }
  }
  // This pipeline's layer table: the shared weights' views, and its own packed copies of the
  // projections when it packs (options.packing).
  void pack_weights() {
    if (options_.batch_invariant && options_.packing == weight_packing::off) {
      raise(error_code::invalid_argument,
            "causal_lm: batch_invariant needs packed dense weights, and packing is off");
    }
    layers_ = weights_->layers;
    lm_head_ = weights_->lm_head;
    const bool dense = packs_weights(), quantized = packs_quantized_weights();
    const bool tiles = repacks_quantized_weights();
    const auto tiled = [](const projection<W>& p) {
      return p.is_quantized() && ops::has_repacked_layout(p.quantized->format) &&
             p.quantized->cols % 32 == 0;
    };
    // The tiles of all matrices in one arena: the small ones (attention, experts) share huge
    // pages too.
    const auto arena = tiles ? std::make_shared<huge_page_arena>() : nullptr;
    if (tiles) {  // reserved: the projections point into it
      std::size_t n = tiled(lm_head_) ? 1 : 0;
      for (const layer_weights<W>& l : layers_)
        for_each_projection(l, [&](const projection<W>& p) { n += tiled(p) ? 1 : 0; });
      repacked_.reserve(n);
      if (tiled(lm_head_)) {
        lm_head_.repacked = &repacked_.emplace_back(
            ops::repack(*lm_head_.quantized, pool_policy{options_.pool}, arena));
      }
    }
    if (!dense && !quantized && !tiles) return;
    std::size_t matrices = 0;
    for (const layer_weights<W>& l : layers_)
      for_each_projection(l, [&](const projection<W>&) { ++matrices; });
    packed_.reserve(matrices + 1);  // + the LM head (batch_invariant); pointers stay valid
    packed_quantized_.reserve(matrices);
    if (dense && options_.batch_invariant && !lm_head_.is_quantized())
      lm_head_.packed = &packed_.emplace_back(lm_head_.w, pool_policy{options_.pool});
    for (layer_weights<W>& l : layers_) {
      for_each_projection(l, [&](projection<W>& p) {
        if (p.is_quantized()) {
          if (quantized) {
            p.packed_quantized = &packed_quantized_.emplace_back(
                ops::pack(*p.quantized, pool_policy{options_.pool}));
          } else if (tiles && tiled(p)) {
            p.repacked = &repacked_.emplace_back(
                ops::repack(*p.quantized, pool_policy{options_.pool}, arena));
          }
        } else if (dense) {
          p.packed = &packed_.emplace_back(p.w, pool_policy{options_.pool});
        }
      });
    }
  }

  void create_kv() {
    const kv::kv_shape shape{config_.num_hidden_layers, config_.num_key_value_heads,
                             config_.head_dim};
    if constexpr (blocks) {
      constexpr std::size_t bs = kv_policy::block_size;
      const std::size_t tokens =
          options_.kv_capacity != 0 ? options_.kv_capacity : options_.max_sequence;
      pool_.emplace(shape, bs, (tokens + bs - 1) / bs, kv_alloc());
      table_.emplace(*pool_);
    } else if constexpr (pyramid) {
      // Variants of past i * q up to the largest past that holds max_sequence.
      constexpr std::size_t q = attention_policy::chunk;
      plan_.emplace(q, ((options_.max_sequence + q - 1) / q + 1) * q);
      cache_.emplace(shape, plan_->max_past(), kv_alloc());
    } else if (const std::size_t w = every_layer_window();
               w != 0 && ring_type::capacity_for(w, max_step_rows()) < options_.max_sequence) {
      // Every layer is windowed: keep only what the windows still see (memory flat in the
      // sequence length; the positions stay absolute).
      ring_.emplace(shape, w, max_step_rows(), kv_alloc());
    } else {
      cache_.emplace(shape, options_.max_sequence, kv_alloc());
    }
  }

  // The largest window when every layer has one, else 0 (some layer sees the whole past).
  std::size_t every_layer_window() const noexcept {
    std::size_t w = 0;
    for (std::size_t l = 0; l < config_.num_hidden_layers; ++l) {
      if (config_.window(l) == 0) return 0;
      w = std::max(w, config_.window(l));
    }
    return w;
  }
  std::size_t max_step_rows() const noexcept {
    return std::max(prefill_rows_, options_.decode_rows);
  }

  // fn(the contiguous cache or the ring), whichever this pipeline keeps.
  template <class Fn>
  decltype(auto) with_cache(Fn&& fn) const {
    if (ring_) return fn(*ring_);
    return fn(*cache_);
  }
  template <class Fn>
  decltype(auto) with_cache(Fn&& fn) {
    if (ring_) return fn(*ring_);
    return fn(*cache_);
  }

  // Block KV of a model whose every layer is windowed: the blocks no window can see any more
  // go back to the pool. A margin of decode_rows positions is kept, so a speculative rollback
  // of up to that many tokens (truncate) still finds its blocks.
  void release_out_of_window(table_type& table) const {
    const std::size_t w = every_layer_window();
    const std::size_t keep = w + options_.decode_rows;
    if (w != 0 && table.length() + 1 > keep) table.release_before(table.length() + 1 - keep);
  }

  // A call's result in host memory (counted by the host backend's statistics).
  tensor<float, 2> host_output(const std::array<std::size_t, 2>& shape) {
    if constexpr (backend_type::device_memory) {
      return tensor<float, 2>(shape);
    } else {
      return backend_.template allocate<float, 2>(shape);
    }
  }

  // The buffers each function touches, as graph arguments: head (activations, embeddings),
  // body (activations, the KV storage, one layer's weights), tail (head's, the final norm and
  // the LM head; each call adds its rows' stage).
  void bind_arguments() {
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
    const std::vector<npu::argument> activations = act_.arguments();
    head_args_ = activations;
    marg(head_args_, weights_->embed);
    tail_args_ = head_args_;
    tail_args_.push_back(warg(weights_->final_norm));
    if (weights_->lm_head.identity() != weights_->embed.identity())
      marg(tail_args_, weights_->lm_head);
    npu::argument kv_storage{};
    if constexpr (blocks) {
      kv_storage = {pool_->data(), pool_->storage_bytes()};
    } else {
      kv_storage = with_cache([](const auto& c) {
        return npu::argument{c.data(), c.storage_bytes()};
      });
    }
    layer_args_.clear();
    for (const auto& w : layers_) {
      std::vector<npu::argument> a = activations;
      a.push_back(kv_storage);
      for (const auto* m : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down}) marg(a, *m);
      a.push_back(warg(w.input_norm));
      a.push_back(warg(w.post_norm));
      for (const auto* b : {&w.q_bias, &w.k_bias, &w.v_bias}) {
        if (!b->empty()) a.push_back({b->data(), b->size() * sizeof(float)});
      }
      layer_args_.push_back(std::move(a));
    }
  }

  // ---- a step ----------------------------------------------------------------------------

  void check_ids(std::span<const std::int32_t> ids) const {
    if (ids.empty()) raise(error_code::invalid_argument, "causal_lm: no tokens");
    check_token_ids(ids, config_.vocab_size, "causal_lm:");
  }
  void check_layers(std::size_t layers) const {
    if (layers != all_layers && layers > layers_.size()) {
      raise(error_code::invalid_argument, "causal_lm: a step through ", layers,
            " layers; the model has ", layers_.size());
    }
  }
  void check_capacity(std::size_t n) const {
    if (length() + n > options_.max_sequence) {
      raise(error_code::capacity_exhausted, "causal_lm: KV cache is full: ", length(), " + ", n,
            " tokens exceed the capacity of ", options_.max_sequence);
    }
  }

  step_output make_output(const output_selection& sel, std::size_t n) {
    step_output out;
    out.logit_rows = sel.logit_rows(n);
    out.hidden_rows = sel.hidden_rows(n);
    // Only the selected rows: a (n, vocab) buffer exists only when every row is asked for.
    out.logits = host_output({out.logit_rows.size(), config_.vocab_size});
    out.hidden = host_output({out.hidden_rows.size(), config_.hidden_size});
    return out;
  }

  template <class Body>
  void run_step(std::span<const std::int32_t> ids, std::size_t token_offset, slots s,
                const Body& bodies, step_output& out, std::size_t layers = all_layers) {
    const std::size_t n = ids.size();
    check_capacity(n);
    step_state st{ids, length(), s, std::vector<std::int64_t>(s.rows, 0), nullptr};
    for (std::size_t t = 0; t < n; ++t)
      st.positions[s.first + t] = static_cast<std::int64_t>(st.past + t);

    // Reserve the KV positions; undo them if anything below throws.
    if constexpr (blocks) {
      table_->append(n);
    } else {
      with_cache([&](auto& c) { c.append(n); });
    }
    reads_.assign(config_.num_hidden_layers, {});
    struct rollback {
      causal_lm* lm;
      std::size_t past;
      bool done = false;
      ~rollback() {
        if (!done) lm->truncate(past);
      }
    } guard{this, st.past};

    std::optional<tensor<float, 2>> full_mask;
    std::optional<attention::pyramid_step> pstep;
    if constexpr (pyramid) {
      // The variant mask, built once for every layer of this step.
      const std::size_t max_past = plan_->max_past();
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
      pstep.emplace(*plan_, full_mask->view(), st.past, s.rows);
      st.pyramid_step = &*pstep;
    }

    auto clock = std::chrono::steady_clock::now();
    auto lap = [&](double& bucket) {
      const auto now = std::chrono::steady_clock::now();
      bucket += std::chrono::duration<double>(now - clock).count();
      clock = now;
    };
    backend_.execute(head_, st, -1, head_args_);
    lap(timings_.head);
    for (std::size_t l = 0; l < std::min(layers, layers_.size()); ++l) {
      backend_.execute(bodies[layer_kind_[l]], body_closure{l, &st}, static_cast<std::ptrdiff_t>(l),
                       layer_args_[l]);
    }
    lap(timings_.body);

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
        const std::size_t need =
            (logit_local.size() * config_.vocab_size + hidden_local.size() * config_.hidden_size);
        if (tail_stage_.size() < need) tail_stage_ = backend_.template allocate<float>(need);
        std::vector<npu::argument> args = tail_args_;
        args.push_back({tail_stage_.data(), need * sizeof(float)});
        backend_.execute(tail_, tc, -1, args);
        const float* stage = tail_stage_.data();
        const std::size_t nl = logit_local.size() * config_.vocab_size;
        if (nl != 0) std::copy_n(stage, nl, &out.logits.view()(logit_offset, 0));
        if (!hidden_local.empty()) {
          std::copy_n(stage + nl, hidden_local.size() * config_.hidden_size,
                      &out.hidden.view()(hidden_offset, 0));
        }
      } else {
        backend_.execute(tail_, tc);
      }
    }
    backend_.wait();
    lap(timings_.tail);
    guard.done = true;
    if constexpr (blocks) {
      if (layers >= layers_.size()) release_out_of_window(*table_);
    }
  }

  void run_head(const step_state& st) {
    auto x = rows(act_.x.view(), 0, st.s.rows);
    std::fill_n(x.data_handle(), x.size(), 0.0f);
    const auto real = rows(act_.x.view(), st.s.first, st.s.first + st.ids.size());
    gather_rows(st.ids, weights_->embed, real);  // a quantized embedding: rows dequantized
    if (config_.embedding_scale != 1.0) {        // Gemma 2: embeddings times sqrt(hidden)
      const float scale = static_cast<float>(config_.embedding_scale);
      for (std::size_t i = 0; i < real.size(); ++i) real.data_handle()[i] *= scale;
    }
  }

  // The mask of a layer's step whose first query is at position `past`: causal, within the
  // layer's window when it has one. Full attention is the window no key can fall out of (the
  // same classification and the same visible keys as attention::causal, one flash
  // instantiation for both kinds of layer).
  attention::sliding_window layer_mask(std::size_t layer, std::size_t past) const noexcept {
    const std::size_t w = config_.window(layer);
    return attention::sliding_window{w != 0 ? w : kv_capacity_positions() + 1, past};
  }
  std::size_t kv_capacity_positions() const noexcept {
    return std::max(options_.max_sequence, options_.prefill.size) + options_.decode_rows;
  }

  // Tokens [0, past) of one layer as tiles of the cache: what a step attends to before its own.
  std::vector<kv_tile_type> past_tiles(std::size_t layer, std::size_t past,
                                       const table_type* seq = nullptr) const {
    std::vector<kv_tile_type> tiles;
    if (past == 0) return tiles;
    if constexpr (blocks) {
      const auto& table = seq ? *seq : *table_;
      for (std::size_t i = 0; i < table.tile_count(past); ++i)  // live blocks only
        tiles.push_back(table.tile(layer, i, past));
    } else if (ring_) {
      const auto ring = ring_->range_tiles(layer, ring_->first_position(), past);
      tiles.assign(ring.span().begin(), ring.span().end());
    } else {
      tiles.push_back(cache_->range_tile(layer, 0, past));
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
  void run_layer(const body_closure& c) {
    const step_state& st = *c.step;
    const std::size_t S = st.s.rows, n = st.ids.size();
    const pool_policy policy{options_.pool};
    const std::vector<segment> whole{{0, S}};
    const std::vector<segment>& segments = st.packed.empty() ? whole : st.packed;
    auto attend = [&](const segment& g, const attention::attention_io& step_io,
                      dense_view<float, 3> kh, dense_view<float, 3> vh) {
      attention::attention_io io = step_io;
      if (c.layer < reads_.size()) io.stats = &reads_[c.layer];
      if (!st.packed.empty()) {
        if (g.table == nullptr) {  // an independent sequence: its own K/V only, causal
          const kv::kv_tile<float> present{kh, vh, 0};
          attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(), &present,
                                            layer_mask(c.layer, 0), policy);
          return;
        }
        if constexpr (blocks) {  // one of several sequences: its own blocks, then its K/V join them
          const kv::kv_tile<float> present{kh, vh, g.past};
          const auto past = past_tiles(c.layer, g.past, g.table);
          attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(past), &present,
                                            layer_mask(c.layer, g.past), policy);
          write_kv(*g.table, c.layer, g.past, kh, vh, 0, g.rows);
        }
        return;
      }
      const kv::kv_tile<float> present{kh, vh, st.past};
      const auto past = past_tiles(c.layer, st.past);
      if constexpr (pyramid) {
        const kv_tile_type ptile = attention::pyramid_past(*cache_, c.layer, *st.pyramid_step);
        attention::pyramid_attention<tiles>(io, std::span<const kv_tile_type>(&ptile, 1), present,
                                            *st.pyramid_step, policy);
      } else if (st.s.first > 0) {  // static prefill (empty past): left padding is masked
        attention::flash_attention<tiles>(
            io, std::span<const kv_tile_type>(past), &present,
            attention::all_of<attention::sliding_window, attention::padding>{
                layer_mask(c.layer, st.past), attention::padding::left(st.s.first, S)},
            policy);
      } else {
        attention::flash_attention<tiles>(io, std::span<const kv_tile_type>(past), &present,
                                          layer_mask(c.layer, st.past), policy);
      }
      // The step's real K/V join the cache.
      if constexpr (blocks) {
        write_kv(*table_, c.layer, st.past, kh, vh, st.s.first, n);
      } else {
        with_cache([&](auto& cache) { write_kv(cache, c.layer, st.past, kh, vh, st.s.first, n); });
      }
    };
    decoder_layer<KvT>(layers_[c.layer], act_, config_, rope_, st.positions, S,
                       std::span<const segment>(segments), policy, attend);
  }

  // Writes the selected rows into the call's output, or (device_memory backends) into the
  // stage: logit rows (vocab each) then hidden rows (hidden_size each).
  void run_tail(const tail_closure& t) {
    const auto& cfg = config_;
    const step_state& st = *t.step;
    const std::size_t nl = t.logit_rows.size(), nh = t.hidden_rows.size();
    dense_view<float, 2> logits, hidden;
    if constexpr (backend_type::device_memory) {
      logits = dense_view<float, 2>(tail_stage_.data(), nl, cfg.vocab_size);
      hidden = dense_view<float, 2>(tail_stage_.data() + nl * cfg.vocab_size, nh, cfg.hidden_size);
    } else {
      logits = rows(t.out->logits.view(), t.logit_offset, t.logit_offset + nl);
      if (nh != 0) hidden = rows(t.out->hidden.view(), t.hidden_offset, t.hidden_offset + nh);
    }
    // Pre-norm hidden rows, copied out as they are.
    for (std::size_t i = 0; i < nh; ++i) {
      std::copy_n(&act_.x.view()(st.s.first + t.hidden_rows[i], 0), cfg.hidden_size, &hidden(i, 0));
    }
    if (nl == 0) return;
    std::vector<std::size_t> step_rows(nl);
    for (std::size_t i = 0; i < nl; ++i) step_rows[i] = st.s.first + t.logit_rows[i];
    run_lm_head(step_rows, logits);
  }

  // The selected step rows of x gathered, final-normed and through the LM head into out.
  void run_lm_head(const std::vector<std::size_t>& step_rows, dense_view<float, 2> out) {
    const auto& cfg = config_;
    const std::size_t m = step_rows.size();
    if (m == 0) return;
    auto sel = rows(act_.h.view(), 0, m);
    for (std::size_t i = 0; i < m; ++i)
      std::copy_n(&act_.x.view()(step_rows[i], 0), cfg.hidden_size, &sel(i, 0));
    ops::rms_norm<W>(sel, weights_->final_norm, static_cast<float>(cfg.rms_norm_eps), sel,
                     cfg.norm_unit_offset ? 1.0f : 0.0f);
    project(sel, lm_head_, out, {}, pool_policy{options_.pool});  // W's, quantized or tiles
    if (cfg.final_logit_softcapping > 0) {  // Gemma 2: logits = c tanh(logits / c)
      ops::softcap(std::span<float>(out.data_handle(), out.size()),
                   static_cast<float>(cfg.final_logit_softcapping));
    }
  }

  std::shared_ptr<const model_weights<W>> host_weights_;  // as given (shared)
  model_config config_;
  std::shared_ptr<const model_weights<W>> device_weights_;  // device_memory backends: a copy
  const model_weights<W>* weights_ = nullptr;   // what runs: *host_weights_ or the device copy
  std::vector<layer_weights<W>> layers_;        // weights_'s, with this pipeline's packing
  std::vector<ops::packed_weights<W>> packed_;  // packed projections (reserved: no moves)
  std::vector<ops::packed_quantized> packed_quantized_;  // packed quantized ones (reserved too)
  std::vector<ops::repacked_quantized> repacked_;        // tiles of quantized ones (reserved too)
  projection<W> lm_head_;  // weights_'s, with this pipeline's tiles when it repacks
  pipeline_options options_;
  backend_type backend_;
  ops::rope_table rope_;
  std::size_t prefill_rows_ = 0;

  using ring_type = kv::ring_cache<KvT, kv_allocator>;
  std::optional<kv::contiguous_cache<KvT, kv_allocator>> cache_;
  std::optional<ring_type> ring_;              // instead of cache_ when every layer is windowed
  std::vector<attention::flash_stats> reads_;  // per layer, of the last step
  std::optional<pool_type> pool_;
  std::optional<table_type> table_;
  std::optional<attention::pyramid_plan> plan_;

  activations<backend_type> act_;
  buffer<float, 1> tail_stage_;  // device_memory backends: the tail's output rows
  std::vector<npu::argument> head_args_, tail_args_;  // tail: + the stage, per call
  std::vector<std::vector<npu::argument>> layer_args_;

  using head_fn = std::function<void(const step_state&)>;
  using body_fn = std::function<void(const body_closure&)>;
  using tail_fn = std::function<void(const tail_closure&)>;
  typename backend_type::template function<head_fn> head_;
  // Per layer kind (kind_windows_[k]: 0 = full attention, else the window); layer l runs kind
  // layer_kind_[l].
  std::vector<typename backend_type::template function<body_fn>> body_prefill_, body_decode_;
  std::vector<std::size_t> kind_windows_, layer_kind_;
  typename backend_type::template function<tail_fn> tail_;
  timings timings_;
};

}  // namespace npullm::model
