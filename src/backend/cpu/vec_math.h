// Inline math that the compiler vectorises inside `omp simd` loops (glibc's expf/tanhf are scalar calls).
#pragma once

#include <cstdint>
#include <cstring>

namespace anvil::cpu {

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]; exp(r) by a degree-6
// Taylor polynomial (truncation error < 2e-8 relative on that interval). Inputs clamp to [-87, 88].
inline float vexp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float t = x * 1.44269504088896341f + shifter;
    const float n = t - shifter;
    float r = x - n * 0.693145751953125f;  // ln2 split into a high part exact in float ...
    r = r - n * 1.428606765330187e-06f;    // ... and the remainder
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t e = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &e, 4);
    return p * scale;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); absolute error ~1e-7, which is what GELU's (1 + tanh) needs.
inline float vtanh(float u) {
    return 1.0f - 2.0f / (vexp(2.0f * u) + 1.0f);
}

}  // namespace anvil::cpu
