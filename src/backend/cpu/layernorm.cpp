// LayerNorm over the last dimension, eps 1e-5. The backward computes din row by row and the parameter
// gradients channel block by channel block, so the result does not depend on the thread count.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/op_checks.h"

namespace anvil::cpu {

constexpr float kLnEps = 1e-5f;

void layernorm_row(float* o, float* mean, float* rstd, const float* x, const float* w, const float* b, int C,
                   float eps) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    const float m = s / float(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / std::sqrt(v / float(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
    *mean = m;
    *rstd = r;
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                       int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_row(out + size_t(n) * C, mean + n, rstd + n, in + size_t(n) * C, w, b, C, kLnEps);
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

namespace anvil {

// The residual add fused into the norm after it (ops.def): a block of rows is summed, then normed while it
// is in cache. The sum and the norm are the same f32 operations as residual_fwd's and the norm's alone, so
// the results are theirs to the bit.
void CpuBackend::add_norm_fwd(Tensor sum, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                              Tensor bias, float eps) {
    check_op_add_norm_fwd(sum, out, mean, rstd, a, b, w, bias, eps);
    const int C = int(cols(sum)), N = int(rows(sum));
    float *s = sum.f32(), *o = out.f32(), *r = rstd.f32();
    float* m = mean.empty() ? nullptr : mean.f32();
    const float *x = a.f32(), *y = b.f32(), *g = w.f32(), *beta = bias.empty() ? nullptr : bias.f32();
    constexpr int kRows = 8;  // a block's sums are still in cache when its rows are normed
#pragma omp parallel for schedule(static)
    for (int n0 = 0; n0 < N; n0 += kRows) {
        const int n1 = n0 + kRows < N ? n0 + kRows : N;
#pragma omp simd
        for (size_t i = size_t(n0) * C; i < size_t(n1) * C; i++) s[i] = x[i] + y[i];
        for (int n = n0; n < n1; n++) {
            const size_t at = size_t(n) * C;
            if (m)
                cpu::layernorm_row(o + at, m + n, r + n, s + at, g, beta, C, eps);
            else
                cpu::rmsnorm_row(o + at, r + n, s + at, g, C, eps);
        }
    }
}

}  // namespace anvil
