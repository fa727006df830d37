// GGUF files of each architecture npullm reads, against the same model from Hugging Face
// safetensors: llama.cpp's own converter's files from ../shared/vectors/gguf-archs (Llama 3 with
// rope_freqs, Llama 2, Gemma 2, Phi-3; the test skips, saying so, when that folder is absent),
// and files this test writes in llama.cpp's naming (Qwen 3, and the strictness cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "logits_support.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/io/gguf_writer.hpp"
#include "npullm/io/safetensors.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/gguf_model.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/ops/argmax.hpp"
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

const fs::path archs_dir = NPULLM_GGUF_ARCHS_DIR;

#define SKIP_WITHOUT_ARCHS()                                                  \
  if (!fs::exists(archs_dir / "README.md"))                                   \
  GTEST_SKIP() << archs_dir.string()                                          \
               << " is absent (llama.cpp's GGUF files of each architecture: " \
                  "../shared/vectors/gguf-archs beside the checkout)"

using lm_type = causal_lm<pipeline_config<contiguous_kv<float>, dynamic_attention<>, float>>;

// Logits of every position of one sequence from position 0, as a [n][vocab] row-major vector.
std::vector<float> logits(std::shared_ptr<const model_weights<float>> w,
                          const std::vector<std::int32_t>& ids) {
  lm_type lm(std::move(w), {.max_sequence = ids.size()});
  const auto out = lm.prefill(ids, npullm::output_selection::all_rows());
  return {out.logits.data(), out.logits.data() + out.logits.size()};
}

std::vector<std::int32_t> shared_tokens() {
  return read_token_list(archs_dir / "tokens.txt");
}

fs::path scratch(const std::string& name) {
  const fs::path d = npullm::testing::scratch_root() / "archs" / name;
  fs::create_directories(d.parent_path());
  return d;
}

// ---- llama.cpp's files ----------------------------------------------------------------------

struct arch_case {
  std::string family;
  // npullm's GGUF logits against its safetensors logits. 0 where the GGUF holds exactly the
  // values the safetensors path computes with (Llama 2: the same floats, Q/K rows put back;
  // Gemma 2: its norms hold fl(1 + w), which is what the safetensors path multiplies by). Llama 3
  // and Phi-3 hold their RoPE divisors as f32, where the safetensors path computes them in
  // double (Llama 3) or reads them as doubles from config.json (Phi-3): each frequency moves by
  // at most 2^-24 relative, an angle at position 79 by at most 79 x 2^-24 x f ~ 5e-6 rad, which
  // moves a logit (std about 1) by a few 1e-6.
  double bound_safetensors;
  // Against llama.cpp's logits: what ../shared/vectors/gguf-archs/README.md measured for the
  // safetensors path, 4.9e-6, 5.8e-6, 8.2e-6 (bound 1e-5), and Gemma 2 4.1e-3 (ggml's CPU GELU
  // reads a 16-bit lookup table): 4.14e-3 unrounded, which the GGUF gives too since its logits
  // are the safetensors path's bit for bit; bound 4.2e-3.
  double bound_llama_cpp;
};

class gguf_arch : public ::testing::TestWithParam<arch_case> {};

