// RMSNorm over the last dimension (Llama), statistics in f32: one warp per row, as layernorm.cu; the gain's
// gradient is reduced over rows in two fixed-order stages (no atomics: deterministic).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kChunks = 64;       // row chunks for the gain-gradient reduction

template <typename T>
__global__ void rmsnorm_fwd_kernel(T* out, float* rstd, const T* in, const T* w, int N, int C, float eps) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T* x = in + size_t(row) * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float v = to_f(x[c]);
        s += v * v;
    }
    const float r = rsqrtf(warp_sum(s) / float(C) + eps);
    T* o = out + size_t(row) * C;
    for (int c = lane; c < C; c += 32) o[c] = from_f<T>(to_f(x[c]) * r * to_f(w[c]));
    if (lane == 0) rstd[row] = r;
}

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
    for (int c = lane; c < C; c += 32) dot += to_f(d[c]) * to_f(w[c]) * to_f(x[c]);
    const float k = warp_sum(dot) / float(C) * r * r;
    T* di = din + size_t(row) * C;
    for (int c = lane; c < C; c += 32)
        di[c] = from_f<T>(to_f(di[c]) + (to_f(d[c]) * to_f(w[c]) - to_f(x[c]) * k) * r);
}

// partial[chunk][c] = sum of dout * x * rstd over the chunk's rows; blocks of 32 columns x 8 row lanes
template <typename T>
__global__ void rmsnorm_bwd_param_partial(float* partial, const T* dout, const T* in, const float* rstd, int N,
                                          int C) {
    __shared__ float sw[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int per = (N + kChunks - 1) / kChunks;
    const int r0 = blockIdx.y * per, r1 = min(N, r0 + per);
    float aw = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8)
            aw += to_f(dout[size_t(r) * C + c]) * to_f(in[size_t(r) * C + c]) * rstd[r];
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += sw[y][threadIdx.x];
        partial[size_t(blockIdx.y) * C + c] = t;
    }
}

template <typename T>
__global__ void rmsnorm_bwd_param_finish(T* dw, const float* partial, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = to_f(dw[c]);
    for (int k = 0; k < kChunks; k++) t += partial[size_t(k) * C + c];
    dw[c] = from_f<T>(t);
}

}  // namespace

void rmsnorm_fwd(const Ctx& c, Tensor out, Tensor rstd, Tensor in, Tensor w, float eps) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        rmsnorm_fwd_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), w.ptr<T>(), N, C, eps);
        CUDA_LAUNCH_CHECK();
    });
}

void rmsnorm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        rmsnorm_bwd_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
            din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        if (dw.empty()) return;  // a frozen gain
        auto* partial = static_cast<float*>(c.scratch(0, size_t(kChunks) * C * sizeof(float)));
        rmsnorm_bwd_param_partial<T><<<dim3((C + 31) / 32, kChunks), dim3(32, 8), 0, c.stream>>>(
            partial, dout.ptr<T>(), in.ptr<T>(), rstd.ptr<float>(), N, C);
        CUDA_LAUNCH_CHECK();
        rmsnorm_bwd_param_finish<T><<<(C + 255) / 256, 256, 0, c.stream>>>(dw.ptr<T>(), partial, C);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace anvil::cuda
