// Mixtures of experts in files: GGUF files written here (qwen2moe and llama-with-experts, i.e.
// Mixtral: prefill == decode, written back and quantized, malformed files refused), the mixtures'
// config.json keys, and llama.cpp's files and logits from ../shared/vectors/gguf-moe (skipped,
// saying so, when that folder is absent), with bounds on how many positions the router's
// near-ties excuse and on argmax agreement. The router and the MoE MLP alone: test_moe.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "logits_support.hpp"
#include "npullm/io/gguf_writer.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/quantized_io.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/moe/router.hpp"
#include "npullm/ops/argmax.hpp"
#include "npullm/ops/quant.hpp"
#include "npullm/ops/quant_linear.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace npullm;
using namespace npullm::model;
using npullm::io::ggml_type;
using npullm::io::gguf_meta;
using npullm::testing::argmax_agreement;
using npullm::testing::expect_error;
using npullm::testing::max_abs_diff;
using npullm::testing::read_f32;
using npullm::testing::read_token_list;

// ---- GGUF files written here -----------------------------------------------------------------

struct moe_file {
  std::string arch = "qwen2moe";                          // or "llama" (Mixtral)
  std::size_t experts = 4, used = 2, tensor_experts = 0;  // 0: experts
  std::vector<std::pair<std::string, gguf_meta>> keys = {};
  std::set<std::string> drop_keys = {};
};

constexpr std::size_t H = 64, heads = 4, kv_heads = 2, head_dim = 16, ff = 32, shared_ff = 64,
                      vocab = 96, layers = 2;

// The files written here (under the test process's scratch_root, removed when it ends).
const fs::path& scratch_dir() {
  static const fs::path d = [] {
    const fs::path p = npullm::testing::scratch_root() / "moe";
    fs::create_directories(p);
    return p;
  }();
  return d;
}

fs::path write_moe(const moe_file& f, const std::string& name) {
  const fs::path& dir = scratch_dir();
  const bool qwen = f.arch == "qwen2moe";
  const std::string p = f.arch + ".";
  io::gguf_writer w;
  std::vector<std::pair<std::string, gguf_meta>> keys = {
      {"general.architecture", gguf_meta(f.arch)},
      {p + "block_count", gguf_meta(std::uint32_t{layers})},
      {p + "context_length", gguf_meta(std::uint32_t{256})},
      {p + "embedding_length", gguf_meta(std::uint32_t{H})},
      {p + "feed_forward_length", gguf_meta(std::uint32_t{ff})},
      {p + "attention.head_count", gguf_meta(std::uint32_t{heads})},
      {p + "attention.head_count_kv", gguf_meta(std::uint32_t{kv_heads})},
      {p + "rope.freq_base", gguf_meta(10000.0f)},
      {p + "attention.layer_norm_rms_epsilon", gguf_meta(1e-6f)},
      {p + "expert_count", gguf_meta(static_cast<std::uint32_t>(f.experts))},
      {p + "expert_used_count", gguf_meta(static_cast<std::uint32_t>(f.used))},
  };
  if (qwen) {
    keys.emplace_back(p + "expert_feed_forward_length", gguf_meta(std::uint32_t{ff}));
    keys.emplace_back(p + "expert_shared_feed_forward_length", gguf_meta(std::uint32_t{shared_ff}));
  }
  for (const auto& k : f.keys) {
    std::erase_if(keys, [&](const auto& e) { return e.first == k.first; });
    keys.push_back(k);
  }
  for (const auto& [k, v] : keys)
    if (!f.drop_keys.contains(k)) w.add(k, v);
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 0.2f);
  std::vector<std::vector<float>> keep;
  auto tensor = [&](const std::string& n, std::vector<std::size_t> shape, float base = 0) {
    std::size_t count = 1;
    for (std::size_t s : shape) count *= s;
    std::vector<float> v(count);
    for (float& x : v) x = base + d(rng);
    std::vector<std::byte> bytes(count * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(n, ggml_type::f32, shape, std::move(bytes));
  };
  const std::size_t te = f.tensor_experts != 0 ? f.tensor_experts : f.experts;
  tensor("token_embd.weight", {vocab, H});
  tensor("output_norm.weight", {H}, 1);
  tensor("output.weight", {vocab, H});
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", {H}, 1);
    tensor(b + "attn_q.weight", {heads * head_dim, H});
    tensor(b + "attn_k.weight", {kv_heads * head_dim, H});
    tensor(b + "attn_v.weight", {kv_heads * head_dim, H});
    tensor(b + "attn_output.weight", {H, heads * head_dim});
    if (qwen) {
      tensor(b + "attn_q.bias", {heads * head_dim});
      tensor(b + "attn_k.bias", {kv_heads * head_dim});
      tensor(b + "attn_v.bias", {kv_heads * head_dim});
    }
    tensor(b + "ffn_norm.weight", {H}, 1);
    tensor(b + "ffn_gate_inp.weight", {te, H});
    tensor(b + "ffn_gate_exps.weight", {te, ff, H});
    tensor(b + "ffn_up_exps.weight", {te, ff, H});
    tensor(b + "ffn_down_exps.weight", {te, H, ff});
    if (qwen) {
      tensor(b + "ffn_gate_shexp.weight", {shared_ff, H});
      tensor(b + "ffn_up_shexp.weight", {shared_ff, H});
      tensor(b + "ffn_down_shexp.weight", {H, shared_ff});
      tensor(b + "ffn_gate_inp_shexp.weight", {H});
    }
  }
  const fs::path path = dir / (name + ".gguf");
  w.write(path);
  return path;
}

