// gguf: memory-mapped GGUF (version 3) model files, the format of llama.cpp, with zero-copy
// views of the tensor data. The sibling of safetensors.hpp; gguf_writer.hpp writes them. This
// header is the reading (the parser and the mapped file); the type tables, metadata values,
// tensor infos and the parsed header it fills are in gguf_types.hpp (included here).
//
// File layout, every field little-endian and packed (no padding unless said):
//   "GGUF" | u32 version (3) | u64 tensor_count | u64 kv_count
//   kv_count     x { string key | u32 value type | value }
//   tensor_count x { string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset }
//   zero padding up to a multiple of the alignment (`general.alignment`, default 32)
//   the data section: each tensor at `offset` from its start, a multiple of the alignment
// A string is a u64 byte count and that many bytes (no terminator). An array value is a u32
// element type, a u64 element count and the elements, which may themselves be arrays.
//
// Shapes. GGUF lists the dimensions innermost first: ne[0] is the contiguous one. A linear
// weight with N outputs and K inputs, row-major (N, K), is stored with ne = [K, N]:
//   gguf_tensor_info::ne       ggml order, ne[0] contiguous; entries past n_dims are 1
//   gguf_tensor_info::shape()  row-major, outermost first: {N, K} for that weight
// view<T, Rank>() takes the row-major shape, like safetensors_file::view.
//
//   parse_gguf(bytes, file)    validates a whole file image (used by gguf_file and the fuzzer)
//   gguf_file::open(path)      maps a file (io errors name the path) and parses it
//   get<T>(key), find<T>(key)  metadata of exactly type T (find: std::nullopt when absent);
//                              get_uint / get_float accept any integer / floating type
//   info(name), bytes(name)    a tensor's description and its bytes, zero-copy
//   view<T, Rank>(name)        a (shape...) view of an F32, F16 or BF16 tensor as float,
//                              float16 or bfloat16
//
// What open checks (all corrupt_data naming the file and what is wrong, unless said):
// - the magic; version 3 (any other version is `unsupported`, naming it; a version field that
//   reads byte-swapped, as a big-endian file's does, is `unsupported` as big-endian);
// - every length and count against the bytes left before it is used (a truncated header, a
//   string or array past the end), so an absurd count never allocates;
// - value types 0..12, bools 0 or 1, arrays nested at most 64 deep, keys non-empty, at most
//   65535 bytes and unique; `general.alignment`, when present, a uint32 power of two;
// - tensors: a name of 1..64 bytes, unique; n_dims 1..4; element count and byte size without
//   overflow (every ne at most INT64_MAX, as ggml requires); ne[0] a multiple of the type's
//   block size; an offset that is a multiple of the alignment and lies in the data section;
//   the byte range inside the file; no two byte ranges overlapping.
// A ggml type id this table does not know (a newer format, or one ggml removed) is kept: the
// tensor is listed and its offset checked, but its size cannot be computed, so bytes() and
// view() refuse it as `unsupported`, naming the tensor and the id, and the size and overlap
// checks cannot include it. Every tensor of a known type passes every check above.
//
// Not checked: that strings are valid UTF-8, that keys follow the lower_snake_case convention,
// that tensors are stored in the order they are listed (ggml's own reader asks that; the spec
// does not). A missing key or tensor is corrupt_data, as a missing safetensors tensor is.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/io/gguf_types.hpp"
#include "npullm/io/safetensors.hpp"  // mapped_file: the read-only mmap both formats use

namespace npullm::io {

// ---- the parser -------------------------------------------------------------------------------

// Reads a file image front to back. Every read checks the bytes left first.
struct gguf_parser {
  static constexpr std::size_t max_depth = 64;  // nested arrays
  static constexpr std::size_t max_key_bytes = 65535;
  static constexpr std::size_t max_name_bytes = 64;

  gguf_parser(std::span<const std::byte> image, std::string_view name) : bytes(image), file(name) {}

  std::span<const std::byte> bytes;
  std::string_view file;
  std::size_t pos = 0;
  std::string_view where;  // the key or tensor being read, for messages

  [[noreturn]] void fail(const std::string& what) const {
    if (where.empty()) raise(error_code::corrupt_data, "GGUF ", file, ": ", what);
    raise(error_code::corrupt_data, "GGUF ", file, ": ", where, ": ", what);
  }
  [[nodiscard]] std::size_t left() const noexcept { return bytes.size() - pos; }

