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
//
// This header is the public face and the pipeline's state; how it is built (options, packing,
// KV, graph arguments) is in causal_lm_build.hpp, how a step runs in causal_lm_step.hpp.
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
#include "npullm/model/causal_lm_build.hpp"
#include "npullm/model/causal_lm_step.hpp"
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
    build::validate_options(*this);
    if constexpr (backend_type::device_memory) {
      device_weights_ = host_weights_->copied_into(backend_);
      weights_ = device_weights_.get();
    } else {
      weights_ = host_weights_.get();
    }
    build::pack_weights(*this);
    build::create_kv(*this);
    act_ = activations<backend_type>::allocate(backend_, config_,
                                               std::max(prefill_rows_, options_.decode_rows));
    build::bind_arguments(*this);
    const body_fn body = [this](const body_closure& c) { steps::run_layer(*this, c); };
    head_ = backend_.compile("head", {{0, config_.hidden_size}, false},
                             head_fn([this](const step_state& s) { steps::run_head(*this, s); }));
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
                             tail_fn([this](const tail_closure& t) { steps::run_tail(*this, t); }));
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
      steps::run_step(*this, ids, 0, slots{mode.size, mode.size - n}, body_prefill_, out);
    } else if (mode.mode == prefill_mode::kind::chunked || pyramid || n > prefill_rows_) {
      const std::size_t q = chunk_size();
      check_capacity(n);
      for (std::size_t t0 = 0; t0 < n; t0 += q) {
        const std::size_t len = std::min(q, n - t0);
        steps::run_step(*this, ids.subspan(t0, len), t0, slots{pyramid ? q : len, 0}, body_prefill_,
                        out);
      }
    } else {
      steps::run_step(*this, ids, 0, slots{n, 0}, body_prefill_, out);
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
    steps::run_step(*this, ids, 0, slots{ids.size(), 0}, body_decode_, out, layers);
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
      steps::run_lm_head(*this, rows_last, rows(out.view(), first, last));
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
    steps::run_lm_head(*this, out.logit_rows, out.logits.view());
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
  // How the pipeline is put together and how a step runs: causal_lm_build.hpp and
  // causal_lm_step.hpp, static functions over this pipeline's state (their friends).
  friend struct detail::causal_lm_build<causal_lm>;
  friend struct detail::causal_lm_steps<causal_lm>;
  using build = detail::causal_lm_build<causal_lm>;
  using steps = detail::causal_lm_steps<causal_lm>;

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

  static std::shared_ptr<const model_weights<W>> checked(
      std::shared_ptr<const model_weights<W>> w) {
    if (!w) raise(error_code::invalid_argument, "causal_lm: no weights");
    return w;
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
