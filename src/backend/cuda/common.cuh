// Device helpers shared by the kernels: dtype conversion, 16-byte packs, warp and block reductions, the
// dtype dispatch and the launch helper.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "core/tensor.h"

namespace anvil::cuda {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16_t x) { return __half2float(x); }
__device__ __forceinline__ float to_f(int8_t x) {
    return float(x);
}

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ f16_t from_f<f16_t>(float x) { return __float2half_rn(x); }

// GELU (tanh approximation, as GPT-2) and its derivative, in f32
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
    const float th = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
}

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

// L consecutive elements of T moved as one access (L * sizeof(T) a power of two up to 16 bytes, the address a
// multiple of it): a 16-byte pack is Vec<T, Pack<T>::N>.
template <typename T, int L>
struct alignas(L * sizeof(T)) Vec {
    T v[L];
};

// L consecutive elements as floats, the unit the row helpers below hand out: a whole 16-byte pack (one
// vector access), a single element (a row that is not whole packs), or any Vec in between. L is a
// compile-time constant so the values stay in registers.
template <int L>
struct Floats {
    float v[L];
};
template <int L>
using Len = std::integral_constant<int, L>;

template <int L, typename T>
__device__ __forceinline__ Floats<L> load_floats(const T* p) {
    const Vec<T, L> q = *reinterpret_cast<const Vec<T, L>*>(p);
    Floats<L> f;
#pragma unroll
    for (int k = 0; k < L; k++) f.v[k] = to_f(q.v[k]);
    return f;
}
template <int L, typename T>
__device__ __forceinline__ void store_floats(T* p, const Floats<L>& f) {
    Vec<T, L> q;
#pragma unroll
    for (int k = 0; k < L; k++) q.v[k] = from_f<T>(f.v[k]);
    *reinterpret_cast<Vec<T, L>*>(p) = q;
}

