// gguf_types: what a GGUF file holds, as the reader (gguf.hpp) gives it: the ggml tensor type
// table (ids, block sizes, bytes per block, names, the dense types' storage), the metadata value
// types (gguf_type, gguf_value, gguf_array: arrays read from the image on access), tensor infos
// (ggml-order ne and the row-major shape) and the parsed header with its typed metadata lookups
// (get<T>, find<T>, get_uint, get_float; a value of another type is corrupt_data naming the key).
// The file layout and what the parser checks: gguf.hpp.
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

namespace npullm::io {

// ---- ggml tensor types ------------------------------------------------------------------------

// A ggml tensor type id as GGUF stores it (ids from ggml's include/ggml.h). The enum holds any
// u32, so an id this table does not know is kept as read; ggml_type_known() tells them apart.
enum class ggml_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  // 4, 5: Q4_2, Q4_3, removed from ggml
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  // 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, no longer allowed in GGUF files
  tq1_0 = 34,
  tq2_0 = 35,
  // 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8, likewise
  mxfp4 = 39,
  nvfp4 = 40,
  q1_0 = 41,
  q2_0 = 42,
};

// How a type packs elements: `block_size` consecutive elements along ne[0] take `block_bytes`
// bytes. block_size == 0 marks an id this table does not know.
struct ggml_type_traits {
  std::string_view name;  // as ggml prints it: "F32", "Q8_0", "Q4_K", ...
  std::size_t block_size = 0;
  std::size_t block_bytes = 0;
};

constexpr ggml_type_traits ggml_traits(ggml_type t) noexcept {
  // Block sizes: QK_K = 256 for the K and IQ types (but IQ4_NL: 32). Bytes per block are the
  // sizes of ggml's block structs (src/ggml-common.h), e.g. Q8_0 = f16 scale + 32 x i8 = 34,
  // Q4_K = 2 x f16 + 12 bytes of 6-bit scales/mins + 128 bytes of nibbles = 144.
  switch (t) {
    case ggml_type::f32: return {"F32", 1, 4};
    case ggml_type::f16: return {"F16", 1, 2};
    case ggml_type::q4_0: return {"Q4_0", 32, 18};
    case ggml_type::q4_1: return {"Q4_1", 32, 20};
    case ggml_type::q5_0: return {"Q5_0", 32, 22};
    case ggml_type::q5_1: return {"Q5_1", 32, 24};
    case ggml_type::q8_0: return {"Q8_0", 32, 34};
    case ggml_type::q8_1: return {"Q8_1", 32, 36};
    case ggml_type::q2_k: return {"Q2_K", 256, 84};
    case ggml_type::q3_k: return {"Q3_K", 256, 110};
    case ggml_type::q4_k: return {"Q4_K", 256, 144};
    case ggml_type::q5_k: return {"Q5_K", 256, 176};
    case ggml_type::q6_k: return {"Q6_K", 256, 210};
    case ggml_type::q8_k: return {"Q8_K", 256, 292};
    case ggml_type::iq2_xxs: return {"IQ2_XXS", 256, 66};
    case ggml_type::iq2_xs: return {"IQ2_XS", 256, 74};
    case ggml_type::iq3_xxs: return {"IQ3_XXS", 256, 98};
    case ggml_type::iq1_s: return {"IQ1_S", 256, 50};
    case ggml_type::iq4_nl: return {"IQ4_NL", 32, 18};
    case ggml_type::iq3_s: return {"IQ3_S", 256, 110};
    case ggml_type::iq2_s: return {"IQ2_S", 256, 82};
    case ggml_type::iq4_xs: return {"IQ4_XS", 256, 136};
    case ggml_type::i8: return {"I8", 1, 1};
    case ggml_type::i16: return {"I16", 1, 2};
    case ggml_type::i32: return {"I32", 1, 4};
    case ggml_type::i64: return {"I64", 1, 8};
    case ggml_type::f64: return {"F64", 1, 8};
    case ggml_type::iq1_m: return {"IQ1_M", 256, 56};
    case ggml_type::bf16: return {"BF16", 1, 2};
    case ggml_type::tq1_0: return {"TQ1_0", 256, 54};
    case ggml_type::tq2_0: return {"TQ2_0", 256, 66};
    case ggml_type::mxfp4: return {"MXFP4", 32, 17};
    case ggml_type::nvfp4: return {"NVFP4", 64, 36};
    case ggml_type::q1_0: return {"Q1_0", 128, 18};
    case ggml_type::q2_0: return {"Q2_0", 64, 18};
  }
  return {};
}

constexpr bool ggml_type_known(ggml_type t) noexcept {
  return ggml_traits(t).block_size != 0;
}