using lm_f32 = causal_lm<pipeline_config<contiguous_kv<float>, dynamic_attention<>, float>>;

std::vector<float> prefill_logits(std::shared_ptr<const model_weights<float>> w,
                                  const std::vector<std::int32_t>& ids) {
  lm_f32 lm(std::move(w), {.max_sequence = ids.size()});
  const auto out = lm.prefill(ids, npullm::output_selection::all_rows());
  return {out.logits.data(), out.logits.data() + out.logits.size()};
}

class written_moe : public ::testing::TestWithParam<std::string> {};

TEST_P(written_moe, reads_the_experts_and_decodes_as_it_prefills) {
  const auto path = write_moe({.arch = GetParam()}, GetParam());
  const auto w = model_weights<float>::load_gguf(path);
  const model_config& c = w->config();
  EXPECT_EQ(c.moe.experts, 4u);
  EXPECT_EQ(c.moe.experts_per_token, 2u);
  EXPECT_EQ(c.moe.expert_intermediate_size, ff);
  EXPECT_EQ(c.moe.normalize_top_k, GetParam() == "llama");
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, GetParam() == "llama" ? 0u : shared_ff);
  ASSERT_EQ(w->layers[1].moe.gate.size(), 4u);
  EXPECT_EQ(w->layers[1].moe.down[3].rows(), H);
  EXPECT_EQ(w->layers[1].gate.rows(), 0u);  // no dense MLP in an MoE layer

  std::vector<std::int32_t> ids(23);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 37 + 5) % vocab);
  const auto all = prefill_logits(w, ids);
  lm_f32 lm(w, {.max_sequence = ids.size()});
  lm.record_routing(true);
  std::set<std::int32_t> used;
  double worst = 0;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const auto out = lm.decode(std::span(ids).subspan(t, 1));
    for (std::size_t v = 0; v < vocab; ++v)
      worst = std::max(worst, double(std::fabs(out.logits.data()[v] - all[t * vocab + v])));
  }
  for (const auto& r : lm.routing_records()) used.insert(r.experts.begin(), r.experts.end());
  EXPECT_EQ(lm.routing_records().size(), ids.size() * layers);  // one per token and layer
  EXPECT_EQ(used.size(), 4u);
  EXPECT_LE(worst, 2e-5);  // one row's GEMVs against the step's GEMMs: f32 reassociation
}

INSTANTIATE_TEST_SUITE_P(gguf, written_moe, ::testing::Values("qwen2moe", "llama"),
                         [](const auto& info) {
                           return info.param == "llama" ? std::string("mixtral") : info.param;
                         });

