// npullm: header-only C++20 LLM execution primitives. This umbrella header includes every
// public header; include the ones you use for faster builds.
#pragma once

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/interop.hpp"
#include "npullm/core/parallel.hpp"
#include "npullm/core/simd.hpp"
#include "npullm/core/slice.hpp"
#include "npullm/core/tensor.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/core/tokens.hpp"

#include "npullm/step/output.hpp"
#include "npullm/step/pipeline.hpp"

#include "npullm/kv/block_pool.hpp"
#include "npullm/kv/block_table.hpp"
#include "npullm/kv/contiguous_cache.hpp"
#include "npullm/kv/kv_tile.hpp"
#include "npullm/kv/laddered_cache.hpp"
#include "npullm/kv/prefix_cache.hpp"

#include "npullm/attention/flash.hpp"
#include "npullm/attention/mask.hpp"
#include "npullm/attention/pyramid.hpp"
#include "npullm/attention/reference.hpp"
#include "npullm/attention/state.hpp"

#include "npullm/ops/argmax.hpp"
#include "npullm/ops/gather.hpp"
#include "npullm/ops/linear.hpp"
#include "npullm/ops/rms_norm.hpp"
#include "npullm/ops/rope.hpp"
#include "npullm/ops/silu_mul.hpp"
#include "npullm/ops/softmax.hpp"

#include "npullm/model/config.hpp"
#include "npullm/model/medusa_head.hpp"
#include "npullm/model/pipeline_config.hpp"
#include "npullm/model/safetensors.hpp"
#include "npullm/model/synthetic.hpp"

#include "npullm/batch/generate.hpp"
#include "npullm/batch/inputs.hpp"
#include "npullm/batch/sampler.hpp"
#include "npullm/batch/scorer.hpp"
#include "npullm/batch/speculative.hpp"
#include "npullm/batch/unroll.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/npu/backend.hpp"
#include "npullm/npu/default_backend.hpp"
#include "npullm/npu/host.hpp"
