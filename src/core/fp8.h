// 8-bit floats for FP8 matrix products (--precision fp8): OCP's E4M3 (4 exponent bits, 3 mantissa bits, max
// 448, no infinities: the top pattern is NaN) and E5M2 (5 and 2, max 57344, IEEE-style Inf and NaN), and the
// per-tensor power-of-two scale anvil quantizes a tensor with. Shared by the CPU backend (the specification)
// and the CUDA kernels, so both pick the same scale for the same amax.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

#if defined(__CUDACC__)
#define ANVIL_HD __host__ __device__
#else
#define ANVIL_HD
#endif

namespace anvil {

// The largest finite value of an 8-bit format (F8E4M3 or F8E5M2); both are 1.75 * 2^emax.
ANVIL_HD constexpr float fp8_max(DType t) {
    return t == DType::F8E4M3 ? 448.0f : 57344.0f;
}

// The exponent k of the scale 2^k a tensor with largest magnitude `amax` is multiplied by before rounding to
// the format: the largest k with amax * 2^k <= fp8_max (so nothing overflows and the top binade is used),
// clamped to [-126, 126]; 0 when amax is 0 or not finite (non-finite values then stay non-finite). Exact: no
// logarithm, only the exponent and mantissa of amax (amax = m 2^e, m in [0.5, 1); the max is 0.875 2^emax').
ANVIL_HD inline int fp8_scale_exp(float amax, DType t) {
    if (!(amax > 0.0f) || !(amax <= 3.4028234663852886e38f)) return 0;
    int e = 0;
    const float m = frexpf(amax, &e);
    int k = (t == DType::F8E4M3 ? 9 : 16) - e - (m > 0.875f ? 1 : 0);
    k = k < -126 ? -126 : k;
    return k > 126 ? 126 : k;
}

// x rounded to the nearest value of the format (ties to even), as the hardware converts without saturation:
// NaN stays NaN; a magnitude that rounds past the max becomes NaN (E4M3) or Inf (E5M2), as does Inf.
float fp8_round(float x, DType t);
// The format's bit pattern of fp8_round(x) and the value of a bit pattern.
uint8_t fp8_bits(float x, DType t);
float fp8_value(uint8_t bits, DType t);

// dst = fp8_round(src * 2^k) * 2^-k with k = fp8_scale_exp(max |src|): src as the FP8 product sees it.
// Returns k. NaN elements are skipped by the amax (as fmaxf skips them) and stay NaN.
int fp8_fake_quantize(float* dst, const float* src, size_t n, DType t);

}  // namespace anvil
