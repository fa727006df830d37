// chat_template: the prompt text of a conversation, rendered from the model's own Jinja
// template (tokenizer.chat_template, or a file) by npullm's interpreter (text/jinja.hpp) as
// Hugging Face transformers' apply_chat_template renders it: messages (role, content or null,
// tool_calls, tool role messages, any other fields), tools, add_generation_prompt, bos_token,
// eos_token and extra variables (enable_thinking, ...).
//
//   auto t = chat_template::from_vocabulary(tok.vocab());     // parsed once
//   std::string text = t.apply(messages, {.add_generation_prompt = true});
//   tok.encode(text, {.add_special = false, .parse_special = true});
//
// The text is what the template writes, BOS included where the template writes bos_token (as
// transformers' text is); encode it with parse_special, and without adding BOS again where the
// text starts with it. A template that fails (raise_exception, None + str, ...) is npullm's
// error carrying its message; nothing is guessed.
//
// Fallback, for a file that has no template: hand-written formats by name (`named`, below),
// which are npullm's idea of each family's format, not a model's template:
//
//   format      one turn; generation prompt
//   chatml      <|im_start|>ROLE\nTEXT<|im_end|>\n; <|im_start|>assistant\n
//   llama3      <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>;
//               <|start_header_id|>assistant<|end_header_id|>\n\n
//   llama2      [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] ...
//   mistral_v1  [INST] USER [/INST] ANSWER</s> [INST] ...
//   mistral_v3  [INST]USER[/INST] ANSWER</s>[INST]...
//   mistral_v7  [SYSTEM_PROMPT]SYS[/SYSTEM_PROMPT][INST]USER[/INST] ANSWER</s>
//   gemma       <start_of_turn>user\nTEXT<end_of_turn>\n (assistant is "model");
//               <start_of_turn>model\n
//   phi3        <|ROLE|>\nTEXT<|end|>\n; <|assistant|>\n
//
// Conventions of the fallback formats: the text never starts with BOS (encoding with add_special
// adds it, as the vocabulary asks); markers are control tokens, so encode the text with
// parse_special. A system message in a format without one (llama2 without <<SYS>>, mistral v1 / v3,
// gemma) is put before the first user message, separated by a blank line. Roles: system, user,
// assistant (chatml and llama3 take any role name); anything else is invalid_argument.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/text/jinja.hpp"
#include "npullm/text/vocabulary.hpp"

namespace npullm::text {

enum class chat_format {
  chatml,
  llama3,
  llama2,
  llama2_sys,
  mistral_v1,
  mistral_v3,
  mistral_v7,
  gemma,
  phi3
};

struct chat_message {
  std::string role;                    // "system", "user", "assistant", "tool", ...
  std::optional<std::string> content;  // null: an assistant turn that only calls tools
  jinja::json tool_calls = nullptr;    // [{"type": "function", "function": {"name": ...,
                                       //   "arguments": ...}}, ...] or null (none)
  jinja::json fields = nullptr;        // any other fields (an object): tool_call_id, name,
                                       // reasoning_content, ...

  // The message as the template sees it: {"role", "content", ["tool_calls",] fields...}.
  [[nodiscard]] jinja::json to_json() const {
    jinja::json m = jinja::json::object();
    m["role"] = role;
    m["content"] = content ? jinja::json(*content) : jinja::json(nullptr);
    if (!tool_calls.is_null()) m["tool_calls"] = tool_calls;
    if (fields.is_object()) {
      for (auto it = fields.begin(); it != fields.end(); ++it) m[it.key()] = it.value();
    }
    return m;
  }
};

struct chat_options {
  bool add_generation_prompt = true;
  jinja::json tools = nullptr;        // the tool list (an array), or null: no `tools` variable
  jinja::json variables = nullptr;    // more variables (an object): {"enable_thinking": false}
  jinja::render_options render = {};  // strftime_now's date, the limits
};

class chat_template {
 public:
  // Fallback for a file without a template: a hand-written format (see the top of the file).
  explicit chat_template(chat_format f) : format_(f) {}

  // A Jinja template and the texts of its bos_token / eos_token (parsed here, once).
  static chat_template from_jinja(std::string_view source, std::string bos_token = {},
                                  std::string eos_token = {}) {
    chat_template t(chat_format::chatml);
    t.program_ = jinja::template_program::parse(source);
    t.jinja_ = true;
    t.bos_ = std::move(bos_token);
    t.eos_ = std::move(eos_token);
    return t;
  }

