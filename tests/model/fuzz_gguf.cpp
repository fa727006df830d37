// libFuzzer harness over the GGUF parser: any byte string either parses, with the invariants
// below holding for what it returns, or raises npullm::error with corrupt_data (or unsupported,
// for a version other than 3 or a big-endian file); anything else is a bug. A parsed file then
// goes through the model reader (model::read_gguf_model: the architecture keys, RoPE factor
// tensors), which must give a config or raise corrupt_data or unsupported, and every tensor of
// a weight type the pipeline runs (model::gguf_weight_format: Q8_0 .. IQ4_XS) is decoded, its
// first and last rows, as a quantized view over its bytes: any bytes are a valid block (NaN or
// infinite scales included), so neither may throw. Built with clang
// when it is available (target fuzz_gguf); test_gguf replays the corpus (tests/model/corpus_gguf)
// through the same check, so those inputs run in CI without libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "npullm/io/gguf.hpp"
#include "npullm/model/gguf_model.hpp"
#include "npullm/ops/quant.hpp"

namespace npullm_fuzz_gguf {

// An invariant that parse_gguf promised and did not keep.
struct violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const char* what) {
  if (!ok) throw violation(what);
}

inline void walk(const npullm::io::gguf_array& a, std::span<const std::byte> image,
                 std::size_t& touched) {
  using npullm::io::gguf_type;
  const auto* lo = image.data();
  const auto* hi = image.data() + image.size();
  const auto raw = a.raw();
  require(raw.empty() || (raw.data() >= lo && raw.data() + raw.size() <= hi),
          "array bytes outside the image");
  if (a.type() == gguf_type::string) {
    require(a.strings().size() == a.size(), "string array size");
    for (std::string_view s : a.strings()) {
      const auto* p = reinterpret_cast<const std::byte*>(s.data());
      require(s.empty() || (p >= lo && p + s.size() <= hi), "string outside the image");
      touched += s.size();
    }
  } else if (a.type() == gguf_type::array) {
    require(a.arrays().size() == a.size(), "nested array size");
    for (const auto& e : a.arrays()) walk(e, image, touched);
  } else {
    require(raw.size() == a.size() * npullm::io::gguf_type_size(a.type()), "array byte size");
    std::size_t n = 0;
    switch (a.type()) {
      case gguf_type::uint8: n = a.to_vector<std::uint8_t>().size(); break;
      case gguf_type::int8: n = a.to_vector<std::int8_t>().size(); break;
      case gguf_type::uint16: n = a.to_vector<std::uint16_t>().size(); break;
      case gguf_type::int16: n = a.to_vector<std::int16_t>().size(); break;
      case gguf_type::uint32: n = a.to_vector<std::uint32_t>().size(); break;
      case gguf_type::int32: n = a.to_vector<std::int32_t>().size(); break;
      case gguf_type::float32: n = a.to_vector<float>().size(); break;
      case gguf_type::boolean: n = a.to_vector<bool>().size(); break;
      case gguf_type::uint64: n = a.to_vector<std::uint64_t>().size(); break;
      case gguf_type::int64: n = a.to_vector<std::int64_t>().size(); break;
      case gguf_type::float64: n = a.to_vector<double>().size(); break;
      default: require(false, "array element type");
    }
    require(n == a.size(), "array element count");
    touched += n;
  }
}

// Parses one image and checks what comes back.
inline void run_one(std::span<const std::byte> bytes) {
  using namespace npullm::io;
  std::optional<gguf_header> parsed;
  try {
    parsed.emplace(parse_gguf(bytes, "fuzz"));
  } catch (const npullm::error& e) {
    if (e.code() != npullm::error_code::corrupt_data &&
        e.code() != npullm::error_code::unsupported) {
      throw violation(std::string("unexpected error code: ") + e.what());
    }
    return;
  }
  // Parsed: what it says must hold. Any npullm::error from here on is a bug too.
  try {
    const gguf_header& h = *parsed;
    require(h.version == 3, "version");
    require(h.alignment != 0 && (h.alignment & (h.alignment - 1)) == 0, "alignment");
    require(h.data_offset <= bytes.size() && h.data_offset + h.data_size == bytes.size(),
            "data section");
    require(h.key_index.size() == h.metadata.size(), "duplicate keys");
    require(h.tensor_index.size() == h.tensors.size(), "duplicate tensor names");
    std::size_t touched = 0;
    for (const auto& kv : h.metadata) {
      require(!kv.key.empty() && h.find_value(kv.key) == &kv.value, "key lookup");
      if (const auto* a = std::get_if<gguf_array>(&kv.value)) {
        walk(*a, bytes, touched);  // reads every element with its own type: must not throw
      }
    }
    for (const auto& t : h.tensors) {
      require(t.n_dims >= 1 && t.n_dims <= 4, "n_dims");
      require(t.offset % h.alignment == 0, "misaligned tensor");
      require(t.offset <= h.data_size, "offset past the data section");
      require(h.find_tensor(t.name) == &t, "tensor lookup");
      if (t.known()) {
        require(t.nbytes <= h.data_size - t.offset, "tensor past the end");
        require(t.ne[0] % ggml_traits(t.type).block_size == 0, "partial block");
        require(t.shape().size() == t.n_dims, "shape rank");
      } else {
        require(t.nbytes == 0, "size of an unknown type");
      }
    }
    std::vector<const gguf_tensor_info*> known;
    for (const auto& t : h.tensors) {
      if (t.known() && t.nbytes != 0) known.push_back(&t);
    }
    std::sort(known.begin(), known.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < known.size(); ++i) {
      require(known[i - 1]->offset + known[i - 1]->nbytes <= known[i]->offset, "overlap");
    }
    (void)touched;
    // Every tensor of a runnable weight type, decoded (its first and last rows).
    for (const auto& t : h.tensors) {
      const auto format = t.known() ? npullm::model::gguf_weight_format(t.type) : std::nullopt;
      if (!format || t.rows() == 0) continue;
      const npullm::ops::quantized_view w(
          *format, t.rows(), static_cast<std::size_t>(t.ne[0]),
          bytes.subspan(h.data_offset + static_cast<std::size_t>(t.offset), t.nbytes));
      std::vector<float> row(w.cols);
      npullm::ops::dequantize_row(w, 0, row);
      npullm::ops::dequantize_row(w, w.rows - 1, row);
    }
  } catch (const npullm::error& e) {
    throw violation(std::string("accessor threw on a parsed file: ") + e.what());
  }
  // The model reader over what parsed: a config, or corrupt_data / unsupported.
  try {
    const gguf_header& h = *parsed;
    const auto info = npullm::model::read_gguf_model(h, [&](const gguf_tensor_info& t) {
      return bytes.subspan(h.data_offset + static_cast<std::size_t>(t.offset), t.nbytes);
    });
    require(info.config.num_hidden_layers > 0 && info.config.head_dim % 2 == 0, "config sizes");
    require(info.config.layer_windows.size() == info.config.num_hidden_layers, "windows");
  } catch (const npullm::error& e) {
    if (e.code() != npullm::error_code::corrupt_data &&
        e.code() != npullm::error_code::unsupported) {
      throw violation(std::string("model reader: unexpected error code: ") + e.what());
    }
  }
}

}  // namespace npullm_fuzz_gguf

#ifndef NPULLM_GGUF_FUZZ_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    npullm_fuzz_gguf::run_one({reinterpret_cast<const std::byte*>(data), size});
  } catch (const npullm_fuzz_gguf::violation& v) {
    std::fprintf(stderr, "violation: %s\n", v.what());
    __builtin_trap();
  }
  return 0;
}
#endif
