// The SwiGLU gate of Llama's MLP: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), over R rows of C
// elements, each tensor's rows its own ld apart (contiguous: one row of every element).
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"

namespace anvil::cpu {

void swiglu_forward(Rows<float> out, Rows<const float> gate, Rows<const float> up, int64_t R, int64_t C) {
#pragma omp parallel for simd collapse(2) schedule(static)
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < C; j++) {
            const float g = gate(r, j);
            out(r, j) = g / (1.0f + vexp(-g)) * up(r, j);
        }
}

// dgate = dout * up * silu'(gate), silu'(g) = sig(g) (1 + g (1 - sig(g))); dup = dout * silu(gate).
void swiglu_backward(Rows<float> dgate, Rows<float> dup, Rows<const float> dout, Rows<const float> gate,
                     Rows<const float> up, int64_t R, int64_t C) {
#pragma omp parallel for simd collapse(2) schedule(static)
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < C; j++) {
            const float g = gate(r, j), s = 1.0f / (1.0f + vexp(-g)), d = dout(r, j);
            dgate(r, j) = d * up(r, j) * s * (1.0f + g * (1.0f - s));
            dup(r, j) = d * g * s;
        }
}

}  // namespace anvil::cpu
