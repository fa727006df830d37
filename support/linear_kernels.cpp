// The dense linear kernels (ops/linear.hpp: f32 / f16 / bf16 weights, serial and pool_policy)
// instantiated once for npullm's own programs, which include the header with
// NPULLM_LINEAR_KERNELS_EXTERN (npullm_kernels in CMakeLists.txt, as quant_kernels.cpp).
#define NPULLM_LINEAR_KERNELS_INSTANTIATE
#include "npullm/ops/linear.hpp"
