// Token + position embedding (wpe null: tokens only). The backward is deterministic: the positions are stably sorted by token id
// (CUB radix sort), and one block per distinct token sums its positions' gradients in position order.
#include <cub/cub.cuh>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

template <typename T>
__global__ void embedding_fwd_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int T_,
                                     int C, int V) {
    const int per_row = C / Pack<T>::N;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(N) * per_row) return;
    const int n = int(idx / per_row), c = int(idx % per_row) * Pack<T>::N, t = n % T_;
    const int tok = tokens[n];
    Pack<T> o;
    if (tok < 0 || tok >= V) {  // the loaders validate ids; make a stray one visible rather than read wild memory
#pragma unroll
        for (int k = 0; k < Pack<T>::N; k++) o.v[k] = from_f<T>(__int_as_float(0x7fc00000));
    } else {
        const Pack<T> e = load16(wte + size_t(tok) * C + c);
        if (wpe) {
            const Pack<T> p = load16(wpe + size_t(t) * C + c);
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++) o.v[k] = from_f<T>(to_f(e.v[k]) + to_f(p.v[k]));
        } else {  // no learned positions (rotary models)
            o = e;
        }
    }
    store16(out + size_t(n) * C + c, o);
}

template <typename T>
__global__ void embedding_fwd_scalar(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int T_, int C,
                                     int V) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(N) * C) return;
    const int n = int(idx / C), c = int(idx % C), tok = tokens[n];
    out[idx] = tok < 0 || tok >= V ? from_f<T>(__int_as_float(0x7fc00000))
                                   : from_f<T>(to_f(wte[size_t(tok) * C + c]) +
                                               (wpe ? to_f(wpe[size_t(n % T_) * C + c]) : 0.0f));
}

// dwpe[t, c] += sum over b of dout[b, t, c], b in order
template <typename T>
__global__ void wpe_grad_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(T_) * C) return;
    float acc = to_f(dwpe[idx]);
    for (int b = 0; b < B; b++) acc += to_f(dout[size_t(b) * T_ * C + idx]);
    dwpe[idx] = from_f<T>(acc);
}

__global__ void iota_kernel(int32_t* v, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = i;
}

// One block per run of equal token ids: dwte[token] += sum of dout over the run's positions, in order.
template <typename T>
__global__ void wte_grad_kernel(T* dwte, const T* dout, const int32_t* unique, const int32_t* offsets,
                                const int32_t* counts, const int32_t* positions, const int32_t* num_runs, int C) {
    const int run = blockIdx.x;
    if (run >= *num_runs) return;
    const int tok = unique[run], begin = offsets[run], count = counts[run];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = to_f(dwte[size_t(tok) * C + c]);
        for (int k = 0; k < count; k++) acc += to_f(dout[size_t(positions[begin + k]) * C + c]);
        dwte[size_t(tok) * C + c] = from_f<T>(acc);
    }
}

}  // namespace

void embedding_fwd(const Ctx& c, Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
    const int B = int(tokens.dim(0)), T_ = int(tokens.dim(1)), C = int(wte.dim(1)), V = int(wte.dim(0)), N = B * T_;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (C % Pack<T>::N == 0)
            launch(embedding_fwd_kernel<T>, size_t(N) * (C / Pack<T>::N), 256, c.stream, out.ptr<T>(),
                   tokens.ptr<int32_t>(), wte.ptr<T>(), wpe.ptr<T>(), N, T_, C, V);
        else
            launch(embedding_fwd_scalar<T>, size_t(N) * C, 256, c.stream, out.ptr<T>(), tokens.ptr<int32_t>(),
                   wte.ptr<T>(), wpe.ptr<T>(), N, T_, C, V);
    });
}

namespace {

// out (n, C) += table[rows[i]] (R rows; one outside is skipped: the host cannot check device values); thread
// per element
template <typename T>
__global__ void rows_add_kernel(T* out, const T* table, const int* rows, int R, int n, int C) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(n) * C) return;
    const int i = int(idx / C), c = int(idx % C), r = rows[i];
    if (r < 0 || r >= R) return;
    out[idx] = from_f<T>(to_f(out[idx]) + to_f(table[size_t(r) * C + c]));
}

}  // namespace

void embedding_rows_add(const Ctx& c, Tensor out, Tensor table, Tensor rows) {
    const int C = int(table.dim(1)), B = int(rows.numel());
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(rows_add_kernel<T>, size_t(B) * C, 256, c.stream, out.ptr<T>(), table.ptr<T>(),
               rows.ptr<int32_t>(), int(table.dim(0)), B, C);
    });
}

void embedding_bwd(const Ctx& c, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
    const int B = int(tokens.dim(0)), T_ = int(tokens.dim(1)), C = int(dout.dim(2)), N = B * T_;
    if (!dwpe.empty())
        dispatch(dwpe.dtype, [&](auto tag) {
            using T = decltype(tag);
            launch(wpe_grad_kernel<T>, size_t(T_) * C, 256, c.stream, dwpe.ptr<T>(), dout.ptr<T>(), B, T_, C);
        });
    if (dwte.empty()) return;  // a frozen token embedding
    const int V = int(dwte.dim(0));
    int bits = 1;
    while ((1 << bits) < V) bits++;
    // workspace: sorted keys, positions in and out, unique ids, counts, offsets, run count, CUB's temp
    const size_t ints = size_t(N);
    size_t off = 0;
    auto take = [&](size_t bytes) {
        void* p = c.scratch(off, bytes);
        off = (off + 255) / 256 * 256 + bytes;
        return p;
    };
    auto* keys = static_cast<int32_t*>(take(ints * 4));
    auto* pos_in = static_cast<int32_t*>(take(ints * 4));
    auto* pos = static_cast<int32_t*>(take(ints * 4));
    auto* unique = static_cast<int32_t*>(take(ints * 4));
    auto* counts = static_cast<int32_t*>(take(ints * 4));
    auto* offsets = static_cast<int32_t*>(take(ints * 4));
    auto* num_runs = static_cast<int32_t*>(take(4));
    size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens.ptr<int32_t>(), keys, pos_in, pos, N, 0,
                                               bits, c.stream));
    CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, keys, unique, counts, num_runs, N, c.stream));
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets, N, c.stream));
    const size_t temp_bytes = std::max({sort_bytes, rle_bytes, scan_bytes});
    void* temp = take(temp_bytes);
    launch(iota_kernel, size_t(N), 256, c.stream, pos_in, N);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, tokens.ptr<int32_t>(), keys, pos_in, pos, N, 0, bits,
                                               c.stream));
    CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, rle_bytes, keys, unique, counts, num_runs, N, c.stream));
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, offsets, N, c.stream));
    dispatch(dwte.dtype, [&](auto tag) {
        using T = decltype(tag);
        wte_grad_kernel<T><<<N, 256, 0, c.stream>>>(dwte.ptr<T>(), dout.ptr<T>(), unique, offsets, counts, pos,
                                                     num_runs, C);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace anvil::cuda
