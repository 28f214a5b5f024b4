// Products over a few rows (decoding: a token a row): out (N, OC) = in (N, C) . W (+ bias, + GELU), N up to
// kDirectRows. Such a product is bound by reading the weight once; cuBLASLt's tiles are sized for many rows
// and at one row spread the weight over few SMs. The weight is in the activations' dtype, or int8 with one
// f32 scale per output channel (W = q * scale[o]: the weight-only int8 models, which read a quarter of f32's
// bytes). f32 accumulation in a fixed order: runs repeat bit for bit, whatever order the blocks run in.
//   W (OC, C) (a Hugging Face Linear, the tied classifier): a warp per output channel, its lanes over 16-byte
//     runs of the channel's row, four loads in flight a lane; the lanes' sums added by shuffles.
//   W (C, OC) (GPT-2's Conv1D): a block per strip of 32 columns and a slice of the rows; a thread takes 8
//     columns (one 8- or 16-byte load a row) over every 64th row of the slice, four loads in flight; the row
//     lanes added in order (shuffles, then the block's warps through shared memory). Where the strips are too
//     few to fill the card, the rows are cut into slices: each block writes its sums to the workspace, and
//     the strip's last block to finish adds the slices in order (a counter a strip, set back to 0 by that
//     block).
// Weights whose rows are not whole runs, or tensors not 16-byte aligned, take plain kernels (an element a
// lane). The value is bias + scale * sum; with a GELU, pre_gelu gets it rounded and out its GELU
// (matmul_fwd's definition: the GELU of the unrounded value, as cuBLASLt's epilogue computes it).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kUnroll = 4;         // weight loads in flight a thread
constexpr int kStripCols = 32;     // W (C, OC): columns a block
constexpr int kColsPerThread = 8;  // a thread's columns: one load a row
constexpr int kColThreads = kStripCols / kColsPerThread;
constexpr int kThreads = 256;
constexpr int kRowLanes = kThreads / kColThreads;  // rows a block reads at once
constexpr int kWarps = kThreads / 32;

// The product's last step for row n, output channel o: s is the f32 sum.
template <typename T>
struct Finish {
    RowsOf<T> out, pre;  // pre.p null: no GELU
    const float* scale;  // int8 weights: a scale an output channel; else null
    const T* bias;       // or null
    __device__ void operator()(int n, int o, float s) const {
        float v = (scale ? scale[o] * s : s) + (bias ? to_f(bias[o]) : 0.0f);
        if (pre.p) {
            *pre.at(size_t(n), size_t(o)) = from_f<T>(v);
            v = gelu(v);
        }
        *out.at(size_t(n), size_t(o)) = from_f<T>(v);
    }
};

// L consecutive elements from p as floats, in accesses of at most 16 bytes (p aligned to them)
template <int L, typename T>
__device__ __forceinline__ Floats<L> load_run(const T* p) {
    constexpr int P = Pack<T>::N < L ? Pack<T>::N : L;
    Floats<L> f;
#pragma unroll
    for (int k = 0; k < L; k += P) {
        const Floats<P> part = load_floats<P>(p + k);
#pragma unroll
        for (int j = 0; j < P; j++) f.v[k + j] = part.v[j];
    }
    return f;
}

// W (OC, C), rows whole 16-byte runs: warp o of the grid computes output channel o for each of the N <= R
// rows.
template <typename T, typename W, int R>
__global__ void __launch_bounds__(kThreads)
    outin_kernel(Finish<T> fin, const T* x, const W* w, int N, int C, int OC) {
    constexpr int V = Pack<W>::N;
    const int o = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32), lane = int(threadIdx.x % 32);
    if (o >= OC) return;  // the whole warp
    float acc[R] = {};
    packs_loaded<kUnroll>(w + size_t(o) * C, C / V, lane, 32, [&](int p, const Floats<V>& wv) {
#pragma unroll
        for (int n = 0; n < R; n++) {
            if (n >= N) break;
            const Floats<V> xv = load_run<V>(x + size_t(n) * C + size_t(p) * V);
#pragma unroll
            for (int k = 0; k < V; k++) acc[n] += xv.v[k] * wv.v[k];
        }
    });
