// vocabulary: a GGUF file's tokenizer data (`tokenizer.ggml.*`) as one value: the tokens and
// their types and scores, the BPE merges, the special ids and flags, the chat template. The
// tokenizer (tokenizer.hpp) encodes and decodes with it.
//
// Keys read (those of llama.cpp's GGUF writer):
//   tokenizer.ggml.model          "llama" (SentencePiece) or "gpt2" (byte-level BPE); others
//                                 (bert, t5, rwkv, ...) are `unsupported`, naming them
//   tokenizer.ggml.pre            the pre-tokenizer (pretokenizer.hpp), BPE only
//   tokenizer.ggml.tokens         string[n]
//   tokenizer.ggml.token_type     int32[n]: 1 normal, 2 unknown, 3 control, 4 user-defined,
//                                 5 unused, 6 byte (optional: all normal)
//   tokenizer.ggml.scores         float32[n] (SentencePiece merge priorities; optional)
//   tokenizer.ggml.merges         string[m] "left right", by rank (BPE)
//   tokenizer.ggml.{bos,eos,eot,eom,unknown,seperator,padding}_token_id, add_bos_token,
//   add_eos_token, add_space_prefix; tokenizer.chat_template; general.name
//
// Like llama.cpp, tokens whose text names an end of turn or a fill-in-the-middle marker
// ("<|im_end|>", "<|eot_id|>", "<|fim_prefix|>", ...) are control tokens whatever their stored
// type, and Phi-3 vocabularies (general.name) strip whitespace after their special tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/io/gguf.hpp"
#include "npullm/text/pretokenizer.hpp"

namespace npullm::text {

enum class tokenizer_model { spm, bpe };  // "llama", "gpt2"

// GGUF's token types (llama.cpp's llama_token_type).
enum class token_type : std::uint8_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct token_info {
  std::string text;  // as stored: "▁" for spaces (SentencePiece), GPT-2's byte alphabet (BPE)
  float score = 0.0f;
  token_type type = token_type::normal;
  bool lstrip = false;  // when parsed as a special token: whitespace before it is dropped
  bool rstrip = false;  // ... whitespace after it is dropped

  // Matched in text before the model's own splitting: control and unknown tokens when
  // special tokens are parsed, user-defined ones always.
  [[nodiscard]] bool special() const noexcept {
    return type == token_type::control || type == token_type::unknown ||
           type == token_type::user_defined;
  }
};

struct vocabulary {
  tokenizer_model model = tokenizer_model::spm;
  std::string pre;                 // tokenizer.ggml.pre as stored ("" if absent)
  pretokenizer_info pre_info;      // BPE only
  std::string name;                // general.name
  std::vector<token_info> tokens;  // by id
  std::vector<std::pair<std::string, std::string>> merges;  // by rank (BPE)

  std::int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SentencePiece: a space before the text (and after specials)
  std::vector<std::int32_t> eog;  // ids that end a generation (eos, eot, eom and the like)
  std::optional<std::string> chat_template;  // tokenizer.chat_template

  [[nodiscard]] std::size_t size() const noexcept { return tokens.size(); }
  [[nodiscard]] bool is_eog(std::int32_t id) const noexcept {
    return std::find(eog.begin(), eog.end(), id) != eog.end();
  }

  // Reads the tokenizer keys of an open GGUF file; problems name the file and the key.
  static vocabulary from_gguf(const io::gguf_file& f) {
    vocabulary v;
    const std::string& path = f.path();
    const auto model = f.find<std::string_view>("tokenizer.ggml.model");
    if (!model)
      raise(error_code::corrupt_data, "GGUF ", path,
            ": no tokenizer (key 'tokenizer.ggml.model' missing)");
    if (*model == "llama") {
      v.model = tokenizer_model::spm;
    } else if (*model == "gpt2") {
      v.model = tokenizer_model::bpe;
    } else {
      raise(error_code::unsupported, "GGUF ", path, ": tokenizer model '", *model,
            "' is not implemented (npullm reads 'llama' SentencePiece and 'gpt2' byte-level BPE "
            "vocabularies)");
    }
    if (const auto pre = f.find<std::string_view>("tokenizer.ggml.pre")) v.pre = std::string(*pre);
    if (const auto name = f.find<std::string_view>("general.name")) v.name = std::string(*name);

    const auto& toks = f.array("tokenizer.ggml.tokens");
    const auto texts = toks.strings();
    const std::size_t n = texts.size();
    if (n == 0)
      raise(error_code::corrupt_data, "GGUF ", path, ": 'tokenizer.ggml.tokens' is empty");
    if (n > 0x7FFFFFFF)
      raise(error_code::corrupt_data, "GGUF ", path, ": ", n, " tokens do not fit int32 ids");
    v.tokens.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      v.tokens[i].text = std::string(texts[i]);
      // An empty token could never be matched nor told apart; llama.cpp renames it the same way.
      if (v.tokens[i].text.empty()) v.tokens[i].text = "[EMPTY_" + std::to_string(i) + "]";
    }
    if (const auto* types = f.find_value("tokenizer.ggml.token_type")) {
      const auto& a = f.array("tokenizer.ggml.token_type");
      (void)types;
      if (a.size() != n) {
        raise(error_code::corrupt_data, "GGUF ", path, ": 'tokenizer.ggml.token_type' has ",
              a.size(), " entries for ", n, " tokens");
      }
      for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t t = a.type() == io::gguf_type::int32
                                   ? a.at<std::int32_t>(i)
                                   : static_cast<std::int32_t>(a.at<std::uint32_t>(i));
        v.tokens[i].type = (t >= 1 && t <= 6) ? static_cast<token_type>(t) : token_type::undefined;
      }
    }
    if (f.find_value("tokenizer.ggml.scores") != nullptr) {
      const auto& a = f.array("tokenizer.ggml.scores");
      if (a.size() != n) {
        raise(error_code::corrupt_data, "GGUF ", path, ": 'tokenizer.ggml.scores' has ", a.size(),
              " entries for ", n, " tokens");
      }
      for (std::size_t i = 0; i < n; ++i) v.tokens[i].score = a.at<float>(i);
    }
    if (v.model == tokenizer_model::bpe) {
      v.pre_info = pretokenizer_of(v.pre);
      const auto merges = f.array("tokenizer.ggml.merges").strings();
      v.merges.reserve(merges.size());
      for (std::size_t r = 0; r < merges.size(); ++r) {
        const std::string_view m = merges[r];
        const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
        if (sp == std::string_view::npos) {
          raise(error_code::corrupt_data, "GGUF ", path, ": merge ", r, " '",
                io::detail::gguf_printable(m), "' is not 'left right'");
        }
        v.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
      }
    }

