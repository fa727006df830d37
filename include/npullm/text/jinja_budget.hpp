// jinja_budget: what one render of a Jinja template may use (render_limits, render_options)
// and the accounting that holds a render to it (render_budget): a string is checked against
// max_output_bytes before it is allocated, a list against max_items, loop iterations against
// max_iterations, and the bytes made, written or scanned are counted against max_work_bytes.
// The interpreter is a chain of classes, each deriving from the one before: render_budget,
// string_ops (text/jinja_strings.hpp), value_ops (text/jinja_operators.hpp), method_ops
// (text/jinja_methods.hpp), filter_ops (text/jinja_filters.hpp) and the evaluator
// (text/jinja.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "npullm/text/jinja_ops.hpp"
#include "npullm/text/jinja_print.hpp"
#include "npullm/text/jinja_value.hpp"

namespace npullm::text::jinja {

// What one render may use; past any of them the render is capacity_exhausted naming it.
// The defaults keep a render within about 1 GiB of memory and a few seconds.
struct render_limits {
  std::size_t max_output_bytes = std::size_t{16} << 20;  // the text, and any string made
  std::size_t max_iterations = std::size_t{1} << 20;     // loop iterations of one render
  std::size_t max_call_depth = 64;                       // macro calls inside macro calls
  std::size_t max_depth = 1024;  // expressions and statements evaluated inside one another
                                 // (macro calls' bodies included): the interpreter's recursion
  std::size_t max_items = std::size_t{1} << 20;  // elements of any list made (48 bytes each)
  // Bytes of strings and lists made, output written and text scanned by the operations of
  // one render, all together (a comparison of two values counts 16): bounds the time of a
  // render that makes or scans big values many times (quadratic appends, a 16 MiB string
  // copied in each of 10^6 iterations) to about a second.
  std::size_t max_work_bytes = std::size_t{1} << 30;
};

struct render_options {
  // strftime_now's date and time (a std::tm as localtime gives it); absent: the current local
  // time.
  std::optional<std::tm> now;
  render_limits limits;
};

// The limits of one render and what it has used so far: the base of the interpreter.
class render_budget : protected python_ops {
 public:
  explicit render_budget(const render_options& opt) : opt_(opt) {}

 protected:
  // Strings made are bounded by max_output_bytes, checked before they are allocated.
  [[nodiscard]] text_bound bound(int line) const { return {opt_.limits.max_output_bytes, line}; }
  // A string of n bytes about to be made: refused past the limit, else counted as work.
  void check_size(std::size_t n, int line) const {
    if (n > opt_.limits.max_output_bytes) {
      fail_limit(line, "text of ", std::to_string(n), " bytes exceeds the limit of ",
                 std::to_string(opt_.limits.max_output_bytes),
                 " (render_limits::max_output_bytes)");
    }
    made(n, line);
  }
  // A list of n elements about to be made: refused past max_items, else counted as work.
  void check_items(std::size_t n, int line) const {
    if (n > opt_.limits.max_items) {
      fail_limit(line, "a list of ", std::to_string(n), " items exceeds the limit of ",
                 std::to_string(opt_.limits.max_items), " (render_limits::max_items)");
    }
    made(n * sizeof(value), line);
  }
  // bytes of work done (made, written or scanned): refused past max_work_bytes in all.
  void made(std::size_t bytes, int line) const {
    work_ += bytes;
    if (work_ > opt_.limits.max_work_bytes) {
      fail_limit(line, "more than ", std::to_string(opt_.limits.max_work_bytes),
                 " bytes of strings and lists made or scanned in one render "
                 "(render_limits::max_work_bytes)");
    }
  }
  // The items of v (iterate) once their number is known to be within max_items.
  std::vector<value> items_of(const value& v, int line) const {
    if (v.is(value_kind::array) || v.is(value_kind::object)) {
      check_items(v.size(), line);
    } else if (v.is(value_kind::string)) {
      made(v.s.size(), line);
      check_items(detail_eval::char_count(v.s), line);
    }
    return iterate(v, line);
  }
  // str(v), bounded by max_output_bytes as it is made, counted as work.
  std::string str_of(const value& v, int line) const {
    std::string s = to_str(v, bound(line));
    made(s.size(), line);
    return s;
  }
  // v itself when a string, else str(v) as a string value.
  value text_of(const value& v, int line) const {
    return v.is(value_kind::string) ? v : value::string(str_of(v, line));
  }
  void count_iteration(int line) {
    if (++iterations_ > opt_.limits.max_iterations) {
      fail_limit(line, "more than ", std::to_string(opt_.limits.max_iterations),
                 " loop iterations (render_limits)");
    }
  }

  const render_options& opt_;
  mutable std::size_t work_ = 0;  // bytes made or scanned (render_limits::max_work_bytes)
  std::size_t iterations_ = 0;
};

}  // namespace npullm::text::jinja
