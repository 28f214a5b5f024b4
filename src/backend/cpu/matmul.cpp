// Matrix products through CBLAS (OpenBLAS, OpenMP build). Row-major throughout; the weight's layout picks
// the transpose flag. Bias is pre-filled into the output so the product accumulates onto it (beta = 1).
#include <cblas.h>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

void matmul_forward(float* out, const float* in, const float* w, const float* bias, int N, int C, int OC,
                    WLayout layout) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float* o = out + size_t(n) * OC;
#pragma omp simd
            for (int j = 0; j < OC; j++) o[j] = bias[j];
        }
        beta = 1.0f;
    }
    if (layout == WLayout::InOut)  // W (C,OC)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, in, C, w, OC, beta, out, OC);
    else  // W (OC,C)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, in, C, w, C, beta, out, OC);
}

void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                     int N, int C, int OC, WLayout layout) {
    if (layout == WLayout::InOut) {
        if (din)  // (N,C) = dout (N,OC) @ W^T
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC, 0.0f, din,
                        C);
        if (dw)  // dW (C,OC) += in^T @ dout
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, in, C, dout, OC, 1.0f, dw, OC);
    } else {
        if (din)  // (N,C) = dout (N,OC) @ W
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, din,
                        C);
        if (dw)  // dW (OC,C) += dout^T @ in
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, in, C, 1.0f, dw, C);
    }
    if (dbias) {
        constexpr int kBlock = 64;
        const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            const int j0 = blk * kBlock, j1 = j0 + kBlock < OC ? j0 + kBlock : OC;
            float acc[kBlock] = {};
            for (int n = 0; n < N; n++) {
                const float* d = dout + size_t(n) * OC;
#pragma omp simd
                for (int j = j0; j < j1; j++) acc[j - j0] += d[j];
            }
            for (int j = j0; j < j1; j++) dbias[j] += acc[j - j0];
        }
    }
}

}  // namespace anvil::cpu