#pragma unroll
    for (int n = 0; n < R; n++) {
        if (n >= N) break;
        const float s = warp_sum(acc[n]);
        if (lane == 0) fin(n, o, s);
    }
}

// W (C, OC), OC a multiple of 8, w 16-byte aligned: block (x, y) takes the strip of columns from 32 x and
// slice y of gridDim.y of the rows. With slices, `partial` (gridDim.y, N, OC) and `done` (a counter a strip).
template <typename T, typename W, int R>
__global__ void __launch_bounds__(kThreads) inout_kernel(Finish<T> fin, float* partial, unsigned* done,
                                                         const T* x, const W* w, int N, int C, int OC) {
    constexpr int L = kColsPerThread;
    __shared__ float part[kWarps][R][kStripCols];
    __shared__ bool last;
    const int t = int(threadIdx.x), ct = t % kColThreads, rl = t / kColThreads, warp = t / 32, lane = t % 32;
    const int col = int(blockIdx.x) * kStripCols + ct * L;  // a thread's 8 columns are all in or all out
    const int per = (C + int(gridDim.y) - 1) / int(gridDim.y);
    const int r0 = int(blockIdx.y) * per, r1 = min(C, r0 + per);
    float acc[R][L] = {};
    const auto add_row = [&](int i, const Floats<L>& wv) {
#pragma unroll
        for (int n = 0; n < R; n++) {
            if (n >= N) break;
            const float xi = to_f(x[size_t(n) * C + i]);
#pragma unroll
            for (int k = 0; k < L; k++) acc[n][k] += xi * wv.v[k];
        }
    };
    if (col < OC) {
        int r = r0 + rl;
        for (; r + (kUnroll - 1) * kRowLanes < r1; r += kUnroll * kRowLanes) {
            Floats<L> wv[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) wv[u] = load_run<L>(w + size_t(r + u * kRowLanes) * OC + col);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) add_row(r + u * kRowLanes, wv[u]);
        }
        for (; r < r1; r += kRowLanes) add_row(r, load_run<L>(w + size_t(r) * OC + col));
    }
    // a warp's 8 row lanes (lanes ct, ct + 4, ..., ct + 28) added by shuffles, then the warps in order
#pragma unroll
    for (int n = 0; n < R; n++)
#pragma unroll
        for (int k = 0; k < L; k++)
            for (int m = kColThreads; m < 32; m *= 2) acc[n][k] += __shfl_xor_sync(0xffffffffu, acc[n][k], m);
    if (lane < kColThreads)
#pragma unroll
        for (int n = 0; n < R; n++)
