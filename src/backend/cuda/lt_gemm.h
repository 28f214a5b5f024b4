// One column-major matrix product through cuBLASLt, D = alpha * op(A) . op(B) + beta * D (FP8 operands: times
// *a_scale * *b_scale), optionally batched
// with fixed strides and with an epilogue. Row-major tensors are column-major transposes; each caller states
// its product in those terms. Plans (descriptors + the heuristic's algorithm) are cached per shape.
#pragma once

#include "backend/cuda/ops.h"

namespace anvil::cuda {

struct Gemm {
    bool ta = false, tb = false;
    int m = 0, n = 0, k = 0;
    const void* A = nullptr;
    int lda = 0;
    const void* B = nullptr;
    int ldb = 0;
    void* D = nullptr;
    int ldd = 0;
    DType a_type = DType::F32, b_type = DType::F32;  // FP8 operands (E4M3, E5M2) only in the TN form, ta && !tb
    DType d = DType::F32;                            // D (f32 output from 16-bit operands is allowed)
    const float* a_scale = nullptr;  // FP8: device pointers to the factors that scale A's and B's values back
    const float* b_scale = nullptr;
    // FP8: cuBLASLt's fast accumulation (partial sums not periodically promoted to higher precision). On for
    // the forward's products only, as Transformer Engine and XLA do; the gradients' products keep it off.
    bool fast_accum = false;
    float alpha = 1.0f, beta = 0.0f;
    // Set: alpha and beta are these device floats instead (cuBLASLt's POINTER_MODE_DEVICE), both or neither:
    // how FP8 products take their scales where cuBLASLt refuses the scale pointers
    const float* alpha_dev = nullptr;
    const float* beta_dev = nullptr;
    int batch = 1;  // with strides in elements between consecutive A, B and D matrices
    int64_t stride_a = 0, stride_b = 0, stride_d = 0;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int ld_aux = 0;
};

// Runs the product; returns false (nothing done) when cuBLASLt offers no algorithm for it.
bool lt_gemm(const Ctx& c, const Gemm& g);
// The same, or a clear error naming the product.
void lt_gemm_or_fail(const Ctx& c, const Gemm& g);

}  // namespace anvil::cuda
