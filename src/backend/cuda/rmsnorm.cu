// RMSNorm's backward (Llama; its forward is layernorm.cu's norm kernel), statistics in f32: one warp per row
// in 16-byte packs, as layernorm.cu; the gain's gradient is reduced over rows in two fixed-order stages (no
// atomics: deterministic).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

// din += (dout*w - x * r^2 * mean(dout*w*x)) * r, one warp per row
template <typename T>
__global__ void rmsnorm_bwd_input_kernel(T* din, const T* dout, const T* in, const T* w, const float* rstd, int N,
                                         int C) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T* x = in + size_t(row) * C;
    const T* d = dout + size_t(row) * C;
    const float r = rstd[row];
    float dot = 0.0f;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
#pragma unroll
        for (int k = 0; k < L; k++) dot += fd.v[k] * fw.v[k] * fx.v[k];
    });
    const float k = warp_sum(dot) / float(C) * r * r;
    T* di = din + size_t(row) * C;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
        Floats<L> g = load_floats<L>(di + c);
#pragma unroll
        for (int j = 0; j < L; j++) g.v[j] += (fd.v[j] * fw.v[j] - fx.v[j] * k) * r;
        store_floats<L>(di + c, g);
    });
}

// The gain gradient's column term: dout * x * rstd.
template <typename T>
struct RmsParamTerm {
    const T *dout, *in;
    const float* rstd;
    int C;
    template <int L>
    __device__ void operator()(int r, int c, Len<L>, float (&q)[1][L]) const {
        const Floats<L> d = load_floats<L>(dout + size_t(r) * C + c),
                        x = load_floats<L>(in + size_t(r) * C + c);
#pragma unroll
        for (int k = 0; k < L; k++) q[0][k] = d.v[k] * x.v[k] * rstd[r];
    }
};

}  // namespace

void rmsnorm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        rmsnorm_bwd_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        if (dw.empty()) return;  // a frozen gain
        col_sums<T, 1>(c, {{dw.ptr<T>()}}, N, C, whole_packs<T>(C, dout.data, in.data),
                       RmsParamTerm<T>{dout.ptr<T>(), in.ptr<T>(), rstd.ptr<float>(), C});
    });
}

}  // namespace anvil::cuda
