// int8 weights (weight-only quantization), W = q * scale[o] with one f32 scale per output channel.
// A few rows (decoding) read the int8 weight directly (gemv.cu, matmul_direct). More rows dequantize the
// weight into the activation dtype (here) and run cuBLASLt's product on the tensor cores (cuda_backend.cpp).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

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
