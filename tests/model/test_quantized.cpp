// Quantized weights in the pipeline: quantize at load, quantized safetensors and GGUF files
// (Q8_0, Q4_0, Q4_K, Q6_K; Llama's Q/K permutation), refusals.
//
// Reference: the same pipeline in f32 over the *dequantized* weights (written as an f32
// safetensors model and loaded). The only difference left is the quantized kernels' rounding of
// the activations to int8 per block of 32 (ops/quant_linear.hpp): each product's error is at
// most Σ|w| · dx / 2 with dx = absmax(x block) / 127, i.e. ~0.4 % of a typical term, and it
// compounds through the layers. Tolerance: max |diff| <= 3 % of the reference logits' range
// (max - min), and the mean |diff| <= 0.5 % of it (measured on the tiny models, AVX-512 VNNI:
// max 0.9-1.4 %, mean 0.16-0.20 % of a range of ~29); measured values are printed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "npullm/io/gguf_writer.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/gguf_model.hpp"
#include "npullm/model/quantized_io.hpp"
#include "npullm/model/synthetic.hpp"
#include "npullm/ops/quant.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
namespace model = npullm::model;
using model::load_options;
using model::model_weights;
using model::quantization;
using npullm::error_code;
using npullm::ops::weight_format;

using lm_type = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;

fs::path scratch(const std::string& name) {
  const fs::path d = npullm::testing::scratch_root() / "quantized" / name;
  fs::create_directories(d.parent_path());
  return d;
}

// A tiny model written once per preset; "tiny-k" is tiny with hidden 256 (K-quants need
// K % 256 == 0).
const fs::path& tiny_dir(const std::string& name) {
  static std::map<std::string, fs::path> dirs;
  auto& d = dirs[name];
  if (d.empty()) {
    d = scratch("model_" + name);
    auto spec = model::preset(name == "tiny-k" ? "tiny" : name);
    if (name == "tiny-k") {
      spec.config.hidden_size = 256;
      spec.config.num_attention_heads = 8;
      spec.config.num_key_value_heads = 2;
      spec.config.intermediate_size = 512;
    }
    model::write_model(d, spec);
  }
  return d;
}

const std::vector<std::int32_t> prompt = {3, 17, 42, 99, 7, 250, 1, 64, 300, 5, 77};

// Logits of every prompt position.
std::vector<float> logits(std::shared_ptr<const model_weights<float>> w) {
  lm_type lm(std::move(w), {.max_sequence = 64});
  const auto out = lm.prefill(prompt, npullm::output_selection::all_rows());
  return {out.logits.data(), out.logits.data() + out.logits.size()};
}

// The weights as dense f32 (quantized matrices dequantized), written as a safetensors model.
fs::path write_dequantized(const model_weights<float>& w, const std::string& name) {
  const fs::path dir = scratch("deq_" + name);
  fs::create_directories(dir);
  struct entry {
    std::string name;
    std::vector<std::size_t> shape;
    std::vector<float> values;
  };
  std::vector<entry> entries;
  for (const auto& t : model::detail::named_tensors(w, "test")) {
    if (t.matrix != nullptr) {
      const auto& m = *t.matrix;
      entry e{t.name, {m.rows(), m.cols()}, std::vector<float>(m.rows() * m.cols())};
      if (m.quantized) {
        npullm::ops::dequantize(*m.quantized,
                                npullm::dense_view<float, 2>(e.values.data(), m.rows(), m.cols()));
      } else {
        std::copy_n(m.w.data_handle(), e.values.size(), e.values.begin());
      }
      entries.push_back(std::move(e));
    } else if (!t.bias.empty()) {
      entries.push_back({t.name, {t.bias.size()}, {t.bias.begin(), t.bias.end()}});
    } else {
      entries.push_back({t.name,
                         {t.vector.extent(0)},
                         {t.vector.data_handle(), t.vector.data_handle() + t.vector.extent(0)}});
    }
  }
  nlohmann::json header = nlohmann::json::object();
  std::size_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", "F32"},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + 4 * e.values.size()}}};
    offset += 4 * e.values.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const std::uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
  for (const auto& e : entries)
    out.write(reinterpret_cast<const char*>(e.values.data()),
              static_cast<std::streamsize>(4 * e.values.size()));
  model::model_config c = w.config();
  c.torch_dtype = npullm::dtype::f32;
  std::ofstream(dir / "config.json") << model::config_json(c).dump(2);
  return dir;
}

struct diff_stats {
  double max = 0, mean = 0, range = 0;
};

diff_stats compare(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  diff_stats s;
  float lo = want[0], hi = want[0];
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    EXPECT_TRUE(std::isfinite(got[i]));
    s.max = std::max(s.max, d);
    s.mean += d;
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
  }
  s.mean /= static_cast<double>(want.size());
  s.range = hi - lo;
  return s;
}

// The stated tolerance against the dequantized f32 reference.
void expect_close_to_reference(const std::vector<float>& got, const std::vector<float>& want,
                               const std::string& what) {
  const auto s = compare(got, want);
  std::printf("  %-28s max |diff| %.4f  mean %.5f  (logit range %.2f)\n", what.c_str(), s.max,
              s.mean, s.range);
  EXPECT_LE(s.max, 0.03 * s.range) << what;
  EXPECT_LE(s.mean, 0.005 * s.range) << what;
  EXPECT_GT(s.max, 0.0) << what << ": the quantized kernels ran (activations rounded to int8)";
}

// ---- quantize at load ----------------------------------------------------------------------

struct load_case {
  std::string preset;
  quantization q;
  std::string label;
};

class quantize_at_load : public ::testing::TestWithParam<load_case> {};

