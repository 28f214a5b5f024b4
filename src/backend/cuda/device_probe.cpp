// The CUDA side of `anvil doctor` and `anvil bench`: the devices, and the measured ceilings (the layers above
// reach these through the backend factory, backend.h, and add the datasheets' figures themselves).
#include "backend/cuda/device_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"

namespace anvil {

namespace {

std::string version_str(int v) {
    return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

// cuDNN and NCCL are looked up here: their absence is reported, not fatal.
std::string runtime_library_version(const char* lib, const char* fn, bool nccl) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) return "not found";
    std::string out = "?";
    if (nccl) {
        using F = int (*)(int*);
        if (auto f = reinterpret_cast<F>(dlsym(h, fn))) {
            int v = 0;
            if (f(&v) == 0) out = fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
        }
    } else {
        using F = size_t (*)();
        if (auto f = reinterpret_cast<F>(dlsym(h, fn))) {
            const size_t v = f();
            out = fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
        }
    }
    dlclose(h);
    return out;
}

// cuBLASLt is loaded on its first call too (cublaslt_loader.cpp), which throws where it cannot be.
std::string cublaslt_version() {
    try {
        return fmt::format("{}", cublasLtGetVersion());
    } catch (const DeviceError&) {
        return "not found";
    }
}

}  // namespace

nlohmann::json cuda_device_report(std::string* problem) {
    nlohmann::json devices = nlohmann::json::array();
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    int drv = 0, rt = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorInsufficientDriver && drv == 0)
            *problem = "no NVIDIA driver is installed (libcuda.so.1 not found)";
        else if (e == cudaErrorInsufficientDriver)
            *problem = fmt::format("the NVIDIA driver (CUDA {}) is older than this binary's CUDA runtime {}",
                                   version_str(drv), version_str(rt));
        else if (e == cudaErrorNoDevice)
            *problem = "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
        else
            *problem = std::string("CUDA could not list devices: ") + cudaGetErrorString(e);
        return devices;
    }
    if (n == 0) {
        *problem = "no CUDA device is visible";
        return devices;
    }
    const std::string cudnn = runtime_library_version("libcudnn.so.9", "cudnnGetVersion", false);
    const std::string nccl = runtime_library_version("libnccl.so.2", "ncclGetVersion", true);
    const std::string cublaslt = cublaslt_version();
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        devices.push_back({{"index", i},
                           {"name", p.name},
                           {"compute_capability", fmt::format("{}.{}", p.major, p.minor)},
                           {"memory_gib", double(p.totalGlobalMem) / double(1ull << 30)},
                           {"sm_count", p.multiProcessorCount},
                           {"l2_mib", double(p.l2CacheSize) / double(1 << 20)},
                           {"driver_cuda", version_str(drv)},
                           {"runtime", version_str(rt)},
                           {"cublaslt", cublaslt},
                           {"cudnn", cudnn},
                           {"nccl", nccl}});
    }
    return devices;
}

namespace {

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
    }
    ~Timer() {
        (void)cudaEventDestroy(a);
        (void)cudaEventDestroy(b);
    }
    // median seconds of `reps` runs of f after a warm-up
    template <typename F>
    double median(F&& f, int reps, cudaStream_t s) {
        f();
        CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<float> ms;
        for (int r = 0; r < reps; r++) {
            CUDA_CHECK(cudaEventRecord(a, s));
            f();
            CUDA_CHECK(cudaEventRecord(b, s));
            CUDA_CHECK(cudaEventSynchronize(b));
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return double(ms[ms.size() / 2]) / 1e3;
    }
};

