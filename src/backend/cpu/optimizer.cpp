// Global gradient norm and AdamW.
#include <omp.h>

#include <cmath>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

int max_threads() {
    return omp_get_max_threads();
}

// A fixed number of chunks (not one per thread), summed in order: the same result for any thread count.
double sum_squares(const float* x, size_t n) {
    constexpr int kChunks = 256;
    const size_t chunk = (n + kChunks - 1) / kChunks;
    double part[kChunks];
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < kChunks; ch++) {
        const size_t i0 = size_t(ch) * chunk < n ? size_t(ch) * chunk : n;
        const size_t i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) s += double(x[i]) * double(x[i]);
        part[ch] = s;
    }
    double total = 0.0;
    for (int ch = 0; ch < kChunks; ch++) total += part[ch];
    return total;
}

// PyTorch's AdamW: p *= 1 - lr*wd; m, v moving averages; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float wd, int step, float grad_scale) {
    const float bc1 = 1.0f - std::pow(beta1, float(step));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, float(step)));
    const float step_size = lr / bc1;
    const float decay = 1.0f - lr * wd;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
}

}  // namespace anvil::cpu