TEST_P(gguf_arch, gives_the_safetensors_logits_and_llama_cpps) {
  SKIP_WITHOUT_ARCHS();
  const auto& p = GetParam();
  const auto ids = shared_tokens();
  ASSERT_EQ(ids.size(), 80u);
  const auto st = model_weights<float>::load(archs_dir / p.family);
  const auto g = model_weights<float>::load_gguf(archs_dir / (p.family + "-f32.gguf"));
  const model_config &a = g->config(), &b = st->config();
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.layer_windows, b.layer_windows);
  EXPECT_EQ(a.attn_logit_softcapping, b.attn_logit_softcapping);
  EXPECT_EQ(a.final_logit_softcapping, b.final_logit_softcapping);
  EXPECT_EQ(a.attention_scale(), b.attention_scale());
  EXPECT_EQ(a.embedding_scale, b.embedding_scale);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.rotary_dim(), b.rotary_dim());
  EXPECT_FLOAT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));

  const auto lg = logits(g, ids), ls = logits(st, ids);
  const auto ref = read_f32(archs_dir / (p.family + ".logits.f32"));
  ASSERT_EQ(ref.size(), lg.size());
  const double d_st = max_abs_diff(lg, ls), d_cpp = max_abs_diff(lg, ref);
  std::cout << "[ archs    ] " << p.family << ": max |GGUF - safetensors| " << d_st
            << ", max |GGUF - llama.cpp| " << d_cpp << ", argmax agreement with llama.cpp "
            << argmax_agreement(lg, ref, a.vocab_size) << " / " << ids.size() << "\n";
  RecordProperty("max_diff_safetensors", std::to_string(d_st));
  RecordProperty("max_diff_llama_cpp", std::to_string(d_cpp));
  if (p.bound_safetensors == 0) {
    EXPECT_EQ(lg, ls) << p.family;
  } else {
    EXPECT_LE(d_st, p.bound_safetensors) << p.family;
  }
  EXPECT_LE(d_cpp, p.bound_llama_cpp) << p.family;
  EXPECT_EQ(argmax_agreement(lg, ref, a.vocab_size), ids.size()) << p.family;
}

INSTANTIATE_TEST_SUITE_P(llama_cpp, gguf_arch,
                         ::testing::Values(arch_case{"llama3", 2e-5, 1e-5},
                                           arch_case{"llama2", 0, 1e-5},
                                           arch_case{"gemma2", 0, 4.2e-3},
                                           arch_case{"phi3", 2e-5, 1e-5}),
                         [](const auto& info) { return info.param.family; });

// llama.cpp's Gemma 2 convention, checked on its converter's output: every norm weight in the
// GGUF is fl(1 + w) of the checkpoint's w, which is why the GGUF config has norm_unit_offset off.
TEST(gguf_archs, gemma2_norms_are_stored_with_the_one_added) {
  SKIP_WITHOUT_ARCHS();
  const auto g = model_weights<float>::load_gguf(archs_dir / "gemma2-f32.gguf");
  const auto st = model_weights<float>::load(archs_dir / "gemma2");
  EXPECT_FALSE(g->config().norm_unit_offset);
  EXPECT_TRUE(st->config().norm_unit_offset);
  auto check = [](const dense_view<const float, 1>& stored, const dense_view<const float, 1>& w) {
    ASSERT_EQ(stored.extent(0), w.extent(0));
    for (std::size_t i = 0; i < w.extent(0); ++i) ASSERT_EQ(stored(i), 1.0f + w(i)) << i;
  };
  check(g->final_norm, st->final_norm);
  for (std::size_t l = 0; l < st->layers.size(); ++l) {
    check(g->layers[l].input_norm, st->layers[l].input_norm);
    check(g->layers[l].post_norm, st->layers[l].post_norm);
    check(g->layers[l].attn_out_norm, st->layers[l].attn_out_norm);
    check(g->layers[l].mlp_out_norm, st->layers[l].mlp_out_norm);
  }
}

// Llama 3's rope_freqs are the divisors HF's llama3 rope_type computes: the frequencies from
// the GGUF equal the config's (computed in double) within the rounding of the stored divisors,
// which llama.cpp's converter computes in float32 arithmetic and stores as f32: a few 2^-24
// relative (2^-23 measured, on the interpolated one).
TEST(gguf_archs, llama3_rope_freqs_give_the_llama3_frequencies) {
  SKIP_WITHOUT_ARCHS();
  const auto g = model_weights<float>::load_gguf(archs_dir / "llama3-f32.gguf");
  const auto st = model_weights<float>::load(archs_dir / "llama3");
  EXPECT_EQ(st->config().rope_scaling.kind, ops::rope_kind::llama3);
  const auto a = make_rope_table(g->config(), 128), b = make_rope_table(st->config(), 128);
  ASSERT_EQ(a.inv_freq().size(), 16u);
  bool scaled = false;  // some frequencies are divided: the tensor is not a no-op
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(a.inv_freq()[i], b.inv_freq()[i], b.inv_freq()[i] * 0x1p-22) << i;
    scaled |= g->config().rope_scaling.long_factor[i] > 1;
  }
  EXPECT_TRUE(scaled);
  EXPECT_EQ(a.attention_factor(), 1.0);
}

