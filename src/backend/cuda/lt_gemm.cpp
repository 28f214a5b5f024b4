// The cuBLASLt product and its plan cache (see lt_gemm.h).
#include "backend/cuda/lt_gemm.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"

namespace anvil::cuda {

namespace {

// The heuristic's best few algorithms, best first: one it offers can still be refused at run time
// (CUBLAS_STATUS_NOT_SUPPORTED), and then the next is tried; `next` is the first not yet refused. With
// Ctx::gemm_tune, the heuristic's best kTuneAlgos are timed on the plan's first call and put fastest first.
constexpr int kAlgos = 4, kTuneAlgos = 8;
struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo[kTuneAlgos]{};
    int found = 0, next = 0;
    bool tuned = false;
};

using PlanKey = std::tuple<bool, bool, int, int, int, int, int, int, int, int, int, int, bool, int, int,
                           int64_t, int64_t, int64_t, uint32_t, bool, bool>;

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

// The product's descriptor (types, transposes, epilogue, pointer mode, fast accumulation, the call's
// pointers) and its matrices' layouts (batched where g is)
void describe(Plan& p, const Gemm& g) {
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
    if (g.alpha_dev) {
        const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode));
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
}

// The heuristic's best algorithms (eight to time with Ctx::gemm_tune, else four) for operands that start at
// these alignments, into p.algo
void find_algorithms(const Ctx& c, Plan& p, uint32_t al_a, uint32_t al_b, uint32_t al_d) {
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
    cublasLtMatmulHeuristicResult_t results[kTuneAlgos]{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        c.lt, p.op, p.a, p.b, p.d, p.d, pref, c.gemm_tune ? kTuneAlgos : kAlgos, results, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < found; i++)
            if (results[i].state == CUBLAS_STATUS_SUCCESS) p.algo[p.found++] = results[i].algo;
}

Plan& plan_for(const Ctx& c, const Gemm& g) {
    const uint32_t al_a = alignment(g.A, g.stride_a, g.batch, g.a_type),
                   al_b = alignment(g.B, g.stride_b, g.batch, g.b_type),
                   al_d = alignment(g.D, g.stride_d, g.batch, g.d);
    const PlanKey key{g.ta,
                      g.tb,
                      g.m,
                      g.n,
                      g.k,
                      g.lda,
                      g.ldb,
                      g.ldd,
                      int(g.a_type),
                      int(g.b_type),
                      int(g.d),
                      int(g.epi),
                      g.beta != 0.0f,
                      g.ld_aux,
                      g.batch,
                      g.stride_a,
                      g.stride_b,
                      g.stride_d,
                      al_a | al_b << 9 | al_d << 18,
                      g.fast_accum,
                      g.alpha_dev != nullptr};
    auto& cache = c.lt_plans->map;
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Plan p;
    describe(p, g);
    find_algorithms(c, p, al_a, al_b, al_d);
    return cache.emplace(key, p).first->second;
}

cublasStatus_t run(const Ctx& c, const Plan& p, const Gemm& g, int i, void* D) {
    const float* alpha = g.alpha_dev ? g.alpha_dev : &g.alpha;
    const float* beta = g.alpha_dev ? g.beta_dev : &g.beta;
    return cublasLtMatmul(c.lt, p.op, alpha, g.A, p.a, g.B, p.b, beta, D, p.d, D, p.d, &p.algo[i],
                          c.lt_workspace, c.lt_workspace_bytes, c.stream);
}

// Ctx::gemm_tune: each of the plan's algorithms run once, then timed over kReps runs (CUDA events on the
// stream), into D itself when the product overwrites it (beta 0: the chosen one runs after and writes the
// result) or else into a scratch matrix of D's size, so an accumulated D is untouched. Refused ones are
// dropped; the fastest goes first. Printed: the shape, the fastest and the heuristic's first choice.
void tune(const Ctx& c, Plan& p, const Gemm& g) {
    constexpr int kReps = 3;
    p.tuned = true;
    if (p.found < 2) return;
    void* D = g.D;
    void* scratch = nullptr;
    if (g.beta != 0.0f) {
        const size_t bytes = (size_t(g.ldd) * g.n + size_t(g.batch - 1) * g.stride_d) * dtype_size(g.d);
        if (cudaMalloc(&scratch, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            return;  // no room to time it: the heuristic's order stands
        }
        CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, c.stream));
        D = scratch;
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<std::pair<float, int>> ms;  // (time, algorithm)
    for (int i = 0; i < p.found; i++) {
        if (run(c, p, g, i, D) != CUBLAS_STATUS_SUCCESS) continue;
        CUDA_CHECK(cudaEventRecord(start, c.stream));
        for (int r = 0; r < kReps; r++) CUBLAS_CHECK(run(c, p, g, i, D));
        CUDA_CHECK(cudaEventRecord(stop, c.stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.emplace_back(t / kReps, i);
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    if (scratch) CUDA_CHECK(cudaFree(scratch));
    if (ms.empty()) return;  // every one refused: lt_gemm's loop says so
    const float first = ms.front().second == 0 ? ms.front().first : -1.0f;
    std::stable_sort(ms.begin(), ms.end());
    cublasLtMatmulAlgo_t order[kTuneAlgos];
    for (size_t i = 0; i < ms.size(); i++) order[i] = p.algo[ms[i].second];
    std::copy(order, order + ms.size(), p.algo);
    p.found = int(ms.size()), p.next = 0;
    fmt::print(
        stderr,
        "anvil: gemm tune {}x{}x{} {}{}: {:.4f} ms (algorithm {} of {}), heuristic's first {:.4f} ms\n", g.m,
        g.n, g.k, dtype_name(g.a_type), g.batch > 1 ? " batched" : "", ms.front().first,
        ms.front().second + 1, ms.size(), first);
}

}  // namespace

bool lt_gemm(const Ctx& c, const Gemm& g) {
    Plan& p = plan_for(c, g);
    set_pointers(p, g);
    if (c.gemm_tune && !p.tuned) tune(c, p, g);
    for (; p.next < p.found; p.next++) {
        const cublasStatus_t s = run(c, p, g, p.next, g.D);
        if (s == CUBLAS_STATUS_SUCCESS) return true;
        if (s != CUBLAS_STATUS_NOT_SUPPORTED)  // (refused before any launch: the next is tried)
            ::anvil::device_check_fail("cublasLtMatmul", __func__, __FILE__, __LINE__, cublas_status_name(s));
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
