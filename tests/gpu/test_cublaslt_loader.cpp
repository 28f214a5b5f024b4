// cuBLASLt loaded at run time (src/backend/cuda/cublaslt_loader.cpp), with the real library and no GPU (label
// unit): the first call opens it, and the entry points that need no device (the version, the descriptors a
// product is planned with) reach it with their arguments intact. Which product runs is the GPU tests'
// business.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace {

TEST(CublasLtLoader, OpensTheLibraryThisBuildWasCompiledAgainst) {
    // cuBLAS numbers its versions major * 10000 + minor * 100 + patch; the soname carries the major
    EXPECT_EQ(cublasLtGetVersion() / 10000, size_t(CUBLAS_VER_MAJOR));
    EXPECT_GE(cublasLtGetVersion(), size_t(CUBLAS_VERSION) / 100 * 100);
}

TEST(CublasLtLoader, DescriptorsRoundTripTheirArguments) {
    cublasLtMatrixLayout_t layout = nullptr;
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 768, 3072, 768), CUBLAS_STATUS_SUCCESS);
    ASSERT_NE(layout, nullptr);
    const int32_t batch = 4;
    const int64_t stride = 768 * 3072;
    EXPECT_EQ(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
        CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                               sizeof stride),
              CUBLAS_STATUS_SUCCESS);
    // a wrong size is refused by the library itself, so the size argument arrived
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 1),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);

    cublasLtMatmulDesc_t desc = nullptr;
    ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t t = CUBLAS_OP_T;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);

    cublasLtMatmulPreference_t pref = nullptr;
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const uint64_t workspace = uint64_t(32) << 20;
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                   sizeof workspace),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