TEST(gguf_archs, phi3_reads_its_fused_tensors_and_longrope) {
  SKIP_WITHOUT_ARCHS();
  const auto g = model_weights<float>::load_gguf(archs_dir / "phi3-f32.gguf");
  const auto st = model_weights<float>::load(archs_dir / "phi3");
  const auto& r = g->config().rope_scaling;
  EXPECT_EQ(r.kind, ops::rope_kind::longrope);
  EXPECT_EQ(r.original_max_position_embeddings, 64u);
  ASSERT_EQ(r.long_factor.size(), st->config().rope_scaling.long_factor.size());
  for (std::size_t i = 0; i < r.long_factor.size(); ++i) {
    EXPECT_EQ(r.long_factor[i], static_cast<float>(st->config().rope_scaling.long_factor[i]));
    EXPECT_EQ(r.short_factor[i], static_cast<float>(st->config().rope_scaling.short_factor[i]));
  }
  // The magnitude: the file's rope.scaling.attn_factor, HF's sqrt(1 + ln 64 / ln 64) in f32.
  EXPECT_EQ(*r.attention_factor, static_cast<double>(static_cast<float>(std::sqrt(2.0))));
  // q/k/v are row ranges of attn_qkv, gate/up of ffn_up: the checkpoint's matrices.
  EXPECT_EQ(
      std::memcmp(&g->layers[1].v.w(0, 0), &st->layers[1].v.w(0, 0), st->layers[1].v.w.size() * 4),
      0);
  EXPECT_EQ(std::memcmp(&g->layers[1].up.w(0, 0), &st->layers[1].up.w(0, 0),
                        st->layers[1].up.w.size() * 4),
            0);
}

// ---- files written here in llama.cpp's naming ------------------------------------------------

// What a test changes in the file write_gguf makes.
struct gguf_edit {
  std::vector<std::pair<std::string, gguf_meta>> keys = {};  // added (or replacing)
  std::set<std::string> drop_keys = {};
  std::set<std::string> drop_tensors = {};                              // GGUF names
  std::vector<std::pair<std::string, std::size_t>> extra_tensors = {};  // 1-D F32 zeros
};

