// RMSNorm over the last dimension (Llama): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). As in
// layernorm.cpp, din is computed row by row and dw channel block by channel block: the result does not depend
// on the thread count.
#include <cmath>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

void rmsnorm_row(float* o, float* rstd, const float* x, const float* w, int C, float eps) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c] * x[c];
    const float r = 1.0f / std::sqrt(s / float(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    *rstd = r;
}

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) rmsnorm_row(out + size_t(n) * C, rstd + n, in + size_t(n) * C, w, C, eps);
}

// d(x_c) = r * (w_c d_c - x_c r^2 mean_k(w_k d_k x_k))
void rmsnorm_backward(float* din, float* dw, const float* dout, const float* in, const float* w, const float* rstd,
                      int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = in + size_t(n) * C;
        const float* d = dout + size_t(n) * C;
        float* di = din + size_t(n) * C;
        const float r = rstd[n];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += d[c] * w[c] * x[c];
        const float k = dot / float(C) * r * r;
#pragma omp simd
        for (int c = 0; c < C; c++) di[c] += (d[c] * w[c] - x[c] * k) * r;
    }
    if (!dw) return;  // a frozen gain
    constexpr int kBlock = 32;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * kBlock, c1 = c0 + kBlock < C ? c0 + kBlock : C;
        float aw[kBlock] = {};
        for (int n = 0; n < N; n++) {
            const float* x = in + size_t(n) * C;
            const float* d = dout + size_t(n) * C;
            const float r = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) aw[c - c0] += d[c] * x[c] * r;
        }
        for (int c = c0; c < c1; c++) dw[c] += aw[c - c0];
    }
}

}  // namespace anvil::cpu