TEST(moe_files, malformed_ones_are_refused_naming_what_is_wrong) {
  auto load = [](const moe_file& f, const char* name) {
    return [f, name] { model_weights<float>::load_gguf(write_moe(f, name)); };
  };
  expect_error(load({.experts = 4, .tensor_experts = 8}, "shape"), error_code::corrupt_data,
               "'blk.0.ffn_gate_inp.weight' has shape [8, 64], the hyperparameters imply [4, 64]");
  expect_error(load({.experts = 4, .used = 5}, "used"), error_code::corrupt_data,
               "expert_used_count 5 exceeds expert_count 4");
  expect_error(load({.drop_keys = {"qwen2moe.expert_used_count"}}, "noused"),
               error_code::corrupt_data, "expert_count 4 without expert_used_count");
  expect_error(load({.drop_keys = {"qwen2moe.expert_count"}}, "nocount"), error_code::corrupt_data,
               "qwen2moe without qwen2moe.expert_count");
  expect_error(
      load({.keys = {{"qwen2moe.expert_gating_func", gguf_meta(std::uint32_t{2})}}}, "sigmoid"),
      error_code::unsupported, "expert_gating_func 2");
  expect_error(
      load({.keys = {{"qwen2moe.expert_shared_count", gguf_meta(std::uint32_t{2})}}}, "unknown"),
      error_code::unsupported, "key 'qwen2moe.expert_shared_count'");
}

std::vector<float> logits_of(std::shared_ptr<const model_weights<float>> w) {
  std::vector<std::int32_t> ids(19);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 29 + 3) % vocab);
  return prefill_logits(std::move(w), ids);
}

// What npullm_quantize does with a mixture: written back as GGUF and as safetensors, read again,
// the same logits bit for bit; quantized at load (the experts too), the same once more.
TEST_P(written_moe, writes_back_and_quantizes_its_experts) {
  const auto w =
      model_weights<float>::load_gguf(write_moe({.arch = GetParam()}, GetParam() + "-in"));
  const auto ref = logits_of(w);
  const fs::path gguf = scratch_dir() / (GetParam() + "-out.gguf");
  const fs::path dir = scratch_dir() / (GetParam() + "-out");
  save_gguf(*w, gguf);
  save_safetensors(*w, dir);
  EXPECT_EQ(logits_of(model_weights<float>::load_gguf(gguf)), ref);
  const auto st = model_weights<float>::load(dir);
  EXPECT_EQ(st->config().moe.experts, 4u);
  EXPECT_EQ(logits_of(st), ref);
  const auto q = model_weights<float>::load(
      dir, {.projections = quantization{ops::weight_format::q8_0, 0, npullm::dtype::f16}});
  EXPECT_TRUE(q->layers[0].moe.down[3].is_quantized());
  EXPECT_EQ(q->quantized_matrices(), layers * (4 + 3 * 4 + (GetParam() == "llama" ? 0 : 3)));
  const fs::path qg = scratch_dir() / (GetParam() + "-q8_0.gguf");
  save_gguf(*q, qg);
  const auto qr = logits_of(q);
  EXPECT_EQ(logits_of(model_weights<float>::load_gguf(qg)), qr);
  // Quantized: not the f32 model's logits, but near them. (Not within the dense types' 0.08 std:
  // this random router's near-ties flip at some positions, measured 0.22-0.28 std at most; the
  // accuracy of the formats is test_quantized's, and of MoE files the llama.cpp tests' below.)
  double d = 0, sq = 0;
  for (std::size_t i = 0; i < qr.size(); ++i) {
    d = std::max(d, double(std::fabs(qr[i] - ref[i])));
    sq += double(ref[i]) * ref[i];
  }
  const double std_dev = std::sqrt(sq / double(ref.size()));
  std::cout << "[ moe      ] " << GetParam() << " q8_0 at load: max |q8_0 - f32| " << d / std_dev
            << " std\n";
  EXPECT_GT(d, 0.0);
  EXPECT_LT(d, 0.5 * std_dev);
}

