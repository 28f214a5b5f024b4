// cuemu's cuBLASLt: the descriptors anvil sets and cublasLtMatmul for them: column-major, op(A) and op(B),
// f32/bf16/f16 operands with f32 compute, strided batches, and the epilogues DEFAULT, BIAS, GELU_AUX and
// GELU_AUX_BIAS (GELU's tanh form on the f32 value, which goes to the aux matrix in D's type) and DGELU (the
// derivative of that form, as cuBLASLt computes it). FP8 operands (E4M3, E5M2, not both E5M2) with their
// A and B scale pointers, under the conditions Hopper's FP8 kernels set: the "TN" form (A transposed, B not),
// dimensions and leading dimensions multiples of 16, a 16-bit or f32 output, no bias epilogue into f32. The
// products run through OpenBLAS in f32.
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

#include "capture.h"

namespace {

struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t ld_aux = 0;
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    int8_t fast_accum = 0;
    cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;  // HOST or DEVICE: the same memory here
};
struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch = 1;
    int64_t stride = 0;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

Desc& desc(cublasLtMatmulDesc_t d) {
    return *reinterpret_cast<Desc*>(d->data);
}
Layout& layout(cublasLtMatrixLayout_t l) {
    return *reinterpret_cast<Layout*>(l->data);
}

bool fp8(cudaDataType_t t) {
    return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2;
}
bool supported(cudaDataType_t t) {
    return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F || fp8(t);
}

float read(const void* base, cudaDataType_t t, size_t i) {
    switch (t) {
        case CUDA_R_16BF:
            return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
        case CUDA_R_16F:
            return __half2float(static_cast<const __half*>(base)[i]);
        case CUDA_R_8F_E4M3:
            return float(static_cast<const __nv_fp8_e4m3*>(base)[i]);
        case CUDA_R_8F_E5M2:
            return float(static_cast<const __nv_fp8_e5m2*>(base)[i]);
        default:
            return static_cast<const float*>(base)[i];
    }
}
void write(void* base, cudaDataType_t t, size_t i, float v) {
    switch (t) {
        case CUDA_R_16BF:
            static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
            break;
        case CUDA_R_16F:
            static_cast<__half*>(base)[i] = __float2half_rn(v);
            break;
        default:
            static_cast<float*>(base)[i] = v;
    }
}