// Whether every pointer is 16-byte aligned: where a packed path may run.
template <typename... P>
__host__ __device__ inline bool aligned16(const P*... p) {
    return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// Whether rows of C elements of T from these bases are whole 16-byte packs, every one aligned: where
// col_sums may read a row 16 bytes at a time.
template <typename T, typename... P>
__host__ __device__ inline bool whole_packs(int C, const P*... p) {
    return C % Pack<T>::N == 0 && aligned16(p...);
}

// Applies f(i, Len<L>{}) to the L elements from i, over n elements grid-strided: 16-byte packs when `packed`
// (every pointer the op touches 16-byte aligned: aligned16), then the tail one element at a time.
template <typename T, typename F>
__device__ __forceinline__ void for_each_pack(size_t n, bool packed, F&& f) {
    constexpr int V = Pack<T>::N;
    const size_t packs = packed ? n / V : 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x,
                 first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (size_t p = first; p < packs; p += stride) f(p * V, Len<V>{});
    for (size_t i = packs * V + first; i < n; i += stride) f(i, Len<1>{});
}

// for_each_pack over R rows of C elements, each tensor's rows its own ld apart (strided views): f(r, j,
// Len<L>{}) for the L elements from column j of row r, the blocks' x over a row's packs and y over the rows,
// both grid-strided. `packed`: every base 16-byte aligned and every ld whole packs.
template <typename T, typename F>
__device__ __forceinline__ void for_each_pack_rows(size_t R, size_t C, bool packed, F&& f) {
    constexpr int V = Pack<T>::N;
    const size_t packs = packed ? C / V : 0, first = size_t(blockIdx.x) * blockDim.x + threadIdx.x,
                 stride = size_t(gridDim.x) * blockDim.x;
    for (size_t r = blockIdx.y; r < R; r += gridDim.y) {
        for (size_t p = first; p < packs; p += stride) f(r, p * V, Len<V>{});
        for (size_t j = packs * V + first; j < C; j += stride) f(r, j, Len<1>{});
    }
}

// A row-major matrix's rows ld elements apart, for kernels that take strided views
template <typename T>
struct RowsOf {
    T* p;
    size_t ld;
    __device__ T* at(size_t r, size_t j) const { return p + r * ld + j; }
};

// Packs first, first + stride, ... below `packs` of x, in that order: f(p, Floats<Pack<T>::N>) for pack p, U
// of them loaded before any is handed to f, so a thread keeps U 16-byte loads in flight.
template <int U, typename T, typename I, typename F>
__device__ __forceinline__ void packs_loaded(const T* x, I packs, I first, I stride, F&& f) {
    constexpr int V = Pack<T>::N;
    I p = first;
    for (; p + (U - 1) * stride < packs; p += U * stride) {
        Floats<V> v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = load_floats<V>(x + (p + u * stride) * V);
#pragma unroll
        for (int u = 0; u < U; u++) f(p + u * stride, v[u]);
    }
    for (; p < packs; p += stride) f(p, load_floats<V>(x + p * V));
}

// A reduction's walk over x[0..n), grid-strided as for_each_pack: f(Floats<L>) for each 16-byte pack (L =
// Pack<T>::N) where `packed`, then each element of the tail (L = 1). U packs are loaded before any is handed
// to f, so a thread keeps U loads in flight: a pass that reads much and computes little over a few hundred
// blocks is bound by memory latency otherwise (one 16-byte load a thread over 256 blocks of 256 threads is
// 1 MiB in flight, about a third of what HBM3 needs at its rate). Each thread sees its packs in the same
// order whatever U is, so a sum does not change by a bit.
template <int U, typename T, typename F>
__device__ __forceinline__ void for_each_loaded(const T* x, size_t n, bool packed, F&& f) {
    constexpr int V = Pack<T>::N;
    const size_t packs = packed ? n / V : 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x,
                 first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    packs_loaded<U>(x, packs, first, stride, [&](size_t, const Floats<V>& v) { f(v); });
    for (size_t i = packs * V + first; i < n; i += stride) f(load_floats<1>(x + i));
}

// A warp's walk over a row of C elements of T: f(c, Len<L>{}) for the L elements from column c, lane-strided
// in 16-byte packs when C is whole packs (rows then start 16-byte aligned), element by element otherwise.
template <typename T, typename F>
__device__ __forceinline__ void warp_row(int C, int lane, F&& f) {
    constexpr int V = Pack<T>::N;
    if (C % V == 0) {
        for (int c = lane * V; c < C; c += 32 * V) f(c, Len<V>{});
    } else {
        for (int c = lane; c < C; c += 32) f(c, Len<1>{});
    }
}

// A block's walk over one row x[0..n): f(j, Len<L>{}) for the L elements from j, thread-strided in 16-byte
// packs when x is 16-byte aligned, then the tail (or, unaligned, every element) one at a time.
template <typename T, typename F>
__device__ __forceinline__ void block_row(const T* x, int n, F&& f) {
    constexpr int V = Pack<T>::N;
    const int tid = int(threadIdx.x), nt = int(blockDim.x);
    int j0 = 0;
    if (aligned16(x)) {
        for (int j = tid * V; j + V <= n; j += nt * V) f(j, Len<V>{});
        j0 = n / V * V;
    }
    for (int j = j0 + tid; j < n; j += nt) f(j, Len<1>{});
}

// block_row's walk with the values loaded: f(j, Floats<L>) for the L elements from j, in block_row's order (a
// running reduction over them gives the same bits), each thread loading U packs before it hands any out, so U
// 16-byte loads are in flight instead of one: a row pass that computes on every element (the classifier's
// exponentials) then overlaps its loads with that work.
template <int U, typename T, typename F>
__device__ __forceinline__ void block_row_loaded(const T* x, int n, F&& f) {
    constexpr int V = Pack<T>::N;
    const int tid = int(threadIdx.x), nt = int(blockDim.x);
    int j0 = 0;
    if (aligned16(x)) {
        packs_loaded<U>(x, n / V, tid, nt, [&](int p, const Floats<V>& v) { f(p * V, v); });
        j0 = n / V * V;
    }
    for (int j = j0 + tid; j < n; j += nt) f(j, load_floats<1>(x + j));
}

// Column sums over the rows of (N, C) tensors, deterministic: how parameter gradients (biases, norm gains)
// are reduced. Stage one: block (x, y) adds chunk y's rows for 32 L columns from 32 L x, each thread L
// adjacent columns (one 16-byte pack where the rows allow, L = Pack<T>::N) over every 8th row, then the 8 row
// lanes in order; stage two adds the chunks in order. Q quantities a column (LayerNorm: the gain's and the
// bias's): term(r, c, Len<L>{}, q) writes row r's Q x L terms for columns c..c+L-1 into float q[Q][L].
constexpr int kColLanes = 8;  // row lanes a block

// Chunks for N rows: at least 64 rows each, at most 256, and halved until their partial sums (`cols` floats a
// chunk: Q x C) fit `bytes` of scratch. It depends on the shape alone, so every card adds in the same order.
inline int col_chunks(int N, size_t cols, size_t bytes) {
    int k = N / 64 < 1 ? 1 : N / 64 > 256 ? 256 : N / 64;
    while (k > 1 && size_t(k) * cols * sizeof(float) > bytes) k /= 2;
    return k;
}

template <int Q, int L, typename Term>
__global__ void col_partial_kernel(float* partial, int N, int C, int chunks, Term term) {
    __shared__ float s[Q][kColLanes][32 * L + 1];
    const int c = (blockIdx.x * 32 + threadIdx.x) * L;
    const int per = (N + chunks - 1) / chunks, r0 = blockIdx.y * per, r1 = min(N, r0 + per);
    float acc[Q][L] = {}, q[Q][L];
    if (c < C)
#pragma unroll 4
        for (int r = r0 + threadIdx.y; r < r1; r += kColLanes) {
            term(r, c, Len<L>{}, q);
#pragma unroll
            for (int i = 0; i < Q; i++)
#pragma unroll
                for (int k = 0; k < L; k++) acc[i][k] += q[i][k];
        }
#pragma unroll
    for (int i = 0; i < Q; i++)
#pragma unroll
        for (int k = 0; k < L; k++) s[i][threadIdx.y][threadIdx.x * L + k] = acc[i][k];
    __syncthreads();
    // the block's 32 L columns, a thread each (blockDim is 32 x 8, so 256 L threads' worth in rounds)
    for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * L; j += 32 * kColLanes) {
        const int col = blockIdx.x * 32 * L + j;
        if (col >= C) continue;
#pragma unroll
        for (int i = 0; i < Q; i++) {
            float t = 0.0f;
            for (int y = 0; y < kColLanes; y++) t += s[i][y][j];
            partial[(size_t(blockIdx.y) * Q + i) * C + col] = t;
        }
    }
}