// A GGUF of the safetensors model at `dir` as llama.cpp's converter writes one (keys and
// tensor names of the family, F32 tensors, Llama's Q/K rows permuted).
fs::path write_gguf(const fs::path& dir, const fs::path& path, const gguf_edit& e = {}) {
  const model_config c = load_config(dir);
  const io::safetensors_model file = io::safetensors_model::open(dir);
  const std::string arch(to_string(c.family));
  const std::string p = arch + ".";
  std::vector<std::pair<std::string, gguf_meta>> keys = {
      {"general.architecture", gguf_meta(arch)},
      {"general.type", gguf_meta("model")},
      {"general.name", gguf_meta("test")},
      {p + "block_count", gguf_meta(static_cast<std::uint32_t>(c.num_hidden_layers))},
      {p + "context_length", gguf_meta(static_cast<std::uint32_t>(c.max_position_embeddings))},
      {p + "embedding_length", gguf_meta(static_cast<std::uint32_t>(c.hidden_size))},
      {p + "feed_forward_length", gguf_meta(static_cast<std::uint32_t>(c.intermediate_size))},
      {p + "attention.head_count", gguf_meta(static_cast<std::uint32_t>(c.num_attention_heads))},
      {p + "attention.head_count_kv", gguf_meta(static_cast<std::uint32_t>(c.num_key_value_heads))},
      {p + "rope.freq_base", gguf_meta(static_cast<float>(c.rope_theta))},
      {p + "attention.layer_norm_rms_epsilon", gguf_meta(static_cast<float>(c.rms_norm_eps))},
      {p + "attention.key_length", gguf_meta(static_cast<std::uint32_t>(c.head_dim))},
      {p + "attention.value_length", gguf_meta(static_cast<std::uint32_t>(c.head_dim))},
      {"general.file_type", gguf_meta(std::uint32_t{0})},
      {p + "vocab_size", gguf_meta(static_cast<std::uint32_t>(c.vocab_size))},
      {p + "rope.dimension_count", gguf_meta(static_cast<std::uint32_t>(c.head_dim))},
      {"tokenizer.ggml.model", gguf_meta("none")},
      {"general.quantization_version", gguf_meta(std::uint32_t{2})},
  };
  io::gguf_writer g;
  std::set<std::string> replaced;
  for (const auto& [k, v] : e.keys) replaced.insert(k);
  for (const auto& [k, v] : keys) {
    if (!e.drop_keys.contains(k) && !replaced.contains(k)) g.add(k, v);
  }
  for (const auto& [k, v] : e.keys) g.add(k, v);
  for (const auto& [name, shape] : tensor_list(c)) {
    const std::string gname = gguf_tensor_name(name, c.family);
    if (e.drop_tensors.contains(gname)) continue;
    std::size_t count = 1;
    for (auto s : shape) count *= s;
    const float* x = shape.size() == 1 ? file.view<float, 1>(name).data_handle()
                                       : file.view<float, 2>(name).data_handle();
    std::vector<std::byte> bytes(count * 4);
    const std::size_t rows = shape[0], row_bytes = count / rows * 4;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t to =
          gguf_rows_permuted(c.family, name) ? llama_permuted_row(r, c.head_dim) : r;
      std::memcpy(bytes.data() + to * row_bytes,
                  reinterpret_cast<const std::byte*>(x) + r * row_bytes, row_bytes);
    }
    g.add_tensor(gname, ggml_type::f32, shape, std::move(bytes));
  }
  for (const auto& [name, n] : e.extra_tensors)
    g.add_tensor(name, ggml_type::f32, {n}, std::vector<std::byte>(n * 4));
  g.write(path);
  return path;
}

const fs::path& model_dir(const std::string& preset) {
  return npullm::testing::generated_model(preset, 7);
}

std::vector<std::int32_t> prompt(std::size_t n) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>((i * 97u + 5u) % 512u);
  return ids;
}

// Qwen 3 has no llama.cpp file in the shared data: its converter's layout is qwen2's without
// biases plus attn_q_norm / attn_k_norm [head_dim], written here. The tiny preset's head dim
// (48) is not hidden / heads (32), so attention.key_length matters.
TEST(gguf_archs, qwen3_written_in_llama_cpp_naming_gives_the_safetensors_logits) {
  const fs::path dir = model_dir("tiny-qwen3");
  const fs::path path = write_gguf(dir, scratch("qwen3.gguf"));
  {
    const auto file = io::gguf_file::open(path);
    ASSERT_NE(file->find_tensor("blk.1.attn_k_norm.weight"), nullptr);
    EXPECT_EQ(file->info("blk.1.attn_q_norm.weight").shape(), std::vector<std::size_t>{48});
  }
  const auto g = model_weights<float>::load_gguf(path);
  const auto st = model_weights<float>::load(dir);
  EXPECT_EQ(g->config().family, model_family::qwen3);
  EXPECT_TRUE(g->config().qk_norm);
  EXPECT_EQ(g->config().head_dim, 48u);
  EXPECT_FALSE(g->config().attention_bias);
  const auto ids = prompt(40);
  const auto lg = logits(g, ids), ls = logits(st, ids);
  std::cout << "[ archs    ] qwen3: max |GGUF - safetensors| " << max_abs_diff(lg, ls) << "\n";
  EXPECT_EQ(lg, ls);  // the same floats through the same kernels

  // Without its q/k norms the file is incomplete: refused naming the tensor.
  const fs::path bad = write_gguf(dir, scratch("qwen3_no_knorm.gguf"),
                                  {.drop_tensors = {"blk.0.attn_k_norm.weight"}});
  expect_error([&] { (void)model_weights<float>::load_gguf(bad); }, error_code::corrupt_data,
               "blk.0.attn_k_norm.weight");
}

