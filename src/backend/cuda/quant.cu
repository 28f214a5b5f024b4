// int8 weights (weight-only quantization), W = q * scale[o] with one f32 scale per output channel.
// A few rows (decoding) read the int8 weight directly: a warp per output channel for W (out, in), a thread
// per output channel for W (in, out), fp32 accumulation in a fixed order (runs repeat bit for bit). More rows
// dequantize the weight into the activation dtype and run cuBLASLt's product on the tensor cores
// (cuda_backend.cpp).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kQ8Rows = 8;  // the most rows the direct kernels take (kQ8DirectRows in ops.h)

// W (OC, C): warp w of the grid computes output channel w for every row; lanes stride over the inputs.
template <typename T>
__global__ void q8_gemv_outin(T* out, size_t ldo, const T* in, const int8_t* q, const float* scale,
                              const T* bias, int N, int C, int OC) {
    const int o = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (o >= OC) return;
    const int8_t* w = q + size_t(o) * C;
    float acc[kQ8Rows] = {};
    for (int i = lane; i < C; i += 32) {
        const float wi = float(w[i]);
        for (int n = 0; n < N; n++) acc[n] += to_f(in[size_t(n) * C + i]) * wi;
    }
    for (int n = 0; n < N; n++) {
        const float s = warp_sum(acc[n]);
        if (lane == 0) out[size_t(n) * ldo + o] = from_f<T>((bias ? to_f(bias[o]) : 0.0f) + scale[o] * s);
    }
}

// W (C, OC): thread o walks the input rows of its column; neighbouring threads read neighbouring bytes.
template <typename T>
__global__ void q8_gemv_inout(T* out, size_t ldo, const T* in, const int8_t* q, const float* scale,
                              const T* bias, int N, int C, int OC) {
    const int o = int(size_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (o >= OC) return;
    float acc[kQ8Rows] = {};
    for (int i = 0; i < C; i++) {
        const float wi = float(q[size_t(i) * OC + o]);
        for (int n = 0; n < N; n++) acc[n] += to_f(in[size_t(n) * C + i]) * wi;
    }
    for (int n = 0; n < N; n++)
        out[size_t(n) * ldo + o] = from_f<T>((bias ? to_f(bias[o]) : 0.0f) + scale[o] * acc[n]);
}

template <typename T>
__global__ void q8_dequant(T* w, const int8_t* q, const float* scale, size_t n, int C, int OC, bool outin) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t o = outin ? i / size_t(C) : i % size_t(OC);
    w[i] = from_f<T>(scale[o] * float(q[i]));
}

template <typename T>
__global__ void q8_embedding(T* out, const int32_t* tokens, const int8_t* q, const float* scale, const T* wpe,
                             int N, int T_, int C, int V) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(N) * C) return;
    const int n = int(idx / C), c = int(idx % C), tok = tokens[n];
    if (tok < 0 ||
        tok >= V) {  // the loaders validate ids; make a stray one visible rather than read wild memory
        out[idx] = from_f<T>(__int_as_float(0x7fc00000));
        return;
    }
    const float e = scale[tok] * float(q[size_t(tok) * C + c]);
    out[idx] = from_f<T>(e + (wpe ? to_f(wpe[size_t(n % T_) * C + c]) : 0.0f));
}

}  // namespace

void matmul_q8_direct(const Ctx& c, Tensor out, Tensor in, Tensor q, Tensor scale, WLayout layout,
                      Tensor bias) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    ANVIL_ASSERT(N <= kQ8Rows && N <= kQ8DirectRows);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* b = bias.empty() ? nullptr : bias.ptr<T>();
        if (layout == WLayout::OutIn)
            launch(q8_gemv_outin<T>, size_t(OC) * 32, 256, c.stream, out.row0<T>(), size_t(out.ld()),
                   in.ptr<T>(), q.ptr<int8_t>(), scale.ptr<float>(), b, N, C, OC);
        else
            launch(q8_gemv_inout<T>, size_t(OC), 256, c.stream, out.row0<T>(), size_t(out.ld()), in.ptr<T>(),
                   q.ptr<int8_t>(), scale.ptr<float>(), b, N, C, OC);
    });
}

void dequant_q8(const Ctx& c, Tensor w, Tensor q, Tensor scale, WLayout layout) {
    const bool outin = layout == WLayout::OutIn;
    const int OC = int(outin ? q.dim(0) : q.dim(1)), C = int(outin ? q.dim(1) : q.dim(0));
    dispatch(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(q8_dequant<T>, size_t(q.numel()), 256, c.stream, w.ptr<T>(), q.ptr<int8_t>(),
               scale.ptr<float>(), size_t(q.numel()), C, OC, outin);
    });
}

void embedding_q8_fwd(const Ctx& c, Tensor out, Tensor tokens, Tensor q, Tensor scale, Tensor wpe) {
    const int B = int(tokens.dim(0)), T_ = int(tokens.dim(1)), C = int(q.dim(1)), V = int(q.dim(0));
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(q8_embedding<T>, size_t(B) * T_ * C, 256, c.stream, out.ptr<T>(), tokens.ptr<int32_t>(),
               q.ptr<int8_t>(), scale.ptr<float>(), wpe.empty() ? nullptr : wpe.ptr<T>(), B * T_, T_, C, V);
    });
}

}  // namespace anvil::cuda
