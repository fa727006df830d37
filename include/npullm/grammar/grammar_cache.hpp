// grammar_cache: compiled token grammars kept by their text, for an engine or a server that
// sees the same GBNF grammar or JSON Schema on many requests (a tool's schema on every call):
// the first request compiles it (the grammar, its automaton, its mask cache), later ones share
// that token_grammar and the masks it has already computed.
//
//   grammar_cache cache(token_index_of_the_vocabulary, capacity);
//   auto g = cache.json_schema(R"({"type": "object", ...})");   // or cache.gbnf("root ::= ...")
//   batch::grammar_processor p(g, prompt.size());               // one per sequence
//
// The key is the exact text with its kind and options (two texts that differ in whitespace are
// two entries). At most `capacity` grammars are kept, and at most `max_bytes` of them (default
// 256 MiB, counted by token_grammar::bytes(): automata and cached masks, which grow as masks
// are asked for; checked at each request), the least recently asked for leaving first (the one
// just asked for stays); a grammar that left stays alive while a matcher holds it. Each grammar
// is made with the cache's grammar_memory (token_matcher.hpp: its own mask and automaton
// budgets).
//
// Thread-safe: requests from several threads for a text not yet compiled compile it once (the
// others wait for it); a text that fails to compile raises the same error to each of them and
// is not kept (the cache is as before). The token_grammars it returns are thread-safe
// themselves (token_matcher.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "npullm/core/error.hpp"
#include "npullm/grammar/gbnf.hpp"
#include "npullm/grammar/json_schema.hpp"
#include "npullm/grammar/token_matcher.hpp"

namespace npullm::grammar {

class grammar_cache {
 public:
  static constexpr std::size_t default_max_bytes = std::size_t{256} << 20;

  grammar_cache(std::shared_ptr<const token_index> index, std::size_t capacity = 64,
                std::size_t max_bytes = default_max_bytes, grammar_memory memory = {})
      : index_(std::move(index)), capacity_(capacity), max_bytes_(max_bytes), memory_(memory) {
    if (!index_) raise(error_code::invalid_argument, "grammar_cache: no token_index");
    if (capacity_ == 0) raise(error_code::invalid_argument, "grammar_cache: capacity 0");
  }

  // The grammar of GBNF text (gbnf.hpp's errors if it does not parse).
  std::shared_ptr<token_grammar> gbnf(std::string_view text) {
    return get(key('g', 0, text), [&] { return parse_gbnf(text); });
  }
  // The grammar of a JSON Schema's text (json_schema.hpp's errors if it cannot be compiled).
  std::shared_ptr<token_grammar> json_schema(std::string_view schema_text,
                                             json_schema_options opt = {}) {
    // The limits are part of the key too (a fixed-size suffix after the text).
    std::string k = key('j', static_cast<char>(opt.whitespace), schema_text);
    for (const std::size_t v :
         {std::size_t{opt.limits.max_depth}, opt.limits.max_rules, opt.limits.max_elements,
          opt.limits.max_bytes, opt.limits.max_schema_work})
      k.append(reinterpret_cast<const char*>(&v), sizeof v);
    return get(std::move(k), [&] { return json_schema_grammar(schema_text, opt); });
  }

  [[nodiscard]] std::size_t size() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t max_bytes() const noexcept { return max_bytes_; }
  // Bytes of the grammars kept now (token_grammar::bytes()).
  [[nodiscard]] std::size_t bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return kept_bytes();
  }
  // Requests answered from the cache / compiled (failed compilations included).
  [[nodiscard]] std::size_t hits() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }
  [[nodiscard]] std::size_t misses() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return misses_;
  }
  [[nodiscard]] const std::shared_ptr<const token_index>& index() const noexcept { return index_; }

 private:
  using future = std::shared_future<std::shared_ptr<token_grammar>>;
  struct entry {
    future value;
    std::uint64_t id = 0;                   // which compilation made it
    std::list<std::string>::iterator used;  // its place in order_
    std::shared_ptr<token_grammar> made;    // once compiled (for its bytes)
  };

  static std::string key(char kind, char option, std::string_view text) {
    std::string k;
    k.reserve(text.size() + 2);
    k += kind;
    k += option;
    k.append(text);
    return k;
  }

  template <class Compile>
  std::shared_ptr<token_grammar> get(std::string k, Compile compile) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (const auto it = entries_.find(k); it != entries_.end()) {
      ++hits_;
      order_.splice(order_.begin(), order_, it->second.used);
      future f = it->second.value;
      trim();  // the grammars grew since the last request
      lock.unlock();
      return f.get();  // waits while another thread compiles it
    }
    ++misses_;
    std::promise<std::shared_ptr<token_grammar>> promise;
    const future f = promise.get_future().share();
    const std::uint64_t id = ++compilations_;
    order_.push_front(k);
    entries_.emplace(k, entry{f, id, order_.begin(), nullptr});
    lock.unlock();
    try {
      auto g = std::make_shared<token_grammar>(compile(), index_, memory_);
      promise.set_value(g);
      lock.lock();  // made: now the least recently used leave (not before: a failure keeps them)
      if (const auto it = entries_.find(k); it != entries_.end() && it->second.id == id)
        it->second.made = g;
      trim();
      return g;
    } catch (...) {
      promise.set_exception(std::current_exception());
      lock.lock();
      if (const auto it = entries_.find(k); it != entries_.end() && it->second.id == id) {
        order_.erase(it->second.used);
        entries_.erase(it);
      }
      throw;
    }
  }

  std::size_t kept_bytes() const {
    std::size_t total = 0;
    for (const auto& [k, e] : entries_)
      if (e.made) total += e.made->bytes();
    return total;
  }
  // Under mutex_: the least recently asked for leave while over the count or the bytes; the
  // most recent stays (a grammar alone over the budget is still served).
  void trim() {
    while (entries_.size() > capacity_) {
      entries_.erase(order_.back());
      order_.pop_back();
    }
    std::size_t total = kept_bytes();
    while (total > max_bytes_ && entries_.size() > 1) {
      const auto it = entries_.find(order_.back());
      if (it->second.made) total -= std::min(total, it->second.made->bytes());
      entries_.erase(it);
      order_.pop_back();
    }
  }

  std::shared_ptr<const token_index> index_;
  std::size_t capacity_ = 0;
  std::size_t max_bytes_ = default_max_bytes;
  grammar_memory memory_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, entry> entries_;
  std::list<std::string> order_;  // keys, most recently asked for first
  std::size_t hits_ = 0, misses_ = 0;
  std::uint64_t compilations_ = 0;
};

}  // namespace npullm::grammar
