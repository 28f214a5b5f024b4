// cuBLASLt's FP8 product in the forms anvil asks for, straight through the library (no anvil code between):
// E4M3 x E4M3 -> bf16 in the TN form, with and without fast accumulation, the A/B scale pointers absent or at
// several alignments. On the first H100 run (cuBLASLt 13.1) the heuristic offered algorithms for anvil's FP8
// products and cublasLtMatmul refused every one (CUBLAS_STATUS_NOT_SUPPORTED), while `anvil bench`'s product,
// without scale pointers, ran. The table this prints says which attribute the refusal follows, at 64^3 and at
// GPT-2 124M's first FP8 product (2304 x 16384 x 768); the test requires one of the two forms anvil uses to
// run: the scales as 256-byte aligned scale pointers, or (its fallback) their product as a device alpha
// (POINTER_MODE_DEVICE), with fast accumulation on and off.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#ifndef ANVIL_CUDA_EMU
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

namespace {

#ifndef ANVIL_CUDA_EMU
// "ran", or the status of the heuristic or of the last algorithm tried
// alpha_beta: device floats alpha (1) and beta (0) 256 bytes apart, used in POINTER_MODE_DEVICE; null: host
std::string try_product(cublasLtHandle_t lt, void* ws, size_t ws_bytes, int m, int n, int k, const void* A,
                        const void* B, void* D, const float* a_scale, const float* b_scale,
                        const float* alpha_beta, bool fast_accum) {
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if (fast_accum) {
        const int8_t on = 1;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on);
    }
    if (alpha_beta) {
        const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode);
    }
    if (a_scale)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale);
    if (b_scale)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t wsb = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res[4]{};
    int found = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 4, res, &found);
    std::string outcome = h != CUBLAS_STATUS_SUCCESS ? "heuristic: status " + std::to_string(int(h))
                          : found == 0               ? "heuristic: no algorithm"
                                                     : "";
    const float alpha = 1.0f, beta = 0.0f;
    const float* pa = alpha_beta ? alpha_beta : &alpha;
    const float* pb = alpha_beta ? alpha_beta + 64 : &beta;
    // every element is k x 1.0 x 1.0: k in bf16 (k a power of two times 3 at most: exact), its top 16 bits
    const float kf = float(k);
    uint32_t kbits;
    std::memcpy(&kbits, &kf, 4);
    for (int i = 0; i < found && outcome.empty(); i++) {
        cudaMemset(D, 0, 2);
        const cublasStatus_t s =
            cublasLtMatmul(lt, op, pa, A, la, B, lb, pb, D, ld, D, ld, &res[i].algo, ws, ws_bytes, 0);
        uint16_t d0 = 0;
        if (s == CUBLAS_STATUS_SUCCESS && cudaMemcpy(&d0, D, 2, cudaMemcpyDeviceToHost) == cudaSuccess)
            outcome =
                (d0 == uint16_t(kbits >> 16) ? "ran (algorithm " : "ran, but D[0] is not k (algorithm ") +
                std::to_string(i + 1) + " of " + std::to_string(found) + ")";
        else if (i + 1 == found)
            outcome = "refused: status " + std::to_string(int(s)) + " from all " + std::to_string(found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return outcome;
}
#endif

TEST(CudaFp8Lt, TheProductAnvilAsksForRuns) {
#ifdef ANVIL_CUDA_EMU
    GTEST_SKIP() << "cuemu: this probes the real cuBLASLt";
#else
    int dev = 0;
    cudaDeviceProp p{};
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaGetDeviceProperties(&p, dev), cudaSuccess);
    if (p.major * 10 + p.minor < 89)
        GTEST_SKIP() << "compute capability " << p.major << "." << p.minor << ": no FP8";
    cublasLtHandle_t lt;
    ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    const size_t ws_bytes = size_t(32) << 20;
    constexpr int kM = 2304, kN = 16384, kK = 768;  // the largest shape tried
    void *ws, *A, *B, *D;
    float* scales;  // one 1024-byte block: 1.0f at every offset the table tries, 0.0f at 192 (a device beta)
    ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&A, size_t(kK) * kM), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&B, size_t(kK) * kN), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&D, size_t(kM) * kN * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&scales, 1024), cudaSuccess);
    ASSERT_EQ(cudaMemset(A, 0x38, size_t(kK) * kM), cudaSuccess);  // E4M3 1.0
    ASSERT_EQ(cudaMemset(B, 0x38, size_t(kK) * kN), cudaSuccess);
    float ones[256];
    for (float& v : ones) v = 1.0f;
    ones[192] = 0.0f;
    ASSERT_EQ(cudaMemcpy(scales, ones, sizeof ones, cudaMemcpyHostToDevice), cudaSuccess);
    struct Form {
        const char* what;
        int a_at, b_at;  // float offsets of the scales from a 256-byte boundary; -1: no scale pointer
        bool device_alpha;  // alpha at scales + 128, beta at + 192 (POINTER_MODE_DEVICE)
        bool anvils;        // a form anvil uses
    };
    const Form forms[] = {{"no scale pointers", -1, -1, false, false},
                          {"scales 256-byte aligned (anvil's first choice)", 0, 64, false, true},
                          {"scales 4 bytes past a boundary (anvil before)", 1, 65, false, false},
                          {"scales 16-byte aligned", 4, 68, false, false},
                          {"no scale pointers, device alpha (anvil's fallback)", -1, -1, true, true}};
    struct Shape {
        int m, n, k;
    };
    for (const Shape& sh : {Shape{64, 64, 64}, Shape{kM, kN, kK}}) {
        int modes_run = 0;  // accumulation modes in which one of anvil's forms ran
        for (bool fast : {false, true}) {
            bool ran = false;
            for (const Form& f : forms) {
                const std::string r = try_product(
                    lt, ws, ws_bytes, sh.m, sh.n, sh.k, A, B, D, f.a_at < 0 ? nullptr : scales + f.a_at,
                    f.b_at < 0 ? nullptr : scales + f.b_at, f.device_alpha ? scales + 128 : nullptr, fast);
                std::printf("fp8 %dx%dx%d TN, fast accumulation %s, %-52s %s\n", sh.m, sh.n, sh.k,
                            fast ? "on " : "off", f.what, r.c_str());
                ran = ran || (f.anvils && r.rfind("ran (", 0) == 0);
            }
            modes_run += ran;
        }
        // each accumulation mode must run in one of anvil's forms (the forward's products take fast
        // accumulation, the gradients' not)
        EXPECT_EQ(modes_run, 2) << "cuBLASLt refuses the FP8 product in both forms anvil uses (table above)";
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(ws), cudaFree(A), cudaFree(B), cudaFree(D), cudaFree(scales);
    cublasLtDestroy(lt);
#endif
}

}  // namespace
