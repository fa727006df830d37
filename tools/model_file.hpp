// What the programs in examples/ (npullm_run, npullm_server) read of a GGUF file before they
// load it: the weight type of the pipeline to build over it. Not a library header, the programs'
// own (tools/: namespace npullm_tools, see tools/README.md).
#pragma once

#include "npullm/core/dtype.hpp"
#include "npullm/io/gguf.hpp"

namespace npullm_tools::cli {

// The dense type of the file's 2-D tensors (the pipeline's weight type): f32 when every matrix
// is quantized.
inline npullm::dtype dense_matrix_type(const npullm::io::gguf_file& f) {
  for (const auto& t : f.tensors()) {
    if (t.n_dims != 2) continue;
    if (const auto d = npullm::io::ggml_storage(t.type)) return *d;
  }
  return npullm::dtype::f32;
}

}  // namespace npullm_tools::cli