TEST(moe_config, reads_the_mixtures_config_keys_strictly) {
  const std::string base =
      R"("hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  const auto q = parse_config(R"({"model_type": "qwen2_moe", )" + base +
                                  R"(, "num_experts": 6, "num_experts_per_tok": 2,
                                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 80,
                                  "decoder_sparse_step": 2, "mlp_only_layers": [3]})",
                              "q");
  EXPECT_EQ(q.family, model_family::qwen2);
  EXPECT_EQ(q.moe.experts, 6u);
  EXPECT_FALSE(q.moe.normalize_top_k);
  EXPECT_EQ(q.moe.layers, (std::vector<bool>{false, true, false, false}));
  // config_json writes the mixture's keys back (what npullm_quantize would write).
  const auto back = parse_config(config_json(q).dump(), "back");
  EXPECT_EQ(back.moe.experts, 6u);
  EXPECT_EQ(back.moe.experts_per_token, 2u);
  EXPECT_EQ(back.moe.expert_intermediate_size, 32u);
  EXPECT_EQ(back.moe.shared_expert_intermediate_size, 80u);
  EXPECT_EQ(back.moe.layers, q.moe.layers);
  EXPECT_FALSE(back.moe.normalize_top_k);
  const auto m = parse_config(R"({"model_type": "mixtral", )" + base + "}", "m");
  const auto m_back = parse_config(config_json(m).dump(), "m_back");
  EXPECT_EQ(m_back.moe.experts, 8u);
  EXPECT_EQ(m_back.family, model_family::mistral);
  EXPECT_EQ(m.family, model_family::mistral);
  EXPECT_EQ(m.moe.experts, 8u);
  EXPECT_EQ(m.moe.expert_intermediate_size, 96u);
  EXPECT_TRUE(m.moe.normalize_top_k);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.window(0), 0u);  // MixtralConfig: no window unless given
  EXPECT_TRUE(m.moe.in_layer(3));
  expect_error(
      [&] {
        parse_config(R"({"model_type": "mixtral", "num_experts_per_tok": 9, )" + base + "}", "k");
      },
      error_code::corrupt_data, "num_experts_per_tok 9 exceeds the 8 experts");
  expect_error(
      [&] {
        parse_config(R"({"model_type": "mixtral", "router_jitter_noise": 0.1, )" + base + "}", "j");
      },
      error_code::unsupported, "router_jitter_noise 0.1");
  expect_error(
      [&] { parse_config(R"({"model_type": "qwen2", "num_experts": 4, )" + base + "}", "d"); },
      error_code::unsupported, "num_experts 4 for qwen2");
  expect_error(
      [&] {
        parse_config(R"({"model_type": "qwen3_moe", "mlp_only_layers": [4], )" + base + "}", "o");
      },
      error_code::corrupt_data, "mlp_only_layers holds 4");
}

// ---- llama.cpp's files -----------------------------------------------------------------------

const fs::path moe_dir = NPULLM_GGUF_MOE_DIR;

#define SKIP_WITHOUT_MOE()                                                        \
  if (!fs::exists(moe_dir / "README.md"))                                         \
  GTEST_SKIP() << moe_dir.string()                                                \
               << " is absent (llama.cpp's mixture-of-experts files and logits: " \
                  "../shared/vectors/gguf-moe beside the checkout)"

std::vector<std::int32_t> moe_tokens() {
  return read_token_list(moe_dir / "tokens.txt");
}

using lm_bf16 = causal_lm<pipeline_config<contiguous_kv<float>, dynamic_attention<>, bfloat16>>;

// The bf16 checkpoint's logits, one token a step: steps of up to 8 rows multiply f32 activations
// (ops/linear.hpp), where a prefill's GEMMs round them to bf16 on an AVX-512 BF16 machine.
std::vector<float> safetensors_logits(const fs::path& dir, const std::vector<std::int32_t>& ids) {
  lm_bf16 lm(model_weights<bfloat16>::load(dir), {.max_sequence = ids.size()});
  std::vector<float> out;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const auto step = lm.decode(std::span(ids).subspan(t, 1));
    out.insert(out.end(), step.logits.data(), step.logits.data() + step.logits.size());
  }
  return out;
}

class llama_cpp_moe : public ::testing::TestWithParam<std::string> {};