    // Defaults of the tokenizer kind, then the file's keys.
    if (v.model == tokenizer_model::spm) {
      v.bos = 1, v.eos = 2, v.unk = 0;
      v.add_bos = true;
      v.add_space_prefix = true;
    } else {
      v.add_bos = v.pre_info.add_bos;
    }
    const auto id_key = [&](std::string_view key, std::int32_t& id) {
      if (const auto x = f.find_uint(key)) {
        if (*x >= n)
          raise(error_code::corrupt_data, "GGUF ", path, ": '", key, "' = ", *x, " is past the ", n,
                " tokens");
        id = static_cast<std::int32_t>(*x);
      }
    };
    id_key("tokenizer.ggml.bos_token_id", v.bos);
    id_key("tokenizer.ggml.eos_token_id", v.eos);
    id_key("tokenizer.ggml.eot_token_id", v.eot);
    id_key("tokenizer.ggml.eom_token_id", v.eom);
    id_key("tokenizer.ggml.unknown_token_id", v.unk);
    id_key("tokenizer.ggml.seperator_token_id", v.sep);
    id_key("tokenizer.ggml.padding_token_id", v.pad);
    if (const auto b = f.find<bool>("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
    if (const auto b = f.find<bool>("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
    if (const auto b = f.find<bool>("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
    if (v.add_bos && v.bos < 0)
      raise(error_code::corrupt_data, "GGUF ", path,
            ": add_bos_token is set but there is no BOS id");
    if (v.add_eos && v.eos < 0)
      raise(error_code::corrupt_data, "GGUF ", path,
            ": add_eos_token is set but there is no EOS id");
    if (const auto t = f.find<std::string_view>("tokenizer.chat_template"))
      v.chat_template = std::string(*t);
    v.finish();
    return v;
  }

  static vocabulary from_gguf(const std::filesystem::path& path) {
    const auto f = io::gguf_file::open(path);
    return from_gguf(*f);
  }

 private:
  // Control-looking tokens, end-of-generation ids and per-model strip flags (see the top).
  void finish() {
    static constexpr std::string_view eog_names[] = {"<|eot_id|>",    "<|im_end|>",    "<|end|>",
                                                     "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                                                     "<EOT>"};
    static constexpr std::string_view control_names[] = {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<EOT>",
        "<\xef\xbd\x9c"
        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<|eom_id|>",
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81"
        "begin\xef\xbd\x9c>",
        "<PRE>",
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81hole\xef\xbd\x9c>",
        "<SUF>",
        "<|fim_middle|>",
        "<fim-middle>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81"
        "end\xef\xbd\x9c>",
        "<MID>",
        "<|fim_pad|>",
        "<fim-pad>",
        "<PAD>",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<|file_sep|>"};
    static constexpr std::string_view eog_fim_names[] = {
        "<|fim_pad|>",   "<fim-pad>",  "<PAD>",  "<|fim_repo|>",
        "<|repo_name|>", "<fim-repo>", "<REPO>", "<|file_sep|>"};
    const auto listed = [](const auto& names, std::string_view s) {
      return std::find(std::begin(names), std::end(names), s) != std::end(names);
    };
    eog.clear();
    const auto add_eog = [&](std::int32_t id) {
      if (id >= 0 && !is_eog(id)) eog.push_back(id);
    };
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (listed(control_names, t.text)) t.type = token_type::control;
      if (listed(eog_names, t.text) || listed(eog_fim_names, t.text))
        add_eog(static_cast<std::int32_t>(i));
      if (eot < 0 && (t.text == "<|eot_id|>" || t.text == "<|im_end|>" || t.text == "<|end|>" ||
                      t.text == "<end_of_turn>" || t.text == "<EOT>")) {
        eot = static_cast<std::int32_t>(i);
      }
    }
    add_eog(eos);
    add_eog(eot);
    add_eog(eom);
    std::sort(eog.begin(), eog.end());

    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    if (lower.find("phi-3") != std::string::npos || lower.find("phi3") != std::string::npos) {
      // Phi-3's added tokens strip the whitespace after them (its tokenizer.json rstrip),
      // "</s>" too, but not <unk>, <s> and <|endoftext|>.
      for (auto& t : tokens) {
        if (t.special()) t.rstrip = true;
        if (t.text == "</s>") t.rstrip = true;
        if (t.text == "<unk>" || t.text == "<s>" || t.text == "<|endoftext|>") t.rstrip = false;
      }
    }
  }
};

}  // namespace npullm::text
