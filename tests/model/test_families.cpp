// Every supported family (Qwen2 with and without windows, Llama 2 and 3.x, Qwen 3, Mistral,
// Phi-3, Gemma 2) through the
// pipeline against an independent double-precision forward pass written here from the
// published Hugging Face model definitions (modeling_qwen2/llama/qwen3/mistral/phi3/gemma2.py
// and modeling_rope_utils.py), not from npullm's ops: the frequencies, masks, norms and
// activations are computed from their formulas in this file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "npullm/model/causal_lm.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/model/synthetic.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::model;
using namespace npullm::io;
using npullm::testing::expect_error;
namespace fs = std::filesystem;

const char* const families[] = {"tiny",         "tiny-qwen2-window", "tiny-llama", "tiny-llama3",
                                "tiny-qwen3",   "tiny-mistral",      "tiny-phi3",  "tiny-gemma2"};

const fs::path& model_dir(const std::string& name) {
  return npullm::testing::generated_model(name, 7);
}

std::vector<std::int32_t> prompt(std::size_t n, std::uint32_t seed = 1) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i)
    ids[i] = static_cast<std::int32_t>((seed * 2654435761u + i * 97u) % 512u);
  return ids;
}

// ---- the reference -------------------------------------------------------------------------

struct reference {
  model_config c;
  safetensors_model w;
  std::size_t capacity;          // the pipeline's RoPE table length (longrope picks by it)
  std::vector<double> inv_freq;  // rotary_dim / 2
  double rope_magnitude = 1.0;   // yarn / longrope attention factor on cos and sin