// An environment switch of the emulation: set, and not "0"
bool env_on(const char* name) {
    const char* e = std::getenv(name);
    return e && *e && std::string_view(e) != "0";
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
// tanh(u) of GELU's tanh form, gelu(x) = 0.5 x (1 + tanh(u))
float gelu_tanh(float x) {
    return std::tanh(kGeluC * (x + 0.044715f * x * x * x));
}
float gelu(float x) {
    return 0.5f * x * (1.0f + gelu_tanh(x));
}
float dgelu(float x) {
    const float th = gelu_tanh(x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
}

// op(M) of a stored column-major matrix as a dense row-major rows x cols f32 matrix.
std::vector<float> dense(const void* base, const Layout& l, bool trans, size_t offset, uint64_t rows,
                         uint64_t cols) {
    std::vector<float> out(rows * cols);
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++) {
            // op(M)(i, j) is M(i, j) or M(j, i); M(r, c) lives at r + c * ld
            const uint64_t r = trans ? j : i, c = trans ? i : j;
            out[i * cols + j] = read(base, l.type, offset + r + c * uint64_t(l.ld));
        }
    return out;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    *h = reinterpret_cast<cublasLtHandle_t>(new char);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete reinterpret_cast<char*>(h);
    return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion() {
    return CUBLAS_VERSION;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    *d = new cublasLtMatmulDescOpaque_t{};
    new ((*d)->data) Desc{compute, scale};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    Desc& m = desc(d);
    auto take = [&](auto& field) {
        if (size != sizeof field) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(&field, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    };
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
            return take(m.ta);
        case CUBLASLT_MATMUL_DESC_TRANSB:
            return take(m.tb);
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            return take(m.epi);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            return take(m.bias);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
            return take(m.aux);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
            return take(m.ld_aux);
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
            return take(m.a_scale);
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
            return take(m.b_scale);
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM:  // accepted; the emulation always accumulates in f32
            return take(m.fast_accum);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE:
            if (take(m.pointer_mode) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
            return m.pointer_mode == CUBLASLT_POINTER_MODE_HOST ||
                           m.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE
                       ? CUBLAS_STATUS_SUCCESS
                       : CUBLAS_STATUS_NOT_SUPPORTED;
        default:
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!supported(type) || ld < int64_t(rows)) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublasLtMatrixLayoutOpaque_t{};
    new ((*l)->data) Layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                size_t size) {
    Layout& m = layout(l);
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof m.batch) {
        std::memcpy(&m.batch, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof m.stride) {
        std::memcpy(&m.stride, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new cublasLtMatmulPreferenceOpaque_t{};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t, const void*,
                                                    size_t) {
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
    const Desc& m = desc(d);
    const cublasLtEpilogue_t known[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                        CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                        CUBLASLT_EPILOGUE_DGELU};
    const Layout &la = layout(a), &lb = layout(b), &lc = layout(c), &ldl = layout(dl);
    bool ok = requested >= 1 && m.compute == CUBLAS_COMPUTE_32F && m.scale == CUDA_R_32F && lc.type == ldl.type;
    ok = ok && std::find(std::begin(known), std::end(known), m.epi) != std::end(known);
    if (fp8(la.type) || fp8(lb.type)) {
        const uint64_t M = ldl.rows, N = ldl.cols, K = la.rows;  // TN: A stored K x M
        ok = ok && fp8(la.type) && fp8(lb.type) && !(la.type == CUDA_R_8F_E5M2 && lb.type == CUDA_R_8F_E5M2);
        ok = ok && m.ta == CUBLAS_OP_T && m.tb == CUBLAS_OP_N;
        ok = ok && M % 16 == 0 && N % 16 == 0 && K % 16 == 0 && la.ld % 16 == 0 && lb.ld % 16 == 0 && ldl.ld % 16 == 0;
        ok = ok && !fp8(ldl.type) && !(ldl.type == CUDA_R_32F && m.epi == CUBLASLT_EPILOGUE_BIAS);
        ok = ok && m.epi != CUBLASLT_EPILOGUE_DGELU && m.epi != CUBLASLT_EPILOGUE_GELU_AUX &&
             m.epi != CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    } else {
        ok = ok && la.type == lb.type;
    }
    // CUEMU_LT_NO_GELU_EPILOGUE=1: no algorithm with a GELU in the epilogue, as a cuBLASLt build may answer
    // for a shape; the caller's kernel then runs
    static const bool no_gelu = env_on("CUEMU_LT_NO_GELU_EPILOGUE");
    ok =
        ok && !(no_gelu && (m.epi == CUBLASLT_EPILOGUE_GELU_AUX || m.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS));
    // CUEMU_LT_NO_ZERO_STRIDE=1: no algorithm for a batch whose A or B is one matrix read again (a stride of
    // 0), as a cuBLASLt build may answer; the callers' fallbacks then run
    static const bool no_zero_stride = env_on("CUEMU_LT_NO_ZERO_STRIDE");
    const auto repeats = [](const Layout& l) { return l.batch > 1 && l.stride == 0; };
    ok = ok && !(no_zero_stride && (repeats(la) || repeats(lb)));
    // CUEMU_LT_ALGOS=N: N algorithms offered (all the same product), for what times or falls back among them
    const char* algos = std::getenv("CUEMU_LT_ALGOS");
    const int n = ok ? std::clamp(algos && *algos ? std::atoi(algos) : 1, 1, requested) : 0;
    *found = n;
    for (int i = 0; i < n; i++)
        results[i] = cublasLtMatmulHeuristicResult_t{}, results[i].state = CUBLAS_STATUS_SUCCESS;
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t al, const void* B, cublasLtMatrixLayout_t bl,
                              const void* beta_p, const void* C, cublasLtMatrixLayout_t cl, void* D,
                              cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t*, void*, size_t,
                              cudaStream_t stream) {
    // the descriptors' values now: a captured product keeps them, whatever the caller sets on them later
    const Desc m = desc(d);
    const Layout la = layout(al), lb = layout(bl), lc = layout(cl), ld = layout(dl);
    const bool ta = m.ta == CUBLAS_OP_T, tb = m.tb == CUBLAS_OP_T;
    const uint64_t M = ld.rows, N = ld.cols, K = ta ? la.rows : la.cols;
    if ((ta ? la.cols : la.rows) != M || (tb ? lb.cols : lb.rows) != K || (tb ? lb.rows : lb.cols) != N ||
        lc.rows != M || lc.cols != N)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool gelu_epi = m.epi == CUBLASLT_EPILOGUE_GELU_AUX || m.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool bias = m.epi == CUBLASLT_EPILOGUE_BIAS || m.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
               dgelu_epi = m.epi == CUBLASLT_EPILOGUE_DGELU;
    if ((bias && m.bias == nullptr) ||
        ((dgelu_epi || gelu_epi) && (m.aux == nullptr || m.ld_aux < int64_t(M))) ||
        (gelu_epi && ld.batch > 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool scaled = fp8(la.type) || fp8(lb.type);
    if (scaled) {
        // CUEMU_LT_FP8_SCALES_REFUSED=1: every algorithm refuses an FP8 product with scale pointers at run
        // time, as cuBLASLt 13.1 did on an H100 (its heuristic had offered them)
        if ((m.a_scale || m.b_scale) && env_on("CUEMU_LT_FP8_SCALES_REFUSED"))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    // host scalars are read at the call (a capture keeps their values, as cuBLASLt's does), device ones (and
    // the FP8 scales) when the product runs; device and host memory are one here
    const bool device_scalars = m.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    const float alpha_h = *static_cast<const float*>(alpha_p), beta_h = *static_cast<const float*>(beta_p);
    cuemu::enqueue(stream, [=] {
        float alpha = device_scalars ? *static_cast<const float*>(alpha_p) : alpha_h;
        const float beta = device_scalars ? *static_cast<const float*>(beta_p) : beta_h;
        if (scaled && m.a_scale) alpha *= *m.a_scale;  // FP8's scales multiply the product (D = alpha sA sB
        if (scaled && m.b_scale) alpha *= *m.b_scale;  // op(A) op(B) + ...); an absent scale is 1
        for (int32_t bi = 0; bi < ld.batch; bi++) {
            const std::vector<float> a = dense(A, la, ta, size_t(bi) * size_t(la.stride), M, K);
            const std::vector<float> b = dense(B, lb, tb, size_t(bi) * size_t(lb.stride), K, N);
            std::vector<float> p(M * N, 0.0f);
            if (K > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, a.data(),
                            int(K), b.data(), int(N), 0.0f, p.data(), int(N));
            const size_t doff = size_t(bi) * size_t(ld.stride), coff = size_t(bi) * size_t(lc.stride);
            for (uint64_t i = 0; i < M; i++)
                for (uint64_t j = 0; j < N; j++) {
                    float v = alpha * p[i * N + j];
                    if (beta != 0.0f) v += beta * read(C, lc.type, coff + i + j * uint64_t(lc.ld));
                    if (bias) v += read(m.bias, ld.type, i);
                    if (dgelu_epi) v *= dgelu(read(m.aux, ld.type, i + j * uint64_t(m.ld_aux)));
                    if (gelu_epi) write(m.aux, ld.type, i + j * uint64_t(m.ld_aux), v), v = gelu(v);
                    write(D, ld.type, doff + i + j * uint64_t(ld.ld), v);
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
