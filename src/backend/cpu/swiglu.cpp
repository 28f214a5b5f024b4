// The SwiGLU gate of Llama's MLP: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"

namespace anvil::cpu {

void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + vexp(-g)) * up[i];
    }
}

// dgate = dout * up * silu'(gate), silu'(g) = sig(g) (1 + g (1 - sig(g))); dup = dout * silu(gate).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], s = 1.0f / (1.0f + vexp(-g)), d = dout[i];
        dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = d * g * s;
    }
}

}  // namespace anvil::cpu
