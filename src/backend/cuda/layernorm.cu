// LayerNorm over the last dimension, eps 1e-5, statistics in f32. One warp per row with 16-byte loads; the
// weight and bias gradients are reduced over rows in two fixed-order stages (no atomics: deterministic).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr float kLnEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kChunks = 64;       // row chunks for the parameter-gradient reduction

// Visits row elements lane-strided in packs of 16 bytes (scalar when C is not a multiple of a pack).
template <typename T, typename F>
__device__ __forceinline__ void row_packs(int C, int lane, F&& f) {
    constexpr int V = Pack<T>::N;
    if (C % V == 0) {
        for (int c = lane * V; c < C; c += 32 * V) f(c, V);
    } else {
        for (int c = lane; c < C; c += 32) f(c, 1);
    }
}

template <typename T>
__global__ void layernorm_fwd_kernel(T* out, float* mean, float* rstd, const T* in, const T* w, const T* b, int N,
                                     int C) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T* x = in + size_t(row) * C;
    float s = 0.0f;
    row_packs<T>(C, lane, [&](int c, int len) {
        if (len > 1) {
            const Pack<T> p = load16(x + c);
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++) s += to_f(p.v[k]);
        } else {
            s += to_f(x[c]);
        }
    });
    const float m = warp_sum(s) / float(C);
    float v = 0.0f;
    row_packs<T>(C, lane, [&](int c, int len) {
        for (int k = 0; k < len; k++) {
            const float d = to_f(x[c + k]) - m;
            v += d * d;
        }
    });
    const float r = rsqrtf(warp_sum(v) / float(C) + kLnEps);
    T* o = out + size_t(row) * C;
    row_packs<T>(C, lane, [&](int c, int len) {
        if (len > 1) {
            const Pack<T> p = load16(x + c), pw = load16(w + c), pb = load16(b + c);
            Pack<T> q;
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++)
                q.v[k] = from_f<T>((to_f(p.v[k]) - m) * r * to_f(pw.v[k]) + to_f(pb.v[k]));
            store16(o + c, q);
        } else {
            o[c] = from_f<T>((to_f(x[c]) - m) * r * to_f(w[c]) + to_f(b[c]));
        }
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
    row_packs<T>(C, lane, [&](int c, int len) {
        for (int k = 0; k < len; k++) {
            const float dn = to_f(d[c + k]) * to_f(w[c + k]);
            a += dn;
            bsum += dn * (to_f(x[c + k]) - m) * r;
        }
    });
    const float dnorm_mean = warp_sum(a) / float(C), dnorm_norm_mean = warp_sum(bsum) / float(C);
    T* di = din + size_t(row) * C;
    row_packs<T>(C, lane, [&](int c, int len) {
        for (int k = 0; k < len; k++) {
            const float norm = (to_f(x[c + k]) - m) * r;
            const float g = (to_f(d[c + k]) * to_f(w[c + k]) - dnorm_mean - norm * dnorm_norm_mean) * r;
            di[c + k] = from_f<T>(to_f(di[c + k]) + g);
        }
    });
}

// partial[chunk][c] = (sum dout*norm, sum dout) over the chunk's rows; blocks of 32 columns x 8 row lanes
template <typename T>
__global__ void layernorm_bwd_param_partial(float* partial, const T* dout, const T* in, const float* mean,
                                            const float* rstd, int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int per = (N + kChunks - 1) / kChunks;
    const int r0 = blockIdx.y * per, r1 = min(N, r0 + per);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const float d = to_f(dout[size_t(r) * C + c]);
            aw += d * (to_f(in[size_t(r) * C + c]) - mean[r]) * rstd[r];
            ab += d;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 8; y++) {
            tw += sw[y][threadIdx.x];
            tb += sb[y][threadIdx.x];
        }
        partial[size_t(blockIdx.y) * 2 * C + c] = tw;
        partial[size_t(blockIdx.y) * 2 * C + C + c] = tb;
    }
}

template <typename T>
__global__ void layernorm_bwd_param_finish(T* dw, T* db, const float* partial, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float tw = dw ? to_f(dw[c]) : 0.0f, tb = db ? to_f(db[c]) : 0.0f;
    for (int k = 0; k < kChunks; k++) {
        tw += partial[size_t(k) * 2 * C + c];
        tb += partial[size_t(k) * 2 * C + C + c];
    }
    if (dw) dw[c] = from_f<T>(tw);  // null: a frozen gain or bias
    if (db) db[c] = from_f<T>(tb);
}

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
    auto* partial = static_cast<float*>(c.scratch(0, size_t(kChunks) * 2 * C * sizeof(float)));
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        layernorm_bwd_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), w.ptr<T>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        if (dw.empty() && db.empty()) return;  // a frozen norm: no parameter gradients
        layernorm_bwd_param_partial<T><<<dim3((C + 31) / 32, kChunks), dim3(32, 8), 0, c.stream>>>(
            partial, dout.ptr<T>(), in.ptr<T>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        layernorm_bwd_param_finish<T><<<(C + 255) / 256, 256, 0, c.stream>>>(dw.ptr<T>(), db.ptr<T>(), partial, C);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace anvil::cuda
