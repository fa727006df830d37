// The instruction set npullm's kernels are compiled for, chosen by the compiler's target flags:
//
//   macro defined by the compiler           path               NPULLM_ISA_NAMESPACE
//   __AVX512F__ and __AVX512BF16__          AVX-512 + BF16     avx512_bf16
//   __AVX512F__                             AVX-512            avx512
//   __AVX2__ and __FMA__ (F16C assumed)     AVX2 + FMA         avx2
//   otherwise                               portable C++       portable
//
// (-march=native picks what the build machine has; -march=x86-64-v3 is AVX2 + FMA + F16C;
// -march=x86-64-v4 or -march=znver4 / sapphirerapids add AVX-512; plain x86-64 is portable.)
//
// Code whose behaviour depends on the ISA (the SIMD layer, the kernels, the bulk dtype
// conversions) lives in `inline namespace NPULLM_ISA_NAMESPACE`, as Highway does per target:
// translation units compiled with different flags then define differently named entities, so
// an engine that builds one object per ISA and dispatches at run time links them side by side,
// each calling its own kernels, instead of the linker silently keeping one ISA's copy for all.
// The pipeline types carry the ISA in a default template argument for the same reason.
#pragma once

#include <string_view>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define NPULLM_ISA_NAMESPACE avx512_bf16
#define NPULLM_ISA_AVX512 1
#elif defined(__AVX512F__)
#define NPULLM_ISA_NAMESPACE avx512
#define NPULLM_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define NPULLM_ISA_NAMESPACE avx2
#define NPULLM_ISA_AVX2 1
#else
#define NPULLM_ISA_NAMESPACE portable
#define NPULLM_ISA_PORTABLE 1
#endif

namespace npullm {
inline namespace NPULLM_ISA_NAMESPACE {

// A tag type per ISA: `isa_tag` differs between translation units built for different ISAs.
struct isa_tag {
  static constexpr std::string_view name =
#if defined(__AVX512F__) && defined(__AVX512BF16__)
      "avx512-bf16";
#elif defined(__AVX512F__)
      "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
      "avx2";
#else
      "portable";
#endif
};

// The ISA this translation unit's kernels are compiled for ("avx512-bf16", "avx512", "avx2",
// "portable"): benchmarks record it, and an engine can log which copy it dispatched to.
inline std::string_view isa_name() noexcept {
  return isa_tag::name;
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm

// Precompiled kernels (CMake: npullm::kernels; npullm's own programs: npullm_kernels_<isa>).
// A kernel library built for one ISA defines NPULLM_KERNELS_<namespace>=1 for its users (e.g.
// NPULLM_KERNELS_avx2=1): a translation unit built for that ISA then takes the kernels it would
// otherwise compile itself (the quantized linear, the dense linear, flash attention's sub-tile
// kernels and pipeline drivers) as extern templates. One built for an ISA no linked library
// has compiles them itself, so every -march links. The _INSTANTIATE side (the libraries' own
// sources) is left alone.
#define NPULLM_KERNELS_FOR_ISA_(ns) NPULLM_KERNELS_##ns
#define NPULLM_KERNELS_FOR_ISA(ns) NPULLM_KERNELS_FOR_ISA_(ns)
#if NPULLM_KERNELS_FOR_ISA(NPULLM_ISA_NAMESPACE)
#if !defined(NPULLM_QUANT_KERNELS_INSTANTIATE) && !defined(NPULLM_QUANT_KERNELS_EXTERN)
#define NPULLM_QUANT_KERNELS_EXTERN 1
#endif
#if !defined(NPULLM_LINEAR_KERNELS_INSTANTIATE) && !defined(NPULLM_LINEAR_KERNELS_EXTERN)
#define NPULLM_LINEAR_KERNELS_EXTERN 1
#endif
#if !defined(NPULLM_FLASH_KERNELS_INSTANTIATE) && !defined(NPULLM_FLASH_KERNELS_EXTERN)
#define NPULLM_FLASH_KERNELS_EXTERN 1
#endif
#endif
#undef NPULLM_KERNELS_FOR_ISA
#undef NPULLM_KERNELS_FOR_ISA_