// "Q8_0", or "type 31" for an id the table does not know.
inline std::string ggml_type_name(ggml_type t) {
  const auto tr = ggml_traits(t);
  if (tr.block_size != 0) return std::string(tr.name);
  return "type " + std::to_string(static_cast<std::uint32_t>(t));
}

// The npullm storage type of F32, F16 and BF16; nothing for the others.
constexpr std::optional<npullm::dtype> ggml_storage(ggml_type t) noexcept {
  if (t == ggml_type::f32) return npullm::dtype::f32;
  if (t == ggml_type::f16) return npullm::dtype::f16;
  if (t == ggml_type::bf16) return npullm::dtype::bf16;
  return std::nullopt;
}

// ---- metadata values --------------------------------------------------------------------------

// Metadata value types, numbered as GGUF stores them.
enum class gguf_type : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

constexpr std::string_view gguf_type_name(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8: return "uint8";
    case gguf_type::int8: return "int8";
    case gguf_type::uint16: return "uint16";
    case gguf_type::int16: return "int16";
    case gguf_type::uint32: return "uint32";
    case gguf_type::int32: return "int32";
    case gguf_type::float32: return "float32";
    case gguf_type::boolean: return "bool";
    case gguf_type::string: return "string";
    case gguf_type::array: return "array";
    case gguf_type::uint64: return "uint64";
    case gguf_type::int64: return "int64";
    case gguf_type::float64: return "float64";
  }
  return "unknown";
}

// Bytes of one value of a fixed-size type; 0 for string and array (variable size).
constexpr std::size_t gguf_type_size(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8:
    case gguf_type::int8:
    case gguf_type::boolean: return 1;
    case gguf_type::uint16:
    case gguf_type::int16: return 2;
    case gguf_type::uint32:
    case gguf_type::int32:
    case gguf_type::float32: return 4;
    case gguf_type::uint64:
    case gguf_type::int64:
    case gguf_type::float64: return 8;
    case gguf_type::string:
    case gguf_type::array: return 0;
  }
  return 0;
}

// The C++ types of the fixed-size values (numbers and bool).
template <class T>
concept gguf_number = std::same_as<T, std::uint8_t> || std::same_as<T, std::int8_t> ||
    std::same_as<T, std::uint16_t> || std::same_as<T, std::int16_t> ||
    std::same_as<T, std::uint32_t> || std::same_as<T, std::int32_t> || std::same_as<T, float> ||
    std::same_as<T, bool> || std::same_as<T, std::uint64_t> || std::same_as<T, std::int64_t> ||
    std::same_as<T, double>;

template <gguf_number T>
inline constexpr gguf_type gguf_type_of = std::same_as<T, std::uint8_t>    ? gguf_type::uint8
                                          : std::same_as<T, std::int8_t>   ? gguf_type::int8
                                          : std::same_as<T, std::uint16_t> ? gguf_type::uint16
                                          : std::same_as<T, std::int16_t>  ? gguf_type::int16
                                          : std::same_as<T, std::uint32_t> ? gguf_type::uint32
                                          : std::same_as<T, std::int32_t>  ? gguf_type::int32
                                          : std::same_as<T, float>         ? gguf_type::float32
                                          : std::same_as<T, bool>          ? gguf_type::boolean
                                          : std::same_as<T, std::uint64_t> ? gguf_type::uint64
                                          : std::same_as<T, std::int64_t>  ? gguf_type::int64
                                                                           : gguf_type::float64;

namespace detail {

// A little-endian value of T at p (any alignment; the host's byte order does not matter).
template <gguf_number T>
T gguf_load(const std::byte* p) noexcept {
  if constexpr (std::same_as<T, bool>) {
    return std::to_integer<std::uint8_t>(p[0]) != 0;
  } else {
    using bits_t = std::conditional_t<
        sizeof(T) == 1, std::uint8_t,
        std::conditional_t<sizeof(T) == 2, std::uint16_t,
                           std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    bits_t v = 0;
    for (std::size_t i = sizeof(T); i-- > 0;)
      v = static_cast<bits_t>((v << 8) | std::to_integer<bits_t>(p[i]));
    return std::bit_cast<T>(v);
  }
}

// A key or name from a file, fit for a message: bytes outside printable ASCII as \xNN, and
// at most 96 characters (a key may be 65535 bytes).
inline std::string gguf_printable(std::string_view s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= 96) return out + "...";
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

[[noreturn]] inline void gguf_array_mismatch(gguf_type stored, gguf_type asked) {
  raise(error_code::corrupt_data, "GGUF array of ", gguf_type_name(stored), " read as ",
        gguf_type_name(asked));
}

}  // namespace detail

