// libFuzzer harness over the Jinja interpreter (text/jinja.hpp): an input is a template source,
// optionally followed by a NUL byte and the variables as JSON (a default conversation with
// messages, tools and tool calls when absent or not a JSON object). For every input:
//   - parsing either succeeds or throws npullm::error (a syntax error, an unsupported
//     construct, nesting too deep), nothing else;
//   - rendering, under small render_limits, either gives text within the output limit or throws
//     npullm::error; never a crash (the sanitizers), another exception, or a hang (the loop,
//     recursion and output limits);
//   - rendering twice gives the same text (render keeps no state).
// The corpus holds size bombs (replace / indent / '*' / tojson / join, doubling and quadratic
// appending loops) and long chains (filters, attributes, elifs, operators) to grow from.
// Built with clang when available (target fuzz_jinja); test_jinja replays the corpus
// (tests/text/corpus_jinja) through the same checks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "npullm/text/jinja.hpp"

namespace npullm_fuzz_jinja {

namespace jinja = npullm::text::jinja;

struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what) {
  if (!ok) throw violation(what);
}

inline const jinja::json& default_variables() {
  static const jinja::json v = jinja::json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp_c\": 21}"},
      {"role": "assistant", "content": "<think>\nwarm\n</think>\n\n21 °C."},
      {"role": "user", "content": "Thanks"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false
  })");
  return v;
}

// The options every input renders with: small limits keep each input fast (a size bomb is
// refused at 64 KiB of text, 4,096 items or 16 MiB of work, whatever it would have made) and a
// fixed date.
inline jinja::render_options fuzz_options() {
  jinja::render_options options;
  options.limits = {.max_output_bytes = 1 << 16,
                    .max_iterations = 1 << 12,
                    .max_call_depth = 16,
                    .max_items = 1 << 12,
                    .max_work_bytes = 1 << 24};
  std::tm date{};
  date.tm_year = 124, date.tm_mon = 6, date.tm_mday = 26;
  options.now = date;
  return options;
}

// The checks on what two renders of one input gave (a text, or nullopt where the render threw
// npullm::error): the text within max_output bytes; the second render as the first (render
// keeps no state). A violation is thrown otherwise.
inline void check_renders(const std::optional<std::string>& first,
                          const std::optional<std::string>& second, std::size_t max_output) {
  if (first) require(first->size() <= max_output, "output within the limit");
  if (second) {
    require(first.has_value() && *second == *first, "a second render gives the same text");
  } else {
    require(!first.has_value(), "a second render fails as the first did");
  }
}

inline void run_one(std::string_view input) {
  const std::size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  jinja::json vars = default_variables();
  if (nul != std::string_view::npos) {
    const std::string_view text = input.substr(nul + 1);
    jinja::json parsed = jinja::json::parse(text.begin(), text.end(), nullptr, false);
    if (parsed.is_object()) vars = std::move(parsed);
  }
  std::optional<jinja::template_program> program;
  try {
    program = jinja::template_program::parse(source, {.max_depth = 64});
  } catch (const npullm::error&) {
    return;  // refused, with a message: fine
  }
  const jinja::render_options options = fuzz_options();
  const auto render = [&]() -> std::optional<std::string> {
    try {
      return program->render(vars, options);
    } catch (const npullm::error&) {
      return std::nullopt;  // refused, with a message: fine
    }
  };
  const std::optional<std::string> first = render();
  const std::optional<std::string> second = render();
  check_renders(first, second, options.limits.max_output_bytes);
}

}  // namespace npullm_fuzz_jinja

#ifndef NPULLM_JINJA_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_jinja::run_one({reinterpret_cast<const char*>(data), size});
  } catch (const npullm_fuzz_jinja::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