  const std::byte* take(std::size_t n, std::string_view what) {
    if (n > left()) {
      fail(npullm::detail::concat("truncated: ", what, " at byte ", pos, " needs ", n, " bytes, ",
                                  left(), " left in the file"));
    }
    const std::byte* p = bytes.data() + pos;
    pos += n;
    return p;
  }
  template <gguf_number T>
  T read(std::string_view what) {
    return detail::gguf_load<T>(take(sizeof(T), what));
  }
  std::string_view string(std::string_view what) {
    const std::size_t at = pos;
    const auto n = read<std::uint64_t>(what);
    if (n > left()) {
      fail(npullm::detail::concat(what, " at byte ", at, " has length ", n,
                                  ", past the end of the file (", left(), " bytes left)"));
    }
    const char* p = reinterpret_cast<const char*>(take(static_cast<std::size_t>(n), what));
    return {p, static_cast<std::size_t>(n)};
  }
  gguf_type value_type(std::string_view what) {
    const std::size_t at = pos;
    const auto t = read<std::uint32_t>(what);
    if (t > static_cast<std::uint32_t>(gguf_type::float64)) {
      fail(npullm::detail::concat("bad ", what, " ", t, " at byte ", at,
                                  " (GGUF value types are 0..12)"));
    }
    return static_cast<gguf_type>(t);
  }
  bool boolean() {
    const std::size_t at = pos;
    const auto b = std::to_integer<std::uint8_t>(*take(1, "bool"));
    if (b > 1)
      fail(npullm::detail::concat("bad bool value ", unsigned{b}, " at byte ", at,
                                  " (must be 0 or 1)"));
    return b == 1;
  }

  template <gguf_number T>
  gguf_value number(std::string_view what) {
    return gguf_value(std::in_place_type<T>, read<T>(what));
  }

  gguf_value value(gguf_type t, std::size_t depth) {
    switch (t) {
      case gguf_type::uint8: return number<std::uint8_t>("uint8 value");
      case gguf_type::int8: return number<std::int8_t>("int8 value");
      case gguf_type::uint16: return number<std::uint16_t>("uint16 value");
      case gguf_type::int16: return number<std::int16_t>("int16 value");
      case gguf_type::uint32: return number<std::uint32_t>("uint32 value");
      case gguf_type::int32: return number<std::int32_t>("int32 value");
      case gguf_type::float32: return number<float>("float32 value");
      case gguf_type::boolean: return gguf_value(std::in_place_type<bool>, boolean());
      case gguf_type::string:
        return gguf_value(std::in_place_type<std::string_view>, string("string value"));
      case gguf_type::array: return gguf_value(std::in_place_type<gguf_array>, array(depth));
      case gguf_type::uint64: return number<std::uint64_t>("uint64 value");
      case gguf_type::int64: return number<std::int64_t>("int64 value");
      case gguf_type::float64: return number<double>("float64 value");
    }
    fail("bad value type");  // value_type() let no other through
  }

  gguf_array array(std::size_t depth) {
    if (depth >= max_depth) fail(npullm::detail::concat("arrays nested deeper than ", max_depth));
    gguf_array a;
    a.type_ = value_type("array element type");
    const std::size_t at = pos;
    const auto n = read<std::uint64_t>("array length");
    // The least each element takes: its size, a string's length field, an array's type + count.
    const std::size_t fixed = gguf_type_size(a.type_);
    const std::size_t least = fixed != 0 ? fixed : a.type_ == gguf_type::string ? 8 : 12;
    if (n > left() / least) {
      fail(npullm::detail::concat("array at byte ", at, " claims ", n, " ", gguf_type_name(a.type_),
                                  " elements, more than the ", left(), " bytes left can hold"));
    }
    a.size_ = static_cast<std::size_t>(n);
    a.data_ = bytes.data() + pos;
    const std::size_t begin = pos;
    if (a.type_ == gguf_type::boolean) {
      for (std::size_t i = 0; i < a.size_; ++i) (void)boolean();
    } else if (fixed != 0) {
      (void)take(a.size_ * fixed, "array elements");  // no overflow: a.size_ <= left() / fixed
    } else if (a.type_ == gguf_type::string) {
      a.strings_.reserve(a.size_);  // <= left() / 8 views: bounded by the file size
      for (std::size_t i = 0; i < a.size_; ++i) a.strings_.push_back(string("array string"));
    } else {
      for (std::size_t i = 0; i < a.size_; ++i) a.arrays_.push_back(array(depth + 1));
    }
    a.bytes_ = pos - begin;
    return a;
  }