TEST_P(quantize_at_load, matches_the_dequantized_f32_pipeline_and_decode_equals_prefill) {
  const auto& p = GetParam();
  const load_options opts{.projections = p.q, .embedding_and_head = p.q};
  const auto w = model_weights<float>::load(tiny_dir(p.preset), opts);
  const auto& c = w->config();
  ASSERT_EQ(w->quantized_matrices(), 7 * c.num_hidden_layers + 1 + !c.tie_word_embeddings);
  EXPECT_EQ(w->layers[0].q.quantized->format, p.q.format);
  const auto ref = model_weights<float>::load(write_dequantized(*w, p.preset + p.label));
  const auto got = logits(w), want = logits(ref);
  expect_close_to_reference(got, want, p.preset + " " + p.label);

  // Decode equals prefill: the prompt but its last token, then the last token decoded.
  lm_type lm(w, {.max_sequence = 64});
  lm.prefill(std::span(prompt).first(prompt.size() - 1));
  const auto step = lm.decode(std::span(prompt).last(1));
  const std::size_t v = c.vocab_size;
  const std::vector<float> last(got.end() - static_cast<std::ptrdiff_t>(v), got.end());
  for (std::size_t i = 0; i < v; ++i)
    ASSERT_NEAR(step.logits.data()[i], last[i], 1e-4f * (1 + std::fabs(last[i]))) << i;
}

std::vector<load_case> load_cases() {
  std::vector<load_case> out;
  const std::array<std::pair<quantization, const char*>, 6> qs{{
      {{weight_format::q8_0, 0, npullm::dtype::f16}, "q8_0"},
      {{weight_format::q4_0, 0, npullm::dtype::f16}, "q4_0"},
      {{weight_format::int8_sym, 0, npullm::dtype::f32}, "int8_sym_channel"},
      {{weight_format::int8_sym, 64, npullm::dtype::f16}, "int8_sym_g64"},
      {{weight_format::int4_sym, 32, npullm::dtype::f16}, "int4_sym_g32"},
      {{weight_format::int4_sym, 128, npullm::dtype::f16}, "int4_sym_g128"},
  }};
  for (const char* preset : {"tiny", "tiny-llama"})
    for (const auto& [q, label] : qs) out.push_back({preset, q, label});
  return out;
}

INSTANTIATE_TEST_SUITE_P(formats, quantize_at_load, ::testing::ValuesIn(load_cases()),
                         [](const auto& info) {
                           std::string s = info.param.preset + "_" + info.param.label;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(quantize_at_load, projections_only_keeps_the_embedding_dense) {
  const auto w = model_weights<float>::load(
      tiny_dir("tiny"), {.projections = quantization{weight_format::int4_sym, 128}});
  EXPECT_FALSE(w->embed.is_quantized());
  EXPECT_TRUE(w->layers[1].down.is_quantized());
  EXPECT_EQ(w->quantized_matrices(), 14u);
}

// weight_packing::on packs the quantized projections into int8 panels (ops::pack) too; steps of
// more than 16 rows read them, with results bit for bit those of the blocks read in place
// (ops/quant_linear.hpp's promise, here through every projection of the pipeline). automatic
// repacks the quantized projections of a tiled format into tiles instead (next test).
TEST(quantize_at_load, packing_on_packs_quantized_projections_with_the_same_logits) {
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 37; ++i) ids.push_back((i * 53 + 11) % 400);
  const auto all = npullm::output_selection::all_rows();
  for (const auto& q :
       {quantization{weight_format::q4_0, 0}, quantization{weight_format::int4_sym, 128},
        quantization{weight_format::q8_0, 0}}) {
    const auto w = model_weights<float>::load(tiny_dir("tiny"), {.projections = q});
    lm_type in_place(w, {.max_sequence = 64, .packing = model::weight_packing::off});
    lm_type packed(w, {.max_sequence = 64, .packing = model::weight_packing::on});
    EXPECT_EQ(in_place.packed_bytes(), 0u);
#if defined(__AVX2__)
    // int8 panels: at least one byte per weight of the 14 quantized projections.
    std::size_t weights = 0;
    for (const auto& l : w->layers)
      for (const auto* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
        weights += p->rows() * p->cols();
    EXPECT_GE(packed.packed_bytes(), weights);
#endif
    const auto a = in_place.prefill(ids, all);
    const auto b = packed.prefill(ids, all);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0)
        << npullm::ops::to_string(q.format);
    // Decode (one row: the GEMV over the blocks) continues from the packed prefill.
    const auto da = in_place.decode(std::array<std::int32_t, 1>{9});
    const auto db = packed.decode(std::array<std::int32_t, 1>{9});
    EXPECT_EQ(std::memcmp(da.logits.data(), db.logits.data(), da.logits.size() * sizeof(float)), 0);
  }
}

// weight_packing::automatic repacks the quantized projections of a tiled format (q4_0, q8_0)
// into tiles (ops::repack), the f32 LM head stays as it is, int4_sym stays as stored; prefill
// (37 rows: the tiles MR rows at a time) and decode read the tiles, with logits equal to the
// blocks read in place within f32 reassociation (ops/quant_linear.hpp: the same integer dot
// products and piece scales, summed in another order), far below the activations' rounding:
// bound 1e-4 · the logits' max |value|.
TEST(quantize_at_load, automatic_repacks_quantized_projections_into_tiles) {
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 37; ++i) ids.push_back((i * 53 + 11) % 400);
  const auto all = npullm::output_selection::all_rows();
  for (const auto& q : {quantization{weight_format::q4_0, 0}, quantization{weight_format::q8_0, 0},
                        quantization{weight_format::int4_sym, 128}}) {
    SCOPED_TRACE(std::string(npullm::ops::to_string(q.format)));
    const auto w = model_weights<float>::load(tiny_dir("tiny"), {.projections = q});
    lm_type in_place(w, {.max_sequence = 64, .packing = model::weight_packing::off});
    lm_type automatic(w, {.max_sequence = 64});
    std::size_t bytes = 0;
    for (const auto& l : w->layers)
      for (const auto* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) bytes += p->bytes();
    if (npullm::ops::has_repacked_layout(q.format)) {
      EXPECT_GE(automatic.packed_bytes(), bytes);
      EXPECT_LE(automatic.packed_bytes(), bytes + bytes / 2);  // + zero rows of the last tiles
    } else {
      EXPECT_EQ(automatic.packed_bytes(), 0u);
    }
    const auto check = [](const auto& a, const auto& b) {
      ASSERT_EQ(a.logits.size(), b.logits.size());
      float amax = 0.0f, diff = 0.0f;
      for (std::size_t i = 0; i < a.logits.size(); ++i) {
        amax = std::max(amax, std::fabs(a.logits.data()[i]));
        diff = std::max(diff, std::fabs(a.logits.data()[i] - b.logits.data()[i]));
      }
      EXPECT_LE(diff, 1e-4f * amax);
    };
    check(in_place.prefill(ids, all), automatic.prefill(ids, all));
    check(in_place.decode(std::array<std::int32_t, 1>{9}),
          automatic.decode(std::array<std::int32_t, 1>{9}));
  }
}

