// npullm_apply_template: a conversation rendered by a chat template with npullm's Jinja
// interpreter (text/jinja.hpp), as Hugging Face transformers' apply_chat_template renders it,
// to compare the two or to see the exact prompt a model gets.
//
//   npullm_apply_template (-t TEMPLATE.jinja | -m FILE.gguf) --messages CONV.json
//                         [--add-generation-prompt] [--bos S] [--eos S] [--date "26 Jul 2024"]
//
//   -t FILE          the template's source
//   -m FILE.gguf     the file's template (tokenizer.chat_template) and its BOS / EOS tokens'
//                    texts as bos_token / eos_token
//   --messages FILE  {"messages": [...], "tools": [...], "variables": {...}} (tools and
//                    variables optional; variables such as enable_thinking), or a bare array of
//                    messages
//   --add-generation-prompt   add_generation_prompt true (false without it)
//   --bos S, --eos S bos_token / eos_token (over -m's; "" without -m)
//   --date D         strftime_now's date, "DD Mon YYYY" at 00:00 (default: now, local time)
// Prints exactly the rendered text (no newline added); an error (the template's own
// raise_exception message, a type error, a bad flag) goes to stderr with exit code 1.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "npullm/io/gguf.hpp"
#include "npullm/text/chat_template.hpp"
#include "npullm/text/vocabulary.hpp"
#include "tools/cli.hpp"

namespace {

namespace text = npullm::text;
using json = text::jinja::json;

void usage(const char* argv0) {
  std::printf(
      "usage: %s (-t TEMPLATE.jinja | -m FILE.gguf) --messages CONV.json\n"
      "          [--add-generation-prompt] [--bos S] [--eos S] [--date \"26 Jul 2024\"]\n\n"
      "Prints a conversation rendered by a chat template (npullm's Jinja interpreter, as\n"
      "transformers' apply_chat_template renders it), with no newline added.\n"
      "  -t FILE                  the template's source\n"
      "  -m FILE.gguf             the file's template and its BOS / EOS texts\n"
      "  --messages FILE          {\"messages\": [...], \"tools\": [...], \"variables\": {...}}\n"
      "  --add-generation-prompt  open the assistant's turn\n"
      "  --bos S, --eos S         bos_token / eos_token\n"
      "  --date \"DD Mon YYYY\"     strftime_now's date (default: now)\n",
      argv0);
}

std::string read_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) npullm_tools::cli::refuse(flag, path, "cannot be read");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::tm parse_date(const std::string& flag, const std::string& value) {
  std::tm t{};
  const char* end = strptime(value.c_str(), "%d %b %Y", &t);
  if (end == nullptr || *end != '\0')
    npullm_tools::cli::refuse(flag, value, "want a date as DD Mon YYYY (26 Jul 2024)");
  t.tm_isdst = -1;
  std::tm normalized = t;
  std::mktime(&normalized);  // the weekday and day of the year
  t.tm_wday = normalized.tm_wday;
  t.tm_yday = normalized.tm_yday;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> template_file, model, messages_file, bos, eos;
  std::optional<std::tm> date;
  bool add_generation_prompt = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&] { return std::string(npullm_tools::cli::value(argc, argv, i)); };
      if (a == "-h" || a == "--help") {
        usage(argv[0]);
        return 0;
      } else if (a == "-t" || a == "--template") {
        template_file = value();
      } else if (a == "-m" || a == "--model") {
        model = value();
      } else if (a == "--messages") {
        messages_file = value();
      } else if (a == "--add-generation-prompt") {
        add_generation_prompt = true;
      } else if (a == "--bos") {
        bos = value();
      } else if (a == "--eos") {
        eos = value();
      } else if (a == "--date") {
        date = parse_date(a, value());
      } else {
        std::fprintf(stderr, "error: unknown option '%s' (-h for help)\n", a.c_str());
        return 1;
      }
    }
    if (template_file.has_value() == model.has_value() || !messages_file) {
      std::fprintf(stderr,
                   "error: give one of -t TEMPLATE.jinja or -m FILE.gguf, and "
                   "--messages CONV.json (-h for help)\n");
      return 1;
    }
    const std::string conv_text = read_file("--messages", *messages_file);
    const json conv = json::parse(conv_text, nullptr, false);
    if (conv.is_discarded() ||
        !(conv.is_array() || (conv.is_object() && conv.contains("messages"))))
      npullm_tools::cli::refuse("--messages", *messages_file,
                                "not JSON with \"messages\" (or an array of messages)");
    text::chat_template t(text::chat_format::chatml);
    if (template_file) {
      t = text::chat_template::from_jinja(read_file("-t", *template_file), bos.value_or(""),
                                          eos.value_or(""));
    } else {
      const auto v = text::vocabulary::from_gguf(*npullm::io::gguf_file::open(*model));
      if (!v.chat_template)
        npullm_tools::cli::refuse("-m", *model, "the file has no chat template");
      const auto from_file = text::chat_template::from_vocabulary(v);
      t = text::chat_template::from_jinja(*v.chat_template, bos.value_or(from_file.bos_token()),
                                          eos.value_or(from_file.eos_token()));
    }
    text::chat_options options{.add_generation_prompt = add_generation_prompt};
    if (conv.is_object()) {
      if (conv.contains("tools")) options.tools = conv["tools"];
      if (conv.contains("variables")) options.variables = conv["variables"];
    }
    options.render.now = date;
    const std::string out = t.apply_json(conv.is_array() ? conv : conv["messages"], options);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "error: %.*s\n", static_cast<int>(e.message().size()), e.message().data());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