  reference(const fs::path& dir, std::size_t capacity_positions)
      : c(load_config(dir)), w(safetensors_model::open(dir)), capacity(capacity_positions) {
    const std::size_t r = c.rotary_dim(), half = r / 2;
    const auto& s = c.rope_scaling;
    for (std::size_t i = 0; i < half; ++i) {
      // Plain: theta^(-2i / r).
      double f = 1.0 / std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(r));
      if (s.kind == ops::rope_kind::llama3) {
        // Llama 3.1: long wavelengths slowed by factor, short ones kept, a ramp in between.
        const double orig = static_cast<double>(s.original_max_position_embeddings);
        const double low_wavelen = orig / s.low_freq_factor, high_wavelen = orig / s.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f = f / s.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
      } else if (s.kind == ops::rope_kind::longrope) {
        // Phi-3: per-frequency divisors, long ones beyond the original context.
        const bool long_context = capacity > s.original_max_position_embeddings;
        f = f / (long_context ? s.long_factor[i] : s.short_factor[i]);
      }
      inv_freq.push_back(f);
    }
    if (s.kind == ops::rope_kind::longrope) {
      const double scale = static_cast<double>(c.max_position_embeddings) /
                           static_cast<double>(s.original_max_position_embeddings);
      rope_magnitude = scale <= 1.0
                           ? 1.0
                           : std::sqrt(1.0 + std::log(scale) /
                                                 std::log(static_cast<double>(
                                                     s.original_max_position_embeddings)));
    }
  }

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
  bool has(const std::string& name) const { return w.contains(name); }

  // RMSNorm; Gemma 2 scales by (1 + w).
  std::vector<double> rms(const std::vector<double>& x, const std::string& name) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_norm_eps);
    const double offset = c.family == model_family::gemma2 ? 1.0 : 0.0;
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (offset + at(name, i));
    return y;
  }
  // y = W[row0 : row0 + out] x (+ bias): a row range for Phi-3's fused matrices.
  std::vector<double> proj(const std::vector<double>& x, const std::string& name, std::size_t out,
                           std::size_t row0 = 0, const std::string& bias = "") const {
    std::vector<double> y(out);
    (void)at(name, 0, 0);  // the view, looked up once
    const auto& m = mats.at(name);
    for (std::size_t o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : at(bias, o);
      for (std::size_t i = 0; i < x.size(); ++i) s += static_cast<double>(m(row0 + o, i)) * x[i];
      y[o] = s;
    }
    return y;
  }
  void rope(std::vector<double>& v, std::size_t heads, std::size_t pos) const {
    const std::size_t d = c.head_dim, half = inv_freq.size();
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t i = 0; i < half; ++i) {
        const double a = v[h * d + i], b = v[h * d + i + half];
        const double angle = static_cast<double>(pos) * inv_freq[i];
        const double cs = rope_magnitude * std::cos(angle), sn = rope_magnitude * std::sin(angle);
        v[h * d + i] = a * cs - b * sn;
        v[h * d + i + half] = b * cs + a * sn;
      }
    }
  }
  static double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
  }

  // Logits of the rows asked for.
  std::vector<std::vector<double>> forward(const std::vector<std::int32_t>& ids,
                                           const std::vector<std::size_t>& rows) const {
    const std::size_t n = ids.size(), hdim = c.hidden_size, d = c.head_dim;
    const std::size_t hq = c.num_attention_heads, hkv = c.num_key_value_heads, group = hq / hkv;
    const std::size_t inter = c.intermediate_size;
    const bool phi3 = c.family == model_family::phi3, gemma2 = c.family == model_family::gemma2;
    std::vector<std::vector<double>> x(n, std::vector<double>(hdim));
    const double embed_scale = gemma2 ? std::sqrt(static_cast<double>(hdim)) : 1.0;
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t i = 0; i < hdim; ++i)
        x[t][i] = at("model.embed_tokens.weight", static_cast<std::size_t>(ids[t]), i) * embed_scale;
    }
    const double scale =
        1.0 / std::sqrt(gemma2 ? c.query_pre_attn_scalar : static_cast<double>(d));
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::size_t window = c.layer_windows.empty() ? 0 : c.layer_windows[l];
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (std::size_t t = 0; t < n; ++t) {
        const auto h = rms(x[t], p + "input_layernorm.weight");
        if (phi3) {
          const std::string qkv = p + "self_attn.qkv_proj.weight";
          q[t] = proj(h, qkv, hq * d, 0);
          k[t] = proj(h, qkv, hkv * d, hq * d);
          v[t] = proj(h, qkv, hkv * d, (hq + hkv) * d);
        } else {
          const bool b = c.attention_bias;
          q[t] = proj(h, p + "self_attn.q_proj.weight", hq * d, 0, b ? p + "self_attn.q_proj.bias" : "");
          k[t] = proj(h, p + "self_attn.k_proj.weight", hkv * d, 0, b ? p + "self_attn.k_proj.bias" : "");
          v[t] = proj(h, p + "self_attn.v_proj.weight", hkv * d, 0, b ? p + "self_attn.v_proj.bias" : "");
        }
        if (c.family == model_family::qwen3) {  // q_norm / k_norm over each head
          auto head_norm = [&](std::vector<double>& u, std::size_t heads, const std::string& name) {
            for (std::size_t hh = 0; hh < heads; ++hh) {
              std::vector<double> one(u.begin() + static_cast<std::ptrdiff_t>(hh * d),
                                      u.begin() + static_cast<std::ptrdiff_t>((hh + 1) * d));
              one = rms(one, name);
              std::copy(one.begin(), one.end(), u.begin() + static_cast<std::ptrdiff_t>(hh * d));
            }
          };
          head_norm(q[t], hq, p + "self_attn.q_norm.weight");
          head_norm(k[t], hkv, p + "self_attn.k_norm.weight");
        }
        rope(q[t], hq, t);
        rope(k[t], hkv, t);
      }
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> att(hq * d, 0.0);
        // HF's sliding-window mask: key j is visible from query t iff t - window < j <= t.
        const std::size_t first = window != 0 && t + 1 > window ? t + 1 - window : 0;
        for (std::size_t h = 0; h < hq; ++h) {
          const std::size_t g = h / group;
          std::vector<double> s;
          double m = -INFINITY;
          for (std::size_t j = first; j <= t; ++j) {
            double dot = 0;
            for (std::size_t e = 0; e < d; ++e) dot += q[t][h * d + e] * k[j][g * d + e];
            dot *= scale;
            if (c.attn_logit_softcapping > 0)
              dot = c.attn_logit_softcapping * std::tanh(dot / c.attn_logit_softcapping);
            s.push_back(dot);
            m = std::max(m, dot);
          }
          double sum = 0;
          for (double& sj : s) sum += (sj = std::exp(sj - m));
          for (std::size_t j = first; j <= t; ++j) {
            for (std::size_t e = 0; e < d; ++e)
              att[h * d + e] += s[j - first] / sum * v[j][g * d + e];
          }
        }
        auto o = proj(att, p + "self_attn.o_proj.weight", hdim, 0,
                      c.attention_output_bias ? p + "self_attn.o_proj.bias" : "");
        if (gemma2) o = rms(o, p + "post_attention_layernorm.weight");
        for (std::size_t i = 0; i < hdim; ++i) x[t][i] += o[i];
        const auto h2 =
            rms(x[t], p + (gemma2 ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"));
        std::vector<double> gate, up;
        if (phi3) {
          gate = proj(h2, p + "mlp.gate_up_proj.weight", inter, 0);
          up = proj(h2, p + "mlp.gate_up_proj.weight", inter, inter);
        } else {
          gate = proj(h2, p + "mlp.gate_proj.weight", inter);
          up = proj(h2, p + "mlp.up_proj.weight", inter);
        }
        std::vector<double> a(inter);
        for (std::size_t i = 0; i < inter; ++i) {
          const double g = gate[i];
          a[i] = (gemma2 ? gelu_tanh(g) : g / (1.0 + std::exp(-g))) * up[i];
        }
        auto down = proj(a, p + "mlp.down_proj.weight", hdim);
        if (gemma2) down = rms(down, p + "post_feedforward_layernorm.weight");
        for (std::size_t i = 0; i < hdim; ++i) x[t][i] += down[i];
      }
    }
    const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    std::vector<std::vector<double>> logits;
    for (std::size_t t : rows) {
      auto y = proj(rms(x[t], "model.norm.weight"), head, c.vocab_size);
      if (c.final_logit_softcapping > 0) {
        for (double& v : y) v = c.final_logit_softcapping * std::tanh(v / c.final_logit_softcapping);
      }
      logits.push_back(std::move(y));
    }
    return logits;
  }
};

