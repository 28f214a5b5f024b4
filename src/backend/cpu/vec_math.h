// Inline math that the compiler vectorises inside `omp simd` loops (glibc's expf/tanhf are scalar calls).
#pragma once

#include <cstddef>
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

// GELU (tanh form) over a span, single-threaded: the building blocks of gelu.cpp and of the fused matmuls.
// With s = 1 / (1 + exp(-2u)) (the logistic of 2u), 1 + tanh(u) = 2 s and 1 - tanh(u) = 2 s exp(-2u), each a
// quotient of positive terms: accurate to a few ulps for any u. (1 - 2 / (exp(2u) + 1) for tanh(u) had an
// absolute error of ~1e-7, which in the far negative tail, where 1 + tanh(u) is ~1e-6, was a relative error
// of 14% in the GELU and its derivative: at x = -4.665, -2.224e-6 for -1.946e-6.)
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

inline void gelu_span(float* out, const float* in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
        out[i] = x / (1.0f + vexp(-2.0f * u));  // 0.5 x (1 + tanh(u))
    }
}

// din = dout * gelu'(in); din may alias dout.
inline void gelu_grad_span(float* din, const float* dout, const float* in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
        const float e = vexp(-2.0f * u), s = 1.0f / (1.0f + e);
        // 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u', with 1 - tanh^2 u = (1 + tanh u)(1 - tanh u) = 4 s^2 e
        const float grad = s + 2.0f * x * (s * e) * s * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
        din[i] = dout[i] * grad;
    }
}

}  // namespace anvil::cpu