// One square product of size n in the given types; returns TFLOP/s, or 0 when cuBLASLt has no algorithm.
double matmul_rate(cublasLtHandle_t lt, cudaStream_t s, int n, cudaDataType_t ab, cudaDataType_t d,
                   cublasComputeType_t compute, bool fp8, void* ws, size_t ws_bytes, int reps) {
    const size_t ab_bytes = (ab == CUDA_R_32F ? 4 : (ab == CUDA_R_8F_E4M3 ? 1 : 2)) * size_t(n) * n;
    const size_t d_bytes = (d == CUDA_R_32F ? 4 : 2) * size_t(n) * n;
    void *A, *B, *D;
    CUDA_CHECK(cudaMalloc(&A, ab_bytes));
    CUDA_CHECK(cudaMalloc(&B, ab_bytes));
    CUDA_CHECK(cudaMalloc(&D, d_bytes));
    const size_t elems = size_t(n) * n;
    cuda::fill_uniform(s, A, elems, ab, 1);
    cuda::fill_uniform(s, B, elems, ab, 2);
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    if (fp8)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    else
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &nt, sizeof nt));
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, ab, n, n, n));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, n, n, n));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d, n, n, n));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                      sizeof wsb));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    double rate = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        const float alpha = 1.0f, beta = 0.0f;
        Timer timer;
        const double sec = timer.median(
            [&] {
                CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws,
                                            ws_bytes, s));
            },
            reps, s);
        rate = 2.0 * double(n) * n * n / sec / 1e12;
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    (void)cublasLtMatrixLayoutDestroy(la);
    (void)cublasLtMatrixLayoutDestroy(lb);
    (void)cublasLtMatrixLayoutDestroy(ld);
    (void)cublasLtMatmulDescDestroy(op);
    (void)cudaFree(A);
    (void)cudaFree(B);
    (void)cudaFree(D);
    return rate;
}

}  // namespace

GpuRates cuda_measure(int device, bool quick) {
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    GpuRates r;
    r.device_name = p.name;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cublasLtHandle_t lt;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    const size_t ws_bytes = size_t(64) << 20;
    void* ws;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    const int n = quick ? 4096 : 8192, reps = quick ? 5 : 10;
    struct Case {
        const char* name;
        cudaDataType_t ab, d;
        cublasComputeType_t compute;
        bool fp8;
    };
    std::vector<Case> cases = {
        {"matmul_fp32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, false},
        {"matmul_tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, false},
        {"matmul_bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, false},
        {"matmul_fp16", CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, false},
    };
    if (p.major * 10 + p.minor >= 89)
        cases.push_back({"matmul_fp8", CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, true});
    for (const Case& c : cases) {
        const double rate = matmul_rate(lt, s, n, c.ab, c.d, c.compute, c.fp8, ws, ws_bytes, reps);
        if (rate > 0)
            r.rates.push_back({c.name, "TFLOP/s", rate,
                               fmt::format("cuBLASLt {}x{}x{}, random inputs, median of {}", n, n, n, reps)});
    }
    // bandwidths
    const size_t bytes = size_t(quick ? 256 : 1024) << 20;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    Timer timer;
    double sec =
        timer.median([&] { CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); }, reps, s);
    r.rates.push_back({"copy_d2d", "GB/s", 2.0 * double(bytes) / sec / 1e9,
                       fmt::format("cudaMemcpy of {} MiB, bytes read + written", bytes >> 20)});
    const size_t hbytes = size_t(256) << 20;
    void* pinned;
    CUDA_CHECK(cudaHostAlloc(&pinned, hbytes, cudaHostAllocDefault));
    std::memset(pinned, 1, hbytes);
    sec = timer.median([&] { CUDA_CHECK(cudaMemcpyAsync(a, pinned, hbytes, cudaMemcpyHostToDevice, s)); },
                       reps, s);
    r.rates.push_back(
        {"h2d_pinned", "GB/s", double(hbytes) / sec / 1e9, "256 MiB from page-locked host memory"});
    std::vector<char> pageable(hbytes, 1);
    sec = timer.median(
        [&] { CUDA_CHECK(cudaMemcpyAsync(a, pageable.data(), hbytes, cudaMemcpyHostToDevice, s)); }, reps, s);
    r.rates.push_back(
        {"h2d_pageable", "GB/s", double(hbytes) / sec / 1e9, "256 MiB from ordinary host memory"});
    (void)cudaFreeHost(pinned);
    (void)cudaFree(a);
    (void)cudaFree(b);
    (void)cudaFree(ws);
    (void)cublasLtDestroy(lt);
    (void)cudaStreamDestroy(s);
    return r;
}

}  // namespace anvil
