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

// partial[block] += the block's share of sum(x^2), 16-byte packs where x is aligned, four loads in flight a
// thread; the grid is the tensor's own (up to kNormBlocks), so a small tensor does not launch hundreds of
// idle blocks
template <typename T>
__global__ void sumsq_partial_kernel(float* partial, const T* x, size_t n, bool packed) {
    __shared__ float red[32];
    float s = 0.0f;
    for_each_loaded<4>(x, n, packed, [&](const auto& f) {
        for (const float v : f.v) s += v * v;
    });
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] += s;
}

__global__ void sumsq_finish_kernel(float* out, const float* partial) {
    __shared__ float red[32];
    const float s = block_sum(partial[threadIdx.x], red);
    if (threadIdx.x == 0) out[0] = s;
}

template <typename T>
__global__ void adamw_kernel(T* p, const T* g, float* m, float* v, float* master, size_t n, float lr, float beta1,
                             float beta2, float eps, float wd, float bc1, float bc2_sqrt, float grad_scale,
                             float max_norm, const float* norm_sq, bool packed) {
    const float nsq = *norm_sq;
    if (!isfinite(nsq)) return;  // the trainer reports the skipped step
    float scale = grad_scale;
    const float norm = sqrtf(nsq) * grad_scale;
    if (max_norm > 0.0f && norm > max_norm) scale *= max_norm / (norm + 1e-6f);
    const float step_size = lr / bc1, decay = 1.0f - lr * wd;
    // 4 elements a step where every array is 16-byte aligned: the f32 state in 16-byte accesses, T in 8 or 16
    for_each_pack<float>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> gl = load_floats<L>(g + i);
        Floats<L> ml = load_floats<L>(m + i), vl = load_floats<L>(v + i);
        Floats<L> w = master ? load_floats<L>(master + i) : load_floats<L>(p + i);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float gi = gl.v[k] * scale;
            ml.v[k] = beta1 * ml.v[k] + (1.0f - beta1) * gi;
            vl.v[k] = beta2 * vl.v[k] + (1.0f - beta2) * gi * gi;
            w.v[k] = w.v[k] * decay - step_size * ml.v[k] / (sqrtf(vl.v[k]) / bc2_sqrt + eps);
        }
        store_floats<L>(m + i, ml);
        store_floats<L>(v + i, vl);
        if (master) store_floats<L>(master + i, w);
        store_floats<L>(p + i, w);
    });
}

}  // namespace

void global_norm_sq(const Ctx& c, Tensor out, const std::vector<Tensor>& grads) {
    auto* partial = static_cast<float*>(c.scratch(0, kNormBlocks * sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(partial, 0, kNormBlocks * sizeof(float), c.stream));
    for (const Tensor& t : grads) {
        if (t.numel() == 0) continue;
        dispatch(t.dtype, [&](auto tag) {
            using T = decltype(tag);
            const size_t n = size_t(t.numel());
            const unsigned blocks = std::min<unsigned>(kNormBlocks, blocks_for(n, 4 * Pack<T>::N * 256));
            sumsq_partial_kernel<T><<<blocks, 256, 0, c.stream>>>(partial, t.ptr<T>(), n, aligned16(t.data));
            CUDA_LAUNCH_CHECK();
        });
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
        const unsigned grid = std::min<unsigned>(blocks_for(n, 4 * 256), unsigned(c.sm_count) * 8);
        float* master = s.master.empty() ? nullptr : s.master.ptr<float>();
        const bool packed = aligned16(s.param.data, s.grad.data, s.m.data, s.v.data, master);
        dispatch(s.param.dtype, [&](auto tag) {
            using T = decltype(tag);
            adamw_kernel<T><<<grid, 256, 0, c.stream>>>(s.param.ptr<T>(), s.grad.ptr<T>(), s.m.ptr<float>(),
                                                         s.v.ptr<float>(), master, n, a.lr, a.beta1, a.beta2, a.eps,
                                                         s.weight_decay, bc1, bc2_sqrt, a.grad_scale,
                                                         a.max_grad_norm, norm_sq.ptr<float>(), packed);
            CUDA_LAUNCH_CHECK();
        });
    }
}

}  // namespace anvil::cuda