// f32 GGUF by llama.cpp's converter: its logits (which agree with a float64 forward pass to
// ~6e-6, the README says) within 1e-4, every argmax; the bf16 checkpoint through safetensors
// gives the same (its values are the GGUF's exactly; only the kernels' order of summation
// differs).
TEST_P(llama_cpp_moe, f32_file_gives_llama_cpps_logits_and_the_checkpoints) {
  SKIP_WITHOUT_MOE();
  const std::string f = GetParam();
  const auto ids = moe_tokens();
  ASSERT_EQ(ids.size(), 80u);
  const auto g = model_weights<float>::load_gguf(moe_dir / (f + "-f32.gguf"));
  const auto lg = prefill_logits(g, ids);
  const auto ref = read_f32(moe_dir / (f + "-f32.logits.f32"));
  const auto st = safetensors_logits(moe_dir / f, ids);
  const double d_cpp = max_abs_diff(lg, ref), d_st = max_abs_diff(lg, st);
  const std::size_t agree = argmax_agreement(lg, ref, g->config().vocab_size);
  std::cout << "[ moe      ] " << f << " f32: max |GGUF - llama.cpp| " << d_cpp
            << ", max |GGUF - safetensors| " << d_st << ", argmax " << agree << " / 80\n";
  EXPECT_LE(d_cpp, 1e-4);
  EXPECT_LE(d_st, 1e-4);
  EXPECT_EQ(agree, 80u);
}

// Quantized files: npullm's logits against llama.cpp's on the same file. The two engines'
// hidden states differ by their kernels' rounding (each quantizes activations its own way), which
// is harmless except where a router's choice was a near-tie: there each engine may pick another
// expert, and that position differs by far more; the positions after it attend to its K/V and
// move too, by less. So a position whose routing (its smallest margin over the layers) was no
// near-tie (margin >= 0.02) must agree within twice the dense types' bound (0.08 / 0.16 of the
// logits' std, test_quantized's); the positions beyond the bound are counted and printed with
// their margins.
//
// The excuse is bounded (issue 57), over the 80 positions of each file:
// - near-ties (margin < 0.02, exempt from the check above) at most 32 (40 %), so that the rule
//   cannot swallow the test (e.g. margins computed wrongly);
// - positions the rule actually excuses (a near-tie AND beyond twice the bound) at most 4 (5 %);
// - the argmax (the greedy token) equal to llama.cpp's at >= 72 positions (90 %).
// Measured (release build, -march=native, AMD EPYC Zen 4 with AVX-512 BF16):
//   file             near-ties  excused  argmax
//   mixtral-Q8_0        26         1      77
//   mixtral-Q4_K_M      25         2      74
//   qwen2moe-Q8_0       18         1      78
//   qwen2moe-Q4_K_M     15         2      77
constexpr std::size_t most_near_ties = 32, most_excused = 4, least_argmax = 72;

struct quantized_case {
  std::string file;
  double bound;  // x logit std
};

class llama_cpp_moe_quantized : public ::testing::TestWithParam<quantized_case> {};

TEST_P(llama_cpp_moe_quantized, agrees_with_llama_cpp_except_after_near_ties) {
  SKIP_WITHOUT_MOE();
  const auto& p = GetParam();
  const auto ids = moe_tokens();
  const auto w = model_weights<float>::load_gguf(moe_dir / (p.file + ".gguf"));
  const std::size_t V = w->config().vocab_size;
  lm_f32 lm(w, {.max_sequence = ids.size()});
  lm.record_routing(true);
  const auto out = lm.prefill(ids, npullm::output_selection::all_rows());
  const std::vector<float> ours(out.logits.data(), out.logits.data() + out.logits.size());
  const auto ref = read_f32(moe_dir / (p.file + ".logits.f32"));
  ASSERT_EQ(ours.size(), ref.size());
  double mean = 0, sq = 0;
  for (float v : ref) mean += v;
  mean /= double(ref.size());
  for (float v : ref) sq += (v - mean) * (v - mean);
  const double std_dev = std::sqrt(sq / double(ref.size()));
  // The smallest margin of each position over the layers (one record per layer: rows = 80).
  std::vector<float> margin(ids.size(), 1.0f);
  ASSERT_EQ(lm.routing_records().size(), w->config().num_hidden_layers);
  for (const auto& r : lm.routing_records()) {
    ASSERT_EQ(r.rows, ids.size());
    for (std::size_t t = 0; t < ids.size(); ++t) margin[t] = std::min(margin[t], r.margins[t]);
  }
  constexpr float tie = 0.02f;  // a 2-point probability gap between chosen and left out
  std::size_t over = 0, ties = 0, excused = 0, agree = 0;
  std::string shown;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    double d = 0;
    for (std::size_t v = 0; v < V; ++v)
      d = std::max(d, std::fabs(double(ours[t * V + v]) - ref[t * V + v]));
    agree += ops::argmax(std::span<const float>(ours).subspan(t * V, V)) ==
             ops::argmax(std::span<const float>(ref).subspan(t * V, V));
    ties += margin[t] < tie;
    if (d > p.bound * std_dev) {
      ++over;
      shown += " " + std::to_string(t) + " (" + std::to_string(d / std_dev) + " std, margin " +
               std::to_string(margin[t]) + ")";
    }
    if (margin[t] >= tie) {
      EXPECT_LE(d, 2 * p.bound * std_dev)
          << p.file << " position " << t << ", margin " << margin[t];
    } else {
      excused += d > 2 * p.bound * std_dev;
    }
  }
  std::cout << "[ moe      ] " << p.file << ": " << over << " of 80 positions beyond " << p.bound
            << " std of llama.cpp's logits, argmax " << agree << " / 80; " << ties
            << " positions with a near-tie (margin < " << tie << "), " << excused
            << " of them beyond twice the bound; beyond:" << shown << "\n";
  EXPECT_LE(ties, most_near_ties) << p.file << ": near-ties exempt from the bound";
  EXPECT_LE(excused, most_excused) << p.file << ": near-ties beyond twice the bound";
  EXPECT_GE(agree, least_argmax) << p.file << ": positions whose argmax is llama.cpp's";
}

