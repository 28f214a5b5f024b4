// LayerNorm over the last dimension, eps 1e-5. The backward computes din row by row and the parameter
// gradients channel block by channel block, so the result does not depend on the thread count.
#include <cmath>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

constexpr float kLnEps = 1e-5f;

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                       int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = in + size_t(n) * C;
        float* o = out + size_t(n) * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += x[c];
        const float m = s / float(C);
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        const float r = 1.0f / std::sqrt(v / float(C) + kLnEps);
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = in + size_t(n) * C;
        const float* d = dout + size_t(n) * C;
        float* di = din + size_t(n) * C;
        const float m = mean[n], r = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            const float dn = d[c] * w[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * (x[c] - m) * r;
        }
        dnorm_mean /= float(C);
        dnorm_norm_mean /= float(C);
#pragma omp simd
        for (int c = 0; c < C; c++) {
            const float norm = (x[c] - m) * r;
            di[c] += (d[c] * w[c] - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
    }
    if (!dw && !db) return;  // a frozen norm: no parameter gradients
    constexpr int kBlock = 32;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * kBlock, c1 = c0 + kBlock < C ? c0 + kBlock : C;
        float aw[kBlock] = {}, ab[kBlock] = {};
        for (int n = 0; n < N; n++) {
            const float* x = in + size_t(n) * C;
            const float* d = dout + size_t(n) * C;
            const float m = mean[n], r = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                aw[c - c0] += d[c] * (x[c] - m) * r;
                ab[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            if (dw) dw[c] += aw[c - c0];
            if (db) db[c] += ab[c - c0];
        }
    }
}

}  // namespace anvil::cpu