using contiguous = pipeline_config<contiguous_kv<float>, dynamic_attention<>, float>;
using blocks = pipeline_config<block_kv<float, 16>, dynamic_attention<>, float>;

double max_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// ---- tests ---------------------------------------------------------------------------------

// The generator writes each family's config.json so that the strict reader gives the same
// architecture back.
TEST(Families, GeneratedConfigsReadBack) {
  for (const char* name : families) {
    SCOPED_TRACE(name);
    const model_config want = preset(name).config;
    const model_config got = parse_config(config_json(want).dump(), name);
    EXPECT_EQ(got.family, want.family);
    EXPECT_EQ(got.head_dim, want.head_dim);
    EXPECT_EQ(got.layer_windows, want.layer_windows);
    EXPECT_EQ(got.rope_scaling.kind, want.rope_scaling.kind);
    EXPECT_EQ(got.qk_norm, want.qk_norm);
    EXPECT_EQ(got.sandwich_norms, want.sandwich_norms);
    EXPECT_EQ(got.norm_unit_offset, want.norm_unit_offset);
    EXPECT_EQ(got.hidden_act, want.hidden_act);
    EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
    EXPECT_EQ(got.attention_bias, want.attention_bias);
    EXPECT_DOUBLE_EQ(got.embedding_scale, want.embedding_scale);
    EXPECT_DOUBLE_EQ(got.attention_scale(), want.attention_scale());
    EXPECT_DOUBLE_EQ(got.final_logit_softcapping, want.final_logit_softcapping);
  }
}

