// The decoder pipeline against an independent reference forward pass (plain double-precision
// loops written here, not npullm's ops) on generated tiny models, and its modes against each
// other: decode after prefill == recomputing; chunked == static == dynamic prefill; block KV ==
// contiguous KV; pyramid == full static; the 1 + L + 1 pattern with two body compilations;
// output-row selection; errors that leave the pipeline usable; dense weights copied into huge
// pages at load (load_options::dense_huge_pages) or read from the mapping, the same logits.
#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::model;
using namespace npullm::io;
using npullm::testing::expect_error;
namespace fs = std::filesystem;

const fs::path& tiny_dir(const std::string& preset_name = "tiny") {
  static std::map<std::string, fs::path> dirs;
  auto& d = dirs[preset_name];
  if (d.empty()) {
    d = npullm::testing::scratch_root() / ("lm_" + preset_name);
    write_model(d, preset(preset_name, npullm::dtype::f32, 3));
  }
  return d;
}

std::vector<std::int32_t> prompt(std::size_t n, std::uint32_t seed = 1) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i)
    ids[i] = static_cast<std::int32_t>((seed * 2654435761u + i * 40503u) % 512u);
  return ids;
}

// ---- the reference: double loops over the safetensors values ------------------------------

struct reference_model {
  model_config c;
  safetensors_model w;
  explicit reference_model(const fs::path& dir)
      : c(load_config(dir)), w(safetensors_model::open(dir)) {}

  // Views looked up once per name (the lookup, not the arithmetic, would dominate).
  mutable std::map<std::string, dense_view<const float, 2>> mats;
  mutable std::map<std::string, dense_view<const float, 1>> vecs;
  double at(const std::string& name, std::size_t i, std::size_t j) const {
    auto it = mats.find(name);
    if (it == mats.end()) it = mats.emplace(name, w.view<float, 2>(name)).first;
    return it->second(i, j);
  }
  double at(const std::string& name, std::size_t i) const {
    auto it = vecs.find(name);
    if (it == vecs.end()) it = vecs.emplace(name, w.view<float, 1>(name)).first;
    return it->second(i);
  }

  std::vector<double> rms(const std::vector<double>& x, const std::string& name) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * at(name, i);
    return y;
  }
  std::vector<double> proj(const std::vector<double>& x, const std::string& name, std::size_t out,
                           const std::string& bias = "") const {
    std::vector<double> y(out, 0.0);
    (void)at(name, 0, 0);
    const auto& m = mats.at(name);
    for (std::size_t o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : at(bias, o);
      for (std::size_t i = 0; i < x.size(); ++i) s += static_cast<double>(m(o, i)) * x[i];
      y[o] = s;
    }
    return y;
  }
  void rope(std::vector<double>& v, std::size_t heads, std::size_t pos) const {
    const std::size_t d = c.head_dim, half = d / 2;
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t i = 0; i < half; ++i) {
        const double f =
            std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double a = v[h * d + i], b = v[h * d + i + half];
        const double cs = std::cos(static_cast<double>(pos) * f),
                     sn = std::sin(static_cast<double>(pos) * f);
        v[h * d + i] = a * cs - b * sn;
        v[h * d + i + half] = b * cs + a * sn;
      }
    }
  }

  // Logits of every position, and the pre-norm hidden states.
  std::pair<std::vector<std::vector<double>>, std::vector<std::vector<double>>> forward(
      const std::vector<std::int32_t>& ids) const {
    const std::size_t n = ids.size(), hdim = c.hidden_size, d = c.head_dim;
    const std::size_t hq = c.num_attention_heads, hkv = c.num_key_value_heads, group = hq / hkv;
    std::vector<std::vector<double>> x(n, std::vector<double>(hdim));
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t i = 0; i < hdim; ++i)
        x[t][i] = at("model.embed_tokens.weight", static_cast<std::size_t>(ids[t]), i);
    }
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (std::size_t t = 0; t < n; ++t) {
        const auto h = rms(x[t], p + "input_layernorm.weight");
        q[t] = proj(h, p + "self_attn.q_proj.weight", hq * d,
                    c.attention_bias ? p + "self_attn.q_proj.bias" : "");
        k[t] = proj(h, p + "self_attn.k_proj.weight", hkv * d,
                    c.attention_bias ? p + "self_attn.k_proj.bias" : "");
        v[t] = proj(h, p + "self_attn.v_proj.weight", hkv * d,
                    c.attention_bias ? p + "self_attn.v_proj.bias" : "");
        rope(q[t], hq, t);
        rope(k[t], hkv, t);
      }
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> att(hq * d, 0.0);
        for (std::size_t h = 0; h < hq; ++h) {
          const std::size_t g = h / group;
          std::vector<double> s(t + 1);
          double m = -INFINITY;
          for (std::size_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (std::size_t e = 0; e < d; ++e) dot += q[t][h * d + e] * k[j][g * d + e];
            s[j] = dot / std::sqrt(static_cast<double>(d));
            m = std::max(m, s[j]);
          }
          double sum = 0;
          for (double& sj : s) sum += (sj = std::exp(sj - m));
          for (std::size_t j = 0; j <= t; ++j) {
            for (std::size_t e = 0; e < d; ++e) att[h * d + e] += s[j] / sum * v[j][g * d + e];
          }
        }
        const auto o = proj(att, p + "self_attn.o_proj.weight", hdim);
        for (std::size_t i = 0; i < hdim; ++i) x[t][i] += o[i];
        const auto h2 = rms(x[t], p + "post_attention_layernorm.weight");
        const auto gate = proj(h2, p + "mlp.gate_proj.weight", c.intermediate_size);
        const auto up = proj(h2, p + "mlp.up_proj.weight", c.intermediate_size);
        std::vector<double> a(c.intermediate_size);
        for (std::size_t i = 0; i < a.size(); ++i)
          a[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
        const auto down = proj(a, p + "mlp.down_proj.weight", hdim);
        for (std::size_t i = 0; i < hdim; ++i) x[t][i] += down[i];
      }
    }
    const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    std::vector<std::vector<double>> logits(n);
    for (std::size_t t = 0; t < n; ++t)
      logits[t] = proj(rms(x[t], "model.norm.weight"), head, c.vocab_size);
    return {logits, x};
  }
};

