// npullm_make_model: writes a generated Hugging Face style model directory.
//   npullm_make_model <preset> <dir> [f32|f16|bf16] [seed] [--vocab-size N]
// --vocab-size: the preset with another vocabulary size (e.g. a real tokenizer's, so that
// npullm_quantize --vocab can give it that tokenizer), 1 .. 2^31 - 1 (token ids are int32).
// seed: 0 .. 2^64 - 1 (default 1). Both whole numbers (tools/cli.hpp), or refused naming them.
// presets: see include/npullm/model/synthetic.hpp (tiny and real-shaped, every family).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "npullm/model/synthetic.hpp"
#include "tools/cli.hpp"

int main(int argc, char** argv) {
  namespace cli = npullm_tools::cli;
  std::size_t vocab_size = 0;  // 0: the preset's
  std::uint64_t seed = 1;
  try {
    if (argc >= 5 && std::string(argv[argc - 2]) == "--vocab-size") {
      vocab_size = cli::integer<std::size_t>(
          "--vocab-size", argv[argc - 1], "the vocabulary size", 1,
          static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()));
      argc -= 2;
    }
    if (argc > 4) seed = cli::integer<std::uint64_t>("seed", argv[4], "the seed", 0);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(e.message().size()), e.message().data());
    return 2;
  }
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s <preset> <dir> [f32|f16|bf16] [seed] [--vocab-size N]\n"
        "presets: tiny tiny-llama tiny-qwen2-window tiny-llama3 tiny-qwen3 tiny-mistral tiny-phi3 "
        "tiny-gemma2 qwen2-0.5b llama-3.2-1b qwen3-0.6b mistral-7b phi-3-mini gemma-2-2b\n",
        argv[0]);
    return 2;
  }
  const std::string dtype = argc > 3 ? argv[3] : "bf16";
  const npullm::dtype d = dtype == "f32"   ? npullm::dtype::f32
                          : dtype == "f16" ? npullm::dtype::f16
                                           : npullm::dtype::bf16;
  if (dtype != "f32" && dtype != "f16" && dtype != "bf16") {
    std::fprintf(stderr, "unknown dtype '%s' (f32, f16, bf16)\n", dtype.c_str());
    return 2;
  }
  try {
    auto spec = npullm::model::preset(argv[1], d, seed);
    if (vocab_size != 0) spec.config.vocab_size = vocab_size;
    const auto start = std::chrono::steady_clock::now();
    npullm::model::write_model(argv[2], spec);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s (%s, %s) in %.1f s\n", argv[2], argv[1], dtype.c_str(), s);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
