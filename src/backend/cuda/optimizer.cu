// The global gradient norm and AdamW. The norm's sum of squares uses a fixed grid and a fixed reduction
// order (deterministic); AdamW reads it from device memory, so clipping and the skip on a non-finite norm
// need no host synchronisation. With bf16/fp16 parameters the update runs on the f32 master copy and the
// parameters get its rounding.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kNormBlocks = 512;

template <typename T>
__global__ void sumsq_partial_kernel(float* partial, const T* x, size_t n, bool first) {
    __shared__ float red[32];
    float s = 0.0f;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float v = to_f(x[i]);
        s += v * v;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = first ? s : partial[blockIdx.x] + s;
}

__global__ void sumsq_finish_kernel(float* out, const float* partial) {
    __shared__ float red[32];
    const float s = block_sum(partial[threadIdx.x], red);
    if (threadIdx.x == 0) out[0] = s;
}

template <typename T>
__global__ void adamw_kernel(T* p, const T* g, float* m, float* v, float* master, size_t n, float lr, float beta1,
                             float beta2, float eps, float wd, float bc1, float bc2_sqrt, float grad_scale,
                             float max_norm, const float* norm_sq) {
    const float nsq = *norm_sq;
    if (!isfinite(nsq)) return;  // the trainer reports the skipped step
    float scale = grad_scale;
    const float norm = sqrtf(nsq) * grad_scale;
    if (max_norm > 0.0f && norm > max_norm) scale *= max_norm / (norm + 1e-6f);
    const float step_size = lr / bc1, decay = 1.0f - lr * wd;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float gi = to_f(g[i]) * scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float w = master ? master[i] : to_f(p[i]);
        w = w * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        if (master) master[i] = w;
        p[i] = from_f<T>(w);
    }
}

}  // namespace

void global_norm_sq(const Ctx& c, Tensor out, const std::vector<Tensor>& grads) {
    auto* partial = static_cast<float*>(c.scratch(0, kNormBlocks * sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(partial, 0, kNormBlocks * sizeof(float), c.stream));
    bool first = true;
    for (const Tensor& t : grads) {
        if (t.numel() == 0) continue;
        dispatch(t.dtype, [&](auto tag) {
            using T = decltype(tag);
            sumsq_partial_kernel<T><<<kNormBlocks, 256, 0, c.stream>>>(partial, t.ptr<T>(), size_t(t.numel()), first);
            CUDA_LAUNCH_CHECK();
        });
        first = false;
    }
    sumsq_finish_kernel<<<1, kNormBlocks, 0, c.stream>>>(out.ptr<float>(), partial);
    CUDA_LAUNCH_CHECK();
}

void adamw(const Ctx& c, const std::vector<ParamSlot>& slots, const AdamWArgs& a, Tensor norm_sq) {
    const float bc1 = 1.0f - std::pow(a.beta1, float(a.step));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(a.beta2, float(a.step)));
    for (const ParamSlot& s : slots) {
        const size_t n = size_t(s.param.numel());
        if (n == 0) continue;
        ANVIL_CHECK(s.param.dtype == DType::F32 || !s.master.empty(), "adamw: {} parameters need f32 master weights",
                    dtype_name(s.param.dtype));
        const unsigned grid = unsigned(std::min<size_t>((n + 255) / 256, size_t(c.sm_count) * 8));
        dispatch(s.param.dtype, [&](auto tag) {
            using T = decltype(tag);
            adamw_kernel<T><<<grid, 256, 0, c.stream>>>(s.param.ptr<T>(), s.grad.ptr<T>(), s.m.ptr<float>(),
                                                         s.v.ptr<float>(), s.master.empty() ? nullptr : s.master.ptr<float>(),
                                                         n, a.lr, a.beta1, a.beta2, a.eps, s.weight_decay, bc1, bc2_sqrt,
                                                         a.grad_scale, a.max_grad_norm, norm_sq.ptr<float>());
            CUDA_LAUNCH_CHECK();
        });
    }
}

}  // namespace anvil::cuda
