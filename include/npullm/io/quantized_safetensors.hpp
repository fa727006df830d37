// quantized_safetensors: how npullm names a quantized matrix inside a safetensors file, so that
// model_weights::load reads it back zero-copy (model/quantized_io.hpp writes such files):
//
//   <name>          the codes: int8_sym: I8 (N, K); int4_sym: U8 (N, ceil(K / 2)), two codes
//                   a byte, low nibble first; a GGUF block format (q8_0, q4_0, q4_k, ...): U8
//                   (N, row bytes), the GGUF blocks. Bit layouts: ops/formats/<name>.hpp.
//   <name>.scales   *_sym only: F16 or F32 (N, K / group)
//   __metadata__["npullm.quantized.<name>"] = "<format> <N> <K>" (GGUF formats) or
//                   "<format> <N> <K> <group> <f16|f32>" (*_sym), e.g. "int4_sym 896 4864 128 f16"
//
//   quantized_metadata_key(name)        "npullm.quantized.<name>"
//   quantized_metadata(view)            the metadata value describing a quantized_view
//   parse_quantized_metadata(value)     its fields back (corrupt_data when malformed)
#pragma once

#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/ops/quant_format.hpp"

namespace npullm::io {

inline std::string quantized_metadata_key(std::string_view name) {
  return "npullm.quantized." + std::string(name);
}

inline std::string quantized_metadata(const ops::quantized_view& q) {
  std::string m = std::string(ops::to_string(q.format)) + " " + std::to_string(q.rows) + " " +
                  std::to_string(q.cols);
  if (!ops::is_block_format(q.format)) {
    m += " " + std::to_string(q.group) + " " + std::string(to_string(q.scale_type));
  }
  return m;
}

// The fields of a metadata value; group and scale_type apply to the *_sym formats.
struct quantized_metadata_fields {
  ops::weight_format format = ops::weight_format::q8_0;
  std::size_t rows = 0, cols = 0, group = 0;
  npullm::dtype scale_type = npullm::dtype::f32;
};

// `where` names the file and tensor in the error.
inline quantized_metadata_fields parse_quantized_metadata(std::string_view value,
                                                          std::string_view where) {
  std::istringstream in{std::string(value)};
  std::string format, scale;
  quantized_metadata_fields f;
  in >> format >> f.rows >> f.cols;
  const std::optional<ops::weight_format> fmt = ops::weight_format_from_string(format);
  if (!in || !fmt) {
    raise(error_code::corrupt_data, where, ": quantization is '", value,
          "' (want '<format> <rows> <cols> [<group> <f16|f32>]')");
  }
  f.format = *fmt;
  if (ops::is_block_format(f.format)) return f;
  in >> f.group >> scale;
  if (!in || (scale != "f16" && scale != "f32")) {
    raise(error_code::corrupt_data, where, ": quantization is '", value,
          "' (want a group and f16 or f32)");
  }
  f.scale_type = scale == "f16" ? npullm::dtype::f16 : npullm::dtype::f32;
  return f;
}

}  // namespace npullm::io
