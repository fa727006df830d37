// The integer dot product of the quantized kernels, as macros for their #if's:
//   NPULLM_QUANT_VNNI512   vpdpbusd on zmm (AVX-512 VNNI with AVX-512 BW)
//   NPULLM_QUANT_VNNI256   vpdpbusd on ymm (AVX-VNNI, or AVX-512 VNNI with VL)
// No include guard, on purpose: each kernel header of ops/quant_linear/ includes this after its
// own includes and vnni_macros_end.hpp at its end, so that the macros end with the header that
// uses them instead of leaking into the user's translation unit.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define NPULLM_QUANT_VNNI512 1
#endif
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define NPULLM_QUANT_VNNI256 1
#endif