// An array value: a view into the file image (which must outlive it). Elements of a fixed-size
// type are read on access (they may sit at any alignment in the file); string elements are
// string_views into the image, nested arrays are gguf_arrays.
class gguf_array {
 public:
  [[nodiscard]] gguf_type type() const noexcept { return type_; }  // of the elements
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  // Element i of an array of T (T must be the element type exactly).
  template <gguf_number T>
  [[nodiscard]] T at(std::size_t i) const {
    if (type_ != gguf_type_of<T>) detail::gguf_array_mismatch(type_, gguf_type_of<T>);
    if (i >= size_) raise(error_code::out_of_range, "GGUF array element ", i, " of ", size_);
    return detail::gguf_load<T>(data_ + i * sizeof(T));
  }
  // All elements, copied out.
  template <gguf_number T>
  [[nodiscard]] std::vector<T> to_vector() const {
    if (type_ != gguf_type_of<T>) detail::gguf_array_mismatch(type_, gguf_type_of<T>);
    std::vector<T> out(size_);
    for (std::size_t i = 0; i < size_; ++i) out[i] = detail::gguf_load<T>(data_ + i * sizeof(T));
    return out;
  }
  // The elements of a string array: views into the file image.
  [[nodiscard]] std::span<const std::string_view> strings() const {
    if (type_ != gguf_type::string) detail::gguf_array_mismatch(type_, gguf_type::string);
    return strings_;
  }
  // The elements of an array of arrays.
  [[nodiscard]] std::span<const gguf_array> arrays() const {
    if (type_ != gguf_type::array) detail::gguf_array_mismatch(type_, gguf_type::array);
    return arrays_;
  }
  // The elements as stored (little-endian), for a fixed-size element type: size() x
  // gguf_type_size(type()) bytes. For strings and arrays: the whole encoded element list.
  [[nodiscard]] std::span<const std::byte> raw() const noexcept { return {data_, bytes_}; }

 private:
  friend struct gguf_parser;
  gguf_type type_ = gguf_type::uint8;
  std::size_t size_ = 0;
  const std::byte* data_ = nullptr;        // the first element's bytes
  std::size_t bytes_ = 0;                  // bytes of all elements
  std::vector<std::string_view> strings_;  // type_ == string
  std::vector<gguf_array> arrays_;         // type_ == array
};

// One metadata value. The alternatives are in GGUF's type order: index() == the type id.
using gguf_value = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t,
                                std::uint32_t, std::int32_t, float, bool, std::string_view,
                                gguf_array, std::uint64_t, std::int64_t, double>;

constexpr gguf_type type_of(const gguf_value& v) noexcept {
  return static_cast<gguf_type>(v.index());
}

// The types get<T>/find<T> accept: a number or bool, a string, an array.
template <class T>
concept gguf_value_type =
    gguf_number<T> || std::same_as<T, std::string_view> || std::same_as<T, gguf_array>;

struct gguf_kv {
  std::string_view key;  // into the file image
  gguf_value value;
};

// ---- tensor infos -----------------------------------------------------------------------------

struct gguf_tensor_info {
  std::string_view name;                        // into the file image
  std::uint32_t n_dims = 0;                     // 1..4
  std::array<std::uint64_t, 4> ne{1, 1, 1, 1};  // ggml order: ne[0] contiguous; past n_dims: 1
  ggml_type type = ggml_type::f32;              // as stored, possibly an id the table does not know
  std::uint64_t offset = 0;                     // from the start of the data section
  std::size_t elements = 0;                     // ne[0] x ... x ne[n_dims - 1]
  std::size_t nbytes = 0;                       // elements / block_size x block_bytes; 0 if unknown

  [[nodiscard]] bool known() const noexcept { return ggml_type_known(type); }
  // Row-major, outermost first: {ne[n_dims - 1], ..., ne[0]}.
  [[nodiscard]] std::vector<std::size_t> shape() const {
    std::vector<std::size_t> s(n_dims);
    for (std::uint32_t i = 0; i < n_dims; ++i) s[i] = static_cast<std::size_t>(ne[n_dims - 1 - i]);
    return s;
  }
  // Rows of ne[0] elements, and the bytes of one (a quantized row is whole blocks).
  [[nodiscard]] std::size_t rows() const noexcept {
    return ne[0] == 0 ? 0 : elements / static_cast<std::size_t>(ne[0]);
  }
  [[nodiscard]] std::size_t row_bytes() const noexcept {
    const auto t = ggml_traits(type);
    return t.block_size == 0 ? 0 : static_cast<std::size_t>(ne[0]) / t.block_size * t.block_bytes;
  }
};

// ---- the parsed header ------------------------------------------------------------------------