INSTANTIATE_TEST_SUITE_P(gguf, llama_cpp_moe, ::testing::Values("mixtral", "qwen2moe"));
INSTANTIATE_TEST_SUITE_P(gguf, llama_cpp_moe_quantized,
                         ::testing::Values(quantized_case{"mixtral-Q8_0", 0.08},
                                           quantized_case{"mixtral-Q4_K_M", 0.16},
                                           quantized_case{"qwen2moe-Q8_0", 0.08},
                                           quantized_case{"qwen2moe-Q4_K_M", 0.16}),
                         [](const auto& info) {
                           std::string s = info.param.file;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// A mixture with a sliding window on every layer (the Mixtral checkpoint, its config given
// sliding_window 16): a contiguous pipeline keeps its KV in a window-sized ring, a block pipeline
// gives unseen blocks back; both compute what the full cache under the same window computes, and
// the window changes the logits only once positions fall out of it. (Steps of at most 8 rows
// throughout: they all multiply f32 activations by the bf16 weights, where a longer prefill's
// GEMMs would round them to bf16 on an AVX-512 BF16 machine.)
TEST(llama_cpp_moe_window, ring_and_blocks_equal_the_full_cache) {
  SKIP_WITHOUT_MOE();
  const auto ids = moe_tokens();
  const fs::path dir = scratch_dir() / "mixtral-window16";
  fs::create_directories(dir);
  fs::copy_file(moe_dir / "mixtral" / "model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  {
    std::ifstream in(moe_dir / "mixtral" / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string key = "\"sliding_window\": null";
    const auto at = text.find(key);
    ASSERT_NE(at, std::string::npos) << "the checkpoint's config has no null sliding_window";
    text.replace(at, key.size(), "\"sliding_window\": 16");
    std::ofstream(dir / "config.json") << text;
  }
  const auto w = model_weights<bfloat16>::load(dir);
  ASSERT_EQ(w->config().window(0), 16u);
  ASSERT_EQ(w->config().window(1), 16u);
  using blocks_bf16 =
      causal_lm<pipeline_config<block_kv<float, 16>, dynamic_attention<>, bfloat16>>;
  lm_bf16 ring(w, {.max_sequence = ids.size(), .step_rows = 8});
  ASSERT_NE(ring.ring_kv_cache(), nullptr);
  EXPECT_LT(ring.ring_kv_cache()->capacity(), ids.size());
  lm_bf16 full(w, {.max_sequence = ids.size()});  // step_rows = max: the whole past kept
  ASSERT_EQ(full.ring_kv_cache(), nullptr);
  blocks_bf16 blk(w, {.max_sequence = ids.size(), .step_rows = 8});
  lm_bf16 unwindowed(model_weights<bfloat16>::load(moe_dir / "mixtral"),
                     {.max_sequence = ids.size()});
  const std::size_t prompt = 8, V = w->config().vocab_size;
  auto logits = [](const auto& o) {
    return std::vector<float>(o.logits.data(), o.logits.data() + o.logits.size());
  };
  const auto head = std::span(ids).first(prompt);
  const auto sel = npullm::output_selection::all_rows();
  auto a = logits(ring.prefill(head, sel)), b = logits(blk.prefill(head, sel)),
       f = logits(full.prefill(head, sel)), u = logits(unwindowed.prefill(head, sel));
  double worst = 0, first_rows = 0, later_rows = 0;
  std::size_t most_blocks = 0;
  for (std::size_t t = 0;;) {
    most_blocks = std::max(most_blocks, blk.kv_pool().used_count());
    worst = std::max({worst, max_abs_diff(a, f), max_abs_diff(b, f)});
    for (std::size_t r = 0; r < f.size() / V; ++r, ++t) {  // position t's row
      const std::vector<float> fr(f.begin() + r * V, f.begin() + (r + 1) * V),
          ur(u.begin() + r * V, u.begin() + (r + 1) * V);
      double& seen = t < 16 ? first_rows : later_rows;
      seen = std::max(seen, max_abs_diff(fr, ur));
    }
    if (t == ids.size()) break;
    const auto next = std::span(ids).subspan(t, 1);
    a = logits(ring.decode(next));
    b = logits(blk.decode(next));
    f = logits(full.decode(next));
    u = logits(unwindowed.decode(next));
  }
  std::cout << "[ moe      ] mixtral, window 16: max |ring - full|, |blocks - full| " << worst
            << "; windowed vs not: " << first_rows << " before position 16, " << later_rows
            << " after\n";
  EXPECT_LE(worst, 1e-5);       // the same keys, the ring's order of summation
  EXPECT_LE(first_rows, 1e-5);  // every key still inside the window
  EXPECT_GT(later_rows, 0.5);
  EXPECT_EQ(ring.length(), ids.size());
  EXPECT_LE(most_blocks, 3u);  // window 16 + the new row in blocks of 16, not 80 / 16
}

// Qwen3-MoE: no llama.cpp file (its converter predates Qwen 3); the checkpoint against a float64
// forward pass in transformers' semantics.
TEST(llama_cpp_moe_qwen3, checkpoint_gives_the_float64_logits) {
  SKIP_WITHOUT_MOE();
  const auto ids = moe_tokens();
  const auto st = safetensors_logits(moe_dir / "qwen3moe", ids);
  const auto ref = read_f32(moe_dir / "qwen3moe.ref.logits.f32");
  const double d = max_abs_diff(st, ref);
  std::cout << "[ moe      ] qwen3moe (bf16 checkpoint): max |npullm - float64| " << d
            << ", argmax " << argmax_agreement(st, ref, 256) << " / 80\n";
  EXPECT_LE(d, 1e-4);
  EXPECT_EQ(argmax_agreement(st, ref, 256), 80u);
}

// npullm's own qwen3moe GGUF (llama.cpp's names: attn_q_norm / attn_k_norm, *_exps, no shared
// expert) of the bf16 checkpoint: read back, the checkpoint's logits bit for bit.
TEST(llama_cpp_moe_qwen3, written_as_gguf_gives_the_checkpoints_logits) {
  SKIP_WITHOUT_MOE();
  const auto ids = moe_tokens();
  const auto st = model_weights<bfloat16>::load(moe_dir / "qwen3moe");
  const fs::path path = scratch_dir() / "qwen3moe-bf16.gguf";
  save_gguf(*st, path);
  EXPECT_EQ(io::gguf_file::open(path)->header().get<std::string_view>("general.architecture"),
            "qwen3moe");
  lm_bf16 a(st, {.max_sequence = ids.size()}),
      b(model_weights<bfloat16>::load_gguf(path), {.max_sequence = ids.size()});
  const auto x = a.prefill(ids, npullm::output_selection::all_rows());
  const auto y = b.prefill(ids, npullm::output_selection::all_rows());
  EXPECT_TRUE(std::equal(x.logits.data(), x.logits.data() + x.logits.size(), y.logits.data()));
}

}  // namespace