using f32_contiguous = pipeline_config<contiguous_kv<float>, dynamic_attention<>, float>;
using f32_blocks = pipeline_config<block_kv<float, 16>, dynamic_attention<>, float>;
using f32_pyramid = pipeline_config<contiguous_kv<float>, pyramid_attention_policy<16>, float>;

double max_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// With the layer weights packed at load (ops::packed_weights) and read as stored.
TEST(CausalLm, MatchesTheReferenceForwardPass) {
  for (const char* name : {"tiny", "tiny-llama"}) {
    const reference_model ref(tiny_dir(name));
    for (const auto packing : {weight_packing::on, weight_packing::off})
    for (std::size_t n : {1u, 17u, 100u}) {
      causal_lm<f32_contiguous> lm(tiny_dir(name), {.max_sequence = 256, .packing = packing});
      SCOPED_TRACE(std::string(name) + " prompt of " + std::to_string(n) +
                   (packing == weight_packing::on ? " packed" : " as stored"));
      lm.reset();
      const auto ids = prompt(n, static_cast<std::uint32_t>(n));
      const auto out =
          lm.prefill(ids, batch::output_selection::last().logits_for({0}).hidden_for({0, n - 1}));
      const auto [logits, hidden] = ref.forward(ids);
      for (std::size_t row : {std::size_t{0}, n - 1}) {
        const auto got = out.logits_of(row);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], logits[row][i], 1e-4) << row << " " << i;
        const auto h = out.hidden_of(row);  // pre-norm hidden state
        for (std::size_t i = 0; i < h.size(); ++i)
          ASSERT_NEAR(h[i], hidden[row][i], 1e-4) << row << " " << i;
      }
    }
  }
}

TEST(CausalLm, DecodeAfterPrefillEqualsRecomputing) {
  causal_lm<f32_contiguous> lm(tiny_dir(), {.max_sequence = 256});
  causal_lm<f32_contiguous> fresh(tiny_dir(), {.max_sequence = 256});
  auto ids = prompt(17);
  lm.prefill(ids);
  for (std::int32_t next : {7, 300, 42}) {
    const std::array<std::int32_t, 1> one{next};
    const auto step = lm.decode(one);
    ids.push_back(next);
    fresh.reset();
    const auto all = fresh.prefill(ids);
    EXPECT_LE(max_diff(step.logits_of(0), all.logits_of(ids.size() - 1)), 1e-5);
  }
  // A few tokens at once (draft verification) equal one at a time.
  const std::array<std::int32_t, 3> three{5, 6, 7};
  const auto together = lm.decode(three, batch::output_selection::all_rows());
  causal_lm<f32_contiguous> single(tiny_dir(), {.max_sequence = 256});
  single.prefill(ids);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::array<std::int32_t, 1> one{three[i]};
    EXPECT_LE(max_diff(single.decode(one).logits_of(0), together.logits_of(i)), 1e-5);
  }
}

