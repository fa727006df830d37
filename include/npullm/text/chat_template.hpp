// chat_template: the prompt text of a conversation for the common chat formats, recognized
// from a GGUF file's `tokenizer.chat_template` (a Jinja template) by the markers it writes. No
// Jinja engine: a template that is none of these is `unsupported`, with what was found.
//
//   format      recognized by                        one turn; generation prompt
//   chatml      "<|im_start|>" (Qwen, ...)           <|im_start|>ROLE\nTEXT<|im_end|>\n;
//   <|im_start|>assistant\n llama3      "<|start_header_id|>"
//   <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>;
//                                                    <|start_header_id|>assistant<|end_header_id|>\n\n
//   llama2      "[INST]" (+ "<<SYS>>")               [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST]
//   ANSWER </s><s>[INST] ... mistral_v1  "[INST]" with "' [INST] ' + system"  [INST] USER [/INST]
//   ANSWER</s> [INST] ... mistral_v3  "[INST]" with "[AVAILABLE_TOOLS]"    [INST]USER[/INST]
//   ANSWER</s>[INST]... mistral_v7  "[SYSTEM_PROMPT]"
//   [SYSTEM_PROMPT]SYS[/SYSTEM_PROMPT][INST]USER[/INST] ANSWER</s> gemma       "<start_of_turn>"
//   <start_of_turn>user\nTEXT<end_of_turn>\n (assistant is
//                                                    "model"); <start_of_turn>model\n
//   phi3        "<|assistant|>" and "<|end|>"        <|ROLE|>\nTEXT<|end|>\n; <|assistant|>\n
//
// Conventions: the text never starts with BOS (encoding with add_special adds it, as the
// vocabulary asks); markers are control tokens, so encode the text with parse_special. A
// system message in a format without one (llama2 without <<SYS>>, mistral v1 / v3, gemma)
// is put before the first user message, separated by a blank line. Roles: system, user,
// assistant (chatml and llama3 take any role name); anything else is invalid_argument.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/error.hpp"
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
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class chat_template {
 public:
  explicit chat_template(chat_format f) : format_(f) {}

  // The format a Jinja template writes; anything else is unsupported, quoting its start.
  static chat_template detect(std::string_view jinja) {
    const auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
    if (has("<|im_start|>")) return chat_template(chat_format::chatml);
    if (has("[SYSTEM_PROMPT]")) return chat_template(chat_format::mistral_v7);
    if (has("[INST]")) {
      if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
        return chat_template(has(" [INST]") ? chat_format::mistral_v1 : chat_format::mistral_v3);
      }
      return chat_template(has("<<SYS>>") ? chat_format::llama2_sys : chat_format::llama2);
    }
    if (has("<|assistant|>") && has("<|end|>")) return chat_template(chat_format::phi3);
    if (has("<start_of_turn>")) return chat_template(chat_format::gemma);
    if (has("<|start_header_id|>") && has("<|end_header_id|>"))
      return chat_template(chat_format::llama3);
    std::string start(jinja.substr(0, 120));
    for (char& c : start) c = (c == '\n' || c == '\r') ? ' ' : c;
    raise(error_code::unsupported,
          "chat template not recognized (npullm knows ChatML / Qwen, Llama 3, Llama 2, Mistral, "
          "Gemma and Phi-3 by their markers; there is no general Jinja engine): the template is ",
          jinja.size(), " bytes and starts '", start, jinja.size() > start.size() ? "...'" : "'");
  }

  // The vocabulary's template (tokenizer.chat_template), detected.
  static chat_template from_vocabulary(const vocabulary& v) {
    if (!v.chat_template) {
      raise(error_code::invalid_argument,
            "the vocabulary has no chat template (key 'tokenizer.chat_template'); name a format "
            "instead (chat_template::named)");
    }
    return detect(*v.chat_template);
  }

  // A format by name: chatml, llama3, llama2, mistral-v1, mistral-v3, mistral-v7, gemma, phi3.
  static chat_template named(std::string_view name) {
    for (const auto& [n, f] : names()) {
      if (n == name) return chat_template(f);
    }
    raise(error_code::invalid_argument, "chat format '", name,
          "' unknown (chatml, llama3, llama2, llama2-sys, mistral-v1, mistral-v3, mistral-v7, "
          "gemma, phi3)");
  }

  [[nodiscard]] chat_format format() const noexcept { return format_; }
  [[nodiscard]] std::string_view name() const noexcept {
    for (const auto& [n, f] : names()) {
      if (f == format_) return n;
    }
    return {};
  }

  // The prompt text of `messages`, ending with the assistant's turn opened when
  // add_generation_prompt.
  [[nodiscard]] std::string apply(std::span<const chat_message> messages,
                                  bool add_generation_prompt = true) const {
    for (const auto& m : messages) check_role(m.role);
    std::string out;
    switch (format_) {
      case chat_format::chatml:
        for (const auto& m : messages)
          out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        if (add_generation_prompt) out += "<|im_start|>assistant\n";
        break;
      case chat_format::llama3:
        for (const auto& m : messages) {
          out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
                 "<|eot_id|>";
        }
        if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
      case chat_format::phi3:
        for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
        if (add_generation_prompt) out += "<|assistant|>\n";
        break;
      case chat_format::gemma: {
        const auto turns = fold_system(messages);
        for (const auto& m : turns) {
          out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n" +
                 trim(m.content) + "<end_of_turn>\n";
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
            system += m.content;
          } else if (m.role == "user") {
            if (!first_user) out += "<s>";
            out += "[INST] ";
            if (first_user && !system.empty()) {
              out += format_ == chat_format::llama2_sys ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n"
                                                        : system + "\n\n";
            }
            out += trim(m.content) + " [/INST]";
            first_user = false;
          } else {
            out += " " + trim(m.content) + " </s>";
          }
        }
        break;  // the generation prompt is the open [/INST]
      }
      case chat_format::mistral_v1:
      case chat_format::mistral_v3: {
        const bool v1 = format_ == chat_format::mistral_v1;
        for (const auto& m : fold_system(messages)) {
          if (m.role == "user") {
            out += v1 ? " [INST] " + m.content + " [/INST]" : "[INST]" + m.content + "[/INST]";
          } else {
            out += " " + m.content + "</s>";
          }
        }
        break;
      }
      case chat_format::mistral_v7:
        for (const auto& m : messages) {
          if (m.role == "system") {
            out += "[SYSTEM_PROMPT]" + m.content + "[/SYSTEM_PROMPT]";
          } else if (m.role == "user") {
            out += "[INST]" + m.content + "[/INST]";
          } else {
            out += " " + m.content + "</s>";
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
        system += (system.empty() ? "" : "\n\n") + m.content;
        continue;
      }
      out.push_back(m);
      if (m.role == "user" && !system.empty()) {
        out.back().content = system + "\n\n" + m.content;
        system.clear();
      }
    }
    return out;
  }

  chat_format format_;
};

}  // namespace npullm::text
