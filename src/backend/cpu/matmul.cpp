// Matrix products through CBLAS (OpenBLAS, OpenMP build), or a Gemm given instead (the bf16 products).
// Row-major throughout; the weight's layout picks the transpose flag. Bias is pre-filled into the output so
// the product accumulates onto it (beta = 1).
#include <cblas.h>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

namespace {

// C (M,N) = op(A) op(B) (+ C): the given product, else OpenBLAS's sgemm
void product(Gemm* gemm, bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
             int ldb, bool accumulate, float* C, int ldc) {
    if (gemm) return (*gemm)(ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

}  // namespace

void matmul_forward(float* out, int ldo, const float* in, const float* w, const float* bias, int N, int C,
                    int OC, WLayout layout, Gemm* gemm) {
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float* o = out + size_t(n) * ldo;
#pragma omp simd
            for (int j = 0; j < OC; j++) o[j] = bias[j];
        }
    }
    if (layout == WLayout::InOut)  // W (C,OC)
        product(gemm, false, false, N, OC, C, in, C, w, OC, bias != nullptr, out, ldo);
    else  // W (OC,C)
        product(gemm, false, true, N, OC, C, in, C, w, C, bias != nullptr, out, ldo);
}

void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                     int N, int C, int OC, WLayout layout, Gemm* gemm) {
    if (layout == WLayout::InOut) {
        if (din)  // (N,C) = dout (N,OC) @ W^T
            product(gemm, false, true, N, C, OC, dout, OC, w, OC, false, din, C);
        if (dw)  // dW (C,OC) += in^T @ dout
            product(gemm, true, false, C, OC, N, in, C, dout, OC, true, dw, OC);
    } else {
        if (din)  // (N,C) = dout (N,OC) @ W
            product(gemm, false, false, N, C, OC, dout, OC, w, C, false, din, C);
        if (dw)  // dW (OC,C) += dout^T @ in
            product(gemm, true, false, OC, C, N, dout, OC, in, C, true, dw, C);
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