TEST(CausalLm, PrefillModesAgree) {
  const auto ids = prompt(37, 5);
  causal_lm<f32_contiguous> dynamic(tiny_dir(), {.max_sequence = 128});
  causal_lm<f32_contiguous> stat(tiny_dir(),
                                 {.max_sequence = 128, .prefill = prefill_mode::static_prompt(64)});
  causal_lm<f32_contiguous> chunked(tiny_dir(),
                                    {.max_sequence = 128, .prefill = prefill_mode::chunked(16)});
  causal_lm<f32_blocks> blocks(tiny_dir(),
                               {.max_sequence = 128, .prefill = prefill_mode::chunked(16)});
  causal_lm<f32_pyramid> pyramid(tiny_dir(), {.max_sequence = 128});
  const auto sel = batch::output_selection::last().logits_for({3, 20});
  const auto a = dynamic.prefill(ids, sel);
  const auto b = stat.prefill(ids, sel);
  const auto c = chunked.prefill(ids, sel);
  const auto d = blocks.prefill(ids, sel);
  const auto e = pyramid.prefill(ids, sel);
  for (std::size_t row : {3u, 20u, 36u}) {
    EXPECT_LE(max_diff(a.logits_of(row), b.logits_of(row)), 1e-5) << "static, row " << row;
    EXPECT_LE(max_diff(a.logits_of(row), c.logits_of(row)), 1e-5) << "chunked, row " << row;
    EXPECT_LE(max_diff(a.logits_of(row), d.logits_of(row)), 1e-5) << "block KV, row " << row;
    EXPECT_LE(max_diff(a.logits_of(row), e.logits_of(row)), 1e-5) << "pyramid, row " << row;
  }
  // And decoding on: every mode continues identically.
  const std::array<std::int32_t, 1> next{99};
  const auto da = dynamic.decode(next);
  EXPECT_LE(max_diff(da.logits_of(0), stat.decode(next).logits_of(0)), 1e-5);
  EXPECT_LE(max_diff(da.logits_of(0), chunked.decode(next).logits_of(0)), 1e-5);
  EXPECT_LE(max_diff(da.logits_of(0), blocks.decode(next).logits_of(0)), 1e-5);
  EXPECT_LE(max_diff(da.logits_of(0), pyramid.decode(next).logits_of(0)), 1e-5);
}

TEST(CausalLm, PyramidEqualsFullStaticAtEveryFill) {
  // The pyramid pipeline against the static-shape pipeline over the largest capacity.
  causal_lm<f32_pyramid> pyramid(tiny_dir(), {.max_sequence = 96, .decode_rows = 1});
  causal_lm<f32_contiguous> full(tiny_dir(),
                                 {.max_sequence = 96, .prefill = prefill_mode::static_prompt(96)});
  const auto ids = prompt(50, 9);
  const auto a = pyramid.prefill(std::span(ids).first(5));
  const auto b = full.prefill(std::span(ids).first(5));
  EXPECT_LE(max_diff(a.logits_of(4), b.logits_of(4)), 1e-5);
  for (std::size_t t = 5; t < ids.size(); ++t) {
    const std::array<std::int32_t, 1> one{ids[t]};
    EXPECT_LE(max_diff(pyramid.decode(one).logits_of(0), full.decode(one).logits_of(0)), 1e-5) << t;
  }
}

