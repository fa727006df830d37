// npullm_run: text in, text out with a GGUF model: tokenizes the prompt with the file's own
// vocabulary (text/tokenizer.hpp), prefills, samples and decodes, streaming the text as it is
// generated, then prints prompt and generation tokens/s.
//
//   npullm_run -m FILE.gguf|DIR -p TEXT [-n 128] [--chat] [--system TEXT] [--temp 0.8]
//              [--top-k 40] [--top-p 0.95] [--min-p 0.05] [--repeat-penalty 1]
//              [--repeat-last-n 64] [--frequency-penalty 0] [--presence-penalty 0] [--seed N]
//              [-t threads] [-c context] [--vocab VOCAB.gguf]
//
//   -m DIR        a Hugging Face directory (config.json + safetensors, read by
//                 model_weights::load; its torch_dtype is the weight type). Its tokenizer.json
//                 is not read: the vocabulary comes from a GGUF, --vocab or DIR/vocab.gguf
//   --vocab       the vocabulary (tokenizer.* keys) from this GGUF instead of the model's: a
//                 vocabulary-only GGUF such as llama.cpp's ggml-vocab-*.gguf, or any model file
//   --chat        the prompt is a user message in the file's chat template
//                 (tokenizer.chat_template: ChatML / Qwen, Llama 3, Llama 2, Mistral, Gemma,
//                 Phi-3), the generation prompt opened; --system adds a system message
//   --temp 0      greedy; otherwise temperature / top-k / top-p / min-p sampling seeded by
//                 --seed (default: a random seed, printed)
//   --repeat-penalty, --frequency-penalty, --presence-penalty   penalties over the last
//                 --repeat-last-n tokens of the context (prompt and generated text), as
//                 llama.cpp's flags of the same names (batch/sampler.hpp's sampler_config)
//   -c            KV capacity in tokens (default: prompt + n)
// Generation stops after n tokens or at an end-of-generation token of the vocabulary (EOS,
// <|im_end|>, <|eot_id|>, ...). Models: what model_weights::load_gguf reads (the README's
// GGUF architectures and weight types); the pipeline's weight type is the file's dense matrix
// type (f32 when every matrix is quantized).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "npullm/batch/sampler.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/detokenizer.hpp"
#include "npullm/text/tokenizer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::string model;
  std::string vocab;  // --vocab: the tokenizer's GGUF when not the model's
  std::string prompt;
  std::optional<std::string> system;
  std::size_t n_predict = 128;
  bool chat = false;
  float temperature = 0.8f;
  std::size_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;  // llama.cpp's defaults for these four
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::int64_t repeat_last_n = 64;
  std::optional<std::uint64_t> seed;
  std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::size_t context = 0;
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m FILE.gguf|DIR -p TEXT [-n 128] [--chat] [--system TEXT] [--temp 0.8]\n"
      "          [--top-k 40] [--top-p 0.95] [--min-p 0.05] [--repeat-penalty 1]\n"
      "          [--repeat-last-n 64] [--frequency-penalty 0] [--presence-penalty 0] [--seed N]\n"
      "          [-t threads] [-c context] [--vocab VOCAB.gguf]\n\n"
      "Generates text with a GGUF model (or a Hugging Face directory with a GGUF vocabulary:\n"
      "--vocab or DIR/vocab.gguf), streaming it, then prints tokens/s.\n"
      "  --chat            the prompt as a user message in the file's chat template\n"
      "  --temp 0          greedy decoding\n"
      "  --repeat-penalty, --frequency-penalty, --presence-penalty: over the last\n"
      "                    --repeat-last-n tokens of prompt and output (0: none)\n",
      argv0);
}

