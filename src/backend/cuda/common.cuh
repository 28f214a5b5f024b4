// Device helpers shared by the kernels: dtype conversion, 16-byte packs, warp and block reductions, the
// dtype dispatch and the launch helper.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "core/tensor.h"

namespace anvil::cuda {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16_t x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ f16_t from_f<f16_t>(float x) { return __float2half_rn(x); }

// 16 bytes of T: the unit of coalesced loads and stores.
template <typename T>
struct alignas(16) Pack {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
template <typename T>
__device__ __forceinline__ Pack<T> load16(const T* p) {
    return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const Pack<T>& x) {
    *reinterpret_cast<Pack<T>*>(p) = x;
}

// cp.async (sm_80+): 16 bytes from global to shared memory without passing through registers, landing by the
// time a later cp_async_wait<N> covers their group (the groups are what cp_async_commit closes); `bytes` of
// them are read, the rest zero-filled (0: nothing read, `global` need only be a valid address). A barrier
// after the wait makes the other threads' copies visible.
__device__ __forceinline__ void cp_async16(void* smem, const void* global, int bytes) {
#if defined(ANVIL_CUEMU)
    ::cuemu::cp_async16(smem, global, bytes);
#else
    const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(global), "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(ANVIL_CUEMU)
    ::cuemu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(ANVIL_CUEMU)
    ::cuemu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Reduction over the block (blockDim.x a multiple of 32); every thread gets the result. `shared` holds 32
// floats; the leading barrier lets calls follow each other on the same buffer.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* shared, float identity, Op op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : identity;
    return warp_reduce(v, op);
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp{}); }
__device__ __forceinline__ float block_sum(float v, float* shared) { return block_reduce(v, shared, 0.0f, SumOp{}); }
__device__ __forceinline__ float block_max(float v, float* shared) {
    return block_reduce(v, shared, -FLT_MAX, MaxOp{});
}

// Calls f(T{}) with T the device type of `t` (float, bf16_t, f16_t).
template <typename F>
void dispatch(DType t, F&& f) {
    switch (t) {
        case DType::F32: f(float{}); return;
        case DType::BF16: f(bf16_t{}); return;
        case DType::F16: f(f16_t{}); return;
        default: ::anvil::fail("cuda backend: dtype {} is not a float type", dtype_name(t));
    }
}

inline unsigned blocks_for(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

// The launch helper: grid from the element count, then the launch check.
template <typename Kernel, typename... Args>
void launch(Kernel k, size_t n, unsigned threads, cudaStream_t s, Args... args) {
    if (n == 0) return;
    k<<<blocks_for(n, threads), threads, 0, s>>>(args...);
    CUDA_LAUNCH_CHECK();
}

}  // namespace anvil::cuda