TEST(CausalLm, HeadBodyTailPatternAndTwoBodyCompilations) {
  std::vector<npu::trace_event> events;
  npu::host_backend backend;
  backend.set_tracer([&](const npu::trace_event& e) { events.push_back(e); });
  causal_lm<f32_contiguous> lm(tiny_dir(), {.max_sequence = 64}, std::move(backend));
  std::size_t compiles = 0, body_compiles = 0;
  for (const auto& e : events) {
    if (e.what == npu::trace_event::kind::compile) {
      ++compiles;
      body_compiles += e.function.rfind("body/", 0) == 0;
    }
  }
  EXPECT_EQ(body_compiles, 2u);  // prefill and decode shapes, for all layers
  EXPECT_EQ(compiles, 4u);
  const std::size_t layers = lm.config().num_hidden_layers;
  events.clear();
  lm.backend().set_tracer([&](const npu::trace_event& e) { events.push_back(e); });
  lm.prefill(prompt(9));
  const std::array<std::int32_t, 1> one{3};
  lm.decode(one);
  ASSERT_EQ(events.size(), 2 * (layers + 2));
  for (std::size_t step = 0; step < 2; ++step) {
    const auto* e = &events[step * (layers + 2)];
    EXPECT_EQ(e[0].function, "head");
    for (std::size_t l = 0; l < layers; ++l) {
      EXPECT_EQ(e[1 + l].function, step == 0 ? "body/prefill" : "body/decode");
      EXPECT_EQ(e[1 + l].closure, static_cast<std::ptrdiff_t>(l));  // that layer's weights
      EXPECT_EQ(e[1 + l].what, npu::trace_event::kind::execute);
    }
    EXPECT_EQ(e[layers + 1].function, "tail");
  }
}

TEST(CausalLm, OnlyTheSelectedRowsGetLogits) {
  causal_lm<f32_contiguous> lm(tiny_dir(), {.max_sequence = 128});
  const std::size_t vocab = lm.config().vocab_size;
  const auto before = lm.backend().stats();
  const auto out = lm.prefill(prompt(100));
  const auto after = lm.backend().stats();
  EXPECT_EQ(out.logits.extent(0), 1u);
  EXPECT_LT(after.bytes - before.bytes, 100 * vocab * sizeof(float));  // no (100, vocab) buffer
  try {
    (void)out.logits_of(50);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("no logits for row 50"), std::string::npos);
  }
  lm.reset();
  const auto before_all = lm.backend().stats();
  const auto all = lm.prefill(prompt(100), batch::output_selection::all_rows());
  EXPECT_EQ(all.logits.extent(0), 100u);
  EXPECT_GE(lm.backend().stats().largest, 100 * vocab * sizeof(float));
  EXPECT_GE(lm.backend().stats().bytes - before_all.bytes, 100 * vocab * sizeof(float));
  EXPECT_LE(max_diff(all.logits_of(99), out.logits_of(99)), 1e-5);
  // Hidden rows without any logits.
  lm.reset();
  const auto h = lm.prefill(prompt(10), batch::output_selection::none().hidden_for({2, 9}));
  EXPECT_EQ(h.logits.extent(0), 0u);
  EXPECT_EQ(h.hidden.extent(0), 2u);
}

// Weights are loaded once and shared: pipelines of other KV / attention policies over the same
// model_weights read the same memory, compute what a pipeline with its own copy computes, and
// keep the weights alive after the pipeline that loaded them is gone.
TEST(CausalLm, PipelinesShareOneLoadOfTheWeights) {
  using f32_blocks = pipeline_config<block_kv<float, 8>, dynamic_attention<>, float>;
  const auto ids = prompt(21);
  auto weights = model_weights<float>::load(tiny_dir());
  std::optional<causal_lm<f32_contiguous>> first(std::in_place, weights,
                                                 pipeline_options{.max_sequence = 64});
  causal_lm<f32_blocks> second(first->weights(), {.max_sequence = 64});
  EXPECT_EQ(first->weights(), weights);
  EXPECT_EQ(second.weights(), weights);
  EXPECT_EQ(weights.use_count(), 3);
  EXPECT_EQ(&weights->layers[1].q.w(0, 0), &second.weights()->layers[1].q.w(0, 0));
  const auto a = first->prefill(ids);
  first.reset();
  weights.reset();  // `second` holds the only reference now
  causal_lm<f32_contiguous> own(tiny_dir(), {.max_sequence = 64});
  const auto b = own.prefill(ids);
  EXPECT_LE(max_diff(a.logits_of(20), b.logits_of(20)), 0.0);  // identical
  EXPECT_LE(max_diff(second.prefill(ids).logits_of(20), b.logits_of(20)), 1e-5);
}

