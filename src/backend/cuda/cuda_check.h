// One family of check macros for the NVIDIA libraries, built on anvil's generic check (expression, function,
// file, line). CUDA_LAUNCH_CHECK() checks the last kernel launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace anvil::cuda {
const char* cublas_status_name(cublasStatus_t s);
}

#define ANVIL_CHECK_GEN(expr, type, ok, describe)                                                            \
    do {                                                                                                     \
        const type status_ = (expr);                                                                         \
        if (status_ != (ok)) [[unlikely]]                                                                    \
            ::anvil::device_check_fail(#expr, __func__, __FILE__, __LINE__, std::string(describe(status_))); \
    } while (0)

#define CUDA_CHECK(expr) ANVIL_CHECK_GEN(expr, cudaError_t, cudaSuccess, cudaGetErrorString)
#define CUBLAS_CHECK(expr) \
    ANVIL_CHECK_GEN(expr, cublasStatus_t, CUBLAS_STATUS_SUCCESS, ::anvil::cuda::cublas_status_name)
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
