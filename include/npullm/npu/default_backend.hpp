// npu::default_backend: the backend the build selected (CMake -DNPULLM_BACKEND=host|level_zero
// defines NPULLM_BACKEND_HOST or NPULLM_BACKEND_LEVEL_ZERO on the npullm::npullm target).
//
//   using config = model::pipeline_config<model::block_kv<bfloat16, 16>,
//                                         model::dynamic_attention<>, bfloat16,
//                                         npu::default_backend>;
//
// pipeline_config's own default stays host_backend: a Level Zero backend needs the caller's
// graph blobs (level_zero_options), so it is never constructed implicitly.
#pragma once

#include "npullm/npu/host.hpp"

#if defined(NPULLM_BACKEND_LEVEL_ZERO)
#include "npullm/npu/level_zero_backend.hpp"
#endif

namespace npullm::npu {

#if defined(NPULLM_BACKEND_LEVEL_ZERO)
using default_backend = level_zero_backend;
#else
using default_backend = host_backend;
#endif

}  // namespace npullm::npu
