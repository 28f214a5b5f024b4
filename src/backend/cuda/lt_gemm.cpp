// The cuBLASLt product and its plan cache (see lt_gemm.h).
#include "backend/cuda/lt_gemm.h"

#include <map>
#include <tuple>

#include "backend/cuda/cuda_check.h"

namespace anvil::cuda {

namespace {

// The heuristic's best few algorithms, best first: one it offers can still be refused at run time
// (CUBLAS_STATUS_NOT_SUPPORTED), and then the next is tried; `next` is the first not yet refused.
constexpr int kAlgos = 4;
struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo[kAlgos]{};
    int found = 0, next = 0;
};

using PlanKey = std::tuple<bool, bool, int, int, int, int, int, int, int, int, int, int, bool, int, int, int64_t,
                           int64_t, int64_t, uint32_t, bool>;

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
        case DType::F32:
            return CUDA_R_32F;
        case DType::BF16:
            return CUDA_R_16BF;
        case DType::F16:
            return CUDA_R_16F;
        case DType::F8E4M3:
            return CUDA_R_8F_E4M3;
        case DType::F8E5M2:
            return CUDA_R_8F_E5M2;
        default:
            ::anvil::fail("matmul: dtype {} is not supported", dtype_name(t));
    }
}

// The alignment (a power of two, at most 256 bytes) every matrix of a batch starts at: cuBLASLt's heuristic
// assumes 256 unless told, and an algorithm that needs more than a pointer has fails at run time.
uint32_t alignment(const void* p, int64_t stride_elems, int batch, DType t) {
    uint64_t a = reinterpret_cast<uintptr_t>(p) | 256;
    if (batch > 1) a |= uint64_t(stride_elems) * dtype_size(t);
    return uint32_t(a & (~a + 1));
}

// The pointers a call sets on the descriptor, set before the heuristic too, so it sees the descriptor the
// calls run with (as Transformer Engine does; on the H100 this alone did not make the FP8 products run).
void set_pointers(const Plan& p, const Gemm& g) {
    const std::pair<cublasLtMatmulDescAttributes_t, const void*> ptrs[] = {
        {CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux},
        {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale},
        {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale}};
    for (const auto& [attr, ptr] : ptrs)
        if (ptr) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, attr, &ptr, sizeof ptr));
}

Plan& plan_for(const Ctx& c, const Gemm& g) {
    const uint32_t al_a = alignment(g.A, g.stride_a, g.batch, g.a_type),
                   al_b = alignment(g.B, g.stride_b, g.batch, g.b_type),
                   al_d = alignment(g.D, g.stride_d, g.batch, g.d);
    const PlanKey key{g.ta,        g.tb,       g.m,        g.n,        g.k,
                      g.lda,       g.ldb,      g.ldd,      int(g.a_type), int(g.b_type),
                      int(g.d),    int(g.epi), g.beta != 0.0f, g.ld_aux, g.batch,
                      g.stride_a,  g.stride_b, g.stride_d, al_a | al_b << 9 | al_d << 18, g.fast_accum};
    auto& cache = c.lt_plans->map;
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Plan p;
    const cudaDataType_t atype = cuda_type(g.a_type), btype = cuda_type(g.b_type), dtype = cuda_type(g.d);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof g.epi));
    if (g.ld_aux > 0) {
        const int64_t ld = g.ld_aux;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    if (g.fast_accum) {
        const int8_t on = 1;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on));
    }
    set_pointers(p, g);  // and again per call (lt_gemm)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, atype, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, btype, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, dtype, g.m, g.n, g.ldd));
    if (g.batch > 1) {
        const int32_t count = g.batch;
        const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
            {p.a, g.stride_a}, {p.b, g.stride_b}, {p.d, g.stride_d}};
        for (const auto& [layout, stride] : layouts) {
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                          sizeof count));
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                          &stride, sizeof stride));
        }
    }
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = c.lt_workspace_bytes;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d}};
    for (const auto& [attr, value] : aligns)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t results[kAlgos]{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(c.lt, p.op, p.a, p.b, p.d, p.d, pref, kAlgos, results, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < found; i++)
            if (results[i].state == CUBLAS_STATUS_SUCCESS) p.algo[p.found++] = results[i].algo;
    return cache.emplace(key, p).first->second;
}

}  // namespace

bool lt_gemm(const Ctx& c, const Gemm& g) {
    Plan& p = plan_for(c, g);
    set_pointers(p, g);
    for (; p.next < p.found; p.next++) {
        const cublasStatus_t s =
            cublasLtMatmul(c.lt, p.op, &g.alpha, g.A, p.a, g.B, p.b, &g.beta, g.D, p.d, g.D, p.d,
                           &p.algo[p.next], c.lt_workspace, c.lt_workspace_bytes, c.stream);
        if (s == CUBLAS_STATUS_SUCCESS) return true;
        if (s != CUBLAS_STATUS_NOT_SUPPORTED)  // (refused before any launch: the next is tried)
            ::anvil::check_fail("cublasLtMatmul", __func__, __FILE__, __LINE__, cublas_status_name(s));
    }
    return false;
}

void lt_gemm_or_fail(const Ctx& c, const Gemm& g) {
    ANVIL_CHECK(lt_gemm(c, g), "cuBLASLt has no algorithm for a {}x{}x{} {} product (batch {})", g.m, g.n,
                g.k, dtype_name(g.a_type), g.batch);
}

std::shared_ptr<LtPlans> make_lt_plans() {
    return std::make_shared<LtPlans>();
}

}  // namespace anvil::cuda