// Activations are sized from the step capacity (step_rows), not from max_sequence: the
// buffers a pipeline allocates through its backend (activations, and the biases, the same for
// both) do not grow with max_sequence, and grow by exactly one row's worth per step row.
TEST(CausalLm, ActivationsAreSizedFromTheStepNotMaxSequence) {
  causal_lm<f32_contiguous> small(tiny_dir(), {.max_sequence = 256, .step_rows = 16});
  causal_lm<f32_contiguous> large(tiny_dir(), {.max_sequence = 4096, .step_rows = 16});
  causal_lm<f32_contiguous> whole(tiny_dir(), {.max_sequence = 256});  // step_rows 0: 256
  EXPECT_EQ(small.step_rows(), 16u);
  EXPECT_EQ(whole.step_rows(), 256u);
  const auto& c = small.config();
  // x, h (hidden); q, q head-major, attention out (q_size); k, v, both head-major (kv_size);
  // gate, up (intermediate).
  const std::size_t row_bytes = (2 * c.hidden_size + 3 * c.q_size() + 4 * c.kv_size() +
                                 2 * c.intermediate_size) * sizeof(float);
  EXPECT_EQ(large.backend().stats().bytes, small.backend().stats().bytes);
  EXPECT_EQ(whole.backend().stats().bytes - small.backend().stats().bytes, (256 - 16) * row_bytes);
  // A prompt longer than a step runs in steps, with the same logits as one step.
  const auto ids = prompt(40);
  const auto sel = batch::output_selection::all_rows();
  const auto a = small.prefill(ids, sel);
  const auto b = whole.prefill(ids, sel);
  for (std::size_t row = 0; row < ids.size(); ++row)
    EXPECT_LE(max_diff(a.logits_of(row), b.logits_of(row)), 1e-5) << row;
}

// The pipeline builds a pyramid step's variant mask once per step, for all its layers (the
// tiny model has 2; built per layer, a step would count 2).
TEST(CausalLm, PyramidMaskIsBuiltOncePerStepNotPerLayer) {
  causal_lm<f32_pyramid> lm(tiny_dir(), {.max_sequence = 96, .decode_rows = 1});
  ASSERT_GE(lm.config().num_hidden_layers, 2u);
  const std::size_t before = attention::pyramid_step::builds().load();
  (void)lm.prefill(prompt(40));  // chunks of 16: 3 steps
  EXPECT_EQ(attention::pyramid_step::builds().load() - before, 3u);
  (void)lm.decode(std::array<std::int32_t, 1>{1});
  EXPECT_EQ(attention::pyramid_step::builds().load() - before, 4u);
}

// A pyramid pipeline's chunk is its policy's; another chunked size is refused, not overridden.
TEST(CausalLm, PyramidRefusesAnotherChunkSize) {
  expect_error(
      [] {
        causal_lm<f32_pyramid> lm(tiny_dir(),
                                  {.max_sequence = 96, .prefill = prefill_mode::chunked(8)});
      },
      error_code::invalid_argument, "chunks of 16, its own; prefill_mode::chunked(8)");
  causal_lm<f32_pyramid> same(tiny_dir(), {.max_sequence = 96, .prefill = prefill_mode::chunked(16)});
  EXPECT_EQ(same.step_rows(), 16u);
}

TEST(CausalLm, ErrorsLeaveThePipelineUsable) {
  causal_lm<f32_contiguous> lm(tiny_dir(),
                               {.max_sequence = 40, .prefill = prefill_mode::static_prompt(32)});
  try {
    lm.prefill(prompt(33));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::capacity_exhausted);
    EXPECT_NE(std::string(e.what()).find("static prompt capacity 32"), std::string::npos);
  }
  EXPECT_EQ(lm.length(), 0u);
  const auto first = lm.prefill(prompt(30));
  const std::vector<std::int32_t> bad = {1, 512};
  expect_error([&] { lm.decode(bad); }, error_code::invalid_argument,
               "causal_lm: token 512 at 1 outside the vocabulary of 512");
  // More tokens than the decode shape's rows: a capacity, as every "too many tokens".
  expect_error([&] { lm.decode(std::vector<std::int32_t>(9, 1)); }, error_code::capacity_exhausted,
               "exceeds the decode shape of 8 rows");
  for (int i = 0; i < 10; ++i) lm.decode(std::array<std::int32_t, 1>{1});
  try {
    lm.decode(std::array<std::int32_t, 1>{1});
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::capacity_exhausted);
    EXPECT_NE(std::string(e.what()).find("KV cache is full"), std::string::npos);
  }
  EXPECT_EQ(lm.length(), 40u);
  lm.reset();
  EXPECT_EQ(lm.length(), 0u);
  EXPECT_LE(max_diff(lm.prefill(prompt(30)).logits_of(29), first.logits_of(29)), 0.0);  // identical
  causal_lm<f32_contiguous> dyn(tiny_dir(), {.max_sequence = 16});
  EXPECT_THROW(dyn.prefill(prompt(17)), error);
  EXPECT_EQ(dyn.length(), 0u);
  using bf16_weights = pipeline_config<contiguous_kv<float>, dynamic_attention<>, bfloat16>;
  try {
    causal_lm<bf16_weights> wrong(tiny_dir(), {});
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("configured for bf16 weights"), std::string::npos);
  }
}

