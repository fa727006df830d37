// f32x16: sixteen float lanes, the unit npullm's hot loops are written in, and `native`, one
// register of the target, for kernels blocked to the register file (GEMM micro-kernels).
//
// The path is chosen at compile time (core/isa.hpp):
//   AVX-512  f32x16 is one zmm register; exp is a polynomial (max relative error ~2 ulp,
//            exp(-inf) == 0 exactly) scaled with vscalefps.
//   AVX2     f32x16 is two ymm registers (lo = lanes 0..7, hi = 8..15): the kernels keep their
//            16-key / 16-column structure and choose their register blocking from
//            `f32x16_registers` (8 here, 32 with AVX-512). Same exp polynomial; f16 loads by
//            F16C, bf16 loads by a shift, partial loads by vmaskmovps.
//   portable a struct of 16 floats whose loops the compiler vectorizes for the target (SSE2 on
//            baseline x86-64); the same exp polynomial in plain float arithmetic; fmadd fused
//            only where the target has an FMA instruction (FP_FAST_FMAF).
// All paths give the same results for the same inputs up to rounding: reduce_add sums in the
// same pairwise order everywhere; exp and (portable, no FMA) fmadd may differ in the last bit.
//
// Each path is its own header (simd_avx512.hpp, simd_avx2.hpp, simd_portable.hpp), empty unless
// core/isa.hpp picked it; this one includes the three and adds what is common to them.
// Everything here is in `inline namespace NPULLM_ISA_NAMESPACE` (see core/isa.hpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "npullm/core/dtype.hpp"
#include "npullm/core/isa.hpp"

#if defined(NPULLM_ISA_AVX512) || defined(NPULLM_ISA_AVX2)
#include <immintrin.h>
#endif

// Fully unrolls the loop that follows. Kernels put it on every loop over a register block (its
// accumulators in a small array): GCC keeps such an array in registers only when every index
// into it is a constant after unrolling, and otherwise stores the accumulators on every
// iteration (measured: half the FMA rate of the AVX2 GEMM micro-kernel).
// Sanitizer builds (NPULLM_NO_FORCED_UNROLL, which the asan preset sets, or GCC's
// __SANITIZE_ADDRESS__) leave the choice to the compiler: the loops and their results are the
// same, but the instrumented, fully unrolled kernels took 10x the compile time (measured: one
// TU calling ops::linear on a quantized view, -O1 ASan + UBSan, 520 s unrolled vs 52 s).
#if defined(NPULLM_NO_FORCED_UNROLL) || defined(__SANITIZE_ADDRESS__)
#define NPULLM_UNROLL
#else
#define NPULLM_UNROLL _Pragma("GCC unroll 32")
#endif

#include "npullm/core/simd_avx2.hpp"
#include "npullm/core/simd_avx512.hpp"
#include "npullm/core/simd_portable.hpp"

namespace npullm::simd {
inline namespace NPULLM_ISA_NAMESPACE {

static_assert(lanes == 16, "f32x16 has 16 lanes on every path");

// How many f32x16 values fit in the register file: kernels size their register blocks by it.
inline constexpr std::size_t f32x16_registers = native::registers * native::lanes / lanes;

// Broadcast-multiply-add from memory: acc + (*p) * b.
inline f32x16 fmadd_broadcast(const float* p, f32x16 b, f32x16 acc) noexcept {
  return fmadd(set1(*p), b, acc);
}

}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace npullm::simd