// project_together (Q/K/V, gate/up of a decode step as one job over their tiles) gives each y
// project()'s bits: with and without a bias, 1 / 3 / 16 rows (one job) and 17 (each alone),
// serially and on 2 threads, and when one matrix has no tiles (each alone).
TEST(project_together, equals_project_bit_for_bit_on_every_path) {
  const std::size_t k = 256;
  const npullm::thread_pool pool(2);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  struct matrix {
    npullm::ops::quantized_matrix q;
    npullm::ops::repacked_quantized tiles;
    std::vector<float> bias;
  };
  std::vector<matrix> ms;
  for (const auto& [f, n] : {std::pair{weight_format::q8_0, std::size_t{37}},
                             std::pair{weight_format::q4_k, std::size_t{17}},
                             std::pair{weight_format::q6_k, std::size_t{48}}}) {
    npullm::tensor<float, 2> w(n, k);
    for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = u(rng);
    auto q = npullm::ops::quantize(w.view(), f);
    auto tiles = npullm::ops::repack(q.view());
    std::vector<float> bias(n);
    for (float& b : bias) b = u(rng);
    ms.push_back({std::move(q), std::move(tiles), std::move(bias)});
  }
  std::vector<model::projection<float>> ps(ms.size());
  for (std::size_t i = 0; i < ms.size(); ++i) {
    ps[i].quantized.emplace(ms[i].q.view());
    ps[i].repacked = &ms[i].tiles;
  }
  for (const bool untiled : {false, true}) {
    ps[1].repacked = untiled ? nullptr : &ms[1].tiles;
    for (const std::size_t m : {1u, 3u, 16u, 17u}) {
      SCOPED_TRACE("m " + std::to_string(m) + (untiled ? " (one without tiles)" : ""));
      npullm::tensor<float, 2> x(m, k);
      for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
      std::vector<npullm::tensor<float, 2>> want, got, got2;
      for (const auto& p : ps) {
        want.emplace_back(m, p.rows());
        got.emplace_back(m, p.rows());
        got2.emplace_back(m, p.rows());
      }
      std::vector<model::projection_into<float>> outs, outs2;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        const std::span<const float> bias =
            i == 1 ? std::span<const float>{} : std::span<const float>(ms[i].bias);
        model::project(x.view(), ps[i], want[i].view(), bias, npullm::serial{});
        outs.push_back({&ps[i], got[i].view(), bias});
        outs2.push_back({&ps[i], got2[i].view(), bias});
      }
      model::project_together<float>(x.view(), outs, npullm::serial{});
      model::project_together<float>(x.view(), outs2, npullm::pool_policy{&pool});
      for (std::size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)), 0)
            << "matrix " << i;
        EXPECT_EQ(std::memcmp(want[i].data(), got2[i].data(), want[i].size() * sizeof(float)), 0)
            << "matrix " << i << ", 2 threads";
      }
    }
  }
  // a y of the wrong shape: refused naming it, before anything is written
  npullm::tensor<float, 2> x(1, k), y0(1, 37), bad(1, 16), y2(1, 48);
  y0.data()[0] = 5.0f;
  ps[1].repacked = &ms[1].tiles;
  const model::projection_into<float> outs[] = {
      {&ps[0], y0.view(), {}}, {&ps[1], bad.view(), {}}, {&ps[2], y2.view(), {}}};
  try {
    model::project_together<float>(x.view(), outs, npullm::serial{});
    ADD_FAILURE() << "no error";
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape);
    EXPECT_NE(std::string(e.what()).find("projection 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(y0.data()[0], 5.0f);
}

TEST(quantize_at_load, refuses_a_k_quant_of_rows_not_a_multiple_of_256_and_a_bad_group) {
  try {  // tiny's rows are 128 values
    (void)model_weights<float>::load(tiny_dir("tiny"),
                                     {.projections = quantization{weight_format::q3_k, 0}});
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_shape);
    EXPECT_NE(e.message().find("block of 256"), std::string::npos) << e.message();
  }
  try {
    (void)model_weights<float>::load(tiny_dir("tiny"),
                                     {.projections = quantization{weight_format::int4_sym, 48}});
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
  }
}

// ---- quantized safetensors: write, load back ------------------------------------------------

