// gguf_writer: builds a GGUF version 3 file (layout in gguf.hpp) from metadata and tensors.
//
//   gguf_writer w;                                   // alignment 32 (or gguf_writer w(64))
//   w.add("general.architecture", "qwen2");          // a gguf_meta: number, bool, string, array
//   w.add("qwen2.block_count", std::uint32_t{24});
//   w.add("tokenizer.ggml.tokens", gguf_meta::array(tokens));        // strings or numbers
//   w.add_tensor("token_embd.weight", ggml_type::q8_0, {vocab, hidden}, blocks);  // row-major
//   w.write("model.gguf");                           // temp file + rename; errors are io
//
// Shapes are row-major (outermost first), as gguf_tensor_info::shape() reads them back; the file
// stores them reversed (ne[0] = the last, contiguous dimension). Tensors are laid out in the
// order they were added, each at the next multiple of the alignment, zero padding between.
// A non-default alignment is written as the first key, `general.alignment` (uint32).
//
// add_tensor(span) keeps a view of the bytes: they must stay valid until write() or image();
// add_tensor(std::vector&&) keeps the bytes themselves. Every call checks its arguments (a
// duplicate key or name, a shape the type cannot hold, a byte count that does not match) and
// leaves the writer as it was when it throws.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "npullm/core/error.hpp"
#include "npullm/io/gguf.hpp"

namespace npullm::io {

namespace detail {

template <gguf_number T>
void gguf_store(std::vector<std::byte>& out, T v) {
  if constexpr (std::same_as<T, bool>) {
    out.push_back(std::byte{v ? std::uint8_t{1} : std::uint8_t{0}});
  } else {
    using bits_t = std::conditional_t<
        sizeof(T) == 1, std::uint8_t,
        std::conditional_t<sizeof(T) == 2, std::uint16_t,
                           std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    const auto bits = static_cast<std::uint64_t>(std::bit_cast<bits_t>(v));
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out.push_back(static_cast<std::byte>((bits >> (8 * i)) & 0xffu));
    }
  }
}

inline void gguf_store_string(std::vector<std::byte>& out, std::string_view s) {
  gguf_store<std::uint64_t>(out, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

}  // namespace detail

// A metadata value to write, held encoded as the file stores it (without its type tag).
class gguf_meta {
 public:
  template <gguf_number T>
  gguf_meta(T v) : type_(gguf_type_of<T>) {  // NOLINT: implicit, so add(key, 3u) reads well
    detail::gguf_store<T>(payload_, v);
  }
  gguf_meta(std::string_view s) : type_(gguf_type::string) {  // NOLINT
    detail::gguf_store_string(payload_, s);
  }
  gguf_meta(const char* s) : gguf_meta(std::string_view(s)) {}         // NOLINT
  gguf_meta(const std::string& s) : gguf_meta(std::string_view(s)) {}  // NOLINT

  // An array of numbers, bools or strings: any range of them (a std::vector, a span, ...).
  template <std::ranges::input_range R>
  static gguf_meta array(const R& values) {
    using V = std::remove_cvref_t<std::ranges::range_value_t<R>>;
    if constexpr (gguf_number<V>) {
      gguf_meta m(gguf_type::array);
      m.array_header(gguf_type_of<V>, std::ranges::distance(values));
      for (const auto& v : values) detail::gguf_store<V>(m.payload_, static_cast<V>(v));
      return m;
    } else {
      static_assert(std::is_convertible_v<const V&, std::string_view>,
                    "gguf_meta::array takes numbers, bools (exact GGUF types) or strings; "
                    "for an array of arrays use gguf_meta::array_of");
      gguf_meta m(gguf_type::array);
      m.array_header(gguf_type::string, std::ranges::distance(values));
      for (const auto& v : values) detail::gguf_store_string(m.payload_, std::string_view(v));
      return m;
    }
  }
  // An array whose elements are values of type `element` (arrays nest: element = array).
  static gguf_meta array_of(gguf_type element, std::span<const gguf_meta> elements) {
    gguf_meta m(gguf_type::array);
    m.array_header(element, static_cast<std::ptrdiff_t>(elements.size()));
    for (const gguf_meta& e : elements) {
      if (e.type_ != element) {
        raise(error_code::invalid_argument, "gguf_meta::array_of: an element is ",
              gguf_type_name(e.type_), " in an array of ", gguf_type_name(element));
      }
      m.payload_.insert(m.payload_.end(), e.payload_.begin(), e.payload_.end());
    }
    return m;
  }
  // A value read from a GGUF file, re-encoded (to copy metadata from one file to another).
  static gguf_meta from(const gguf_value& v) {
    return std::visit(
        [](const auto& x) -> gguf_meta {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::same_as<X, gguf_array>) {
            return from_array(x);
          } else {
            return gguf_meta(x);
          }
        },
        v);
  }

  [[nodiscard]] gguf_type type() const noexcept { return type_; }
  // The encoded value: what follows the type tag in the file.
  [[nodiscard]] std::span<const std::byte> payload() const noexcept { return payload_; }

 private:
  explicit gguf_meta(gguf_type t) : type_(t) {}

  void array_header(gguf_type element, std::ptrdiff_t count) {
    detail::gguf_store<std::uint32_t>(payload_, static_cast<std::uint32_t>(element));
    detail::gguf_store<std::uint64_t>(payload_, static_cast<std::uint64_t>(count));
  }
  static gguf_meta from_array(const gguf_array& a) {
    gguf_meta m(gguf_type::array);
    m.array_header(a.type(), static_cast<std::ptrdiff_t>(a.size()));
    if (a.type() == gguf_type::array) {
      for (const gguf_array& e : a.arrays()) {
        const gguf_meta inner = from_array(e);
        m.payload_.insert(m.payload_.end(), inner.payload_.begin(), inner.payload_.end());
      }
    } else {
      // Numbers, bools and strings are stored as the file had them.
      m.payload_.insert(m.payload_.end(), a.raw().begin(), a.raw().end());
    }
    return m;
  }

  gguf_type type_;
  std::vector<std::byte> payload_;
};

class gguf_writer {
 public:
  // alignment: of the data section and of every tensor; a power of two (32 is GGUF's default).
  explicit gguf_writer(std::size_t alignment = 32) : alignment_(alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
        alignment > std::numeric_limits<std::uint32_t>::max()) {
      raise(error_code::invalid_argument, "gguf_writer: alignment ", alignment,
            " is not a power of two that fits in uint32");
    }
  }