  gguf_header parse() {
    gguf_header h;
    h.file = std::string(file);
    if (bytes.size() < 24) {
      fail(npullm::detail::concat("truncated: the header needs 24 bytes, the file has ",
                                  bytes.size()));
    }
    const std::byte* magic = take(4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      fail(npullm::detail::concat("not a GGUF file: the magic is 0x",
                                  hex(detail::gguf_load<std::uint32_t>(magic)),
                                  " (little-endian), not \"GGUF\""));
    }
    const auto version = read<std::uint32_t>("version");
    if (version != 3) {
      if ((version & 0xffffu) == 0 && version != 0) {
        raise(error_code::unsupported, "GGUF ", file, ": the version field reads 0x", hex(version),
              ", byte-swapped: a big-endian file (version ", swap_bytes(version),
              "); npullm reads little-endian GGUF only");
      }
      raise(error_code::unsupported, "GGUF ", file, ": version ", version,
            "; npullm reads GGUF version 3");
    }
    h.version = version;
    const auto n_tensors = read<std::uint64_t>("tensor count");
    const auto n_kv = read<std::uint64_t>("metadata count");
    // A key-value pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes.
    if (n_kv > left() / 14) {
      fail(npullm::detail::concat("metadata count ", n_kv, " cannot fit in the ", left(),
                                  " bytes after the header"));
    }
    h.metadata.reserve(static_cast<std::size_t>(n_kv));
    for (std::size_t i = 0; i < n_kv; ++i) {
      where = {};
      const std::size_t at = pos;
      const std::string_view key = string("metadata key");
      if (key.empty()) fail(npullm::detail::concat("empty metadata key at byte ", at));
      if (key.size() > max_key_bytes) {
        fail(npullm::detail::concat("metadata key at byte ", at, " has ", key.size(),
                                    " bytes, more than the 65535 allowed"));
      }
      where_text = "key '" + detail::gguf_printable(key) + "'";
      where = where_text;
      if (!h.key_index.emplace(key, h.metadata.size()).second) fail("duplicate key");
      const gguf_type t = value_type("value type");
      h.metadata.push_back({key, value(t, 0)});
    }
    where = {};

    if (const gguf_value* a = h.find_value("general.alignment")) {
      where = "key 'general.alignment'";
      const auto* v = std::get_if<std::uint32_t>(a);
      if (v == nullptr)
        fail(npullm::detail::concat("is ", gguf_type_name(type_of(*a)), ", must be uint32"));
      if (*v == 0 || (*v & (*v - 1)) != 0)
        fail(npullm::detail::concat(*v, " is not a power of two"));
      h.alignment = *v;
      where = {};
    }

    // A tensor info takes at least 8 (name length) + 1 + 4 (n_dims) + 8 (ne) + 4 + 8 bytes.
    if (n_tensors > left() / 33) {
      fail(npullm::detail::concat("tensor count ", n_tensors, " cannot fit in the ", left(),
                                  " bytes after the metadata"));
    }
    h.tensors.reserve(static_cast<std::size_t>(n_tensors));
    for (std::size_t i = 0; i < n_tensors; ++i) {
      where = {};
      h.tensors.push_back(tensor_info(h, i));
    }
    where = {};

    // The data section starts at the next multiple of the alignment.
    const std::size_t pad = (h.alignment - pos % h.alignment) % h.alignment;
    if (pad > left()) {
      if (!h.tensors.empty()) {
        fail(npullm::detail::concat("truncated: the data section would start at byte ", pos + pad,
                                    ", past the end of the ", bytes.size(), "-byte file"));
      }
      h.data_offset = bytes.size();  // no tensors: nothing needs the padding
    } else {
      h.data_offset = pos + pad;
    }
    h.data_size = bytes.size() - h.data_offset;

    std::vector<const gguf_tensor_info*> order;
    for (const auto& t : h.tensors) {
      where_text = "tensor '" + detail::gguf_printable(t.name) + "'";
      where = where_text;
      if (t.offset > h.data_size) {
        fail(npullm::detail::concat("offset ", t.offset, " lies past the end of the ", h.data_size,
                                    "-byte data section"));
      }
      if (!t.known()) continue;
      if (t.nbytes > h.data_size - t.offset) {
        fail(npullm::detail::concat(ggml_type_name(t.type), " ",
                                    npullm::detail::format_list(t.shape()), " needs ", t.nbytes,
                                    " bytes at data offset ", t.offset, ", past the end of the ",
                                    h.data_size, "-byte data section"));
      }
      if (t.nbytes != 0) order.push_back(&t);
    }
    where = {};
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes) {
        fail(npullm::detail::concat("tensors '", detail::gguf_printable(order[i - 1]->name),
                                    "' and '", detail::gguf_printable(order[i]->name),
                                    "' overlap"));
      }
    }
    return h;
  }

 private:
  std::string where_text;

  static std::uint32_t swap_bytes(std::uint32_t v) noexcept {
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
  }
  static std::string hex(std::uint32_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
    return s;
  }

  gguf_tensor_info tensor_info(gguf_header& h, std::size_t i) {
    gguf_tensor_info t;
    const std::size_t at = pos;
    t.name = string("tensor name");
    if (t.name.empty() || t.name.size() > max_name_bytes) {
      fail(npullm::detail::concat("tensor ", i, " at byte ", at, " has a name of ", t.name.size(),
                                  " bytes (GGUF allows 1 to 64)"));
    }
    where_text = "tensor '" + detail::gguf_printable(t.name) + "'";
    where = where_text;
    if (!h.tensor_index.emplace(t.name, i).second) fail("duplicate tensor name");
    t.n_dims = read<std::uint32_t>("n_dims");
    if (t.n_dims < 1 || t.n_dims > 4)
      fail(npullm::detail::concat("n_dims ", t.n_dims, " (must be 1 to 4)"));
    std::size_t elements = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = read<std::uint64_t>("dimension");
      if (t.ne[d] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(npullm::detail::concat("ne[", d, "] = ", t.ne[d], " is above INT64_MAX"));
      }
    }
    for (std::uint32_t d = 0; d < t.n_dims; ++d) {
      const auto e = static_cast<std::size_t>(t.ne[d]);
      if (e != 0 && elements > std::numeric_limits<std::size_t>::max() / e) overflow = true;
      elements *= e;
    }
    // A zero dimension makes the count 0 whatever the others; an overflow before it still counts.
    if (overflow) {
      fail(npullm::detail::concat(
          "element count of ne = ", npullm::detail::format_list(std::span(t.ne.data(), t.n_dims)),
          " overflows"));
    }
    t.elements = elements;
    t.type = static_cast<ggml_type>(read<std::uint32_t>("ggml type"));
    const auto tr = ggml_traits(t.type);
    if (tr.block_size != 0) {
      if (t.ne[0] % tr.block_size != 0) {
        fail(npullm::detail::concat("ne[0] = ", t.ne[0], " is not a multiple of ", tr.name,
                                    "'s block size ", tr.block_size));
      }
      const std::size_t blocks = elements / tr.block_size;
      if (blocks > std::numeric_limits<std::size_t>::max() / tr.block_bytes) {
        fail(npullm::detail::concat("byte size of ", tr.name, " ",
                                    npullm::detail::format_list(t.shape()), " overflows"));
      }
      t.nbytes = blocks * tr.block_bytes;
    }
    t.offset = read<std::uint64_t>("tensor offset");
    if (t.offset % h.alignment != 0) {
      fail(npullm::detail::concat("offset ", t.offset, " is not a multiple of the alignment ",
                                  h.alignment));
    }
    return t;
  }
};

