// Matrix products through cuBLASLt: bf16/fp16/fp32 operands with fp32 accumulation (tensor cores for the
// 16-bit types), bias and GELU fused as epilogues. Row-major tensors are column-major transposes, so each op
// below is stated as the column-major product cuBLASLt computes. Plans (descriptors + the heuristic's
// algorithm) are cached per shape.
#include <map>
#include <tuple>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

struct Gemm {
    bool ta = false, tb = false;
    int m = 0, n = 0, k = 0;
    const void* A = nullptr;
    int lda = 0;
    const void* B = nullptr;
    int ldb = 0;
    void* D = nullptr;
    int ldd = 0;
    float beta = 0.0f;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int ld_aux = 0;
};

struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // the heuristic found an algorithm
};

using PlanKey = std::tuple<bool, bool, int, int, int, int, int, int, int, int, bool, int>;

}  // namespace

// Keyed by everything that shapes the descriptors; few entries (one per layer kind).
struct LtPlans {
    std::map<PlanKey, Plan> map;
    ~LtPlans() {
        for (auto& [k, p] : map) {
            (void)cublasLtMatrixLayoutDestroy(p.a);
            (void)cublasLtMatrixLayoutDestroy(p.b);
            (void)cublasLtMatrixLayoutDestroy(p.d);
            (void)cublasLtMatmulDescDestroy(p.op);
        }
    }
};

namespace {

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::F32: return CUDA_R_32F;
        case DType::BF16: return CUDA_R_16BF;
        case DType::F16: return CUDA_R_16F;
        default: ::anvil::fail("matmul: dtype {} is not supported", dtype_name(t));
    }
}

const Plan& plan_for(const Ctx& c, const Gemm& g, DType dt) {
    const PlanKey key{g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int(dt), int(g.epi), g.beta != 0.0f, g.ld_aux};
    auto& cache = c.lt_plans->map;
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Plan p;
    const cudaDataType_t type = cuda_type(dt);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof g.epi));
    if (g.ld_aux > 0) {
        const int64_t ld = g.ld_aux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    // pointers are set per call; a placeholder lets the heuristic see an epilogue with operands
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, type, g.m, g.n, g.ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = c.lt_workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(c.lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    p.ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.ok) p.algo = result.algo;
    return cache.emplace(key, p).first->second;
}

// Runs the product; returns false (nothing done) when cuBLASLt has no algorithm for this epilogue/shape.
bool run(const Ctx& c, const Gemm& g, DType dt) {
    const Plan& p = plan_for(c, g, dt);
    if (!p.ok) return false;
    if (g.bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    if (g.aux)
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(c.lt, p.op, &alpha, g.A, p.a, g.B, p.b, &g.beta, g.D, p.d, g.D, p.d, &p.algo,
                                c.lt_workspace, c.lt_workspace_bytes, c.stream));
    return true;
}

void run_or_fail(const Ctx& c, const Gemm& g, DType dt) {
    ANVIL_CHECK(run(c, g, dt), "cuBLASLt has no algorithm for a {}x{}x{} {} product", g.m, g.n, g.k, dtype_name(dt));
}

template <typename T>
__global__ void bias_add_kernel(T* out, const T* bias, size_t n, int OC) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % OC]));
}

}  // namespace

std::shared_ptr<LtPlans> make_lt_plans() { return std::make_shared<LtPlans>(); }

// out (N,OC) = in (N,C) @ W (+ bias) [-> gelu]. Column-major: out^T (OC x N) = W' (OC x C) . in^T (C x N),
// where W' is W's storage read as (OC x C): directly for InOut (C,OC) row-major, transposed for OutIn.
void matmul_fwd(const Ctx& c, Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    Gemm g;
    g.m = OC, g.n = N, g.k = C;
    g.A = w.data, g.ta = layout == WLayout::OutIn, g.lda = layout == WLayout::InOut ? OC : C;
    g.B = in.data, g.ldb = C;
    g.D = pre_gelu.empty() ? out.data : out.data, g.ldd = OC;
    g.bias = bias.empty() ? nullptr : bias.data;
    if (!pre_gelu.empty()) {
        g.epi = bias.empty() ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        g.aux = pre_gelu.data, g.ld_aux = OC;
    } else if (!bias.empty()) {
        g.epi = CUBLASLT_EPILOGUE_BIAS;
    }
    if (run(c, g, in.dtype)) return;
    // No fused algorithm for this shape: the plain product, then bias and GELU as kernels.
    Gemm plain = g;
    plain.epi = CUBLASLT_EPILOGUE_DEFAULT, plain.bias = nullptr, plain.aux = nullptr, plain.ld_aux = 0;
    plain.D = pre_gelu.empty() ? out.data : pre_gelu.data;
    run_or_fail(c, plain, in.dtype);
    Tensor target = pre_gelu.empty() ? out : pre_gelu;
    if (!bias.empty())
        dispatch(out.dtype, [&](auto tag) {
            using T = decltype(tag);
            launch(bias_add_kernel<T>, size_t(target.numel()), 256, c.stream, target.ptr<T>(), bias.ptr<T>(),
                   size_t(target.numel()), OC);
        });
    if (!pre_gelu.empty()) gelu_fwd(c, out, pre_gelu);
}

void matmul_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w, WLayout layout,
                Tensor in_pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(dout.shape[dout.shape.ndim - 1]);
    const DType dt = in.dtype;
    if (!din.empty()) {
        // din^T (C x N) = W'' (C x OC) . dout^T (OC x N); W'' is W's storage read as (C x OC)
        Gemm g;
        g.m = C, g.n = N, g.k = OC;
        g.A = w.data, g.ta = layout == WLayout::InOut, g.lda = layout == WLayout::InOut ? OC : C;
        g.B = dout.data, g.ldb = OC;
        g.D = din.data, g.ldd = C;
        if (!in_pre_gelu.empty()) {
            g.epi = CUBLASLT_EPILOGUE_DGELU;
            g.aux = in_pre_gelu.data, g.ld_aux = C;
        }
        if (!run(c, g, dt)) {
            Gemm plain = g;
            plain.epi = CUBLASLT_EPILOGUE_DEFAULT, plain.aux = nullptr, plain.ld_aux = 0;
            run_or_fail(c, plain, dt);
            if (!in_pre_gelu.empty()) gelu_bwd(c, din, din, in_pre_gelu);
        }
    }
    // weight gradient, accumulated (beta 1)
    Gemm g;
    g.beta = 1.0f;
    if (layout == WLayout::InOut) {  // dW (C,OC) row-major = (OC x C): dout^T (OC x N) . in (N x C)
        g.m = OC, g.n = C, g.k = N;
        g.A = dout.data, g.lda = OC;
        g.B = in.data, g.tb = true, g.ldb = C;
        g.D = dw.data, g.ldd = OC;
    } else {  // dW (OC,C) row-major = (C x OC): in^T (C x N) . dout (N x OC)
        g.m = C, g.n = OC, g.k = N;
        g.A = in.data, g.lda = C;
        g.B = dout.data, g.tb = true, g.ldb = OC;
        g.D = dw.data, g.ldd = C;
    }
    run_or_fail(c, g, dt);
    if (!dbias.empty()) colsum_accumulate(c, dbias, dout);
}

}  // namespace anvil::cuda
