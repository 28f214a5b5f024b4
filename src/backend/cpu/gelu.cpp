// GELU, tanh form, through the vectorisable span kernels of vec_math.h, split across threads.
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"

namespace anvil::cpu {

namespace {
constexpr size_t kGrain = 1 << 14;
}

void gelu_forward(float* out, const float* in, size_t n) {
    const size_t chunks = (n + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * kGrain;
        gelu_span(out + i0, in + i0, i0 + kGrain < n ? kGrain : n - i0);
    }
}

void gelu_backward(float* din, const float* dout, const float* in, size_t n) {
    const size_t chunks = (n + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * kGrain;
        gelu_grad_span(din + i0, dout + i0, in + i0, i0 + kGrain < n ? kGrain : n - i0);
    }
}

}  // namespace anvil::cpu
