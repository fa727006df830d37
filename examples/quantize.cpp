// npullm_quantize: quantizes a safetensors model once and writes it back, so that loading it
// later needs no quantization (model/quantized_io.hpp has the file layouts).
//
//   npullm_quantize <model-dir> <out> [--projections FMT] [--embedding FMT] [--gguf]
//                   [--vocab VOCAB.gguf]
//
//   FMT   q8_0 | q4_0 | q4_1 | q5_0 | q5_1 (llama.cpp's round-to-nearest blocks, bit for bit) |
//         q2_k | q3_k | q4_k | q5_k | q6_k | iq4_xs (K a multiple of 256) | iq4_nl (a
//         least-squares search per sub-block; error no worse than llama-quantize's) |
//         int8 | int4 with an optional group: int4:128 (default for
//         --projections), int8:32, int8 (one group per output channel: the default for
//         --embedding), none (keep dense)
//   out   a directory (config.json + model.safetensors, quantized tensors as <name> codes +
//         <name>.scales), or with --gguf a GGUF file (qwen2 / llama; the GGUF formats only, Llama's
//         Q/K permuted as llama.cpp stores them; the tokenizer.* keys of VOCAB.gguf when --vocab
//         gives one, so npullm_run and llama.cpp can run the file)
//
// Example (the NPU recipe: int4 group 128 for the layers, int8 per channel for the embedding):
//   npullm_quantize models/qwen2-0.5b-bf16 models/qwen2-0.5b-int4
//   npullm_quantize models/qwen2-0.5b-bf16 qwen2-0.5b-q4_0.gguf --projections q4_0
//       --embedding q8_0 --gguf        (one command line)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "npullm/model/quantized_io.hpp"
#include "npullm/model/weights.hpp"
#include "tools/cli.hpp"

namespace {

namespace model = npullm::model;
using npullm::ops::weight_format;

// FMT of --projections / --embedding (`flag`); the group after ':' a whole number
// (tools/cli.hpp), whose value the loader then checks against the format.
std::optional<model::quantization> parse_format(std::string_view flag, const std::string& s) {
  if (s == "none") return std::nullopt;
  const auto colon = s.find(':');
  const std::string name = s.substr(0, colon);
  model::quantization q;
  if (colon != std::string::npos) {
    const auto group =
        npullm_tools::cli::parse_integer<std::size_t>(std::string_view(s).substr(colon + 1));
    if (!group) {
      npullm_tools::cli::refuse(flag, s,
                                "the group after ':' must be an integer >= 0 (int4:128, int8:32)");
    }
    q.group = *group;
  }
  if (name == "int8") {
    q.format = weight_format::int8_sym;
  } else if (name == "int4") {
    q.format = weight_format::int4_sym;
  } else if (const auto f = npullm::ops::weight_format_from_string(name);
             f && npullm::ops::is_block_format(*f)) {
    q.format = *f;
  } else {
    npullm::raise(npullm::error_code::invalid_argument, "npullm_quantize: format '", s,
                  "' (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, "
                  "int8[:G], int4[:G], none)");
  }
  return q;
}

template <npullm::storage_type W>
void run(const std::filesystem::path& in, const std::filesystem::path& out,
         const model::load_options& options, bool gguf, const std::filesystem::path& vocab) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto w = model::model_weights<W>::load(in, options);
  const auto t1 = std::chrono::steady_clock::now();
  if (gguf) {
    model::save_gguf(*w, out, vocab);
  } else {
    model::save_safetensors(*w, out);
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::printf("%zu matrices quantized in %.1f s, written to %s in %.1f s\n",
              w->quantized_matrices(), std::chrono::duration<double>(t1 - t0).count(), out.c_str(),
              std::chrono::duration<double>(t2 - t1).count());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s <model-dir> <out> [--projections FMT] [--embedding FMT] [--gguf]\n"
        "          [--vocab VOCAB.gguf]\n"
        "  FMT: q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q2_k .. q6_k | iq4_nl | iq4_xs | int8[:G] | "
        "int4[:G] | "
        "none (G = 32, 64, 128; none given: "
        "one group per output channel)\n",
        argv[0]);
    return 2;
  }
  try {
    model::load_options options{
        .projections = model::quantization{weight_format::int4_sym, 128},
        .embedding_and_head = model::quantization{weight_format::int8_sym, 0}};
    bool gguf = false;
    std::filesystem::path vocab;
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--gguf") {
        gguf = true;
      } else if (a == "--vocab" && i + 1 < argc) {
        vocab = argv[++i];
      } else if ((a == "--projections" || a == "--embedding") && i + 1 < argc) {
        (a == "--projections" ? options.projections : options.embedding_and_head) =
            parse_format(a, argv[++i]);
      } else {
        std::fprintf(stderr, "npullm_quantize: unknown argument '%s'\n", a.c_str());
        return 2;
      }
    }
    if (!vocab.empty() && !gguf) {
      std::fprintf(stderr, "npullm_quantize: --vocab needs --gguf\n");
      return 2;
    }
    switch (model::stored_weight_type(argv[1])) {
      case npullm::dtype::f32: run<float>(argv[1], argv[2], options, gguf, vocab); break;
      case npullm::dtype::f16: run<npullm::float16>(argv[1], argv[2], options, gguf, vocab); break;
      case npullm::dtype::bf16:
        run<npullm::bfloat16>(argv[1], argv[2], options, gguf, vocab);
        break;
    }
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "npullm_quantize: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npullm_quantize: %s\n", e.what());
    return 1;
  }
  return 0;
}