// The sampler chain of the options (--repeat-last-n -1: the whole context, as llama.cpp's).
npullm::batch::sampler_config sampling(const options& o) {
  return {.temperature = o.temperature,
          .top_k = o.top_k,
          .top_p = o.top_p,
          .min_p = o.min_p,
          .repeat_penalty = o.repeat_penalty,
          .frequency_penalty = o.frequency_penalty,
          .presence_penalty = o.presence_penalty,
          .penalty_last_n =
              o.repeat_last_n == -1 ? std::numeric_limits<std::int64_t>::max() : o.repeat_last_n};
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// The dense type of the file's 2-D tensors (the pipeline's weight type): f32 when all are
// quantized.
npullm::dtype dense_matrix_type(const npullm::io::gguf_file& f) {
  for (const auto& t : f.tensors()) {
    if (t.n_dims != 2) continue;
    if (const auto d = npullm::io::ggml_storage(t.type)) return *d;
  }
  return npullm::dtype::f32;
}

template <class W>
int generate(const options& o, const npullm::text::tokenizer& tok,
             const std::vector<std::int32_t>& prompt) {
  namespace model = npullm::model;
  using config = model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, W>;
  auto t = clock_type::now();
  const auto weights = std::filesystem::is_directory(o.model)
                           ? model::model_weights<W>::load(o.model)
                           : model::model_weights<W>::load_gguf(o.model);
  const std::size_t capacity = o.context != 0 ? o.context : prompt.size() + o.n_predict;
  if (capacity < prompt.size() + 1) {
    std::fprintf(stderr, "error: -c %zu does not hold the prompt's %zu tokens and one more\n",
                 capacity, prompt.size());
    return 1;
  }
  npullm::thread_pool pool(o.threads);
  model::causal_lm<config> lm(weights, {.max_sequence = capacity, .pool = &pool});
  const auto& c = lm.config();
  if (tok.size() > c.vocab_size) {
    std::fprintf(stderr, "error: the vocabulary has %zu tokens, the model's vocab_size is %zu\n",
                 tok.size(), c.vocab_size);
    return 1;
  }
  std::fprintf(stderr,
               "npullm_run: %s, %zu layers, hidden %zu, vocab %zu (tokenizer %zu), %s weights, %zu "
               "threads, loaded in %.2f s\n",
               std::string(model::to_string(c.family)).c_str(), c.num_hidden_layers, c.hidden_size,
               c.vocab_size, tok.size(),
               std::string(npullm::to_string(npullm::dtype_of<W>)).c_str(), o.threads,
               seconds_since(t));

  const std::uint64_t seed = o.seed ? *o.seed : std::random_device{}();
  if (!o.seed && o.temperature > 0.0f)
    std::fprintf(stderr, "npullm_run: seed %llu\n", static_cast<unsigned long long>(seed));
  npullm::batch::sampler sampler(sampling(o), seed);
  // The penalties' context: the prompt, then every token chosen.
  std::vector<std::int32_t> context(prompt);
  // Ids past the tokenizer (an embedding padded to a round size) are never sampled.
  const std::size_t vocab = std::min(c.vocab_size, tok.size());

  t = clock_type::now();
  auto out = lm.prefill(prompt);
  std::int32_t next = sampler.sample(out.logits_of(prompt.size() - 1).first(vocab), context);
  const double prefill_s = seconds_since(t);

  npullm::text::streaming_detokenizer stream(tok);
  std::size_t generated = 0;
  std::size_t steps = 0;
  t = clock_type::now();
  const std::size_t limit = std::min(o.n_predict, capacity - prompt.size());
  while (generated < limit) {
    ++generated;
    if (tok.vocab().is_eog(next)) break;
    const std::string text = stream.push(next);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (generated == limit) break;
    const auto step = lm.decode(std::array{next});
    ++steps;
    context.push_back(next);
    next = sampler.sample(step.logits_of(0).first(vocab), context);
  }
  const double decode_s = seconds_since(t);
  const std::string rest = stream.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "\nprompt:     %5zu tokens in %8.3f s: %8.2f tokens/s\n", prompt.size(),
               prefill_s, static_cast<double>(prompt.size()) / prefill_s);
  std::fprintf(stderr, "generation: %5zu tokens, %zu decode steps in %8.3f s: %8.2f tokens/s\n",
               generated, steps, decode_s,
               steps == 0 ? 0.0 : static_cast<double>(steps) / decode_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  bool have_model = false, have_prompt = false;
  const auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: %s needs a value\n", argv[i]);
      std::exit(1);
    }
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        usage(argv[0]);
        return 0;
      } else if (a == "-m" || a == "--model") {
        o.model = value(i), have_model = true;
      } else if (a == "--vocab") {
        o.vocab = value(i);
      } else if (a == "-p" || a == "--prompt") {
        o.prompt = value(i), have_prompt = true;
      } else if (a == "-n" || a == "--n-predict") {
        o.n_predict = std::stoul(value(i));
      } else if (a == "--chat") {
        o.chat = true;
      } else if (a == "--system") {
        o.system = value(i);
      } else if (a == "--temp") {
        o.temperature = std::stof(value(i));
      } else if (a == "--top-k") {
        o.top_k = std::stoul(value(i));
      } else if (a == "--top-p") {
        o.top_p = std::stof(value(i));
      } else if (a == "--min-p") {
        o.min_p = std::stof(value(i));
      } else if (a == "--repeat-penalty") {
        o.repeat_penalty = std::stof(value(i));
      } else if (a == "--repeat-last-n") {
        o.repeat_last_n = std::stoll(value(i));
      } else if (a == "--frequency-penalty") {
        o.frequency_penalty = std::stof(value(i));
      } else if (a == "--presence-penalty") {
        o.presence_penalty = std::stof(value(i));
      } else if (a == "--seed" || a == "-s") {
        o.seed = std::stoull(value(i));
      } else if (a == "-t" || a == "--threads") {
        o.threads = std::max<std::size_t>(1, std::stoul(value(i)));
      } else if (a == "-c" || a == "--ctx-size") {
        o.context = std::stoul(value(i));
      } else {
        std::fprintf(stderr, "error: unknown option '%s' (-h for help)\n", a.c_str());
        return 1;
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "error: a numeric option has a value that is not a number\n");
    return 1;
  }
  if (!have_model || !have_prompt) {
    usage(argv[0]);
    return 1;
  }
  try {
    sampling(o).validate();  // before the model loads
    // The vocabulary's GGUF: --vocab, else the model file, else (a directory) DIR/vocab.gguf.
    const bool directory = std::filesystem::is_directory(o.model);
    std::filesystem::path vocab = o.vocab.empty() ? o.model : o.vocab;
    if (directory && o.vocab.empty()) {
      vocab /= "vocab.gguf";
      if (!std::filesystem::exists(vocab)) {
        std::fprintf(stderr,
                     "error: %s is a model directory and npullm_run reads vocabularies from GGUF "
                     "files only (not tokenizer.json): give one with --vocab VOCAB.gguf (a "
                     "vocabulary-only GGUF such as llama.cpp's ggml-vocab-qwen2.gguf, or a model "
                     "GGUF of the same vocabulary) or put it at %s\n",
                     o.model.c_str(), vocab.c_str());
        return 1;
      }
    }
    const auto file = npullm::io::gguf_file::open(vocab);
    const auto tok = npullm::text::tokenizer::from_gguf(*file);
    std::string text = o.prompt;
    if (o.chat) {
      const auto tmpl = npullm::text::chat_template::from_vocabulary(tok.vocab());
      std::vector<npullm::text::chat_message> messages;
      if (o.system) messages.push_back({"system", *o.system});
      messages.push_back({"user", o.prompt});
      text = tmpl.apply(messages, true);
      std::fprintf(stderr, "npullm_run: chat template %s\n", std::string(tmpl.name()).c_str());
    } else if (o.system) {
      std::fprintf(stderr, "error: --system needs --chat\n");
      return 1;
    }
    const auto prompt = tok.encode(text, {.add_special = true, .parse_special = true});
    if (prompt.empty()) {
      std::fprintf(stderr, "error: the prompt has no tokens\n");
      return 1;
    }
    if (!o.chat) {
      std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
      std::fflush(stdout);
    }
    // The pipeline's weight type: the directory's torch_dtype, or the GGUF's dense matrices'.
    const npullm::dtype weight_type =
        directory         ? npullm::model::load_config(o.model).torch_dtype
        : o.vocab.empty() ? dense_matrix_type(*file)
                          : dense_matrix_type(*npullm::io::gguf_file::open(o.model));
    switch (weight_type) {
      case npullm::dtype::f16: return generate<npullm::float16>(o, tok, prompt);
      case npullm::dtype::bf16: return generate<npullm::bfloat16>(o, tok, prompt);
      case npullm::dtype::f32: break;
    }
    return generate<float>(o, tok, prompt);
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
