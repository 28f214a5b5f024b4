// cuBLASLt loaded on first use rather than linked. libcublasLt is a 540 MB library whose static initialisers
// cost every process that links it about 0.35 s at start (measured with `perf record anvil --version`: 44% of
// the samples in libcublasLt, the rest mostly its page faults), although most anvil commands, the CPU backend
// and every CPU test never multiply on a GPU. The entry points anvil calls are defined here with cublasLt.h's
// own signatures (the compiler checks them against the header) and forward to the library, opened on the
// first call: the loader's path first (LD_LIBRARY_PATH, the executable's run path, PyTorch's pip package),
// then the CUDA toolkit's lib directory this build found. Under cuemu the emulator defines these symbols
// itself (tests/cuemu/cublaslt.cpp) and this file is not compiled.
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"

namespace {

#define ANVIL_STR2(x) #x
#define ANVIL_STR(x) ANVIL_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." ANVIL_STR(CUBLAS_VER_MAJOR);

void* library() {
    static std::once_flag once;
    static void* lib = nullptr;
    static std::string tried;
    std::call_once(once, [] {
        for (const std::string& name :
             {std::string(kSoname), std::string(ANVIL_CUDA_LIB_DIR "/") + kSoname}) {
            if ((lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) return;
            const char* e = dlerror();
            tried += (tried.empty() ? "" : "; ") + std::string(e ? e : name);
        }
    });
    if (!lib)
        throw anvil::DeviceError(
            std::string(kSoname) + " cannot be loaded (" + tried +
            "): install the CUDA toolkit's cuBLAS (or pip's nvidia-cublas) and put its lib "
            "directory on LD_LIBRARY_PATH, or use --device cpu");
    return lib;
}

void* symbol(const char* name) {
    void* f = dlsym(library(), name);
    if (!f)
        throw anvil::DeviceError(std::string(kSoname) + " has no " + name +
                                 ": it is older than the cuBLAS this build was compiled against (" +
                                 ANVIL_STR(CUBLAS_VERSION) + "); install that cuBLAS or a newer one");
    return f;
}

}  // namespace

// Each entry point: the library's function, looked up once, called with the same arguments.
#define ANVIL_LT_FORWARD(ret, name, params, args)                               \
    ret CUBLASWINAPI name params {                                              \
        static const auto f = reinterpret_cast<decltype(&name)>(symbol(#name)); \
        return f args;                                                          \
    }

ANVIL_LT_FORWARD(size_t, cublasLtGetVersion, (void), ())
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmul,
                 (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                  cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                  const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                  const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream),
                 (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                  workspace_bytes, stream))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                 (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                  cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                  cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                  int* returned),
                 (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescCreate,
                 (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                 (desc, compute, scale))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescSetAttribute,
                 (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                  size_t bytes),
                 (desc, attr, buf, bytes))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                 (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                  size_t bytes),
                 (pref, attr, buf, bytes))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutCreate,
                 (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
                  int64_t ld),
                 (layout, type, rows, cols, ld))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
ANVIL_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
                 (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                  size_t bytes),
                 (layout, attr, buf, bytes))
