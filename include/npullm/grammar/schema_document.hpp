// schema_document: a JSON Schema's text parsed into an ordered_json in linear time with its
// nesting bounded (linear_json_parser), and the depth check of a document given as a value
// (check_json_depth), both refusing past grammar_limits::max_depth before anything recurses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npullm/core/error.hpp"
#include "npullm/grammar/schema_common.hpp"

namespace npullm::grammar {

namespace detail {

// Parses JSON text into an ordered_json in linear time, refusing nesting past max_depth before
// building it: nlohmann's own parser inserts each member of an ordered_json object by a linear
// search of the members before it (a schema of 100,000 properties took 20 s to parse). A
// member is appended to the object's vector with an index of its keys beside it (a repeated
// key keeps its first place and its last value, as nlohmann's parser does). Only the
// innermost open container grows while it is open, so the pointers to the open ones stay valid.
class linear_json_parser : public nlohmann::json_sax<json> {
 public:
  explicit linear_json_parser(std::uint32_t max_depth) : max_depth_(max_depth) {}

  json parse(std::string_view text) {
    json::sax_parse(text.begin(), text.end(), this);
    return std::move(root_);
  }

  bool null() override { return put(json(nullptr)); }
  bool boolean(bool v) override { return put(json(v)); }
  bool number_integer(number_integer_t v) override { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)); }
  bool string(string_t& v) override { return put(json(std::move(v))); }
  bool binary(binary_t&) override { return put(json()); }  // not in JSON text
  bool start_object(std::size_t) override { return open(json::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    raise(error_code::invalid_argument, "JSON Schema is not valid JSON: ", e.what());
  }

 private:
  struct frame {
    json* v;
    std::unordered_map<std::string, std::size_t> keys;  // objects: member -> place
  };
  json* place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    frame& f = open_.back();
    if (f.v->is_array()) {
      auto& a = f.v->get_ref<json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    auto& o = f.v->get_ref<json::object_t&>();
    const auto [it, inserted] = f.keys.emplace(key_, o.size());
    if (!inserted) {
      auto& member = (o.begin() + static_cast<std::ptrdiff_t>(it->second))->second;
      member = std::move(v);
      return &member;
    }
    o.emplace_back(std::move(key_), std::move(v));  // the vector's own: no search
    return &o.back().second;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (open_.size() + 1 > max_depth_)
      raise(error_code::capacity_exhausted, "JSON Schema: the document is nested deeper than ",
            max_depth_, " levels (grammar_limits::max_depth)");
    json* p = place(std::move(v));
    open_.push_back({p, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::uint32_t max_depth_;
  json root_;
  std::string key_;
  std::vector<frame> open_;
};

// Refuses a document nested deeper than max_depth (objects and arrays), without recursion: the
// compiler, nlohmann's dump() and comparisons recurse on a schema's values (a const of
// 100,000 nested arrays), and they run only on documents within the depth budget.
inline void check_json_depth(const json& doc, std::uint32_t max_depth) {
  std::vector<std::pair<const json*, std::uint32_t>> todo{{&doc, 1}};
  while (!todo.empty()) {
    const auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (d > max_depth)
      raise(error_code::capacity_exhausted, "JSON Schema: the document is nested deeper than ",
            max_depth, " levels (grammar_limits::max_depth)");
    for (const auto& x : *v)
      if (x.is_structured()) todo.emplace_back(&x, d + 1);
  }
}

}  // namespace detail

}  // namespace npullm::grammar
