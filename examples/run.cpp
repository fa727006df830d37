// npullm_run: text in, text out with a GGUF model: tokenizes the prompt with the file's own
// vocabulary (text/tokenizer.hpp), prefills, samples and decodes, streaming the text as it is
// generated, then prints prompt and generation tokens/s (and the sampler's share of the decode
// time: with a grammar, what its masks cost per step).
//
//   npullm_run -m FILE.gguf|DIR -p TEXT [-n 128] [--chat] [--system TEXT] [--temp 0.8]
//              [--top-k 40] [--top-p 0.95] [--min-p 0.05] [--repeat-penalty 1]
//              [--repeat-last-n 64] [--frequency-penalty 0] [--presence-penalty 0] [--seed N]
//              [-l TOKEN(+|-)BIAS ...] [--stop TEXT ...] [-t threads] [-c context]
//              [--vocab VOCAB.gguf] [--chat-template-file F] [--chat-template-kwargs JSON]
//              [--grammar GBNF | --grammar-file F | -j SCHEMA]
//
//   -m DIR        a Hugging Face directory (config.json + safetensors, read by
//                 model_weights::load; its torch_dtype is the weight type). Its tokenizer.json
//                 is not read: the vocabulary comes from a GGUF, --vocab or DIR/vocab.gguf
//   --vocab       the vocabulary (tokenizer.* keys) from this GGUF instead of the model's: a
//                 vocabulary-only GGUF such as llama.cpp's ggml-vocab-*.gguf, or any model file
//   --chat        the prompt is a user message in the file's chat template
//                 (tokenizer.chat_template), rendered by npullm's Jinja interpreter as
//                 transformers renders it, the generation prompt opened; --system adds a
//                 system message. A leading BOS the template writes is not added twice.
//   --chat-template-file F     that Jinja template instead of the file's
//   --chat-template-kwargs J   more template variables, a JSON object:
//                 '{"enable_thinking": false}'
//   --temp 0      greedy; otherwise top-k / top-p / min-p / temperature sampling (llama.cpp's
//                 order, batch/sampler.hpp) seeded by --seed (default: a random seed, printed)
//   -l, --logit-bias TOKEN+BIAS, TOKEN-BIAS   llama.cpp's flag: BIAS added to the logit of token
//                 id TOKEN (repeatable; 15043-inf bans the token)
//   --stop TEXT   generation ends where TEXT first appears in the generated text (repeatable;
//                 the text is printed up to it, not including it; batch/stop_strings.hpp)
//   --repeat-penalty, --frequency-penalty, --presence-penalty   penalties over the last
//                 --repeat-last-n tokens of the context (prompt and generated text), as
//                 llama.cpp's flags of the same names (batch/sampler.hpp's sampler_config)
//   -c            KV capacity in tokens (default: prompt + n); -n and -c at most 2^31 - 1
//   --grammar GBNF, --grammar-file F, -j / --json-schema SCHEMA   constrained output: only
//                 tokens the GBNF grammar (llama.cpp's syntax) or the JSON Schema allows are
//                 sampled (grammar/, batch/grammar_processor.hpp); EOS only where it may end;
//                 JSON with json.dumps' separators ", " and ": " and no other whitespace
//   -t            threads, 1..1024 (default: the hardware threads)
// Numbers must be whole values in their flag's range (tools/cli.hpp): "-n 40x", "-t 0" or
// "--top-p 2" is refused naming the flag and the value, before anything loads.
// Generation stops after n tokens or at an end-of-generation token of the vocabulary (EOS,
// <|im_end|>, <|eot_id|>, ...). Models: what model_weights::load_gguf reads (the README's
// GGUF architectures and weight types); the pipeline's weight type is the file's dense matrix
// type (f32 when every matrix is quantized).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "npullm/batch/grammar_processor.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/batch/stop_strings.hpp"
#include "npullm/grammar/gbnf.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/config.hpp"
#include "npullm/model/weights.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/detokenizer.hpp"
#include "npullm/text/tokenizer.hpp"
#include "tools/cli.hpp"
#include "tools/model_file.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
namespace cli = npullm_tools::cli;

// The most tokens -n and -c take: llama.cpp's are int32 too, and a position past that is no
// context any model here was trained for.
constexpr std::size_t max_tokens =
    static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