// Everything before the data section. Names, keys and string values are views into the file
// image it was parsed from, which must outlive it.
struct gguf_header {
  std::string file;  // names the file in errors
  std::uint32_t version = 3;
  std::size_t alignment = 32;             // general.alignment, or 32
  std::size_t data_offset = 0;            // where the data section starts in the file
  std::size_t data_size = 0;              // bytes from there to the end of the file
  std::vector<gguf_kv> metadata;          // in file order
  std::vector<gguf_tensor_info> tensors;  // in file order
  std::map<std::string_view, std::size_t, std::less<>> key_index;     // key -> metadata[i]
  std::map<std::string_view, std::size_t, std::less<>> tensor_index;  // name -> tensors[i]

  [[nodiscard]] const gguf_value* find_value(std::string_view key) const {
    const auto it = key_index.find(key);
    return it == key_index.end() ? nullptr : &metadata[it->second].value;
  }
  // The value of `key` if present; a value of another type than T is corrupt_data.
  template <gguf_value_type T>
  [[nodiscard]] const T* find_ptr(std::string_view key) const {
    const gguf_value* v = find_value(key);
    if (v == nullptr) return nullptr;
    const T* p = std::get_if<T>(v);
    if (p == nullptr) {
      raise(error_code::corrupt_data, "GGUF ", file, ": key '", key, "' is ",
            gguf_type_name(type_of(*v)), ", expected ", gguf_type_name(type_for<T>()));
    }
    return p;
  }
  template <gguf_value_type T>
  [[nodiscard]] std::optional<T> find(std::string_view key) const {
    const T* p = find_ptr<T>(key);
    return p == nullptr ? std::nullopt : std::optional<T>(*p);
  }
  template <gguf_value_type T>
  [[nodiscard]] const T& get(std::string_view key) const {
    const T* p = find_ptr<T>(key);
    if (p == nullptr) missing_key(key);
    return *p;
  }
  [[nodiscard]] const gguf_array& array(std::string_view key) const { return get<gguf_array>(key); }

  // Any integer type with a value >= 0 (GGUF writers use uint32 or uint64 for counts).
  [[nodiscard]] std::optional<std::uint64_t> find_uint(std::string_view key) const {
    const gguf_value* v = find_value(key);
    if (v == nullptr) return std::nullopt;
    return std::visit(
        [&](const auto& x) -> std::uint64_t {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_integral_v<X> && !std::same_as<X, bool>) {
            if constexpr (std::is_signed_v<X>) {
              if (x < 0) {
                raise(error_code::corrupt_data, "GGUF ", file, ": key '", key, "' is ",
                      static_cast<std::int64_t>(x), ", expected a count >= 0");
              }
            }
            return static_cast<std::uint64_t>(x);
          } else {
            raise(error_code::corrupt_data, "GGUF ", file, ": key '", key, "' is ",
                  gguf_type_name(type_of(*v)), ", expected an unsigned integer");
          }
        },
        *v);
  }
  [[nodiscard]] std::uint64_t get_uint(std::string_view key) const {
    const auto v = find_uint(key);
    if (!v) missing_key(key);
    return *v;
  }
  // float32 or float64.
  [[nodiscard]] std::optional<double> find_float(std::string_view key) const {
    const gguf_value* v = find_value(key);
    if (v == nullptr) return std::nullopt;
    if (const float* f = std::get_if<float>(v)) return static_cast<double>(*f);
    if (const double* d = std::get_if<double>(v)) return *d;
    raise(error_code::corrupt_data, "GGUF ", file, ": key '", key, "' is ",
          gguf_type_name(type_of(*v)), ", expected float32 or float64");
  }
  [[nodiscard]] double get_float(std::string_view key) const {
    const auto v = find_float(key);
    if (!v) missing_key(key);
    return *v;
  }

  [[nodiscard]] const gguf_tensor_info* find_tensor(std::string_view name) const {
    const auto it = tensor_index.find(name);
    return it == tensor_index.end() ? nullptr : &tensors[it->second];
  }
  [[nodiscard]] const gguf_tensor_info& info(std::string_view name) const {
    const gguf_tensor_info* t = find_tensor(name);
    if (t == nullptr)
      raise(error_code::corrupt_data, "GGUF ", file, ": missing tensor '", name, "'");
    return *t;
  }

 private:
  template <gguf_value_type T>
  static constexpr gguf_type type_for() noexcept {
    if constexpr (std::same_as<T, std::string_view>)
      return gguf_type::string;
    else if constexpr (std::same_as<T, gguf_array>)
      return gguf_type::array;
    else
      return gguf_type_of<T>;
  }
  [[noreturn]] void missing_key(std::string_view key) const {
    raise(error_code::corrupt_data, "GGUF ", file, ": missing key '", key, "'");
  }
};
}  // namespace npullm::io
