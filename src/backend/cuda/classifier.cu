// Fused softmax + cross-entropy: one block per row finds the row's max and log-sum-exp in one online pass,
// writes the loss, and, when a gradient is wanted, overwrites the logits with dloss * (softmax - onehot).
// The probabilities are never stored.
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

template <typename T>
__global__ void classifier_kernel(float* losses, T* logits, const int32_t* targets, float dloss, int Vp, int V) {
    __shared__ float red[32];
    const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    T* x = logits + size_t(row) * Vp;
    const int tgt = targets[row];
    if (tgt < 0 || tgt >= V) {  // ignored row (the CPU backend rejects ids >= V before this point)
        if (tid == 0) losses[row] = 0.0f;
        if (dloss != 0.0f)
            for (int j = tid; j < Vp; j += nt) x[j] = from_f<T>(0.0f);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int j = tid; j < V; j += nt) {
        const float v = to_f(x[j]);
        if (v > m) {
            s = s * __expf(m - v) + 1.0f;
            m = v;
        } else {
            s += __expf(v - m);
        }
    }
    const float M = block_max(m, red);
    s = m == -INFINITY ? 0.0f : s * __expf(m - M);
    const float lse = M + logf(block_sum(s, red));
    const float target_logit = to_f(x[tgt]);
    __syncthreads();  // every thread has read x[tgt] before anyone overwrites it
    if (tid == 0) losses[row] = lse - target_logit;
    if (dloss != 0.0f)
        for (int j = tid; j < Vp; j += nt) {
            float g = j < V ? __expf(to_f(x[j]) - lse) : 0.0f;
            if (j == tgt) g -= 1.0f;
            x[j] = from_f<T>(g * dloss);
        }
}

}  // namespace

void classifier(const Ctx& c, Tensor losses, Tensor logits, Tensor targets, float dloss, int vocab_real) {
    const int Vp = int(logits.shape[logits.shape.ndim - 1]), N = int(logits.numel() / Vp);
    dispatch(logits.dtype, [&](auto tag) {
        using T = decltype(tag);
        classifier_kernel<T><<<N, 512, 0, c.stream>>>(losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(),
                                                      dloss, Vp, vocab_real);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace anvil::cuda
