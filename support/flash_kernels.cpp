// The flash attention tile kernels a model pipeline runs (attention/flash.hpp: every KV element
// type, a sliding window with or without padding, pool_policy) instantiated once for npullm's
// own programs, which include the header with NPULLM_FLASH_KERNELS_EXTERN (npullm_kernels in
// CMakeLists.txt, as quant_kernels.cpp).
#define NPULLM_FLASH_KERNELS_INSTANTIATE
#include "npullm/attention/flash.hpp"