TEST(gguf_archs, llama_and_qwen2_written_here_give_the_safetensors_logits) {
  for (const char* preset : {"tiny-llama", "tiny", "tiny-llama3"}) {
    const fs::path dir = model_dir(preset);
    const auto st = model_weights<float>::load(dir);
    gguf_edit e;
    if (st->config().rope_scaling.kind == ops::rope_kind::llama3) {
      // The divisors as llama.cpp's converter computes them: f_plain / f_llama3, in f32.
      e.drop_keys = {};
      const auto plain = ops::rope_table(st->config().head_dim, st->config().rope_theta, 1);
      const auto scaled = make_rope_table(st->config(), 1);
      std::vector<float> div;
      for (std::size_t i = 0; i < plain.inv_freq().size(); ++i)
        div.push_back(static_cast<float>(plain.inv_freq()[i] / scaled.inv_freq()[i]));
      const fs::path path = write_gguf(dir, scratch(std::string(preset) + ".gguf"));
      // Rewritten with the rope_freqs tensor added.
      const auto f = io::gguf_file::open(path);
      io::gguf_writer w;
      for (const auto& kv : f->header().metadata)
        w.add(std::string(kv.key), gguf_meta::from(kv.value));
      w.add_tensor("rope_freqs.weight", ggml_type::f32, {div.size()},
                   std::as_bytes(std::span<const float>(div)));
      for (const auto& t : f->tensors())
        w.add_tensor(std::string(t.name), t.type, t.shape(), f->bytes(t));
      const fs::path with = scratch(std::string(preset) + "_freqs.gguf");
      w.write(with);
      const auto g = model_weights<float>::load_gguf(with);
      const auto ids = prompt(40);
      EXPECT_LE(max_abs_diff(logits(g, ids), logits(st, ids)), 2e-5) << preset;
      continue;
    }
    const fs::path path = write_gguf(dir, scratch(std::string(preset) + ".gguf"));
    const auto g = model_weights<float>::load_gguf(path);
    const auto ids = prompt(40);
    EXPECT_EQ(logits(g, ids), logits(st, ids)) << preset;
    // Every dense matrix copied into huge pages at load (Llama's Q / K, permuted at load into
    // a copy of their own: that copy freed): the same logits.
    const auto copied =
        model_weights<float>::load_gguf(path, {.dense_huge_pages = huge_page_copy::on});
    EXPECT_GT(copied->huge_page_copy_bytes(), 0u);
    EXPECT_EQ(logits(copied, ids), logits(g, ids)) << preset;
  }
}

// ---- strictness ------------------------------------------------------------------------------

TEST(gguf_archs, an_unclassified_key_is_refused_naming_it_and_how_to_accept_it) {
  const fs::path dir = model_dir("tiny");
  const fs::path path = write_gguf(dir, scratch("custom_key.gguf"),
                                   {.keys = {{"_finetuner.run_id", gguf_meta("abc123")}}});
  try {
    (void)model_weights<float>::load_gguf(path);
    FAIL() << "loaded";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(e.message().find("'_finetuner.run_id'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("\"abc123\""), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("accept_keys"), std::string::npos) << e.message();
  }
  const auto st = model_weights<float>::load(dir);
  const auto ids = prompt(16);
  for (const std::vector<std::string>& accept :
       {std::vector<std::string>{"_finetuner.run_id"}, std::vector<std::string>{"_*"}}) {
    const auto g = model_weights<float>::load_gguf(path, {.accept_keys = accept});
    EXPECT_EQ(logits(g, ids), logits(st, ids)) << accept[0];
  }
  // Another name or prefix does not accept it.
  expect_error(
      [&] {
        (void)model_weights<float>::load_gguf(path, {.accept_keys = {"_finetuner", "x*"}});
      },
      error_code::unsupported, "_finetuner.run_id");
}

