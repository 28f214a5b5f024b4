// GELU, tanh form, through the vectorisable tanh of vec_math.h.
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"

namespace anvil::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* in, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
        out[i] = 0.5f * x * (1.0f + vtanh(u));
    }
}

void gelu_backward(float* din, const float* dout, const float* in, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
        const float th = vtanh(u);
        const float sech2 = 1.0f - th * th;
        const float grad =
            0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
        din[i] = dout[i] * grad;
    }
}

}  // namespace anvil::cpu
