// Drafts and heads with known answers for the speculative-decoding tests, built from plain greedy
// runs: an oracle draft that proposes exactly the plain greedy continuation (always right) or a
// token that differs from it at every place (always wrong), and an oracle head that does the
// same from the pre-norm hidden row it is given (found among the plain run's hidden rows, so a
// wrong row handed to the head shows up as wrong proposals).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <memory>
#include <vector>

#include "npullm/batch/speculative.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/medusa_head.hpp"
#include "npullm/io/safetensors.hpp"
#include "support.hpp"

namespace npullm::testing {

// The target model of the speculative tests (the tiny preset: 2 layers, vocabulary 512).
inline const std::filesystem::path& target_dir() {
  return generated_model("tiny", 21);
}

// Its weights, loaded once per test program: every target, twin and verifier pipeline of the
// tests is built over these (model_weights is shared, read-only).
inline const std::shared_ptr<const model::model_weights<float>>& target_weights() {
  static const auto w = model::model_weights<float>::load(target_dir());
  return w;
}

// The pipelines of the speculative tests: f32 weights, f32 KV in one contiguous cache or in
// blocks of 8 tokens.
using contiguous_lm = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;
using block_lm = model::causal_lm<
    model::pipeline_config<model::block_kv<float, 8>, model::dynamic_attention<>, float>>;

// A plain greedy run through the single-sequence API: `tokens` are the new tokens; hidden[j] is
// the pre-norm hidden row that produced tokens[j] (the prompt's last row, then each fed token's).
struct plain_run {
  std::vector<std::int32_t> prompt, tokens;
  std::vector<std::vector<float>> hidden;
  [[nodiscard]] std::vector<std::int32_t> sequence() const {
    std::vector<std::int32_t> s = prompt;
    s.insert(s.end(), tokens.begin(), tokens.end());
    return s;
  }
};

template <class LM>
plain_run plain_greedy(LM& lm, std::span<const std::int32_t> prompt, std::size_t n) {
  plain_run r{{prompt.begin(), prompt.end()}, {}, {}};
  lm.reset();
  auto keep = [&](const batch::step_output& o, std::size_t row) {
    r.tokens.push_back(batch::greedy_token(o.logits_of(row)));
    const auto h = o.hidden_of(row);
    r.hidden.emplace_back(h.begin(), h.end());
  };
  keep(lm.prefill(prompt, batch::output_selection::last().hidden_last()), prompt.size() - 1);
  while (r.tokens.size() < n) {
    const std::array<std::int32_t, 1> one{r.tokens.back()};
    keep(lm.decode(one, batch::output_selection::last().hidden_last()), 0);
  }
  return r;
}

// Proposes the plain greedy continuation of whichever known sequence the context starts
// (always right), or that token + 1 (always wrong).
struct oracle_draft {
  std::vector<std::vector<std::int32_t>> sequences;  // prompt + plain greedy tokens
  bool wrong = false;
  std::int32_t vocab = 512;

  batch::draft_proposal propose(std::span<const std::int32_t> context, std::span<const float>,
                                std::size_t n, batch::sampler*) const {
    const std::vector<std::int32_t>* seq = nullptr;
    for (const auto& s : sequences) {
      if (s.size() >= context.size() && std::equal(context.begin(), context.end(), s.begin())) {
        seq = &s;
        break;
      }
    }
    batch::draft_proposal out;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t pos = context.size() + i;
      std::int32_t t = seq != nullptr && pos < seq->size() ? (*seq)[pos] : 0;
      if (wrong) t = (t + 1) % vocab;
      out.tokens.push_back(t);
    }
    return out;
  }
};

// A draft head with known answers: it finds the hidden row among the plain runs' rows (nearest)
// and gives head i the plain token i + 1 places after the one that row produced (or that
// token + 1). `worst` is the largest relative distance to the nearest row it has seen: ~1e-6
// when the loop hands over the right rows.
struct oracle_head {
  struct entry {
    std::vector<float> row;
    const std::vector<std::int32_t>* sequence;
    std::size_t position;  // the row produced (*sequence)[position]
  };
  std::vector<entry> entries;
  std::vector<std::vector<std::int32_t>> sequences;
  bool wrong = false;
  std::size_t vocab_size = 512, hidden = 128;
  mutable double worst = 0;

  oracle_head(const std::vector<plain_run>& runs, bool wrong_tokens) : wrong(wrong_tokens) {
    sequences.reserve(runs.size());
    for (const auto& r : runs) sequences.push_back(r.sequence());
    for (std::size_t s = 0; s < runs.size(); ++s) {
      for (std::size_t j = 0; j < runs[s].hidden.size(); ++j)
        entries.push_back({runs[s].hidden[j], &sequences[s], runs[s].prompt.size() + j});
    }
  }
  oracle_head(const oracle_head&) = delete;