TEST(gguf_archs, ignorable_keys_load_and_a_key_of_another_architecture_does_not) {
  const fs::path dir = model_dir("tiny");
  const std::vector<std::string> tokens = {"a", "b"};
  const fs::path ok =
      write_gguf(dir, scratch("ignorable.gguf"),
                 {.keys = {{"general.license", gguf_meta("apache-2.0")},
                           {"general.base_model.0.name", gguf_meta("Qwen2")},
                           {"general.base_model.count", gguf_meta(std::uint32_t{1})},
                           {"tokenizer.ggml.tokens", gguf_meta::array(tokens)},
                           {"quantize.imatrix.file", gguf_meta("x.dat")},
                           {"qwen2.rope.scaling.finetuned", gguf_meta(false)}}});
  EXPECT_NO_THROW((void)model_weights<float>::load_gguf(ok));
  for (const auto& [k, v] : std::vector<std::pair<std::string, gguf_meta>>{
           {"llama.block_count", gguf_meta(std::uint32_t{2})},  // another architecture's
           {"qwen2.attention.causal", gguf_meta(true)},         // read by no family npullm runs
           {"qwen2.logit_scale", gguf_meta(0.5f)}}) {
    const fs::path bad = write_gguf(dir, scratch("bad_key.gguf"), {.keys = {{k, v}}});
    expect_error([&] { (void)model_weights<float>::load_gguf(bad); }, error_code::unsupported,
                 "'" + k + "'");
  }
}

TEST(gguf_archs, a_tensor_nobody_reads_is_refused_naming_it) {
  const fs::path bad = write_gguf(model_dir("tiny-llama"), scratch("extra_tensor.gguf"),
                                  {.extra_tensors = {{"blk.0.ffn_down.bias", 128}}});
  expect_error([&] { (void)model_weights<float>::load_gguf(bad); }, error_code::unsupported,
               "blk.0.ffn_down.bias");
  // rope_freqs belongs to llama; rope_factors to phi3.
  const fs::path freqs = write_gguf(model_dir("tiny"), scratch("qwen2_freqs.gguf"),
                                    {.extra_tensors = {{"rope_freqs.weight", 16}}});
  expect_error([&] { (void)model_weights<float>::load_gguf(freqs); }, error_code::unsupported,
               "rope_freqs.weight");
}

TEST(gguf_archs, refuses_what_it_does_not_run_naming_it) {
  const fs::path dir = model_dir("tiny");
  const std::vector<std::tuple<std::string, gguf_meta, error_code, std::string>> cases = {
      {"general.type", gguf_meta("adapter"), error_code::unsupported, "adapter"},
      {"general.quantization_version", gguf_meta(std::uint32_t{1}), error_code::unsupported,
       "quantization_version 1"},
      {"split.count", gguf_meta(std::uint16_t{3}), error_code::unsupported, "llama-gguf-split"},
      {"qwen2.expert_count", gguf_meta(std::uint32_t{8}), error_code::unsupported, "experts"},
      {"qwen2.attention.sliding_window", gguf_meta(std::uint32_t{32}), error_code::unsupported,
       "sliding_window 32"},
      {"qwen2.rope.scaling.type", gguf_meta("longrope"), error_code::unsupported, "'longrope'"},
      {"qwen2.rope.scaling.factor", gguf_meta(4.0f), error_code::unsupported,
       "rope.scaling.factor"},
      {"qwen2.vocab_size", gguf_meta(std::uint32_t{511}), error_code::corrupt_data, "511"},
      {"qwen2.rope.dimension_count", gguf_meta(std::uint32_t{16}), error_code::unsupported,
       "dimension_count 16"},
  };
  for (const auto& [k, v, code, words] : cases) {
    const fs::path bad = write_gguf(dir, scratch("refused.gguf"), {.keys = {{k, v}}});
    expect_error([&] { (void)model_weights<float>::load_gguf(bad); }, code, words);
  }
  const fs::path ok = write_gguf(dir, scratch("ok.gguf"));
  expect_error(
      [&] {
        (void)model_weights<float>::load_gguf(
            ok, {.projections = quantization{ops::weight_format::q8_0, 0}});
      },
      error_code::invalid_argument, "as stored");
}