TEST(quantized_safetensors, round_trip_gives_the_logits_of_quantize_at_load_exactly) {
  for (const auto& [preset, q] :
       {std::pair{"tiny", quantization{weight_format::int4_sym, 128}},
        std::pair{"tiny-llama", quantization{weight_format::q4_0, 0}},
        std::pair{"tiny", quantization{weight_format::int8_sym, 0, npullm::dtype::f32}}}) {
    const load_options opts{.projections = q,
                            .embedding_and_head = quantization{weight_format::int8_sym, 0}};
    const auto w = model_weights<float>::load(tiny_dir(preset), opts);
    const fs::path out =
        scratch(std::string("st_") + preset + std::string(npullm::ops::to_string(q.format)));
    model::save_safetensors(*w, out);
    EXPECT_EQ(model::stored_weight_type(out), npullm::dtype::f32);
    const auto back = model_weights<float>::load(out);  // no options: stored quantized
    EXPECT_EQ(back->quantized_matrices(), w->quantized_matrices());
    EXPECT_EQ(back->layers[0].up.quantized->format, q.format);
    EXPECT_EQ(logits(back), logits(w)) << preset;
  }
}

// ---- GGUF ----------------------------------------------------------------------------------

// llama.cpp's permute: rows (heads, 2, D/2) -> (heads, D/2, 2), written out independently of
// the library's llama_permuted_row.
std::vector<std::byte> llama_permute(std::span<const std::byte> rows, std::size_t n,
                                     std::size_t heads, std::size_t row_bytes) {
  std::vector<std::byte> out(rows.size());
  const std::size_t d = n / heads, half = d / 2;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < half; ++j) {
        const std::size_t from = h * d + i * half + j;  // (h, i, j)
        const std::size_t to = h * d + j * 2 + i;       // (h, j, i)
        std::memcpy(out.data() + to * row_bytes, rows.data() + from * row_bytes, row_bytes);
      }
  return out;
}

void put_f16(std::byte* p, float v) {
  const std::uint16_t b = npullm::float16(v).bits();
  std::memcpy(p, &b, 2);
}

// A simple Q4_K quantizer (per sub-block min and scale, 6-bit each; not llama.cpp's search).
std::vector<std::byte> quantize_q4_k(const float* x, std::size_t n, std::size_t k) {
  std::vector<std::byte> out(n * k / 256 * 144);
  for (std::size_t sb = 0; sb < n * k / 256; ++sb) {
    const float* v = x + sb * 256;
    std::byte* b = out.data() + sb * 144;
    float scale[8], mn[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = v[32 * j], hi = v[32 * j];
      for (int i = 0; i < 32; ++i)
        lo = std::min(lo, v[32 * j + i]), hi = std::max(hi, v[32 * j + i]);
      lo = std::min(lo, 0.0f);
      scale[j] = (hi - lo) / 15;
      mn[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, mn[j]);
    }
    const float d = static_cast<float>(npullm::float16(max_scale / 63));
    const float dmin = static_cast<float>(npullm::float16(max_min / 63));
    put_f16(b, d);
    put_f16(b + 2, dmin);
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = d > 0 ? std::clamp(static_cast<int>(std::lround(scale[j] / d)), 1, 63) : 0;
      m[j] = dmin > 0 ? std::clamp(static_cast<int>(std::lround(mn[j] / dmin)), 0, 63) : 0;
    }
    auto* s = reinterpret_cast<std::uint8_t*>(b + 4);
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<std::uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
    auto* q = reinterpret_cast<std::uint8_t*>(b + 16);
    for (int j = 0; j < 8; ++j) {
      const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(m[j]);
      for (int i = 0; i < 32; ++i) {
        const int code =
            step > 0
                ? std::clamp(static_cast<int>(std::lround((v[32 * j + i] + off) / step)), 0, 15)
                : 0;
        q[32 * (j / 2) + i] |= static_cast<std::uint8_t>(code << (4 * (j % 2)));
      }
    }
  }
  return out;
}

// A simple Q6_K quantizer (8-bit scale per 16 values, 6-bit codes).
std::vector<std::byte> quantize_q6_k(const float* x, std::size_t n, std::size_t k) {
  std::vector<std::byte> out(n * k / 256 * 210);
  for (std::size_t sb = 0; sb < n * k / 256; ++sb) {
    const float* v = x + sb * 256;
    auto* b = reinterpret_cast<std::uint8_t*>(out.data() + sb * 210);
    float s[16], max_s = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(v[16 * j + i]));
      s[j] = amax / 31;
      max_s = std::max(max_s, s[j]);
    }
    const float d = static_cast<float>(npullm::float16(max_s / 127));
    put_f16(reinterpret_cast<std::byte*>(b + 208), d);
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? std::clamp(static_cast<int>(std::lround(s[j] / d)), -128, 127) : 0;
      b[192 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(sc));
      const float step = d * static_cast<float>(sc);
      for (int i = 0; i < 16; ++i) {
        const std::size_t e = 16 * static_cast<std::size_t>(j) + static_cast<std::size_t>(i);
        const int q =
            step > 0 ? std::clamp(static_cast<int>(std::lround(v[e] / step)) + 32, 0, 63) : 32;
        const std::size_t h = e / 128, l = e % 32, quarter = (e % 128) / 32;
        b[64 * h + l + (quarter % 2) * 32] |=
            static_cast<std::uint8_t>((q & 0xF) << ((quarter / 2) * 4));
        b[128 + 32 * h + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * quarter));
      }
    }
  }
  return out;
}

