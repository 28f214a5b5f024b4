// cuemu: the CUDA backend's kernels run on the CPU, for testing without a GPU.
//
// Each kernel source (src/backend/cuda/*.cu) is rewritten by rewrite.py (launches `k<<<g, b, smem,
// s>>>(args)` become `cuemu::launch_cfg(g, b, smem, s)(k, args)`, `extern __shared__` arrays become the
// launch's dynamic shared memory) and compiled as C++ with this header included first. A launch runs its
// blocks one after another; the threads of a block are fibers switched at __syncthreads, __syncwarp and the
// warp shuffles, so a block's threads really interleave at every barrier, in the order CUEMU_ORDER says
// (forward, reverse or shuffle: a missing barrier reads what the other order has not yet written). Launches
// are checked against the hardware's limits (threads per block, grid size, dynamic shared memory past 48 KiB
// without cudaFuncSetAttribute), a barrier some threads of the block or warp never reach is reported as the
// deadlock it is on a GPU, and a shuffle that names an exited lane fails. Runtime calls and cuBLASLt are
// emulated in runtime.cpp (device memory is host memory, filled with 0xFF on allocation; streams run in
// order).
//
// What it cannot show: timing, memory coalescing, bank conflicts, real warp scheduling, and races between
// blocks (blocks run one at a time); compute-sanitizer on a card stays the word on those.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

namespace cuemu {

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void* dynamic_smem();
// Called once per static __shared__ array (rewrite.py adds the call): the array is filled with 0xFF before
// each later block of the running kernel. Returns true.
bool register_shared(void* array, size_t bytes);
// The most dynamic shared memory a block may opt in to: Hopper's 227 KiB, or CUEMU_SMEM_OPTIN_KIB (99 for
// Ada).
size_t smem_optin();
// Stops the run naming the block and thread (for the shims' checks).
[[noreturn]] void fail(const std::string& what);
// Stops the run for an access of `size` bytes at an address that is not a multiple of `align` (out of line,
// so that the check inlined into every cast stays small: a kernel's loops still vectorise).
[[noreturn, gnu::cold, gnu::noinline]] void misaligned(size_t size, size_t align);
// Fails when [first, last) starts in the running block's dynamic shared memory and leaves it.
void check_smem_span(const void* first, const void* last);
void sync_block();
void sync_warp(unsigned mask);
enum class Shfl { Idx, Xor };
// Every lane of `mask` publishes `value`; the result is what lane `arg` (Idx, within segments of `width`) or
// lane ^ `arg` (Xor) published.
uint64_t shuffle(unsigned mask, uint64_t value, Shfl kind, int arg, int width);
void run_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);

struct Launch {
    dim3 grid, block;
    size_t smem;
    template <typename... P, typename... A>
    void operator()(void (*kernel)(P...), A&&... args) const {
        // every thread calls the kernel with its own copies of the arguments, as on a GPU
        run_kernel(reinterpret_cast<const void*>(kernel), grid, block, smem, [&] { kernel(args...); });
    }
};
inline Launch launch_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
    return Launch{grid, block, smem};
}

// Every `reinterpret_cast` in a kernel source becomes this (rewrite.py): a pointer cast checks that the
// address suits the type it now points to, as a GPU's vector loads and stores demand (a 16-byte load from an
// address that is not a multiple of 16 is a misaligned-address fault there, while x86 just loads).
template <typename To, typename From>
To checked_cast(From&& from) {
    using F = std::remove_cvref_t<From>;
    if constexpr (std::is_pointer_v<To> && std::is_pointer_v<F>) {
        using E = std::remove_cv_t<std::remove_pointer_t<To>>;
        if constexpr (!std::is_void_v<E> && !std::is_function_v<E>) {
            if (reinterpret_cast<uintptr_t>(from) % alignof(E) != 0) [[unlikely]]
                misaligned(sizeof(E), alignof(E));
        }
    }
    return reinterpret_cast<To>(std::forward<From>(from));
}

template <typename T>
T shfl(unsigned mask, T v, Shfl kind, int arg, int width) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "cuemu: a shuffle moves at most 8 bytes");
    uint64_t in = 0;
    std::memcpy(&in, &v, sizeof(T));
    const uint64_t out = shuffle(mask, in, kind, arg, width);
    T r;
    std::memcpy(&r, &out, sizeof(T));
    return r;
}

}  // namespace cuemu

#define threadIdx (::cuemu::thread_idx())
#define blockIdx (::cuemu::block_idx())
#define blockDim (::cuemu::block_dim())
#define gridDim (::cuemu::grid_dim())

inline void __syncthreads() {
    ::cuemu::sync_block();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ::cuemu::sync_warp(mask);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ::cuemu::shfl(mask, v, ::cuemu::Shfl::Idx, src, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::cuemu::shfl(mask, v, ::cuemu::Shfl::Xor, lane_mask, width);
}

inline float __expf(float x) {
    return std::exp(x);
}
inline float rsqrtf(float x) {
    return 1.0f / std::sqrt(x);
}
inline float __int_as_float(int x) {
    return std::bit_cast<float>(x);
}
inline int __float_as_int(float x) {
    return std::bit_cast<int>(x);
}
// CUDA's integer min/max overloads (mixed signedness compares as unsigned, as CUDA's do)
inline int min(int a, int b) {
    return a < b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
inline unsigned min(int a, unsigned b) {
    return min(unsigned(a), b);
}
inline unsigned min(unsigned a, int b) {
    return min(a, unsigned(b));
}
inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
inline unsigned max(int a, unsigned b) {
    return max(unsigned(a), b);
}
inline unsigned max(unsigned a, int b) {
    return max(a, unsigned(b));
}
inline long long max(long long a, long long b) {
    return a > b ? a : b;
}

// the runtime's C++ overload for a kernel (nvcc declares it only for device compilation)
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