#pragma unroll
            for (int k = 0; k < L; k++) part[warp][n][lane * L + k] = acc[n][k];
    __syncthreads();
    const int n = t / kStripCols, j = t % kStripCols, o = int(blockIdx.x) * kStripCols + j;
    const bool mine = n < N && o < OC;  // thread (n, j) finishes row n's column o
    float s = 0.0f;
    if (mine)
        for (int v = 0; v < kWarps; v++) s += part[v][n][j];
    if (gridDim.y == 1) {
        if (mine) fin(n, o, s);
        return;
    }
    if (mine) partial[(size_t(blockIdx.y) * N + n) * OC + o] = s;
    __threadfence();  // the sums are visible to every block before this block counts as done
    __syncthreads();
    if (t == 0) last = atomicAdd(&done[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    if (mine) {
        s = 0.0f;
        const volatile float* p = partial;  // past L1: other blocks wrote them
        for (unsigned y = 0; y < gridDim.y; y++) s += p[(size_t(y) * N + n) * OC + o];
        fin(n, o, s);
    }
    if (t == 0) done[blockIdx.x] = 0;
}

// Any alignment and width: W (OC, C) a warp per output channel, lanes over the elements; W (C, OC) a thread
// per output channel over the rows.
template <typename T, typename W>
__global__ void outin_plain(Finish<T> fin, const T* x, const W* w, int N, int C, int OC) {
    const int o = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32), lane = int(threadIdx.x % 32);
    if (o >= OC) return;
    float acc[kDirectRows] = {};
    for (int i = lane; i < C; i += 32) {
        const float wi = to_f(w[size_t(o) * C + i]);
        for (int n = 0; n < N; n++) acc[n] += to_f(x[size_t(n) * C + i]) * wi;
    }
    for (int n = 0; n < N; n++) {
        const float s = warp_sum(acc[n]);
        if (lane == 0) fin(n, o, s);
    }
}
template <typename T, typename W>
__global__ void inout_plain(Finish<T> fin, const T* x, const W* w, int N, int C, int OC) {
    const int o = int(size_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (o >= OC) return;
    float acc[kDirectRows] = {};
    for (int i = 0; i < C; i++) {
        const float wi = to_f(w[size_t(i) * OC + o]);
        for (int n = 0; n < N; n++) acc[n] += to_f(x[size_t(n) * C + i]) * wi;
    }
    for (int n = 0; n < N; n++) fin(n, o, acc[n]);
}

// f(Len<R>{}) with R the least of 1, 2, 4, 8 that holds N rows
template <typename F>
void with_rows(int N, F&& f) {
    if (N == 1)
        f(Len<1>{});
    else if (N == 2)
        f(Len<2>{});
    else if (N <= 4)
        f(Len<4>{});
    else
        f(Len<8>{});
}

// W (C, OC)'s slices of the rows: enough blocks for two a SM, each slice at least 256 rows (4 a row lane).
int inout_slices(int C, int OC, int sm_count) {
    const int strips = (OC + kStripCols - 1) / kStripCols;
    if (strips > kDirectStrips) return 1;
    const int want = (2 * std::max(sm_count, 1) + strips - 1) / strips;
    return std::clamp(std::min(want, C / 256), 1, 64);
}

template <typename T, typename W>
void launch_direct(const Ctx& c, const Finish<T>& fin, const T* x, const W* w, int N, int C, int OC,
                   WLayout layout) {
    if (layout == WLayout::OutIn) {
        if (C % Pack<W>::N != 0 || !aligned16(x, w))
            return launch(outin_plain<T, W>, size_t(OC) * 32, kThreads, c.stream, fin, x, w, N, C, OC);
        return with_rows(N, [&](auto r) {
            launch(outin_kernel<T, W, decltype(r)::value>, size_t(OC) * 32, kThreads, c.stream, fin, x, w, N,
                   C, OC);
        });
    }
    if (OC % kColsPerThread != 0 || !aligned16(w))
        return launch(inout_plain<T, W>, size_t(OC), kThreads, c.stream, fin, x, w, N, C, OC);
    const int slices = inout_slices(C, OC, c.sm_count);
    float* partial =
        slices > 1 ? static_cast<float*>(c.scratch(0, size_t(slices) * N * OC * sizeof(float))) : nullptr;
    const dim3 grid(unsigned((OC + kStripCols - 1) / kStripCols), unsigned(slices));
    with_rows(N, [&](auto r) {
        inout_kernel<T, W, decltype(r)::value>
            <<<grid, kThreads, 0, c.stream>>>(fin, partial, c.direct_done, x, w, N, C, OC);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace

void matmul_direct(const Ctx& c, Tensor out, Tensor in, Tensor w, Tensor scale, WLayout layout, Tensor bias,
                   Tensor pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    ANVIL_ASSERT(N >= 1 && N <= kDirectRows && (w.dtype == DType::I8) == !scale.empty() && c.direct_done);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        const Finish<T> fin{
            {out.row0<T>(), size_t(out.ld())},
            pre_gelu.empty() ? RowsOf<T>{nullptr, 0} : RowsOf<T>{pre_gelu.row0<T>(), size_t(pre_gelu.ld())},
            scale.empty() ? nullptr : scale.ptr<float>(),
            bias.empty() ? nullptr : bias.ptr<T>()};
        if (w.dtype == DType::I8)
            launch_direct(c, fin, in.ptr<T>(), w.ptr<int8_t>(), N, C, OC, layout);
        else
            launch_direct(c, fin, in.ptr<T>(), w.ptr<T>(), N, C, OC, layout);
    });
}

}  // namespace anvil::cuda