// A GGUF of the safetensors model at `dir`, written here (not through save_gguf): matrices in
// `type` (embedding / LM head in `head_type`), norms F32, Llama's Q/K permuted as llama.cpp does.
// `edit` may change the writer's input (refusal tests).
struct gguf_spec {
  npullm::io::ggml_type type = npullm::io::ggml_type::q8_0;
  npullm::io::ggml_type head_type = npullm::io::ggml_type::q8_0;
  std::string arch = {};        // empty: the model's family
  std::string bad_tensor = {};  // written with a wrong shape
};

fs::path write_gguf(const fs::path& dir, const fs::path& path, const gguf_spec& spec) {
  using npullm::io::ggml_type;
  const auto c = model::load_config(dir);
  const auto file = npullm::io::safetensors_model::open(dir);
  npullm::io::gguf_writer g;
  const std::string arch = spec.arch.empty() ? std::string(model::to_string(c.family)) : spec.arch;
  const std::string p = arch + ".";
  g.add("general.architecture", arch);
  g.add(p + "block_count", static_cast<std::uint32_t>(c.num_hidden_layers));
  g.add(p + "context_length", static_cast<std::uint32_t>(c.max_position_embeddings));
  g.add(p + "embedding_length", static_cast<std::uint32_t>(c.hidden_size));
  g.add(p + "feed_forward_length", static_cast<std::uint32_t>(c.intermediate_size));
  g.add(p + "attention.head_count", static_cast<std::uint32_t>(c.num_attention_heads));
  g.add(p + "attention.head_count_kv", static_cast<std::uint32_t>(c.num_key_value_heads));
  g.add(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  g.add(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  g.add(p + "rope.dimension_count", static_cast<std::uint32_t>(c.head_dim));
  g.add("tokenizer.ggml.model", "gpt2");  // ignored
  for (const auto& [name, shape] : model::tensor_list(c)) {
    std::size_t count = 1;
    for (auto s : shape) count *= s;
    const float* x = name.find("bias") != std::string::npos || shape.size() == 1
                         ? file.view<float, 1>(name).data_handle()
                         : file.view<float, 2>(name).data_handle();
    std::vector<std::size_t> sh = shape;
    if (name == spec.bad_tensor) sh[0] += 1;
    const std::string gname = model::gguf_tensor_name(name);
    if (shape.size() == 1) {
      std::vector<std::byte> bytes(count * 4);
      std::memcpy(bytes.data(), x, count * 4);
      if (name == spec.bad_tensor) bytes.resize(sh[0] * 4);
      const std::size_t heads =
          name.find("q_proj") != std::string::npos ? c.num_attention_heads : c.num_key_value_heads;
      if (model::gguf_rows_permuted(c.family, name)) bytes = llama_permute(bytes, count, heads, 4);
      g.add_tensor(gname, ggml_type::f32, sh, std::move(bytes));
      continue;
    }
    const std::size_t n = shape[0], k = shape[1];
    const bool head = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    const ggml_type t = head ? spec.head_type : spec.type;
    std::vector<std::byte> bytes;
    const npullm::dense_view<const float, 2> w(x, n, k);
    switch (t) {
      case ggml_type::f32:
        bytes.resize(n * k * 4);
        std::memcpy(bytes.data(), x, bytes.size());
        break;
      case ggml_type::q8_0:
      case ggml_type::q4_0:
      case ggml_type::q4_1:
      case ggml_type::q5_0:
      case ggml_type::q5_1: {
        const auto m = npullm::ops::quantize(w, *model::gguf_weight_format(t));
        bytes.assign(m.data().begin(), m.data().end());
        break;
      }
      case ggml_type::q4_k: bytes = quantize_q4_k(x, n, k); break;
      case ggml_type::q6_k: bytes = quantize_q6_k(x, n, k); break;
      default:  // a type the pipeline cannot run: bytes of the right size
        bytes.resize(n * k / npullm::io::ggml_traits(t).block_size *
                     npullm::io::ggml_traits(t).block_bytes);
    }
    if (model::gguf_rows_permuted(c.family, name)) {
      const std::size_t heads =
          name.find("q_proj") != std::string::npos ? c.num_attention_heads : c.num_key_value_heads;
      bytes = llama_permute(bytes, n, heads, bytes.size() / n);
    }
    if (name == spec.bad_tensor) bytes.resize(bytes.size() / n * sh[0]);
    g.add_tensor(gname, t, sh, std::move(bytes));
  }
  g.write(path);
  return path;
}

TEST(gguf_model, name_mapping_and_permutation_rows) {
  EXPECT_EQ(model::gguf_tensor_name("model.layers.12.mlp.down_proj.weight"),
            "blk.12.ffn_down.weight");
  EXPECT_EQ(model::gguf_tensor_name("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(model::gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(model::gguf_tensor_name("model.layers.0.self_attn.q_norm.weight"),
            "blk.0.attn_q_norm.weight");
  EXPECT_EQ(model::gguf_tensor_name("model.layers.0.mlp.experts.0.weight"), "");
  // Head dim 8: HF rows 0..3 (first halves) go to even rows, 4..7 to odd rows.
  const std::array<std::size_t, 8> want{0, 2, 4, 6, 1, 3, 5, 7};
  for (std::size_t r = 0; r < 8; ++r) EXPECT_EQ(model::llama_permuted_row(r, 8), want[r]);
  EXPECT_EQ(model::llama_permuted_row(8 + 5, 8), 8 + 3u);
}

// Every matrix as the file stores it: equal to the HF model's (after un-permuting Llama's Q/K).
TEST(gguf_model, llama_permutation_round_trip_gives_the_unpermuted_model) {
  for (const char* preset : {"tiny-llama", "tiny"}) {
    const fs::path dir = tiny_dir(preset);
    const fs::path path = write_gguf(dir, scratch(std::string(preset) + "_f32.gguf"),
                                     {npullm::io::ggml_type::f32, npullm::io::ggml_type::f32});
    const auto g = model_weights<float>::load_gguf(path);
    const auto st = model_weights<float>::load(dir);
    EXPECT_EQ(g->config().family, st->config().family);
    EXPECT_EQ(g->config().tie_word_embeddings, st->config().tie_word_embeddings);
    EXPECT_EQ(g->config().vocab_size, st->config().vocab_size);
    for (std::size_t l = 0; l < st->layers.size(); ++l) {
      for (auto m : {&model::layer_weights<float>::q, &model::layer_weights<float>::k,
                     &model::layer_weights<float>::v, &model::layer_weights<float>::down}) {
        const auto& a = (g->layers[l].*m).w;
        const auto& b = (st->layers[l].*m).w;
        ASSERT_EQ(a.extent(0), b.extent(0));
        for (std::size_t r = 0; r < a.extent(0); ++r)
          ASSERT_EQ(std::memcmp(&a(r, 0), &b(r, 0), a.extent(1) * 4), 0) << preset << " row " << r;
      }
    }
    EXPECT_EQ(logits(g), logits(st)) << preset;
  }
}

TEST(gguf_model, permuted_file_without_undoing_differs) {
  // The permutation matters: a llama file read as qwen2-style (no un-permutation) gives other
  // q rows. (Guards against a test that would pass with the permutation a no-op.)
  const fs::path path = write_gguf(tiny_dir("tiny-llama"), scratch("llama_f32b.gguf"),
                                   {npullm::io::ggml_type::f32, npullm::io::ggml_type::f32});
  const auto file = npullm::io::gguf_file::open(path);
  const auto stored = file->view<float, 2>("blk.0.attn_q.weight");
  const auto st = model_weights<float>::load(tiny_dir("tiny-llama"));
  EXPECT_NE(std::memcmp(&stored(1, 0), &st->layers[0].q.w(1, 0), stored.extent(1) * 4), 0);
  EXPECT_EQ(std::memcmp(&stored(2, 0), &st->layers[0].q.w(1, 0), stored.extent(1) * 4), 0);
}

struct gguf_case {
  std::string preset;
  npullm::io::ggml_type type, head_type;
  std::string label;
};

class gguf_formats : public ::testing::TestWithParam<gguf_case> {};

// Quantized GGUF tensors load zero-copy (or row-copied for Llama's Q/K) and run; the logits
// match the f32 pipeline over the same (dequantized) weights.
TEST_P(gguf_formats, loads_and_matches_the_dequantized_reference) {
  const auto& p = GetParam();
  const fs::path path = write_gguf(tiny_dir(p.preset), scratch(p.preset + "_" + p.label + ".gguf"),
                                   {p.type, p.head_type});
  const auto w = model_weights<float>::load_gguf(path);
  ASSERT_TRUE(w->layers[0].up.is_quantized());
  EXPECT_EQ(model::ggml_type_of(w->layers[0].up.quantized->format), p.type);
  EXPECT_EQ(model::ggml_type_of(w->embed.quantized->format), p.head_type);
  const auto ref = model_weights<float>::load(write_dequantized(*w, "gguf_" + p.preset + p.label));
  expect_close_to_reference(logits(w), logits(ref), p.preset + " gguf " + p.label);
  // Zero-copy: an unpermuted quantized tensor points into the file's mapping.
  const auto file = npullm::io::gguf_file::open(path);
  EXPECT_EQ(w->layers[0].up.quantized->data.size(), file->bytes("blk.0.ffn_up.weight").size());
}

using gt = npullm::io::ggml_type;
INSTANTIATE_TEST_SUITE_P(types, gguf_formats,
                         ::testing::Values(gguf_case{"tiny", gt::q8_0, gt::q8_0, "q8_0"},
                                           gguf_case{"tiny-llama", gt::q8_0, gt::q8_0, "q8_0"},
                                           gguf_case{"tiny", gt::q4_0, gt::q8_0, "q4_0"},
                                           gguf_case{"tiny-llama", gt::q4_0, gt::q4_0, "q4_0"},
                                           gguf_case{"tiny-k", gt::q4_k, gt::q6_k, "q4_k_q6_k"},
                                           gguf_case{"tiny", gt::q4_1, gt::q5_0, "q4_1_q5_0"},
                                           gguf_case{"tiny-llama", gt::q5_1, gt::q8_0, "q5_1"}),
                         [](const auto& info) {
                           std::string s = info.param.preset + "_" + info.param.label;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(gguf_model, save_gguf_round_trip_equals_quantize_at_load) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    for (const auto f : {weight_format::q8_0, weight_format::q4_0}) {
      const auto w = model_weights<float>::load(
          tiny_dir(preset), {.projections = quantization{f, 0},
                             .embedding_and_head = quantization{weight_format::q8_0, 0}});
      const fs::path path = scratch(std::string(preset) + "_save_" +
                                    std::string(npullm::ops::to_string(f)) + ".gguf");
      model::save_gguf(*w, path);
      const auto back = model_weights<float>::load_gguf(path);
      EXPECT_EQ(back->quantized_matrices(), w->quantized_matrices());
      EXPECT_EQ(logits(back), logits(w)) << preset << " " << npullm::ops::to_string(f);
    }
  }
}

TEST(gguf_model, save_gguf_refuses_the_symmetric_formats) {
  const auto w = model_weights<float>::load(
      tiny_dir("tiny"), {.projections = quantization{weight_format::int4_sym, 128}});
  try {
    model::save_gguf(*w, scratch("sym.gguf"));
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(e.message().find("int4_sym"), std::string::npos) << e.message();
  }
}

void expect_refused(const fs::path& path, error_code code, const std::vector<std::string>& words) {
  try {
    (void)model_weights<float>::load_gguf(path);
    FAIL() << "loaded " << path;
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), code) << e.message();
    for (const auto& w : words) EXPECT_NE(e.message().find(w), std::string::npos) << e.message();
  }
}

TEST(gguf_model, refuses_an_unknown_architecture) {
  gguf_spec s;
  s.arch = "gpt2";
  expect_refused(write_gguf(tiny_dir("tiny"), scratch("gpt2.gguf"), s), error_code::unsupported,
                 {"gpt2"});
}

TEST(gguf_model, refuses_a_tensor_type_it_cannot_run_naming_the_tensor) {
  gguf_spec s;
  // The grid-based types (IQ1 / IQ2 / IQ3); K = 128 is no multiple of their 256: use the
  // hidden-256 model.
  s.type = gt::iq2_xxs;
  expect_refused(write_gguf(tiny_dir("tiny-k"), scratch("iq2xxs.gguf"), s), error_code::unsupported,
                 {"IQ2_XXS", "blk.0."});
  s.type = gt::iq3_s;
  expect_refused(write_gguf(tiny_dir("tiny-k"), scratch("iq3s.gguf"), s), error_code::unsupported,
                 {"IQ3_S"});
}

// ---- llama.cpp's files of every weight type --------------------------------------------------
// ../shared/vectors/gguf-types (README there): one seeded random Qwen2 model (hidden 256, one
// layer, vocabulary 256) in each type by llama-quantize --pure, with llama.cpp's logits of 32
// tokens at every position. The weights are the same blocks, dequantized bit for bit alike
// (test_quant), so npullm's logits differ from llama.cpp's by the two engines' rounding of the
// activations only: npullm rounds x to int8 per block of 32 (dx = absmax / 127), llama.cpp to
// 8 bits per block of 32 (Q8_0 / Q8_1, for the 32-value types) or of 256 (Q8_K: the K-quants and
// IQ4_XS, a coarser rounding), and this tiny random model amplifies such rounding. Measured
// (max |diff| / std of llama.cpp's logits, AVX-512 VNNI): each engine alone is 0.06-0.08 (npullm)
// and 0.06-0.11 (llama.cpp) away from an f32 run over the same dequantized weights (printed), and
// npullm is 0.046-0.058 away from llama.cpp for the 32-value types, 0.108-0.118 for the Q8_K ones.
// Bounds: 0.08 and 0.16 of the std (two independent roundings of that size), npullm's own
// rounding within 0.1 of it, and the F32 file (no rounding on either side) within 1e-5.
struct llama_cpp_case {
  const char* type;
  double bound;  // of max |npullm - llama.cpp| / std(llama.cpp's logits)
};

TEST(llama_cpp_files, logits_of_every_weight_type_match_llama_cpps) {
  const fs::path dir = NPULLM_GGUF_TYPES_DIR;
  if (!fs::exists(dir / "tokens.txt")) {
    GTEST_SKIP() << "no llama.cpp test files in " << dir
                 << " (../shared/vectors/gguf-types beside the checkout)";
  }
  std::vector<std::int32_t> tokens;
  {
    std::ifstream in(dir / "tokens.txt");
    for (std::string t; std::getline(in, t, ',');) tokens.push_back(std::stoi(t));
  }
  ASSERT_EQ(tokens.size(), 32u);
  const llama_cpp_case cases[] = {{"f32", 1e-5},   {"Q8_0", 0.08}, {"Q4_0", 0.08},   {"Q4_1", 0.08},
                                  {"Q5_0", 0.08},  {"Q5_1", 0.08}, {"IQ4_NL", 0.08}, {"Q2_K", 0.16},
                                  {"Q3_K", 0.16},  {"Q4_K", 0.16}, {"Q5_K", 0.16},   {"Q6_K", 0.16},
                                  {"IQ4_XS", 0.16}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.type);
    const auto w = model_weights<float>::load_gguf(dir / ("tiny-" + std::string(c.type) + ".gguf"));
    lm_type lm(w, {.max_sequence = 64});
    const auto out = lm.prefill(tokens, npullm::output_selection::all_rows());
    const std::size_t vocab = w->config().vocab_size;
    ASSERT_EQ(out.logits.size(), 32 * vocab);
    std::vector<float> want(32 * vocab);
    {
      std::ifstream in(dir / ("tiny-" + std::string(c.type) + ".logits.f32"), std::ios::binary);
      in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
      ASSERT_TRUE(in) << "short logits file";
    }
    // The same weights dequantized, run in f32 (no activation rounding on either side).
    const auto ref_w =
        model_weights<float>::load(write_dequantized(*w, std::string("ll_") + c.type));
    lm_type ref_lm(ref_w, {.max_sequence = 64});
    const auto ref = ref_lm.prefill(tokens, npullm::output_selection::all_rows());
    double mean = 0, var = 0, worst = 0, mine = 0, theirs = 0;
    for (float v : want) mean += v;
    mean /= static_cast<double>(want.size());
    for (float v : want) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double got = out.logits.data()[i], r = ref.logits.data()[i];
      worst = std::max(worst, std::fabs(got - want[i]));
      mine = std::max(mine, std::fabs(got - r));
      theirs = std::max(theirs, std::fabs(want[i] - r));
    }
    std::printf(
        "  %-6s max |npullm - llama.cpp| %.3g of the logits' std %.3g; against f32 over the "
        "dequantized weights: npullm %.3g, llama.cpp %.3g\n",
        c.type, worst / sd, sd, mine / sd, theirs / sd);
    EXPECT_LE(worst / sd, c.bound);
    EXPECT_LE(mine / sd, c.bound == 1e-5 ? 0.0 : 0.1);
  }
}

