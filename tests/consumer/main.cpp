// Built against an installed npullm, linked to npullm::kernels at the compiler's default target:
// the umbrella header, and a tiny generated model run through the pipeline with f32, bf16 and
// quantized weights (tiles, panels and blocks as stored). (header_only.cpp: views, no kernels.)
#include <npullm/model/synthetic.hpp>
#include <npullm/npullm.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

template <class W>
bool run(const std::filesystem::path& dir, const npullm::model::load_options& load,
         npullm::model::weight_packing packing) {
  using namespace npullm::model;
  using lm_type =
      causal_lm<pipeline_config<contiguous_kv<npullm::bfloat16>, dynamic_attention<>, W>>;
  const auto weights = model_weights<W>::load(dir, load);
  lm_type lm(weights, {.max_sequence = 64, .packing = packing});
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 20; ++i) ids.push_back((i * 37 + 5) % 300);
  const auto a = lm.prefill(ids, npullm::output_selection::all_rows());
  const auto b = lm.decode(std::array<std::int32_t, 1>{7});
  for (const auto* out : {&a, &b}) {
    for (std::size_t i = 0; i < out->logits.size(); ++i) {
      if (!std::isfinite(out->logits.data()[i])) return false;
    }
  }
  return a.logits.size() == 20 * weights->config().vocab_size && b.logits.size() != 0;
}

}  // namespace

int main() {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "npullm_consumer_models";
  using npullm::model::weight_packing;
  using npullm::ops::weight_format;
  try {
    npullm::model::ensure_model(root / "f32", npullm::model::preset("tiny"));
    npullm::model::ensure_model(root / "bf16", npullm::model::preset("tiny", npullm::dtype::bf16));
    bool ok = run<float>(root / "f32", {}, weight_packing::automatic) &&
              run<npullm::bfloat16>(root / "bf16", {}, weight_packing::automatic);
    for (const auto format : {weight_format::q4_0, weight_format::q8_0, weight_format::int4_sym}) {
      for (const auto packing :
           {weight_packing::automatic, weight_packing::on, weight_packing::off}) {
        ok = ok && run<float>(root / "f32",
                              {.projections = npullm::model::quantization{format, 32}}, packing);
      }
    }
    if (!ok) {
      std::puts("npullm consumer: a pipeline gave wrong logits");
      return 1;
    }
  } catch (const npullm::error& e) {
    std::printf("npullm consumer: %s\n", e.what());
    return 1;
  }
  std::puts("npullm consumer: ok");
  return 0;
}