// load_options::dense_huge_pages on tiny bf16 models, tied (tiny) and untied (tiny-llama): the
// matrices copied into huge-page memory at load give the logits of the mapping's bit for bit
// (prefill, then decode steps); automatic, the default, copies what decode reads in place (the
// LM head, and the projections where the pipeline does not pack them: bf16 with AVX-512 BF16);
// a kernel that refuses the huge-page advice (madvise is advisory) leaves the copy in 4 KiB
// pages, the same logits.
int refused_advice = 0;
int refuse_huge_pages(void*, std::size_t) noexcept {
  ++refused_advice;
  errno = EINVAL;  // what a kernel without transparent huge pages answers
  return -1;
}

TEST(CausalLm, DenseWeightsInHugePagesGiveTheSameLogits) {
  using bf16_weights = pipeline_config<contiguous_kv<float>, dynamic_attention<>, bfloat16>;
  EXPECT_EQ(load_options{}.dense_huge_pages, huge_page_copy::automatic);
  for (const std::string name : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(name);
    const fs::path dir = npullm::testing::scratch_root() / ("lm_huge_" + name);
    write_model(dir, preset(name, npullm::dtype::bf16, 5));
    using weights_ptr = std::shared_ptr<const model_weights<bfloat16>>;
    const auto load = [&](huge_page_copy mode) {
      return model_weights<bfloat16>::load(dir, {.dense_huge_pages = mode});
    };
    const weights_ptr off = load(huge_page_copy::off), on = load(huge_page_copy::on);
    const weights_ptr automatic = model_weights<bfloat16>::load(dir);
    npullm::detail::advise_huge_pages = refuse_huge_pages;
    refused_advice = 0;
    const weights_ptr refused = load(huge_page_copy::on);
    npullm::detail::advise_huge_pages = npullm::detail::advise_huge_pages_system;
    EXPECT_GT(refused_advice, 0);

    const bool tied = off->lm_head.identity() == off->embed.identity();
    EXPECT_EQ(tied, name == "tiny");
    const auto bytes = [](const projection<bfloat16>& p) {
      return (p.w.size() * sizeof(bfloat16) + 63) / 64 * 64;
    };
    std::size_t layers = 0;
    for (const auto& l : off->layers)
      for_each_projection(l, [&](const projection<bfloat16>& p) { layers += bytes(p); });
    const std::size_t head = bytes(off->lm_head), embed = tied ? 0 : bytes(off->embed);
    EXPECT_EQ(off->huge_page_copy_bytes(), 0u);
    EXPECT_EQ(on->huge_page_copy_bytes(), head + embed + layers);
    EXPECT_EQ(refused->huge_page_copy_bytes(), on->huge_page_copy_bytes());
    EXPECT_EQ(automatic->huge_page_copy_bytes(),
              head + (ops::packing_pays<bfloat16>() ? 0 : layers));
    // Copies, not views of the mapping; a tied head stays its embedding.
    EXPECT_NE(on->layers[1].down.w.data_handle(), off->layers[1].down.w.data_handle());
    EXPECT_NE(on->lm_head.identity(), off->lm_head.identity());
    EXPECT_EQ(on->lm_head.identity() == on->embed.identity(), tied);
    EXPECT_EQ(0, std::memcmp(on->layers[1].down.w.data_handle(),
                             off->layers[1].down.w.data_handle(), bytes(off->layers[1].down)));

    const auto run = [&](const weights_ptr& w) {
      causal_lm<bf16_weights> lm(w, {.max_sequence = 64});
      std::vector<float> out;
      const auto keep = [&](std::span<const float> l) {
        out.insert(out.end(), l.begin(), l.end());
      };
      keep(lm.prefill(prompt(21)).logits_of(20));
      for (std::int32_t next : {7, 300}) {
        const std::array<std::int32_t, 1> one{next};
        keep(lm.decode(one).logits_of(0));
      }
      return out;
    };
    const std::vector<float> want = run(off);
    for (const weights_ptr& w : {on, automatic, refused}) {
      const std::vector<float> got = run(w);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
    }
  }
}

}  // namespace