// The real-shaped presets of every family describe configs the strict reader accepts (their
// files are large, so only the config is checked here).
TEST(Families, RealShapedPresetsReadBack) {
  for (const char* name : {"qwen2-0.5b", "llama-3.2-1b", "qwen3-0.6b", "mistral-7b", "phi-3-mini",
                           "gemma-2-2b"}) {
    SCOPED_TRACE(name);
    const model_config want = preset(name).config;
    const model_config got = parse_config(config_json(want).dump(), name);
    EXPECT_EQ(got.family, want.family);
    EXPECT_EQ(got.q_size(), want.q_size());
    EXPECT_EQ(got.layer_windows, want.layer_windows);
    EXPECT_EQ(got.rope_scaling.kind, want.rope_scaling.kind);
    EXPECT_DOUBLE_EQ(got.attention_scale(), want.attention_scale());
  }
}

// Prefill logits within 1e-4 of the double reference at T = 1, 17, 37 and 300 (beyond every
// preset's window: 32 or 48), with the weights packed and as stored.
TEST(Families, PrefillMatchesTheReference) {
  for (const char* name : families) {
    const auto weights = model_weights<float>::load(model_dir(name));
    const std::size_t max_sequence = 512;
    const reference ref(model_dir(name), max_sequence + 1);
    for (std::size_t n : {1u, 17u, 37u, 300u}) {
      SCOPED_TRACE(std::string(name) + ", T = " + std::to_string(n));
      const auto ids = prompt(n, static_cast<std::uint32_t>(n));
      const std::vector<std::size_t> rows = n > 2 ? std::vector<std::size_t>{0, n / 2, n - 1}
                                                  : std::vector<std::size_t>{n - 1};
      const auto want = ref.forward(ids, rows);
      for (const auto packing : {weight_packing::on, weight_packing::off}) {
        causal_lm<contiguous> lm(weights, {.max_sequence = max_sequence, .packing = packing});
        auto sel = batch::output_selection::last().logits_for(rows);
        const auto out = lm.prefill(ids, sel);
        for (std::size_t r = 0; r < rows.size(); ++r) {
          const auto got = out.logits_of(rows[r]);
          double diff = 0;
          for (std::size_t i = 0; i < got.size(); ++i)
            diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[r][i]));
          EXPECT_LE(diff, 1e-4) << "row " << rows[r];
        }
      }
    }
  }
}

// Phi-3's LongRoPE picks its short factors for a pipeline within the original context (64).
TEST(Families, LongRopeShortFactorsWithinTheOriginalContext) {
  const reference ref(model_dir("tiny-phi3"), 33);
  causal_lm<contiguous> lm(model_dir("tiny-phi3"), {.max_sequence = 32});
  const auto ids = prompt(30, 3);
  const auto want = ref.forward(ids, {29});
  const auto out = lm.prefill(ids);
  const auto got = out.logits_of(29);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[0][i], 1e-4) << i;
}

// Greedy decoding token by token gives the logits of a prefill of the same tokens, and block
// KV gives what contiguous KV gives, past the windows.
TEST(Families, DecodeEqualsPrefillAndBlocksEqualContiguous) {
  for (const char* name : families) {
    SCOPED_TRACE(name);
    const auto weights = model_weights<float>::load(model_dir(name));
    causal_lm<contiguous> lm(weights, {.max_sequence = 128});
    causal_lm<blocks> blk(weights, {.max_sequence = 128});
    auto ids = prompt(40, 9);
    // The last selected row's logits.
    auto last = [](const step_output& o) { return o.logits_of(o.logit_rows.back()); };
    auto a = lm.prefill(ids);
    auto b = blk.prefill(ids);
    for (int step = 0; step < 12; ++step) {
      EXPECT_LE(max_diff(last(a), last(b)), 1e-5) << "step " << step;
      const std::int32_t next = ops::argmax(last(a));
      ids.push_back(next);
      a = lm.decode(std::array{next});
      b = blk.decode(std::array{next});
    }
    causal_lm<contiguous> fresh(weights, {.max_sequence = 128});
    const auto all = fresh.prefill(ids);
    EXPECT_LE(max_diff(last(a), last(all)), 1e-4);
  }
}