TEST(gguf_model, refuses_a_shape_mismatch_naming_the_tensor) {
  gguf_spec s;
  s.bad_tensor = "model.layers.1.mlp.up_proj.weight";
  expect_refused(write_gguf(tiny_dir("tiny"), scratch("shape.gguf"), s), error_code::corrupt_data,
                 {"blk.1.ffn_up.weight"});
  s.bad_tensor = "model.layers.0.post_attention_layernorm.weight";
  expect_refused(write_gguf(tiny_dir("tiny"), scratch("shape2.gguf"), s), error_code::corrupt_data,
                 {"blk.0.ffn_norm.weight"});
}

TEST(gguf_model, refuses_a_dense_matrix_of_another_type_than_w) {
  const fs::path path = write_gguf(tiny_dir("tiny"), scratch("f32dense.gguf"), {gt::f32, gt::f32});
  try {
    (void)model_weights<npullm::bfloat16>::load_gguf(path);
    FAIL();
  } catch (const npullm::error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(e.message().find("F32"), std::string::npos) << e.message();
  }
  // Norms (1-D F32) are converted to W: a bf16 pipeline over a quantized file loads.
  const fs::path q = write_gguf(tiny_dir("tiny"), scratch("q8bf.gguf"), {gt::q8_0, gt::q8_0});
  const auto w = model_weights<npullm::bfloat16>::load_gguf(q);
  EXPECT_EQ(w->quantized_matrices(), 15u);
}

