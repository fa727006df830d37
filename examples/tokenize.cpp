// npullm_tokenize: the token ids of a text under a GGUF file's vocabulary, with the flags of
// llama.cpp's llama-tokenize so that the two can be compared on any file (a model or a
// vocabulary-only GGUF).
//
//   npullm_tokenize -m FILE.gguf (-p TEXT | -f FILE | --stdin) [--ids] [--no-bos]
//                   [--no-parse-special] [--no-escape] [--show-count]
//
//   -p TEXT              the text; \n \r \t \' \" \\ \xNN are processed as llama-tokenize does
//                        (--no-escape: taken as is)
//   -f FILE, --stdin     the text, byte for byte (no escape processing, unlike llama-tokenize,
//                        which processes them in files too unless given --no-escape)
//   --ids                only the ids, as [1, 2, 3]
//   --no-bos             no BOS (nor EOS), even if the vocabulary adds them
//   --no-parse-special   control tokens written in the text stay text
//   --show-count         then "Total number of tokens: N"
// Without --ids: one "    id -> 'piece'" line per token, control tokens as their text.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

#include "npullm/text/tokenizer.hpp"
#include "tools/cli.hpp"

namespace {

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m FILE.gguf (-p TEXT | -f FILE | --stdin) [--ids] [--no-bos]\n"
      "          [--no-parse-special] [--no-escape] [--show-count]\n\n"
      "Prints the tokens of a text under the vocabulary of a GGUF file (llama-tokenize's flags).\n"
      "  -m, --model FILE       the GGUF file (a model or a vocabulary-only file)\n"
      "  -p, --prompt TEXT      the text (escapes such as \\n processed unless --no-escape)\n"
      "  -f, --file FILE        the text from a file, byte for byte\n"
      "  --stdin                the text from standard input, byte for byte\n"
      "  --ids                  print only the ids, as [1, 2, 3]\n"
      "  --no-bos               add no BOS (nor EOS) even if the vocabulary adds one\n"
      "  --no-parse-special     do not turn control tokens written in the text into tokens\n"
      "  --no-escape            take -p's text as is\n"
      "  --show-count           print the number of tokens\n",
      argv0);
}

// llama.cpp's escape processing of a prompt: \n \r \t \' \" \\ and \xNN; others stay as written.
std::string process_escapes(const std::string& in) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'x':
        if (i + 2 < in.size()) {
          const std::string hex = in.substr(i + 1, 2);
          char* end = nullptr;
          const long v = std::strtol(hex.c_str(), &end, 16);
          if (end == hex.c_str() + 2) {
            out += static_cast<char>(v);
            i += 2;
            break;
          }
        }
        [[fallthrough]];
      default: out += '\\'; out += c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> model, prompt, file;
  bool from_stdin = false, ids_only = false, no_bos = false, no_parse_special = false;
  bool no_escape = false, show_count = false;
  // The value after argv[i] (tools/cli.hpp); none: "error: <flag> needs a value".
  const auto value = [&](int& i) -> std::string {
    try {
      return std::string(npullm_tools::cli::value(argc, argv, i));
    } catch (const npullm::error& e) {
      std::fprintf(stderr, "error: %.*s\n", static_cast<int>(e.message().size()),
                   e.message().data());
      std::exit(1);
    }
  };
  const auto once = [](std::optional<std::string>& slot, std::string v, const char* flag) {
    if (slot) {
      std::fprintf(stderr, "error: %s given more than once\n", flag);
      std::exit(1);
    }
    slot = std::move(v);
  };
  if (argc <= 1) {
    usage(argv[0]);
    return 1;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      return 0;
    } else if (a == "-m" || a == "--model") {
      once(model, value(i), "-m");
    } else if (a == "-p" || a == "--prompt") {
      once(prompt, value(i), "-p");
    } else if (a == "-f" || a == "--file") {
      once(file, value(i), "-f");
    } else if (a == "--stdin") {
      from_stdin = true;
    } else if (a == "--ids") {
      ids_only = true;
    } else if (a == "--no-bos") {
      no_bos = true;
    } else if (a == "--no-parse-special") {
      no_parse_special = true;
    } else if (a == "--no-escape") {
      no_escape = true;
    } else if (a == "--show-count") {
      show_count = true;
    } else if (a == "--log-disable") {
      // llama-tokenize's flag; npullm_tokenize logs nothing anyway.
    } else {
      std::fprintf(stderr, "error: unknown option '%s' (-h for help)\n", a.c_str());
      return 1;
    }
  }
  if (!model) {
    std::fprintf(stderr, "error: -m FILE.gguf is required\n");
    return 1;
  }
  if (int(prompt.has_value()) + int(file.has_value()) + int(from_stdin) != 1) {
    std::fprintf(stderr, "error: give exactly one of -p, -f and --stdin\n");
    return 1;
  }
  try {
    const auto tok = npullm::text::tokenizer::from_gguf(*model);
    std::string text;
    if (prompt) {
      text = no_escape ? *prompt : process_escapes(*prompt);
    } else if (file) {
      std::ifstream in(*file, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "error: cannot open '%s'\n", file->c_str());
        return 1;
      }
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
      std::ostringstream ss;
      ss << std::cin.rdbuf();
      text = ss.str();
    }
    // As llama-tokenize: add_special follows the BOS decision (so --no-bos drops EOS as well).
    const bool add_special = tok.vocab().add_bos && !no_bos;
    const auto ids =
        tok.encode(text, {.add_special = add_special, .parse_special = !no_parse_special});
    if (ids_only) {
      std::printf("[");
      for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i ? ", %d" : "%d", ids[i]);
      std::printf("]\n");
    } else {
      for (const std::int32_t id : ids) {
        const std::string_view p = tok.piece(id, true);
        std::printf("%6d -> '%.*s'\n", id, static_cast<int>(p.size()), p.data());
      }
    }
    if (show_count) std::printf("Total number of tokens: %zu\n", ids.size());
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