// What the pipeline does not implement is refused, naming it: pyramid attention (static
// shapes for a device) with sliding windows or with attention soft-capping.
TEST(Families, UnimplementedFeaturesAreRefused) {
  using pyramid = pipeline_config<contiguous_kv<float>, pyramid_attention_policy<16>, float>;
  expect_error([&] { causal_lm<pyramid> lm(model_dir("tiny-mistral"), {.max_sequence = 64}); },
               error_code::unsupported, "pyramid attention with sliding-window layers");
  auto spec = preset("tiny-gemma2", npullm::dtype::f32, 7);
  spec.config.layer_windows.assign(spec.config.num_hidden_layers, 0);
  const fs::path dir = fs::temp_directory_path() / ("npullm_family_softcap_" + std::to_string(::getpid()));
  write_model(dir, spec);
  expect_error([&] { causal_lm<pyramid> lm(dir, {.max_sequence = 64}); },
               error_code::unsupported, "pyramid attention with attn_logit_softcapping 2");
  fs::remove_all(dir);
}

// A windowed layer reads only its window however long the context: decode at 300 tokens with
// 32-token windows (Mistral: every layer; Gemma 2: layers 0 and 2, the others read everything),
// counted by flash (keys times KV heads; whole 16-key sub-tiles, so up to 15 more).
TEST(Families, WindowedLayersReadOnlyTheirWindow) {
  for (const char* name : {"tiny-mistral", "tiny-gemma2"}) {
    SCOPED_TRACE(name);
    const auto weights = model_weights<float>::load(model_dir(name));
    causal_lm<contiguous> lm(weights, {.max_sequence = 512});
    causal_lm<blocks> blk(weights, {.max_sequence = 512});
    const auto& c = lm.config();
    auto ids = prompt(300, 4);
    lm.prefill(ids);
    blk.prefill(ids);
    lm.decode(std::array<std::int32_t, 1>{5});
    blk.decode(std::array<std::int32_t, 1>{5});
    for (const auto* lm_reads : {&lm.attention_reads(), &blk.attention_reads()}) {
      ASSERT_EQ(lm_reads->size(), c.num_hidden_layers);
      for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
        const std::size_t keys = (*lm_reads)[l].keys_read / c.num_key_value_heads;
        if (c.window(l) != 0) {
          EXPECT_GE(keys, c.window(l)) << "layer " << l;
          EXPECT_LE(keys, c.window(l) + 15) << "layer " << l;
        } else {
          EXPECT_EQ(keys, 301u) << "layer " << l;  // the whole past and the new token
        }
      }
    }
  }
}

// Every layer windowed: a contiguous pipeline keeps a window-sized ring, a block pipeline gives
// the blocks no window sees back to the pool; both compute what the full cache computes.
TEST(Families, WindowedKvStaysWindowSized) {
  const auto weights = model_weights<float>::load(model_dir("tiny-mistral"));
  causal_lm<contiguous> ring(weights, {.max_sequence = 1024, .step_rows = 16});
  ASSERT_NE(ring.ring_kv_cache(), nullptr);
  EXPECT_LT(ring.ring_kv_cache()->capacity(), 128u);
  expect_error([&] { (void)ring.kv_cache(); }, error_code::unsupported, "ring");
  causal_lm<blocks> blk(weights, {.max_sequence = 1024, .step_rows = 16});
  causal_lm<contiguous> full(weights, {.max_sequence = 1024});  // step_rows = max: no ring
  ASSERT_EQ(full.ring_kv_cache(), nullptr);
  auto last = [](const step_output& o) { return o.logits_of(o.logit_rows.back()); };
  auto ids = prompt(100, 6);
  auto a = ring.prefill(ids), b = blk.prefill(ids), f = full.prefill(ids);
  std::size_t most_blocks = 0;
  for (int step = 0; step < 200; ++step) {
    ASSERT_LE(max_diff(last(a), last(f)), 1e-5) << step;
    ASSERT_LE(max_diff(last(b), last(f)), 1e-5) << step;
    const std::int32_t next = ops::argmax(last(f));
    a = ring.decode(std::array{next});
    b = blk.decode(std::array{next});
    f = full.decode(std::array{next});
    most_blocks = std::max(most_blocks, blk.kv_pool().used_count());
  }
  EXPECT_EQ(ring.length(), 300u);
  // Window 32 + a decode row kept, in blocks of 16: at most 4 blocks live (not 300 / 16).
  EXPECT_LE(most_blocks, 4u);
}

