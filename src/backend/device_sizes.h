// Sizes a backend decides, written once for the backend itself and for anvil plan's dry run (dry_backend.h),
// which must count what a backend would allocate without being that backend (a CPU-only build plans for a
// GPU): what attention keeps per layer for the backward and uses as scratch, and the CUDA backend's
// workspaces.
#pragma once

#include <algorithm>
#include <cstddef>

#include "backend/backend.h"

namespace anvil::sizes {

// The CPU backend: attention keeps the (T, T) probabilities of every head; its backward works on one (T, T)
// matrix per thread. Elements of the activation dtype (f32 on the CPU).
inline size_t cpu_attention_saved_elems(const AttnDims& d) {
    return size_t(d.B) * d.NH * d.T * d.T;
}
inline size_t cpu_attention_scratch_elems(const AttnDims& d, int threads) {
    return size_t(threads) * d.T * d.T;
}

// The CUDA backend: workspaces held from the start (partial sums and sort buffers; cuBLASLt's own).
inline constexpr size_t kCudaWorkspaceBytes = size_t(64) << 20;
inline constexpr size_t kCudaLtWorkspaceBytes = size_t(32) << 20;
// and the direct products' counters (cuda::kDirectStrips of them, gemv.cu)
inline constexpr size_t kCudaDirectDoneBytes = 1024 * sizeof(unsigned);
// Its flash kernels keep one f32 log-sum-exp per row and head, and the backward as much scratch.
inline size_t cuda_flash_saved_bytes(const AttnDims& d) {
    return size_t(d.B) * d.NH * d.T * sizeof(float);
}
inline size_t cuda_flash_scratch_bytes(const AttnDims& d) {
    return size_t(d.B) * d.NH * d.T * sizeof(float);
}
// Its cuBLASLt attention keeps the (T, T) probabilities of every head (elements of the activation dtype);
// `auto` takes it only where they take at most this much per layer (and the flash kernels cannot run on the
// tensor cores), and only where one head's (T, T) f32 scores fit the workspace.
inline size_t cuda_gemm_saved_elems(const AttnDims& d) {
    return size_t(d.B) * d.NH * d.T * d.T;
}
inline constexpr size_t kCudaGemmSavedLimit = size_t(1) << 30;
inline bool cuda_gemm_fits(const AttnDims& d) {
    return size_t(d.T) * d.T * sizeof(float) <= kCudaWorkspaceBytes;
}
// Whether --attention `impl` keeps cuBLASLt's probabilities for these dims: gemm wherever one head's scores
// fit (`gemm_fits`); auto where the flash kernels cannot take the tensor cores (`flash_tensor_cores`) and
// the probabilities take at most kCudaGemmSavedLimit; flash, flash-simt and cudnn never.
inline bool cuda_gemm_planned(AttentionImpl impl, const AttnDims& d, bool flash_tensor_cores,
                              bool gemm_fits) {
    if (!gemm_fits || (impl != AttentionImpl::Gemm && impl != AttentionImpl::Auto)) return false;
    return impl == AttentionImpl::Gemm ||
           (!flash_tensor_cores && cuda_gemm_saved_elems(d) * 2 <= kCudaGemmSavedLimit);
}
// The saved tensor has the activation dtype; the flash kernels keep f32 statistics in it, so they ask for
// bytes / 2 elements (16-bit types; f32 gets twice what it needs); the cuBLASLt path the probabilities.
inline size_t cuda_attention_saved_elems(const AttnDims& d, bool gemm_planned) {
    const size_t flash = (cuda_flash_saved_bytes(d) + 1) / 2;
    return gemm_planned ? std::max(flash, cuda_gemm_saved_elems(d)) : flash;
}
inline size_t cuda_attention_scratch_elems(const AttnDims& d) {
    return (cuda_flash_scratch_bytes(d) + 1) / 2;
}
// What an FP8 product's forward keeps for its backward (Backend::fp8_kept_elems), where FP8's kernels take
// the product (16-bit activations, every dimension a multiple of 16): a header of kCudaFp8KeptHeader bytes
// (the input's scale, then at 512 the weight's), the weight's rounding in the backward's orientation (C OC
// bytes, rounded up to 256), then the input's rounding transposed (N C bytes). Each part is used where the
// transposing kernel takes its operand's shape (checked per call). Elements of the activations' 16-bit dtype.
inline constexpr size_t kCudaFp8KeptHeader = 1024;
inline size_t cuda_fp8_kept_weight_bytes(int C, int OC) {
    return (size_t(C) * size_t(OC) + 255) / 256 * 256;
}
// Whether cuBLASLt's FP8 kernels take an N x C -> OC product (fp8.cu; else the rounded values scaled back
// go through the ordinary product).
inline bool cuda_fp8_kernels_take(int N, int C, int OC, DType dt) {
    return (dt == DType::BF16 || dt == DType::F16) && N % 16 == 0 && C % 16 == 0 && OC % 16 == 0;
}
inline size_t cuda_fp8_kept_elems(int N, int C, int OC, DType dt) {
    return cuda_fp8_kernels_take(N, C, OC, dt)
               ? (kCudaFp8KeptHeader + cuda_fp8_kept_weight_bytes(C, OC) + size_t(N) * size_t(C) + 1) / 2
               : 0;
}
}  // namespace anvil::sizes