// A GGUF file's W (stored_weight_type and with_stored_weights take a file as well as a model
// directory): the type of its dense matrices, f32 when every matrix is quantized.
TEST(gguf_model, stored_weight_type_of_a_file_is_that_of_its_dense_matrices) {
  const fs::path bf = write_gguf(tiny_dir("tiny"), scratch("wt_bf16.gguf"), {gt::bf16, gt::bf16});
  const fs::path f32 = write_gguf(tiny_dir("tiny"), scratch("wt_f32.gguf"), {gt::f32, gt::q8_0});
  const fs::path q = write_gguf(tiny_dir("tiny"), scratch("wt_q4.gguf"), {gt::q4_0, gt::q8_0});
  EXPECT_EQ(model::stored_weight_type(bf), npullm::dtype::bf16);
  EXPECT_EQ(model::stored_weight_type(f32), npullm::dtype::f32);
  EXPECT_EQ(model::stored_weight_type(q), npullm::dtype::f32);
  auto loaded = [](const fs::path& path) {
    return model::with_stored_weights(path, [](auto w) {
      using W = typename decltype(w)::element_type::weight_type;
      return std::pair{npullm::dtype_of<W>, w->quantized_matrices()};
    });
  };
  EXPECT_EQ(loaded(bf), std::pair(npullm::dtype::bf16, std::size_t{0}));
  EXPECT_EQ(loaded(f32), std::pair(npullm::dtype::f32, std::size_t{1}));
  EXPECT_EQ(loaded(q), std::pair(npullm::dtype::f32, std::size_t{15}));
}

}  // namespace