// One --logit-bias, with the flag and value as given, for messages.
struct logit_bias_flag {
  npullm::batch::token_bias bias;
  std::string flag, text;
};

struct options {
  std::string model;
  std::string vocab;  // --vocab: the tokenizer's GGUF when not the model's
  std::string prompt;
  std::optional<std::string> system;
  std::size_t n_predict = 128;
  bool chat = false;
  std::optional<std::string> chat_template_file;   // --chat-template-file
  npullm::text::jinja::json chat_template_kwargs;  // --chat-template-kwargs (an object)
  float temperature = 0.8f;
  std::size_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;  // llama.cpp's defaults for these four
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::int64_t repeat_last_n = 64;
  std::optional<std::uint64_t> seed;
  std::vector<logit_bias_flag> logit_bias;
  std::vector<std::string> stop;
  std::size_t threads =
      std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, cli::max_threads);
  std::size_t context = 0;
  std::optional<std::string> grammar;      // --grammar / --grammar-file: GBNF text
  std::optional<std::string> json_schema;  // -j / --json-schema
  std::shared_ptr<npullm::grammar::token_grammar> constraint;  // built from one of them
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m FILE.gguf|DIR -p TEXT [-n 128] [--chat] [--system TEXT] [--temp 0.8]\n"
      "          [--top-k 40] [--top-p 0.95] [--min-p 0.05] [--repeat-penalty 1]\n"
      "          [--repeat-last-n 64] [--frequency-penalty 0] [--presence-penalty 0] [--seed N]\n"
      "          [-l TOKEN(+|-)BIAS ...] [--stop TEXT ...] [-t threads] [-c context]\n"
      "          [--vocab VOCAB.gguf] [--chat-template-file F] [--chat-template-kwargs JSON]\n"
      "          [--grammar GBNF | --grammar-file F | -j SCHEMA]\n\n"
      "Generates text with a GGUF model (or a Hugging Face directory with a GGUF vocabulary:\n"
      "--vocab or DIR/vocab.gguf), streaming it, then prints tokens/s.\n"
      "  --chat            the prompt as a user message in the file's chat template\n"
      "  --chat-template-file F      that Jinja template instead of the file's\n"
      "  --chat-template-kwargs JSON more template variables: '{\"enable_thinking\":false}'\n"
      "  --temp 0          greedy decoding\n"
      "  --repeat-penalty, --frequency-penalty, --presence-penalty: over the last\n"
      "                    --repeat-last-n tokens of prompt and output (0: none)\n"
      "  -l, --logit-bias TOKEN+BIAS or TOKEN-BIAS: add BIAS to token TOKEN's logit\n"
      "                    (repeatable; TOKEN-inf bans it)\n"
      "  --stop TEXT       stop where TEXT first appears in the output (repeatable)\n"
      "  -t threads        1..1024; -c context: KV tokens (default: prompt + n)\n"
      "  --grammar GBNF, --grammar-file F: output in a GBNF grammar (llama.cpp's syntax)\n"
      "  -j, --json-schema SCHEMA: output a JSON value the schema accepts\n",
      argv0);
}

// TOKEN+BIAS or TOKEN-BIAS (llama.cpp's --logit-bias): a token id, a sign, a number or inf
// (-inf bans the token; +inf would make every other token impossible, and is refused).
logit_bias_flag parse_logit_bias(std::string_view flag, std::string_view text) {
  const std::size_t sign = text.find_first_of("+-");
  const auto token = sign == std::string_view::npos
                         ? std::nullopt
                         : cli::parse_integer<std::int32_t>(text.substr(0, sign));
  if (!token || *token < 0) {
    cli::refuse(flag, text, "want TOKEN+BIAS or TOKEN-BIAS, a token id >= 0 then a signed bias ",
                "(15043+1, 15043-inf)");
  }
  const std::string_view magnitude = text.substr(sign + 1);
  float bias = 0;
  if (text[sign] == '-' && (magnitude == "inf" || magnitude == "infinity")) {
    bias = -std::numeric_limits<float>::infinity();
  } else {
    const auto v = cli::parse_float(magnitude);
    if (!v || *v < 0) {
      cli::refuse(flag, text, "the bias after the sign must be a finite number (or -inf), as in ",
                  "15043+1, 15043-0.5, 15043-inf");
    }
    bias = text[sign] == '-' ? -*v : *v;
  }
  return {{*token, bias}, std::string(flag), std::string(text)};
}

