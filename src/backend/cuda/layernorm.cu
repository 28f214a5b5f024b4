// LayerNorm over the last dimension, eps 1e-5, statistics in f32. One warp per row with 16-byte accesses; the
// weight and bias gradients are reduced over rows in two fixed-order stages (no atomics: deterministic).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr float kLnEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // one warp per row

template <typename T>
__global__ void layernorm_fwd_kernel(T* out, float* mean, float* rstd, const T* in, const T* w, const T* b, int N,
                                     int C) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T* x = in + size_t(row) * C;
    float s = 0.0f;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> f = load_floats<L>(x + c);
#pragma unroll
        for (int k = 0; k < L; k++) s += f.v[k];
    });
    const float m = warp_sum(s) / float(C);
    float v = 0.0f;  // the second pass reads the row again (from L1): two passes keep the variance exact
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> f = load_floats<L>(x + c);
#pragma unroll
        for (int k = 0; k < L; k++) v += (f.v[k] - m) * (f.v[k] - m);
    });
    const float r = rsqrtf(warp_sum(v) / float(C) + kLnEps);
    T* o = out + size_t(row) * C;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> f = load_floats<L>(x + c);
        const Floats<L> fw = load_floats<L>(w + c), fb = load_floats<L>(b + c);
#pragma unroll
        for (int k = 0; k < L; k++) f.v[k] = (f.v[k] - m) * r * fw.v[k] + fb.v[k];
        store_floats<L>(o + c, f);
    });
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// din += (dout*w - mean(dout*w) - norm * mean(dout*w*norm)) * rstd, one warp per row
template <typename T>
__global__ void layernorm_bwd_input_kernel(T* din, const T* dout, const T* in, const T* w, const float* mean,
                                           const float* rstd, int N, int C) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T* x = in + size_t(row) * C;
    const T* d = dout + size_t(row) * C;
    const float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float dn = fd.v[k] * fw.v[k];
            a += dn;
            bsum += dn * (fx.v[k] - m) * r;
        }
    });
    const float dnorm_mean = warp_sum(a) / float(C), dnorm_norm_mean = warp_sum(bsum) / float(C);
    T* di = din + size_t(row) * C;
    warp_row<T>(C, lane, [&](int c, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
        Floats<L> g = load_floats<L>(di + c);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float norm = (fx.v[k] - m) * r;
            g.v[k] += (fd.v[k] * fw.v[k] - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
        store_floats<L>(di + c, g);
    });
}

// The parameter gradients' column terms: dout * norm for the gain, dout for the bias.
template <typename T>
struct LnParamTerm {
    const T *dout, *in;
    const float *mean, *rstd;
    int C;
    template <int L>
    __device__ void operator()(int r, int c, Len<L>, float (&q)[2][L]) const {
        const Floats<L> d = load_floats<L>(dout + size_t(r) * C + c),
                        x = load_floats<L>(in + size_t(r) * C + c);
        const float m = mean[r], rs = rstd[r];
#pragma unroll
        for (int k = 0; k < L; k++) {
            q[0][k] = d.v[k] * (x.v[k] - m) * rs;
            q[1][k] = d.v[k];
        }
    }
};

}  // namespace

void layernorm_fwd(const Ctx& c, Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor w, Tensor b) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        layernorm_fwd_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            out.ptr<T>(), mean.ptr<float>(), rstd.ptr<float>(), in.ptr<T>(), w.ptr<T>(), b.ptr<T>(), N, C);
        CUDA_LAUNCH_CHECK();
    });
}

void layernorm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w, Tensor mean,
                   Tensor rstd) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        layernorm_bwd_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), w.ptr<T>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        if (dw.empty() && db.empty()) return;  // a frozen norm: no parameter gradients
        col_sums<T, 2>(c, {{dw.ptr<T>(), db.ptr<T>()}}, N, C, whole_packs<T>(C, dout.data, in.data),
                       LnParamTerm<T>{dout.ptr<T>(), in.ptr<T>(), mean.ptr<float>(), rstd.ptr<float>(), C});
    });
}

}  // namespace anvil::cuda