// Gemma 2 alternates windowed and full layers: head + one body per layer kind (each compiled
// for the prefill and the decode shape) invoked per layer with that layer's weights + tail.
TEST(Families, OneCompiledBodyPerLayerKind) {
  std::vector<npu::trace_event> events;
  npu::host_backend backend;
  backend.set_tracer([&](const npu::trace_event& e) { events.push_back(e); });
  causal_lm<contiguous> lm(model_dir("tiny-gemma2"), {.max_sequence = 64}, std::move(backend));
  std::vector<std::string> compiled;
  for (const auto& e : events) {
    if (e.what == npu::trace_event::kind::compile) compiled.push_back(e.function);
  }
  EXPECT_EQ(compiled, (std::vector<std::string>{"head", "body/prefill/window32", "body/decode/window32",
                                                "body/prefill", "body/decode", "tail"}));
  events.clear();
  lm.backend().set_tracer([&](const npu::trace_event& e) { events.push_back(e); });
  lm.prefill(prompt(9));
  lm.decode(std::array<std::int32_t, 1>{3});
  const std::size_t layers = lm.config().num_hidden_layers;
  ASSERT_EQ(layers, 4u);
  ASSERT_EQ(events.size(), 2 * (layers + 2));
  for (std::size_t step = 0; step < 2; ++step) {
    const auto* e = &events[step * (layers + 2)];
    EXPECT_EQ(e[0].function, "head");
    for (std::size_t l = 0; l < layers; ++l) {
      const std::string body = step == 0 ? "body/prefill" : "body/decode";
      EXPECT_EQ(e[1 + l].function, l % 2 == 0 ? body + "/window32" : body) << l;
      EXPECT_EQ(e[1 + l].closure, static_cast<std::ptrdiff_t>(l));
    }
    EXPECT_EQ(e[layers + 1].function, "tail");
  }
}

// The weight type comes from the files: with_stored_weights instantiates the pipeline for what
// is stored (here f16 and bf16 models of the same preset), and a model stored otherwise than a
// pipeline's W is refused naming both.
TEST(Families, WeightTypeFromTheFile) {
  for (const auto d : {npullm::dtype::f16, npullm::dtype::bf16}) {
    const fs::path dir = fs::temp_directory_path() /
                         ("npullm_family_dtype_" + std::string(to_string(d)) + "_" +
                          std::to_string(::getpid()));
    write_model(dir, preset("tiny-qwen3", d, 7));
    EXPECT_EQ(stored_weight_type(dir), d);
    const std::size_t bytes = with_stored_weights(dir, [&](auto weights) {
      using W = typename decltype(weights)::element_type::weight_type;
      EXPECT_EQ(dtype_of<W>, d);
      causal_lm<pipeline_config<contiguous_kv<float>, dynamic_attention<>, W>> lm(
          weights, {.max_sequence = 32});
      const auto out = lm.prefill(prompt(5));
      EXPECT_TRUE(std::isfinite(out.logits_of(4)[0]));
      return sizeof(W);
    });
    EXPECT_EQ(bytes, 2u);
    expect_error([&] { causal_lm<contiguous> lm(dir, {.max_sequence = 32}); },
                 error_code::unsupported, "this pipeline is configured for f32 weights");
    fs::remove_all(dir);
  }
}

}  // namespace