// The sampler chain of the options (--repeat-last-n -1: the whole context, as llama.cpp's).
npullm::batch::sampler_config sampling(const options& o) {
  std::vector<npullm::batch::token_bias> bias;
  for (const logit_bias_flag& b : o.logit_bias) bias.push_back(b.bias);
  return {.temperature = o.temperature,
          .top_k = o.top_k,
          .top_p = o.top_p,
          .min_p = o.min_p,
          .repeat_penalty = o.repeat_penalty,
          .frequency_penalty = o.frequency_penalty,
          .presence_penalty = o.presence_penalty,
          .penalty_last_n =
              o.repeat_last_n == -1 ? std::numeric_limits<std::int64_t>::max() : o.repeat_last_n,
          .logit_bias = std::move(bias)};
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
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
  // Default: the prompt and n tokens (at least one: the first token is sampled from the
  // prefill's logits however small n is).
  const std::size_t capacity =
      o.context != 0 ? o.context : prompt.size() + std::max<std::size_t>(o.n_predict, 1);
  if (capacity < prompt.size() + 1) {
    std::fprintf(stderr, "error: -c %zu does not hold the prompt's %zu tokens and one more\n",
                 capacity, prompt.size());
    return 1;
  }
  npullm::thread_pool pool(o.threads);
  std::optional<model::causal_lm<config>> built;
  const auto too_large = [&] {  // the KV cache and buffers for `capacity` tokens
    if (o.context != 0) {
      std::fprintf(stderr, "error: -c %zu: a KV cache of %zu tokens does not fit in memory\n",
                   o.context, capacity);
    } else {
      std::fprintf(stderr,
                   "error: -n %zu: a KV cache of %zu tokens (the prompt and n) does not fit in "
                   "memory; -c sets a smaller one\n",
                   o.n_predict, capacity);
    }
    return 1;
  };
  try {
    built.emplace(weights, model::pipeline_options{.max_sequence = capacity, .pool = &pool});
  } catch (const std::bad_alloc&) {
    return too_large();
  } catch (const std::length_error&) {  // more elements than a vector holds
    return too_large();
  }
  auto& lm = *built;
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
  auto chain = sampling(o);
  if (o.constraint) {
    // The mask of the next token computed on another thread while the model decodes.
    const npullm::batch::grammar_processor p(o.constraint, prompt.size());
    chain.processor = p;
    chain.prefetch = p.prefetcher();
  }
  npullm::batch::sampler sampler(std::move(chain), seed);
  // The penalties' context: the prompt, then every token chosen.
  std::vector<std::int32_t> context(prompt);
  // Ids past the tokenizer (an embedding padded to a round size) are never sampled.
  const std::size_t vocab = std::min(c.vocab_size, tok.size());

  t = clock_type::now();
  auto out = lm.prefill(prompt);
  std::int32_t next = sampler.sample(out.logits_of(prompt.size() - 1).first(vocab), context);
  const double prefill_s = seconds_since(t);

  npullm::text::streaming_detokenizer stream(tok);
  // The generated text, printed up to `shown`: bytes that may begin a stop string wait until
  // the next token says whether they do.
  std::string text;
  std::size_t shown = 0;
  std::optional<npullm::batch::stop_string_match> stopped;
  const auto add_text = [&](const std::string& piece, bool last) {
    const std::size_t searched = text.size();
    text += piece;
    const auto m = npullm::batch::find_stop_string(text, searched, o.stop);
    if (m.found()) {
      text.resize(m.position);
      stopped = m;
    }
    const std::size_t upto = stopped || last
                                 ? text.size()
                                 : text.size() - npullm::batch::stop_string_holdback(text, o.stop);
    std::fwrite(text.data() + shown, 1, upto - shown, stdout);
    std::fflush(stdout);
    shown = upto;
  };
  std::size_t generated = 0;
  std::size_t steps = 0;
  double sample_s = 0;  // of decode_s: the sampler (with a grammar: its masks)
  t = clock_type::now();
  const std::size_t limit = std::min(o.n_predict, capacity - prompt.size());
  while (generated < limit) {
    ++generated;
    if (tok.vocab().is_eog(next)) break;
    add_text(stream.push(next), false);
    if (stopped || generated == limit) break;
    context.push_back(next);
    sampler.prefetch(context);
    const auto step = lm.decode(std::array{next});
    ++steps;
    const auto sampled_at = clock_type::now();
    next = sampler.sample(step.logits_of(0).first(vocab), context);
    sample_s += seconds_since(sampled_at);
  }
  const double decode_s = seconds_since(t);
  if (!stopped) add_text(stream.flush(), true);  // the last bytes may still complete one
  std::printf("\n");
  std::fflush(stdout);
  if (stopped) {
    std::fprintf(stderr, "\nnpullm_run: stopped at --stop '%s' after %zu tokens\n",
                 o.stop[stopped->index].c_str(), generated);
  }
  std::fprintf(stderr, "\nprompt:     %5zu tokens in %8.3f s: %8.2f tokens/s\n", prompt.size(),
               prefill_s, static_cast<double>(prompt.size()) / prefill_s);
  std::fprintf(stderr, "generation: %5zu tokens, %zu decode steps in %8.3f s: %8.2f tokens/s\n",
               generated, steps, decode_s,
               steps == 0 ? 0.0 : static_cast<double>(steps) / decode_s);
  if (steps != 0) {
    std::fprintf(stderr, "sampling:   %8.3f s of the decode steps' (%.2f %%)%s\n", sample_s,
                 100.0 * sample_s / decode_s,
                 o.constraint
                     ? ", the grammar's mask: computed while the model decodes, waited for here"
                     : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  bool have_model = false, have_prompt = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&] { return std::string(cli::value(argc, argv, i)); };
      if (a == "-h" || a == "--help") {
        usage(argv[0]);
        return 0;
      } else if (a == "-m" || a == "--model") {
        o.model = value(), have_model = true;
      } else if (a == "--vocab") {
        o.vocab = value();
      } else if (a == "-p" || a == "--prompt") {
        o.prompt = value(), have_prompt = true;
      } else if (a == "-n" || a == "--n-predict") {
        o.n_predict = cli::integer<std::size_t>(a, value(), "n_predict", 0, max_tokens);
      } else if (a == "--chat") {
        o.chat = true;
      } else if (a == "--system") {
        o.system = value();
      } else if (a == "--chat-template-file") {
        o.chat_template_file = value();
      } else if (a == "--chat-template-kwargs") {
        const std::string v = value();
        o.chat_template_kwargs = npullm::text::jinja::json::parse(v, nullptr, false);
        if (!o.chat_template_kwargs.is_object()) {
          cli::refuse(a, v,
                      "must be a JSON object of template variables, as "
                      "'{\"enable_thinking\": false}'");
        }
      } else if (a == "--temp") {
        o.temperature = cli::number(a, value(), "temperature", cli::range::at_least(0));
      } else if (a == "--top-k") {
        o.top_k = cli::integer<std::size_t>(a, value(), "top_k", 0);
      } else if (a == "--top-p") {
        o.top_p = cli::number(a, value(), "top_p", cli::range::above_to(0, 1));
      } else if (a == "--min-p") {
        o.min_p = cli::number(a, value(), "min_p", cli::range::closed(0, 1));
      } else if (a == "--repeat-penalty") {
        o.repeat_penalty = cli::number(a, value(), "repeat_penalty", cli::range::above(0));
      } else if (a == "--repeat-last-n") {
        o.repeat_last_n = cli::integer<std::int64_t>(a, value(), "repeat_last_n", -1);
      } else if (a == "--frequency-penalty") {
        o.frequency_penalty = cli::number(a, value(), "frequency_penalty", cli::range::any());
      } else if (a == "--presence-penalty") {
        o.presence_penalty = cli::number(a, value(), "presence_penalty", cli::range::any());
      } else if (a == "--seed" || a == "-s") {
        o.seed = cli::integer<std::uint64_t>(a, value(), "seed", 0);
      } else if (a == "-l" || a == "--logit-bias") {
        o.logit_bias.push_back(parse_logit_bias(a, value()));
      } else if (a == "--stop") {
        std::string stop = value();
        if (stop.empty()) cli::refuse(a, stop, "a stop string must not be empty");
        o.stop.push_back(std::move(stop));
      } else if (a == "-t" || a == "--threads") {
        o.threads = cli::integer<std::size_t>(a, value(), "threads", 1, cli::max_threads);
      } else if (a == "--grammar" || a == "--grammar-file" || a == "-j" || a == "--json-schema") {
        if (o.grammar || o.json_schema) cli::refuse(a, argv[i], "only one grammar or schema");
        std::string text = value();
        if (a == "--grammar-file") {
          std::ifstream in(text, std::ios::binary);
          if (!in) cli::refuse(a, text, "cannot read the file");
          text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        (a == "-j" || a == "--json-schema" ? o.json_schema : o.grammar) = std::move(text);
      } else if (a == "-c" || a == "--ctx-size") {
        o.context = cli::integer<std::size_t>(a, value(), "context", 0, max_tokens);
      } else {
        std::fprintf(stderr, "error: unknown option '%s' (-h for help)\n", a.c_str());
        return 1;
      }
    }
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "error: %.*s\n", static_cast<int>(e.message().size()), e.message().data());
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
    for (const logit_bias_flag& b : o.logit_bias) {
      if (static_cast<std::size_t>(b.bias.token) >= tok.size()) {
        std::fprintf(stderr, "error: %s %s: token %d outside the vocabulary of %zu tokens\n",
                     b.flag.c_str(), b.text.c_str(), b.bias.token, tok.size());
        return 1;
      }
    }
    if (o.grammar || o.json_schema) {
      auto g = o.grammar ? npullm::grammar::parse_gbnf(*o.grammar)
                         : npullm::grammar::json_schema_grammar(
                               *o.json_schema, {npullm::grammar::json_whitespace::separators});
      o.constraint = std::make_shared<npullm::grammar::token_grammar>(
          std::move(g), std::make_shared<const npullm::grammar::token_index>(
                            npullm::grammar::token_index::of(tok)));
    }
    std::string text = o.prompt;
    if (o.chat) {
      // The file's template (or --chat-template-file's), BOS / EOS from the vocabulary.
      const auto& v = tok.vocab();
      const auto token_text = [&](std::int32_t id) {
        return id >= 0 && static_cast<std::size_t>(id) < v.size() ? v.tokens[id].text
                                                                  : std::string();
      };
      npullm::text::chat_template tmpl(npullm::text::chat_format::chatml);
      if (o.chat_template_file) {
        std::ifstream in(*o.chat_template_file, std::ios::binary);
        if (!in) {
          std::fprintf(stderr, "error: --chat-template-file %s: cannot be read\n",
                       o.chat_template_file->c_str());
          return 1;
        }
        const std::string source((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
        tmpl =
            npullm::text::chat_template::from_jinja(source, token_text(v.bos), token_text(v.eos));
        std::fprintf(stderr, "npullm_run: chat template from %s (npullm's Jinja interpreter)\n",
                     o.chat_template_file->c_str());
      } else {
        if (!v.chat_template) {
          std::fprintf(stderr,
                       "error: --chat: %s has no chat template (tokenizer.chat_template): give "
                       "one with --chat-template-file F\n",
                       vocab.c_str());
          return 1;
        }
        tmpl = npullm::text::chat_template::from_vocabulary(v);
        std::fprintf(stderr,
                     "npullm_run: chat template from the file (tokenizer.chat_template, %zu "
                     "bytes; npullm's Jinja interpreter)\n",
                     v.chat_template->size());
      }
      std::vector<npullm::text::chat_message> messages;
      if (o.system) messages.push_back({"system", *o.system});
      messages.push_back({"user", o.prompt});
      npullm::text::chat_options options{.add_generation_prompt = true};
      if (!o.chat_template_kwargs.is_null()) options.variables = o.chat_template_kwargs;
      text = tmpl.apply(messages, options);
      // The template's BOS, where encoding adds one too, once (as llama.cpp does).
      const std::string bos = token_text(v.bos);
      if (v.add_bos && !bos.empty() && text.compare(0, bos.size(), bos) == 0)
        text.erase(0, bos.size());
    } else if (o.system || o.chat_template_file || !o.chat_template_kwargs.is_null()) {
      std::fprintf(stderr,
                   "error: --system, --chat-template-file and --chat-template-kwargs "
                   "need --chat\n");
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
        : o.vocab.empty() ? cli::dense_matrix_type(*file)
                          : cli::dense_matrix_type(*npullm::io::gguf_file::open(o.model));
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