// Validates a whole file image; `file` names it in errors. The header's views point into
// `bytes`, which must outlive it.
inline gguf_header parse_gguf(std::span<const std::byte> bytes, std::string_view file) {
  gguf_parser p{bytes, file};
  return p.parse();
}

// ---- the mapped file --------------------------------------------------------------------------

class gguf_file {
 public:
  static std::unique_ptr<gguf_file> open(const std::filesystem::path& path) {
    return std::unique_ptr<gguf_file>(new gguf_file(path));
  }

  // Metadata (see gguf_header).
  [[nodiscard]] const gguf_value* find_value(std::string_view key) const {
    return header_.find_value(key);
  }
  template <gguf_value_type T>
  [[nodiscard]] std::optional<T> find(std::string_view key) const {
    return header_.find<T>(key);
  }
  template <gguf_value_type T>
  [[nodiscard]] const T& get(std::string_view key) const {
    return header_.get<T>(key);
  }
  [[nodiscard]] const gguf_array& array(std::string_view key) const { return header_.array(key); }
  [[nodiscard]] std::optional<std::uint64_t> find_uint(std::string_view key) const {
    return header_.find_uint(key);
  }
  [[nodiscard]] std::uint64_t get_uint(std::string_view key) const { return header_.get_uint(key); }
  [[nodiscard]] std::optional<double> find_float(std::string_view key) const {
    return header_.find_float(key);
  }
  [[nodiscard]] double get_float(std::string_view key) const { return header_.get_float(key); }

