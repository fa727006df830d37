// npullm::error: the one exception type of the library.
//
// Every public entry point checks its arguments and throws `npullm::error` (and nothing else
// but std::bad_alloc) with a code and a message that names the values involved ("row 7 out of
// range for batch of 4"). A call that throws leaves every structure it was given as it was
// before the call. A caller that adds context re-raises with the same code and e.message()
// (not what(), which carries the "npullm <code>: " prefix once).
//
// One code per condition, across the library:
//
//   condition                                                            code
//   ------------------------------------------------------------------   ------------------
//   views, operands or tensors whose shapes do not fit together          invalid_shape
//   (an op's x/W/y, a KV tile, a file tensor against config.json)
//   an index, slice, row, block id or request id outside what exists     out_of_range
//   more tokens than a fixed capacity holds: the KV cache or block       capacity_exhausted
//   pool, max_sequence, a static prompt, the rows of a decode or step
//   a dtype other than the one a call or pipeline is configured for,     unsupported
//   and input this build or backend does not handle (a model_type, a
//   layout, generation through a scoring executor)
//   a value wrong whatever the shapes: a token id outside the            invalid_argument
//   vocabulary, an empty prompt, a zero count, options that contradict
//   each other or the pipeline, a call in the wrong state
//   a failure the execution backend reports (Level Zero, ...)            backend
//   reading or mapping a file failed                                     io
//   a file or buffer whose contents are malformed                        corrupt_data
//   the system refused a resource other than memory (a thread_pool's     resource
//   threads); memory itself stays std::bad_alloc
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "npullm/core/isa.hpp"

namespace npullm {

enum class error_code {
  invalid_shape,       // shapes or extents that do not fit together
  out_of_range,        // an index or slice outside an extent
  capacity_exhausted,  // a fixed capacity (KV cache, block pool, prompt length) is full
  unsupported,         // valid input that this build or backend does not handle
  invalid_argument,    // a value that is wrong whatever the shapes
  backend,             // a failure reported by the execution backend (Level Zero, ...)
  io,                  // reading or mapping a file failed
  corrupt_data,        // a file or buffer whose contents are malformed
  resource,            // the system refused a resource other than memory (a thread)
};

constexpr std::string_view to_string(error_code code) noexcept {
  switch (code) {
    case error_code::invalid_shape: return "invalid_shape";
    case error_code::out_of_range: return "out_of_range";
    case error_code::capacity_exhausted: return "capacity_exhausted";
    case error_code::unsupported: return "unsupported";
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::backend: return "backend";
    case error_code::io: return "io";
    case error_code::corrupt_data: return "corrupt_data";
    case error_code::resource: return "resource";
  }
  return "unknown";
}

// The type is the same in every translation unit, whatever its ISA (core/isa.hpp), so that an
// engine catches it from any ISA's kernels; its constructor, whose string code the compiler
// vectorizes per ISA, is always inlined (as float16's conversions are), so that no copy of it is
// emitted that the linker could pick for a translation unit of another ISA.
class error : public std::runtime_error {
 public:
  // what() reads "npullm <code>: <message>".
  [[gnu::always_inline]] error(error_code code, const std::string& message)
      : std::runtime_error("npullm " + std::string(to_string(code)) + ": " + message),
        code_(code),
        prefix_(what_prefix(code)) {}

  [[nodiscard]] error_code code() const noexcept { return code_; }
  // The message without the "npullm <code>: " prefix: what a re-raise appends to its context.
  [[nodiscard]] std::string_view message() const noexcept { return what() + prefix_; }

 private:
  static constexpr std::size_t what_prefix(error_code code) noexcept {
    return std::string_view("npullm ").size() + to_string(code).size() + 2;
  }

  error_code code_;
  std::size_t prefix_;  // characters of what() before the message
};

// The messages are built and thrown by code of the translation unit's ISA (string formatting
// is vectorized per ISA like any other loop).
namespace detail {
inline namespace NPULLM_ISA_NAMESPACE {

// Builds a message from streamable parts: concat("row ", r, " of ", n).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Prints a sequence as "[a, b, c]" for messages that name shapes.
template <class Range>
std::string format_list(const Range& values) {
  std::ostringstream out;
  out << '[';
  bool first = true;
  for (const auto& v : values) {
    out << (first ? "" : ", ") << v;
    first = false;
  }
  out << ']';
  return out.str();
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace detail

inline namespace NPULLM_ISA_NAMESPACE {

// Throws npullm::error(code, concat(parts...)). Kept out of line of hot code by [[noreturn]].
template <class... Parts>
[[noreturn]] void raise(error_code code, const Parts&... parts) {
  throw error(code, detail::concat(parts...));
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm
