// safetensors: memory-mapped model weights with zero-copy typed views.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON, then the data
// section. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)}
// (offsets relative to the data section); "__metadata__" holds string pairs.
//
//   parse_safetensors_header(bytes, file)   validates a whole file image (used by the loader
//                                           and the fuzzer): every check below, or an error
//   safetensors_file::open(path)            maps a file (io errors name the path)
//   safetensors_model::open(dir)            model.safetensors, or the sharded form with
//                                           model.safetensors.index.json
//   view<T, Rank>(name)                     a zero-copy (shape...) view, T = float, float16 or
//                                           bfloat16 matching the stored dtype
//
// Bad files raise corrupt_data naming the file and the tensor, never crash: a header length
// beyond the file, invalid JSON, a wrong field type, an unknown dtype, offsets outside the data
// section, a size that does not match dtype x shape, misaligned or overlapping tensors.
// Known dtypes other than F32/F16/BF16 parse, and viewing them is `unsupported`.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <string_view>
#include <utility>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm::io {

struct tensor_info {
  std::string name;
  std::string dtype;               // as stored: "F32", "BF16", "I64", ...
  std::vector<std::size_t> shape;  // row-major
  std::size_t begin = 0, end = 0;  // byte offsets within the data section
  [[nodiscard]] std::size_t bytes() const noexcept { return end - begin; }
  // The npullm storage type, if it is one (F32, F16, BF16).
  [[nodiscard]] std::optional<npullm::dtype> storage() const noexcept {
    if (dtype == "F32") return npullm::dtype::f32;
    if (dtype == "F16") return npullm::dtype::f16;
    if (dtype == "BF16") return npullm::dtype::bf16;
    return std::nullopt;
  }
};

struct safetensors_header {
  std::size_t data_offset = 0;  // where the data section starts in the file (8 + N)
  std::map<std::string, tensor_info, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> metadata;
};

namespace detail {

// Bytes per element of every dtype the format defines; 0 for an unknown name.
inline std::size_t safetensors_dtype_size(std::string_view d) noexcept {
  static constexpr std::pair<std::string_view, std::size_t> known[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : known) {
    if (name == d) return size;
  }
  return 0;
}

[[noreturn]] inline void corrupt(std::string_view file, const std::string& what) {
  raise(error_code::corrupt_data, "safetensors ", file, ": ", what);
}

}  // namespace detail

// Validates a whole file image. `file` names it in errors.
inline safetensors_header parse_safetensors_header(std::span<const std::byte> bytes,
                                                   std::string_view file) {
  using detail::corrupt;
  if (bytes.size() < 8) {
    corrupt(file, "file of " + std::to_string(bytes.size()) +
                      " bytes is shorter than the 8-byte header length");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
  if (n > bytes.size() - 8) {
    corrupt(file, "header length " + std::to_string(n) + " runs past the end of the " +
                      std::to_string(bytes.size()) + "-byte file");
  }
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json j = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) corrupt(file, "header is not valid JSON");
  if (!j.is_object()) corrupt(file, "header is not a JSON object");

  safetensors_header h;
  h.data_offset = 8 + static_cast<std::size_t>(n);
  const std::size_t data_size = bytes.size() - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) corrupt(file, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          corrupt(file, "__metadata__ value of '" + m.key() + "' is not a string");
        h.metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object()) corrupt(file, where + " is not an object");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) corrupt(file, where + " has no string dtype");
    if (sh == v.end() || !sh->is_array()) corrupt(file, where + " has no shape array");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      corrupt(file, where + " has no [begin, end] data_offsets");
    }
    tensor_info t;
    t.name = name;
    t.dtype = dt->get<std::string>();
    const std::size_t elem = detail::safetensors_dtype_size(t.dtype);
    if (elem == 0) corrupt(file, where + " has unknown dtype '" + t.dtype + "'");
    std::size_t count = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        corrupt(file, where + " has a shape entry that is not a non-negative integer");
      const auto e = d.get<std::uint64_t>();
      if (e != 0 && count > std::numeric_limits<std::size_t>::max() / e) {
        corrupt(file, where + " has a shape whose size overflows");
      }
      count *= static_cast<std::size_t>(e);
      t.shape.push_back(static_cast<std::size_t>(e));
    }
    for (const auto& o : *off) {
      if (!o.is_number_unsigned())
        corrupt(file, where + " has data_offsets that are not non-negative integers");
    }
    const auto b = (*off)[0].get<std::uint64_t>(), e = (*off)[1].get<std::uint64_t>();
    if (b > e || e > data_size) {
      corrupt(file, where + " data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                        ") lie outside the " + std::to_string(data_size) + "-byte data section");
    }
    t.begin = static_cast<std::size_t>(b);
    t.end = static_cast<std::size_t>(e);
    if (count > std::numeric_limits<std::size_t>::max() / elem || count * elem != t.bytes()) {
      corrupt(file, where + " holds " + std::to_string(t.bytes()) + " bytes, but " + t.dtype + " " +
                        npullm::detail::format_list(t.shape) + " needs " + std::to_string(count) +
                        " x " + std::to_string(elem));
    }
    if ((h.data_offset + t.begin) % elem != 0) {
      corrupt(file, where + " starts at file offset " + std::to_string(h.data_offset + t.begin) +
                        ", misaligned for " + t.dtype);
    }
    h.tensors.emplace(name, std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const tensor_info*> order;
  for (const auto& [name, t] : h.tensors) {
    if (t.bytes() != 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end) {
      corrupt(file, "tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
    }
  }
  return h;
}

// A read-only memory map of a whole file.
class mapped_file {
 public:
  explicit mapped_file(const std::filesystem::path& path) : path_(path.string()) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) raise(error_code::io, "cannot open ", path_, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      raise(error_code::io, "cannot stat ", path_, ": ", std::strerror(err));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ != 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        raise(error_code::io, "cannot map ", path_, ": ", std::strerror(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

class safetensors_file {
 public:
  static std::unique_ptr<safetensors_file> open(const std::filesystem::path& path) {
    return std::unique_ptr<safetensors_file>(new safetensors_file(path));
  }

  [[nodiscard]] const tensor_info* find(std::string_view name) const {
    const auto it = header_.tensors.find(name);
    return it == header_.tensors.end() ? nullptr : &it->second;
  }
  [[nodiscard]] const tensor_info& info(std::string_view name) const {
    const tensor_info* t = find(name);
    if (t == nullptr)
      raise(error_code::corrupt_data, "safetensors ", map_.path(), ": missing tensor '", name, "'");
    return *t;
  }

  // The tensor as a (shape...) view of T: zero-copy into the mapping.
  template <storage_type T, std::size_t Rank>
  [[nodiscard]] dense_view<const T, Rank> view(std::string_view name) const {
    const tensor_info& t = info(name);
    const auto stored = t.storage();
    if (!stored) {
      raise(error_code::unsupported, "safetensors ", map_.path(), ": tensor '", name,
            "' has dtype ", t.dtype, "; npullm reads F32, F16 and BF16");
    }
    if (*stored != dtype_of<T>) {
      raise(error_code::unsupported, "safetensors ", map_.path(), ": tensor '", name, "' is ",
            t.dtype, ", asked for as ", to_string(dtype_of<T>));
    }
    if (t.shape.size() != Rank) {
      raise(error_code::invalid_shape, "safetensors ", map_.path(), ": tensor '", name,
            "' has shape ", npullm::detail::format_list(t.shape), ", asked for rank ", Rank);
    }
    std::array<std::size_t, Rank> shape{};
    std::copy(t.shape.begin(), t.shape.end(), shape.begin());
    const auto* p = reinterpret_cast<const T*>(map_.bytes().data() + header_.data_offset + t.begin);
    return dense_view<const T, Rank>(p, dextents<Rank>(shape));
  }

  [[nodiscard]] const safetensors_header& header() const noexcept { return header_; }
  [[nodiscard]] const std::string& path() const noexcept { return map_.path(); }

 private:
  explicit safetensors_file(const std::filesystem::path& path)
      : map_(path), header_(parse_safetensors_header(map_.bytes(), map_.path())) {}

  mapped_file map_;
  safetensors_header header_;
};

// A model's weights: one file, or shards listed by model.safetensors.index.json.
class safetensors_model {
 public:
  static safetensors_model open(const std::filesystem::path& dir) {
    safetensors_model m;
    const auto index = dir / "model.safetensors.index.json";
    std::error_code ec;  // cannot inspect: no index; the single file's open reports io
    if (std::filesystem::exists(index, ec)) {
      std::ifstream in(index);
      if (!in) raise(error_code::io, "cannot read ", index.string());
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
          !j["weight_map"].is_object()) {
        raise(error_code::corrupt_data, index.string(), ": no weight_map object");
      }
      std::map<std::string, std::size_t> shard_of_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) {
          raise(error_code::corrupt_data, index.string(), ": weight_map entry '", it.key(),
                "' is not a file name");
        }
        const std::string file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos || file == "." || file == "..") {
          raise(error_code::corrupt_data, index.string(), ": shard name '", file,
                "' is not a plain file name");
        }
        auto [pos, fresh] = shard_of_file.emplace(file, m.shards_.size());
        if (fresh) m.shards_.push_back(safetensors_file::open(dir / file));
        m.owner_.emplace(it.key(), pos->second);
      }
      for (const auto& [name, shard] : m.owner_) {
        if (m.shards_[shard]->find(name) == nullptr) {
          raise(error_code::corrupt_data, index.string(), ": tensor '", name, "' is not in ",
                m.shards_[shard]->path());
        }
      }
    } else {
      m.shards_.push_back(safetensors_file::open(dir / "model.safetensors"));
      for (const auto& [name, t] : m.shards_[0]->header().tensors) m.owner_.emplace(name, 0);
    }
    return m;
  }

  [[nodiscard]] const safetensors_file& file_of(std::string_view name) const {
    const auto it = owner_.find(name);
    if (it == owner_.end())
      raise(error_code::corrupt_data, "model weights: missing tensor '", name, "'");
    return *shards_[it->second];
  }
  [[nodiscard]] bool contains(std::string_view name) const {
    return owner_.find(name) != owner_.end();
  }
  [[nodiscard]] const tensor_info& info(std::string_view name) const {
    return file_of(name).info(name);
  }
  template <storage_type T, std::size_t Rank>
  [[nodiscard]] dense_view<const T, Rank> view(std::string_view name) const {
    return file_of(name).template view<T, Rank>(name);
  }
  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }

 private:
  std::vector<std::unique_ptr<safetensors_file>> shards_;
  std::map<std::string, std::size_t, std::less<>> owner_;
};

}  // namespace npullm::io
