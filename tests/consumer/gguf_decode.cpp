// A user's one-file program, as the README's "npullm::kernels" section describes it: load a
// GGUF model (quantized projections: Q4_0 here), build one pipeline over it, prefill a prompt
// and decode greedily. Built against the installed package with npullm::kernels, once per
// instruction set the package has kernels for, it must link them (its object refers to them
// instead of defining them: run_consumer.cmake checks) and run.
//   npullm_gguf_decode FILE.gguf [tokens]
#include <npullm/core/parallel.hpp>
#include <npullm/model/causal_lm.hpp>
#include <npullm/model/weights.hpp>
#include <npullm/ops/argmax.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE.gguf [tokens]\n", argv[0]);
    return 1;
  }
  namespace model = npullm::model;
  using config =
      model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>;
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 16;
  try {
    const auto weights = model::model_weights<float>::load_gguf(argv[1]);
    const npullm::thread_pool pool(2);
    model::causal_lm<config> lm(weights, {.max_sequence = 64, .pool = &pool});
    const std::vector<std::int32_t> prompt = {1, 17, 42, 99, 7};
    auto out = lm.prefill(prompt);
    std::int32_t next = npullm::ops::argmax(out.logits_of(prompt.size() - 1));
    for (int i = 0; i < tokens; ++i) {
      std::printf("%d ", next);
      const auto step = lm.decode(std::array{next});
      for (const float l : step.logits_of(0)) {
        if (!std::isfinite(l)) {
          std::puts("\nnpullm_gguf_decode: a logit is not finite");
          return 1;
        }
      }
      next = npullm::ops::argmax(step.logits_of(0));
    }
    std::printf("\nnpullm_gguf_decode: %s, %d tokens decoded\n",
                std::string(npullm::isa_name()).c_str(), tokens);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "npullm_gguf_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