// out[i][c] += the chunks' sums of quantity i, in chunk order; a null out[i] is skipped (a frozen parameter).
template <typename T, int Q>
struct ColOut {
    T* p[Q];
};
template <typename T, int Q>
__global__ void col_finish_kernel(ColOut<T, Q> out, const float* partial, int C, int chunks) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
#pragma unroll
    for (int i = 0; i < Q; i++) {
        if (!out.p[i]) continue;
        float t = to_f(out.p[i][c]);
        for (int k = 0; k < chunks; k++) t += partial[(size_t(k) * Q + i) * C + c];
        out.p[i][c] = from_f<T>(t);
    }
}

// Stage one's output for N rows of Q x C column quantities: the chunk count and the workspace's first
// chunks * Q * C floats, where chunk k's sums of quantity i sit at partial[(k * Q + i) * C + column].
struct ColPartials {
    int chunks;
    float* partial;
};
inline ColPartials col_partials(const Ctx& c, int N, int Q, int C) {
    const int chunks = col_chunks(N, size_t(Q) * C, c.workspace_bytes);
    return {chunks, static_cast<float*>(c.scratch(0, size_t(chunks) * Q * C * sizeof(float)))};
}
// Stage two: out[i][c] += the chunks' sums, in chunk order.
template <typename T, int Q>
void col_finish(const Ctx& c, ColOut<T, Q> out, ColPartials p, int C) {
    col_finish_kernel<T, Q><<<(C + 255) / 256, 256, 0, c.stream>>>(out, p.partial, C, p.chunks);
    CUDA_LAUNCH_CHECK();
}

// The two stages; `packed`: the rows the term reads are whole 16-byte packs from 16-byte aligned bases.
template <typename T, int Q, typename Term>
void col_sums(const Ctx& c, ColOut<T, Q> out, int N, int C, bool packed, Term term) {
    const ColPartials p = col_partials(c, N, Q, C);
    if (packed) {
        constexpr int L = Pack<T>::N;
        col_partial_kernel<Q, L, Term><<<dim3((C + 32 * L - 1) / (32 * L), p.chunks), dim3(32, kColLanes), 0,
                                         c.stream>>>(p.partial, N, C, p.chunks, term);
    } else {
        col_partial_kernel<Q, 1, Term>
            <<<dim3((C + 31) / 32, p.chunks), dim3(32, kColLanes), 0, c.stream>>>(p.partial, N, C, p.chunks, term);
    }
    CUDA_LAUNCH_CHECK();
    col_finish(c, out, p, C);
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