// ---- npullm_quantize's files (ctest runs the program first; see tests/CMakeLists.txt) -------

namespace {

std::vector<float> logits_bf16(std::shared_ptr<const model_weights<npullm::bfloat16>> w) {
  model::causal_lm<model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>,
                                          npullm::bfloat16>>
      lm(std::move(w), {.max_sequence = 64});
  const auto out = lm.prefill(prompt, npullm::output_selection::all_rows());
  return {out.logits.data(), out.logits.data() + out.logits.size()};
}

fs::path cli_dir() {
  const char* d = std::getenv("NPULLM_QUANTIZE_DIR");
  return d ? fs::path(d) : fs::path();
}

TEST(cli, gguf_written_by_npullm_quantize_loads_and_runs_as_quantize_at_load) {
  if (cli_dir().empty()) GTEST_SKIP() << "run through ctest (test_quantized_cli)";
  const struct {
    const char* file;
    weight_format projections, embedding;
  } files[] = {{"model-q4_0.gguf", weight_format::q4_0, weight_format::q8_0},
               {"model-q5_1.gguf", weight_format::q5_1, weight_format::q4_1}};
  for (const auto& f : files) {
    SCOPED_TRACE(f.file);
    const auto file = model_weights<npullm::bfloat16>::load_gguf(cli_dir() / f.file);
    const auto at_load = model_weights<npullm::bfloat16>::load(
        cli_dir() / "model", {.projections = quantization{f.projections, 0},
                              .embedding_and_head = quantization{f.embedding, 0}});
    EXPECT_EQ(file->config().family, model::model_family::llama);
    EXPECT_EQ(file->quantized_matrices(), at_load->quantized_matrices());
    EXPECT_EQ(file->layers[0].up.quantized->format, f.projections);
    EXPECT_EQ(file->embed.quantized->format, f.embedding);
    EXPECT_EQ(logits_bf16(file), logits_bf16(at_load));
  }
}

TEST(cli, safetensors_written_by_npullm_quantize_loads_and_runs_as_quantize_at_load) {
  if (cli_dir().empty()) GTEST_SKIP() << "run through ctest (test_quantized_cli)";
  const auto file = model_weights<npullm::bfloat16>::load(cli_dir() / "model-int4");
  const auto at_load = model_weights<npullm::bfloat16>::load(
      cli_dir() / "model", {.projections = quantization{weight_format::int4_sym, 128},
                            .embedding_and_head = quantization{weight_format::int8_sym, 0}});
  EXPECT_EQ(file->layers[0].gate.quantized->format, weight_format::int4_sym);
  EXPECT_EQ(file->embed.quantized->format, weight_format::int8_sym);
  EXPECT_EQ(logits_bf16(file), logits_bf16(at_load));
}

}  // namespace
