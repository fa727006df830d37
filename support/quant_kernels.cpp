// The quantized linear's per-format kernels (ops/quant_linear.hpp), instantiated once for
// npullm's own programs (tests, examples), which include the header with
// NPULLM_QUANT_KERNELS_EXTERN: a build of many translation units compiles them once instead of
// once per unit. Built with the programs' flags and NPULLM_ISA (CMakeLists.txt).
#define NPULLM_QUANT_KERNELS_INSTANTIATE
#include "npullm/ops/quant_linear.hpp"
