// cuemu: the CUDA backend's kernels run on the CPU, for testing without a GPU.
//
// Each kernel source (src/backend/cuda/*.cu) is rewritten by rewrite.py (launches `k<<<g, b, smem,
// s>>>(args)` become `cuemu::launch_cfg(g, b, smem, s)(k, args)`, `extern __shared__` arrays become the
// launch's dynamic shared memory) and compiled as C++ with this header included first. A launch runs its
// blocks one after another; the threads of a block are fibers switched at __syncthreads, __syncwarp and the
// warp shuffles, so a block's threads really interleave at every barrier, in the order CUEMU_ORDER says
// (forward, reverse or shuffle: a missing barrier reads what the other order has not yet written; warps: each
// warp runs on to its next __syncthreads before the next one starts, so one that overtakes the others
// overwrites what they have not yet read). Launches
// are checked against the hardware's limits (threads per block, grid size, dynamic shared memory past 48 KiB
// without cudaFuncSetAttribute), a barrier some threads of the block or warp never reach is reported as the
// deadlock it is on a GPU, and a shuffle that names an exited lane fails. Runtime calls and cuBLASLt are
// emulated in runtime.cpp (device memory is host memory, filled with 0xFF on allocation; streams run in
// order).
//
// What it cannot show: timing, memory coalescing, bank conflicts, real warp scheduling, and races between
// blocks (blocks run one at a time); compute-sanitizer on a card stays the word on those.
#pragma once

#define ANVIL_CUEMU 1  // src/backend/cuda/mma.cuh takes the emulated mma.sync and ldmatrix

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
#include <tuple>
#include <type_traits>
#include <utility>

#include "capture.h"

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
// The whole warp's exchange under mma.sync and ldmatrix (warp_mma below): every lane publishes `bytes` (at
// most kWarpSlot) from `mine` and gets the 32 lanes' at `all`, lane i's at all + i * bytes. The caller reads
// what it needs, then calls sync_warp(0xffffffff), so no lane overwrites its slot before every lane has read.
constexpr size_t kWarpSlot = 64;
void warp_gather(const void* mine, size_t bytes, void* all);
// cp.async (common.cuh): a 16-byte copy from global to shared memory, `src_bytes` of it read and the rest
// zero; it lands only when a cp_async_wait covers its group (the latest a GPU may land it;
// CUEMU_CP_ASYNC=early: at once, the earliest), and a thread that exits with copies in flight is reported.
void cp_async16(void* dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);  // lands every group but the `pending` most recent
void run_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);

struct Launch {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... P, typename... A>
    void operator()(void (*kernel)(P...), A&&... args) const {
        if (!capturing(stream)) {
            // every thread calls the kernel with its own copies of the arguments, as on a GPU
            run_kernel(reinterpret_cast<const void*>(kernel), grid, block, smem, [&] { kernel(args...); });
            return;
        }
        // captured (capture.h): the arguments as they are now, for every replay
        enqueue(
            stream, [kernel, g = grid, b = block, sm = smem, a = std::tuple<std::decay_t<A>...>(args...)] {
                run_kernel(reinterpret_cast<const void*>(kernel), g, b, sm, [&] { std::apply(kernel, a); });
            });
    }
};
inline Launch launch_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
    return Launch{grid, block, smem, stream};
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

// PTX's warp-level matrix instructions as src/backend/cuda/mma.cuh uses them, with the fragment layouts of
// the PTX ISA ("Matrix Fragments for mma.m16n8k16", "ldmatrix"): lane l is in group g = l / 4 at position
// q = l % 4; a 32-bit register holds two 16-bit elements, the lower-numbered column (or row) in its low half.
//   A (16 x 16, row-major): a[0] = (g, 2q..2q+1), a[1] = (g + 8, 2q..), a[2] = (g, 2q + 8..),
//                           a[3] = (g + 8, 2q + 8..)
//   B (16 x 8, k x n):      b[0] = (2q..2q+1, g), b[1] = (2q + 8.., g)
//   C, D (16 x 8, fp32):    c[0..1] = (g, 2q..2q+1), c[2..3] = (g + 8, 2q..2q+1)
// ldmatrix.x4: lane 8j + r names the address of row r of 8 x 8 matrix j (16 bytes, 16-byte aligned);
// register j of lane l gets row l / 4, elements 2(l % 4)..+1 of matrix j, or with .trans elements
// (2(l % 4)..+1, l / 4), the matrix transposed. Every lane of the warp must take part, as on the hardware
// (.sync.aligned).
template <typename T>
float mma_elt(uint32_t r, int i) {
    const auto h = static_cast<unsigned short>(r >> (16 * i));
    if constexpr (std::is_same_v<T, __half>)
        return __half2float(__ushort_as_half(h));
    else
        return __bfloat162float(__ushort_as_bfloat16(h));
}
inline int lane_id() {
    const uint3& t = thread_idx();
    const dim3& b = block_dim();
    return int((t.x + b.x * (t.y + b.y * t.z)) % 32);
}
template <typename T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    struct Frag {
        uint32_t a[4], b[2];
        float c[4];
    } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {d[0], d[1], d[2], d[3]}}, all[32];
    warp_gather(&mine, sizeof mine, all);
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, q = l % 4;
        for (int i = 0; i < 2; i++) {
            A[g][2 * q + i] = mma_elt<T>(all[l].a[0], i);
            A[g + 8][2 * q + i] = mma_elt<T>(all[l].a[1], i);
            A[g][2 * q + 8 + i] = mma_elt<T>(all[l].a[2], i);
            A[g + 8][2 * q + 8 + i] = mma_elt<T>(all[l].a[3], i);
            B[2 * q + i][g] = mma_elt<T>(all[l].b[0], i);
            B[2 * q + 8 + i][g] = mma_elt<T>(all[l].b[1], i);
            C[g][2 * q + i] = all[l].c[i];
            C[g + 8][2 * q + i] = all[l].c[2 + i];
        }
    }
    const int lane = lane_id(), g = lane / 4, q = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * q + i % 2;
        float s = C[row][col];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[i] = s;
    }
    sync_warp(0xffffffffu);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
    const void* all[32];
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail("ldmatrix: a row address is not 16-byte aligned");
    check_smem_span(row, static_cast<const unsigned char*>(row) + 16);
    warp_gather(&row, sizeof row, all);
    const int lane = lane_id();
    for (int j = 0; j < 4; j++) {
        uint16_t e[2];
        for (int i = 0; i < 2; i++) {
            const auto* rows = reinterpret_cast<const uint16_t* const*>(all + 8 * j);
            e[i] = trans ? rows[2 * (lane % 4) + i][lane / 4] : rows[lane / 4][2 * (lane % 4) + i];
        }
        r[j] = uint32_t(e[0]) | uint32_t(e[1]) << 16;
    }
    sync_warp(0xffffffffu);  // what the warp stores next cannot change what a slower lane loaded
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
// Blocks run one at a time and a block's threads switch only at barriers and shuffles, so an atomic is a
// plain read-modify-write and a fence has nothing to order. (Races between blocks stay compute-sanitizer's.)
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline int atomicMax(int* p, int v) {
    const int old = *p;
    *p = std::max(old, v);
    return old;
}
inline void __threadfence() {}
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