  gguf_writer& add(std::string key, gguf_meta value) {
    if (key.empty() || key.size() > gguf_parser::max_key_bytes) {
      raise(error_code::invalid_argument, "gguf_writer: key of ", key.size(),
            " bytes (GGUF allows 1 to 65535)");
    }
    if (key == "general.alignment") {
      raise(error_code::invalid_argument,
            "gguf_writer: general.alignment is written from the constructor's alignment");
    }
    if (keys_.contains(key))
      raise(error_code::invalid_argument, "gguf_writer: duplicate key '", key, "'");
    keys_.insert(key);
    metadata_.emplace_back(std::move(key), std::move(value));
    return *this;
  }

  // A tensor of `type` with a row-major `shape`; `data` (viewed, not copied) holds its bytes.
  gguf_writer& add_tensor(std::string name, ggml_type type, std::vector<std::size_t> shape,
                          std::span<const std::byte> data) {
    check_tensor(name, type, shape, data.size());
    names_.insert(name);
    tensors_.push_back({std::move(name), type, std::move(shape), data, {}, false});
    return *this;
  }
  // The same, keeping the bytes.
  gguf_writer& add_tensor(std::string name, ggml_type type, std::vector<std::size_t> shape,
                          std::vector<std::byte>&& data) {
    check_tensor(name, type, shape, data.size());
    names_.insert(name);
    tensors_.push_back({std::move(name), type, std::move(shape), {}, std::move(data), true});
    return *this;
  }

  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }

  // The whole file in memory.
  [[nodiscard]] std::vector<std::byte> image() const {
    std::vector<std::byte> out;
    emit([&](std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); });
    return out;
  }

  // Writes `path` + ".tmp" and renames it to `path`: an interrupted write leaves no partial file
  // under the final name. Failures are io naming the path.
  void write(const std::filesystem::path& path) const {
    namespace fs = std::filesystem;
    const fs::path tmp = fs::path(path).concat(".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) raise(error_code::io, "cannot write ", tmp.string(), ": ", std::strerror(errno));
      emit([&](std::span<const std::byte> b) {
        out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
      });
      out.flush();
      if (!out) {
        std::error_code ec;
        fs::remove(tmp, ec);
        raise(error_code::io, "writing ", tmp.string(), " failed");
      }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      raise(error_code::io, "cannot rename ", tmp.string(), " to ", path.string(), ": ",
            ec.message());
    }
  }

 private:
  struct tensor_entry {
    std::string name;
    ggml_type type;
    std::vector<std::size_t> shape;   // row-major
    std::span<const std::byte> view;  // the caller's bytes
    std::vector<std::byte> owned;     // or the writer's own
    bool owns = false;
    [[nodiscard]] std::span<const std::byte> data() const noexcept {
      return owns ? std::span<const std::byte>(owned) : view;
    }
  };

  void check_tensor(const std::string& name, ggml_type type, const std::vector<std::size_t>& shape,
                    std::size_t bytes) const {
    if (name.empty() || name.size() > gguf_parser::max_name_bytes) {
      raise(error_code::invalid_argument, "gguf_writer: tensor name '", name, "' of ", name.size(),
            " bytes (GGUF allows 1 to 64)");
    }
    if (names_.contains(name)) {
      raise(error_code::invalid_argument, "gguf_writer: duplicate tensor '", name, "'");
    }
    const auto tr = ggml_traits(type);
    if (tr.block_size == 0) {
      raise(error_code::unsupported, "gguf_writer: tensor '", name, "' has ", ggml_type_name(type),
            ", which npullm does not know");
    }
    if (shape.empty() || shape.size() > 4) {
      raise(error_code::invalid_shape, "gguf_writer: tensor '", name, "' has rank ", shape.size(),
            " (GGUF allows 1 to 4)");
    }
    std::size_t elements = 1;
    for (std::size_t d : shape) {
      if (d > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) ||
          (d != 0 && elements > std::numeric_limits<std::size_t>::max() / d)) {
        raise(error_code::invalid_shape, "gguf_writer: tensor '", name, "' shape ",
              npullm::detail::format_list(shape), " is too large");
      }
      elements *= d;
    }
    if (shape.back() % tr.block_size != 0) {
      raise(error_code::invalid_shape, "gguf_writer: tensor '", name, "' shape ",
            npullm::detail::format_list(shape), ": the last dimension is not a multiple of ",
            tr.name, "'s block size ", tr.block_size);
    }
    const std::size_t blocks = elements / tr.block_size;
    if (blocks > std::numeric_limits<std::size_t>::max() / tr.block_bytes ||
        blocks * tr.block_bytes != bytes) {
      raise(error_code::invalid_shape, "gguf_writer: tensor '", name, "' is ", tr.name, " ",
            npullm::detail::format_list(shape), " but has ", bytes, " bytes of data");
    }
  }

  std::size_t padding(std::size_t at) const noexcept {
    return (alignment_ - at % alignment_) % alignment_;
  }

  // Hands the file to `sink` in pieces, front to back.
  template <class Sink>
  void emit(Sink&& sink) const {
    std::vector<std::byte> head;
    head.insert(head.end(), {std::byte{'G'}, std::byte{'G'}, std::byte{'U'}, std::byte{'F'}});
    detail::gguf_store<std::uint32_t>(head, 3);
    detail::gguf_store<std::uint64_t>(head, tensors_.size());
    const bool custom = alignment_ != 32;
    detail::gguf_store<std::uint64_t>(head, metadata_.size() + (custom ? 1 : 0));
    auto put_kv = [&](std::string_view key, const gguf_meta& v) {
      detail::gguf_store_string(head, key);
      detail::gguf_store<std::uint32_t>(head, static_cast<std::uint32_t>(v.type()));
      head.insert(head.end(), v.payload().begin(), v.payload().end());
    };
    if (custom) put_kv("general.alignment", gguf_meta(static_cast<std::uint32_t>(alignment_)));
    for (const auto& [key, value] : metadata_) put_kv(key, value);
    std::size_t offset = 0;  // in the data section
    for (const tensor_entry& t : tensors_) {
      detail::gguf_store_string(head, t.name);
      detail::gguf_store<std::uint32_t>(head, static_cast<std::uint32_t>(t.shape.size()));
      for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) {
        detail::gguf_store<std::uint64_t>(head, *d);  // ne[0] first: the last row-major dim
      }
      detail::gguf_store<std::uint32_t>(head, static_cast<std::uint32_t>(t.type));
      detail::gguf_store<std::uint64_t>(head, offset);
      offset += t.data().size() + padding(t.data().size());
    }
    sink(std::span<const std::byte>(head));
    const std::array<std::byte, 4096> zeros{};
    auto pad = [&](std::size_t n) {
      for (; n > 0; n -= std::min(n, zeros.size()))
        sink(std::span(zeros).first(std::min(n, zeros.size())));
    };
    pad(padding(head.size()));
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      sink(tensors_[i].data());
      // Zeros up to the next tensor; the last one ends the file.
      if (i + 1 < tensors_.size()) pad(padding(tensors_[i].data().size()));
    }
  }

  std::size_t alignment_;
  std::vector<std::pair<std::string, gguf_meta>> metadata_;
  std::set<std::string, std::less<>> keys_;
  std::vector<tensor_entry> tensors_;
  std::set<std::string, std::less<>> names_;
};

}  // namespace npullm::io