// rope.scaling.type linear and yarn (Qwen 2.5's long-context files) against config.json's
// rope_scaling of the same model. yarn's magnitude: llama.cpp multiplies attn_factor (here
// absent: 1) by 1 + 0.1 ln(factor), HF's default attention_factor.
TEST(gguf_archs, rope_scaling_keys_give_config_jsons_scaling) {
  const fs::path base = model_dir("tiny");
  for (const std::string kind : {"linear", "yarn"}) {
    const fs::path dir = scratch("tiny_" + kind);
    fs::create_directories(dir);
    fs::copy_file(base / "model.safetensors", dir / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ifstream in(base / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["rope_scaling"] = kind == "linear"
                            ? nlohmann::json{{"rope_type", "linear"}, {"factor", 4.0}}
                            : nlohmann::json{{"rope_type", "yarn"},
                                             {"factor", 4.0},
                                             {"original_max_position_embeddings", 1024}};
    std::ofstream(dir / "config.json") << j.dump();
    gguf_edit e{.keys = {{"qwen2.rope.scaling.type", gguf_meta(kind)},
                         {"qwen2.rope.scaling.factor", gguf_meta(4.0f)}}};
    if (kind == "yarn") {
      e.keys.emplace_back("qwen2.rope.scaling.original_context_length",
                          gguf_meta(std::uint32_t{1024}));
    }
    const auto g = model_weights<float>::load_gguf(write_gguf(dir, scratch(kind + ".gguf"), e));
    const auto st = model_weights<float>::load(dir);
    EXPECT_EQ(g->config().rope_scaling.kind, st->config().rope_scaling.kind);
    const auto a = make_rope_table(g->config(), 64), b = make_rope_table(st->config(), 64);
    for (std::size_t i = 0; i < a.inv_freq().size(); ++i)
      EXPECT_EQ(a.inv_freq()[i], b.inv_freq()[i]) << kind << " " << i;
    EXPECT_DOUBLE_EQ(a.attention_factor(), b.attention_factor()) << kind;
    const auto ids = prompt(40);
    EXPECT_LE(max_abs_diff(logits(g, ids), logits(st, ids)), 1e-6) << kind;
  }
}

// ---- config.json's accept list ---------------------------------------------------------------

TEST(config_accept, a_tools_key_is_refused_with_the_way_to_accept_it) {
  std::ifstream in(model_dir("tiny") / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["_my_tool_provenance"] = "run 7";
  const std::string text = j.dump();
  try {
    (void)parse_config(text, "config.json");
    FAIL() << "parsed";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(e.message().find("'_my_tool_provenance'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("accept_keys"), std::string::npos) << e.message();
  }
  const std::vector<std::string> by_name{"_my_tool_provenance"}, by_prefix{"_*"};
  EXPECT_EQ(parse_config(text, "config.json", by_name).hidden_size, 128u);
  EXPECT_EQ(parse_config(text, "config.json", by_prefix).hidden_size, 128u);
  // The keys the issue met in fine-tuned checkpoints are classified ignorable.
  j.erase("_my_tool_provenance");
  j["unsloth_version"] = "2024.9";
  j["_attn_implementation_autoset"] = true;
  EXPECT_NO_THROW((void)parse_config(j.dump(), "config.json"));
  // Through model_weights::load.
  const fs::path dir = scratch("tiny_accept");
  fs::create_directories(dir);
  fs::copy_file(model_dir("tiny") / "model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "config.json") << text;
  expect_error([&] { (void)model_weights<float>::load(dir); }, error_code::unsupported,
               "_my_tool_provenance");
  EXPECT_NO_THROW((void)model_weights<float>::load(dir, {.accept_keys = by_prefix}));
}

}  // namespace