  // Tensors.
  [[nodiscard]] std::span<const gguf_tensor_info> tensors() const noexcept {
    return header_.tensors;
  }
  [[nodiscard]] const gguf_tensor_info* find_tensor(std::string_view name) const {
    return header_.find_tensor(name);
  }
  [[nodiscard]] const gguf_tensor_info& info(std::string_view name) const {
    return header_.info(name);
  }

  // The tensor's bytes as stored (blocks for a quantized type): zero-copy into the mapping.
  [[nodiscard]] std::span<const std::byte> bytes(std::string_view name) const {
    return bytes(info(name));
  }
  [[nodiscard]] std::span<const std::byte> bytes(const gguf_tensor_info& t) const {
    if (!t.known()) {
      raise(error_code::unsupported, "GGUF ", path(), ": tensor '", detail::gguf_printable(t.name),
            "' has ", ggml_type_name(t.type), ", which npullm does not know: its size is unknown");
    }
    return map_.bytes().subspan(header_.data_offset + static_cast<std::size_t>(t.offset), t.nbytes);
  }

  // The tensor as a row-major (shape...) view of T: zero-copy into the mapping.
  template <storage_type T, std::size_t Rank>
  [[nodiscard]] dense_view<const T, Rank> view(std::string_view name) const {
    const gguf_tensor_info& t = info(name);
    const auto stored = ggml_storage(t.type);
    if (!stored) {
      raise(error_code::unsupported, "GGUF ", path(), ": tensor '", name, "' is ",
            ggml_type_name(t.type),
            "; views are of F32, F16 and BF16 (read quantized tensors "
            "through bytes())");
    }
    if (*stored != dtype_of<T>) {
      raise(error_code::unsupported, "GGUF ", path(), ": tensor '", name, "' is ",
            ggml_type_name(t.type), ", asked for as ", to_string(dtype_of<T>));
    }
    const auto shape = t.shape();
    if (shape.size() != Rank) {
      raise(error_code::invalid_shape, "GGUF ", path(), ": tensor '", name, "' has shape ",
            npullm::detail::format_list(shape), ", asked for rank ", Rank);
    }
    const std::byte* p = bytes(t).data();
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0) {
      raise(error_code::unsupported, "GGUF ", path(), ": tensor '", name, "' at file offset ",
            header_.data_offset + t.offset, " is misaligned for ", to_string(dtype_of<T>),
            " (alignment ", header_.alignment, ")");
    }
    std::array<std::size_t, Rank> extents{};
    std::copy(shape.begin(), shape.end(), extents.begin());
    return dense_view<const T, Rank>(reinterpret_cast<const T*>(p), dextents<Rank>(extents));
  }

  [[nodiscard]] const gguf_header& header() const noexcept { return header_; }
  [[nodiscard]] const std::string& path() const noexcept { return map_.path(); }

 private:
  explicit gguf_file(const std::filesystem::path& path)
      : map_(path), header_(parse_gguf(map_.bytes(), map_.path())) {}

  mapped_file map_;
  gguf_header header_;
};

}  // namespace npullm::io