  [[nodiscard]] std::size_t heads() const { return 4; }
  [[nodiscard]] std::size_t vocab() const { return vocab_size; }
  [[nodiscard]] std::size_t hidden_size() const { return hidden; }
  [[nodiscard]] std::vector<float> logits(std::span<const float> h, std::size_t i) const {
    double best = std::numeric_limits<double>::infinity(), norm = 0;
    const entry* near = nullptr;
    for (const entry& e : entries) {
      double d = 0;
      for (std::size_t j = 0; j < h.size(); ++j) d += (h[j] - e.row[j]) * (h[j] - e.row[j]);
      if (d < best) best = d, near = &e;
    }
    for (float v : h) norm += static_cast<double>(v) * v;
    worst = std::max(worst, std::sqrt(best / norm));
    const std::size_t pos = near->position + 1 + i;
    std::int32_t t = pos < near->sequence->size() ? (*near->sequence)[pos] : 0;
    if (wrong) t = (t + 1) % static_cast<std::int32_t>(vocab_size);
    std::vector<float> out(vocab_size, 0.0f);
    out[static_cast<std::size_t>(t)] = 1.0f;
    return out;
  }
};
static_assert(batch::draft_head<oracle_head>);
static_assert(batch::draft_source<oracle_draft>);

// Largest |a - b| over the K and V of positions [0, n) of every layer of two contiguous caches.
template <class Cache>
double kv_difference(const Cache& a, const Cache& b, std::size_t layers, std::size_t n) {
  double diff = 0;
  for (std::size_t layer = 0; layer < layers; ++layer) {
    const auto ta = a.range_tile(layer, 0, n), tb = b.range_tile(layer, 0, n);
    for (std::size_t h = 0; h < ta.k.extent(0); ++h) {
      for (std::size_t j = 0; j < ta.k.extent(1); ++j) {
        for (std::size_t d = 0; d < ta.k.extent(2); ++d) {
          diff = std::max<double>(diff, std::fabs(ta.k(h, j, d) - tb.k(h, j, d)));
          diff = std::max<double>(diff, std::fabs(ta.v(h, j, d) - tb.v(h, j, d)));
        }
      }
    }
  }
  return diff;
}

// Medusa heads over a model directory's final norm and LM head, w_i random N(0, scale^2).
struct medusa_fixture {
  npullm::io::safetensors_model file;
  model::medusa_head<float> head;
  static model::medusa_head<float> make(const npullm::io::safetensors_model& f,
                                        const model::model_config& c, std::size_t heads,
                                        float scale, std::uint64_t seed) {
    std::vector<tensor<float, 2>> w;
    std::uint64_t state = seed;
    auto normal = [&] {  // Box-Muller over a splitmix stream
      auto u = [&] {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) * 0x1.0p-53;
      };
      return std::sqrt(-2.0 * std::log(u())) * std::cos(6.283185307179586 * u());
    };
    for (std::size_t i = 0; i < heads; ++i) {
      tensor<float, 2> t(c.hidden_size, c.hidden_size);
      for (std::size_t j = 0; j < t.size(); ++j) t.data()[j] = static_cast<float>(scale * normal());
      w.push_back(std::move(t));
    }
    const auto head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    return model::medusa_head<float>(f.view<float, 1>("model.norm.weight"),
                                     f.view<float, 2>(head_name),
                                     static_cast<float>(c.rms_norm_eps), std::move(w));
  }
  medusa_fixture(const std::filesystem::path& dir, std::size_t heads, float scale,
                 std::uint64_t seed)
      : file(npullm::io::safetensors_model::open(dir)),
        head(make(file, model::load_config(dir), heads, scale, seed)) {}
};

enum class acceptance { all, none, any };

// Every kind of draft for one target (a 2-layer model), with the acceptance each must show on
// greedy decoding: a second model (the target's twin: always right; a 1-layer model), the
// target's first layer and all its layers (always right), Medusa heads, and the oracles.
template <class LM>
struct draft_set {
  LM& target;
  LM twin, small;
  batch::model_draft<LM> twin_draft{twin}, small_draft{small};
  batch::self_draft<LM> first_layer{target, 1}, all_layers{target, 2};
  medusa_fixture medusa;
  batch::head_draft<model::medusa_head<float>> medusa_draft{medusa.head};
  oracle_draft right, wrong;
  oracle_head right_head, wrong_head;
  batch::head_draft<oracle_head> right_head_draft{right_head}, wrong_head_draft{wrong_head};

  // runs: the plain greedy runs the oracles answer from.
  // The twin shares the target's weights (no second copy); the small model has its own.
  draft_set(LM& t, const std::filesystem::path& small_dir, const model::pipeline_options& options,
            const std::vector<plain_run>& runs)
      : target(t),
        twin(t.weights(), options),
        small(small_dir, options),
        medusa(target_dir(), 4, 0.05f, 5),
        right{sequences_of(runs), false},
        wrong{sequences_of(runs), true},
        right_head(runs, false),
        wrong_head(runs, true) {}

  // Calls fn(name, draft, expected acceptance) for each.
  template <class Fn>
  void each(Fn&& fn) {
    fn("twin model", twin_draft, acceptance::all);
    fn("1-layer model", small_draft, acceptance::any);
    fn("self, first layer", first_layer, acceptance::any);
    fn("self, all layers", all_layers, acceptance::all);
    fn("medusa head", medusa_draft, acceptance::any);
    fn("oracle", right, acceptance::all);
    fn("wrong oracle", wrong, acceptance::none);
    fn("oracle head", right_head_draft, acceptance::all);
    fn("wrong oracle head", wrong_head_draft, acceptance::none);
  }

 private:
  static std::vector<std::vector<std::int32_t>> sequences_of(const std::vector<plain_run>& runs) {
    std::vector<std::vector<std::int32_t>> s;
    for (const auto& r : runs) s.push_back(r.sequence());
    return s;
  }
};

}  // namespace npullm::testing