  // The vocabulary's template (tokenizer.chat_template) with its BOS / EOS tokens' texts.
  static chat_template from_vocabulary(const vocabulary& v) {
    if (!v.chat_template) {
      raise(error_code::invalid_argument,
            "the vocabulary has no chat template (key 'tokenizer.chat_template'): give a "
            "template file, or name a fallback format (chat_template::named), which is not the "
            "model's template");
    }
    const auto text = [&](std::int32_t id) {
      return id >= 0 && static_cast<std::size_t>(id) < v.tokens.size() ? v.tokens[id].text
                                                                       : std::string();
    };
    return from_jinja(*v.chat_template, text(v.bos), text(v.eos));
  }

  // A fallback format by name: chatml, llama3, llama2, llama2-sys, mistral-v1, mistral-v3,
  // mistral-v7, gemma, phi3.
  static chat_template named(std::string_view name) {
    for (const auto& [n, f] : names()) {
      if (n == name) return chat_template(f);
    }
    raise(error_code::invalid_argument, "chat format '", name,
          "' unknown (chatml, llama3, llama2, llama2-sys, mistral-v1, mistral-v3, mistral-v7, "
          "gemma, phi3)");
  }

  // True for a Jinja template, false for a fallback format.
  [[nodiscard]] bool is_jinja() const noexcept { return jinja_; }
  // The fallback format (meaningless for a Jinja template).
  [[nodiscard]] chat_format format() const noexcept { return format_; }
  // "jinja", or the fallback format's name.
  [[nodiscard]] std::string_view name() const noexcept {
    if (jinja_) return "jinja";
    for (const auto& [n, f] : names()) {
      if (f == format_) return n;
    }
    return {};
  }
  [[nodiscard]] const std::string& bos_token() const noexcept { return bos_; }
  [[nodiscard]] const std::string& eos_token() const noexcept { return eos_; }

  // The prompt text of a conversation, the assistant's turn opened when add_generation_prompt.
  [[nodiscard]] std::string apply(std::span<const chat_message> messages,
                                  const chat_options& options) const {
    if (!jinja_) {
      if (!options.tools.is_null() || !options.variables.is_null()) {
        raise(error_code::unsupported, "the fallback chat format ", name(),
              " takes no tools or variables (only a Jinja template does)");
      }
      return apply_format(messages, options.add_generation_prompt);
    }
    jinja::json list = jinja::json::array();
    for (const auto& m : messages) list.push_back(m.to_json());
    return render(list, options);
  }
  [[nodiscard]] std::string apply(std::span<const chat_message> messages,
                                  bool add_generation_prompt = true) const {
    return apply(messages, chat_options{.add_generation_prompt = add_generation_prompt});
  }

  // The same from messages as JSON (an array of objects, transformers' format).
  [[nodiscard]] std::string apply_json(const jinja::json& messages,
                                       const chat_options& options) const {
    if (!messages.is_array()) {
      raise(error_code::invalid_argument, "chat messages must be a JSON array, not ",
            messages.type_name());
    }
    if (jinja_) return render(messages, options);
    std::vector<chat_message> list;
    for (const auto& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          (m.contains("content") && !m["content"].is_string() && !m["content"].is_null())) {
        raise(error_code::invalid_argument, "the fallback chat format ", name(),
              " takes messages with a string role and a string content, not ", m.dump());
      }
      list.push_back({m["role"].get<std::string>(),
                      m.contains("content") && m["content"].is_string()
                          ? std::optional<std::string>(m["content"].get<std::string>())
                          : std::nullopt});
    }
    return apply(list, options);
  }

 private:
  std::string render(const jinja::json& messages, const chat_options& options) const {
    if (!options.variables.is_null() && !options.variables.is_object()) {
      raise(error_code::invalid_argument, "chat template variables must be a JSON object, not ",
            options.variables.type_name());
    }
    // Copied below: nlohmann::json's copy recurses once a level, so the caller's JSON is
    // bounded first (a request nested 100,000 deep is an error, not a stack overflow).
    jinja::check_json_depth(messages, jinja::max_print_depth, "chat messages");
    jinja::check_json_depth(options.tools, jinja::max_print_depth, "chat tools");
    jinja::check_json_depth(options.variables, jinja::max_print_depth, "chat template variables");
    jinja::json v = options.variables.is_object() ? options.variables : jinja::json::object();
    v["messages"] = messages;
    v["add_generation_prompt"] = options.add_generation_prompt;
    v["bos_token"] = bos_;
    v["eos_token"] = eos_;
    if (!options.tools.is_null()) v["tools"] = options.tools;
    return program_.render(v, options.render);
  }

