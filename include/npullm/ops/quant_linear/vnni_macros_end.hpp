// The end of vnni_macros.hpp's macros (no include guard: see there).
#undef NPULLM_QUANT_VNNI512
#undef NPULLM_QUANT_VNNI256