  [[nodiscard]] std::string apply_format(std::span<const chat_message> messages,
                                         bool add_generation_prompt) const {
    for (const auto& m : messages) check_role(m.role);
    std::string out;
    switch (format_) {
      case chat_format::chatml:
        for (const auto& m : messages)
          out += "<|im_start|>" + m.role + "\n" + text(m) + "<|im_end|>\n";
        if (add_generation_prompt) out += "<|im_start|>assistant\n";
        break;
      case chat_format::llama3:
        for (const auto& m : messages) {
          out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(text(m)) +
                 "<|eot_id|>";
        }
        if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
      case chat_format::phi3:
        for (const auto& m : messages) out += "<|" + m.role + "|>\n" + text(m) + "<|end|>\n";
        if (add_generation_prompt) out += "<|assistant|>\n";
        break;
      case chat_format::gemma: {
        const auto turns = fold_system(messages);
        for (const auto& m : turns) {
          out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n" +
                 trim(text(m)) + "<end_of_turn>\n";
        }
        if (add_generation_prompt) out += "<start_of_turn>model\n";
        break;
      }
      case chat_format::llama2:
      case chat_format::llama2_sys: {
        // [INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] U2 [/INST]
        std::string system;
        bool first_user = true;
        for (const auto& m : messages) {
          if (m.role == "system") {
            system += text(m);
          } else if (m.role == "user") {
            if (!first_user) out += "<s>";
            out += "[INST] ";
            if (first_user && !system.empty()) {
              out += format_ == chat_format::llama2_sys ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n"
                                                        : system + "\n\n";
            }
            out += trim(text(m)) + " [/INST]";
            first_user = false;
          } else {
            out += " " + trim(text(m)) + " </s>";
          }
        }
        break;  // the generation prompt is the open [/INST]
      }
      case chat_format::mistral_v1:
      case chat_format::mistral_v3: {
        const bool v1 = format_ == chat_format::mistral_v1;
        for (const auto& m : fold_system(messages)) {
          if (m.role == "user") {
            out += v1 ? " [INST] " + text(m) + " [/INST]" : "[INST]" + text(m) + "[/INST]";
          } else {
            out += " " + text(m) + "</s>";
          }
        }
        break;
      }
      case chat_format::mistral_v7:
        for (const auto& m : messages) {
          if (m.role == "system") {
            out += "[SYSTEM_PROMPT]" + text(m) + "[/SYSTEM_PROMPT]";
          } else if (m.role == "user") {
            out += "[INST]" + text(m) + "[/INST]";
          } else {
            out += " " + text(m) + "</s>";
          }
        }
        break;
    }
    return out;
  }

 private:
  static constexpr std::array<std::pair<std::string_view, chat_format>, 9> names() {
    return {{{"chatml", chat_format::chatml},
             {"llama3", chat_format::llama3},
             {"llama2", chat_format::llama2},
             {"llama2-sys", chat_format::llama2_sys},
             {"mistral-v1", chat_format::mistral_v1},
             {"mistral-v3", chat_format::mistral_v3},
             {"mistral-v7", chat_format::mistral_v7},
             {"gemma", chat_format::gemma},
             {"phi3", chat_format::phi3}}};
  }

  void check_role(const std::string& role) const {
    if (format_ == chat_format::chatml || format_ == chat_format::llama3) {
      if (role.empty()) raise(error_code::invalid_argument, "chat message with an empty role");
      return;
    }
    if (role != "system" && role != "user" && role != "assistant") {
      raise(error_code::invalid_argument, "chat role '", role,
            "' is not system, user or assistant (format ", name(), ")");
    }
  }

  static std::string text(const chat_message& m) { return m.content.value_or(std::string()); }

  static std::string trim(std::string_view s) {
    const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (!s.empty() && ws(s.front())) s.remove_prefix(1);
    while (!s.empty() && ws(s.back())) s.remove_suffix(1);
    return std::string(s);
  }

  // System messages joined onto the first user message ("SYSTEM\n\nUSER").
  static std::vector<chat_message> fold_system(std::span<const chat_message> messages) {
    std::string system;
    std::vector<chat_message> out;
    for (const auto& m : messages) {
      if (m.role == "system") {
        system += (system.empty() ? "" : "\n\n") + text(m);
        continue;
      }
      out.push_back(m);
      if (m.role == "user" && !system.empty()) {
        out.back().content = system + "\n\n" + text(m);
        system.clear();
      }
    }
    return out;
  }

  chat_format format_;
  bool jinja_ = false;
  jinja::template_program program_;
  std::string bos_, eos_;
};

}  // namespace npullm::text
