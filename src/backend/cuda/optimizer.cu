// The global gradient norm and AdamW, each over dozens of tensors a launch. The norm's sum of squares uses a
// fixed grid and a fixed reduction order (deterministic); AdamW reads it from device memory, so clipping and
// the skip on a non-finite norm need no host synchronisation. With bf16/fp16 parameters the update runs on
// the f32 master copy and the parameters get its rounding.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kNormBlocks = 512;

// Tensors handed to one launch by value, as the kernel's parameter (within the 4 KiB every CUDA device
// takes), as apex's multi_tensor_apply does: one launch walks dozens of tensors, where a launch a tensor left
// the card between launches on the many small ones (biases, norm gains: GPT-2 124M has 148 tensors, 98 of
// them under 4k elements). Every thread walks each tensor in turn, grid-strided as for one tensor, so no
// element is computed differently.
constexpr int kNormList = 96;  // 24 bytes a tensor
template <typename T>
struct NormList {
    using type = T;
    struct Entry {
        const T* x;
        size_t n;
        bool packed;  // 16-byte aligned
    } t[kNormList];
    int count = 0;
};

constexpr int kAdamList = 48;  // 56 bytes a tensor
template <typename T>
struct AdamList {
    using type = T;
    struct Entry {
        T* p;
        const T* g;
        float *m, *v, *master;  // master: null for f32 parameters
        size_t n;
        float wd;
        bool packed;  // every array 16-byte aligned
    } t[kAdamList];
    int count = 0;
};

// Calls launch(list, elements) for each run of up to Cap consecutive items of one dtype; add(list, item) puts
// an item in the list, dtype_of(item) says its dtype.
template <template <typename> class List, int Cap, typename Items, typename DtypeOf, typename Add,
          typename Launch>
void in_lists(const Items& items, DtypeOf dtype_of, Add add, Launch launch) {
    for (size_t i = 0; i < items.size();) {
        const DType dt = dtype_of(items[i]);
        dispatch(dt, [&](auto tag) {
            using T = decltype(tag);
            List<T> list;
            size_t elements = 0;
            for (; i < items.size() && list.count < Cap && dtype_of(items[i]) == dt; i++)
                elements += add(list, items[i]);
            if (list.count > 0) launch(list, elements);
        });
    }
}

// partial[block] += the block's share of sum(x^2) over the list's tensors, 16-byte packs where x is aligned,
// four loads in flight a thread
template <typename T>
__global__ void sumsq_partial_kernel(float* partial, const NormList<T> list) {
    __shared__ float red[32];
    float s = 0.0f;
    for (int i = 0; i < list.count; i++)
        for_each_loaded<4>(list.t[i].x, list.t[i].n, list.t[i].packed, [&](const auto& f) {
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
__global__ void adamw_kernel(const AdamList<T> list, float lr, float beta1, float beta2, float eps, float bc1,
                             float bc2_sqrt, float grad_scale, float max_norm, const float* norm_sq) {
    const float nsq = *norm_sq;
    if (!isfinite(nsq)) return;  // the trainer reports the skipped step
    float scale = grad_scale;
    const float norm = sqrtf(nsq) * grad_scale;
    if (max_norm > 0.0f && norm > max_norm) scale *= max_norm / (norm + 1e-6f);
    const float step_size = lr / bc1;
    for (int i = 0; i < list.count; i++) {
        const auto& e = list.t[i];
        const float decay = 1.0f - lr * e.wd;
        // 4 elements a step where every array is 16-byte aligned: the f32 state in 16-byte accesses, T in 8
        // or 16
        for_each_pack<float>(e.n, e.packed, [&](size_t j, auto len) {
            constexpr int L = decltype(len)::value;
            const Floats<L> gl = load_floats<L>(e.g + j);
            Floats<L> ml = load_floats<L>(e.m + j), vl = load_floats<L>(e.v + j);
            Floats<L> w = e.master ? load_floats<L>(e.master + j) : load_floats<L>(e.p + j);
#pragma unroll
            for (int k = 0; k < L; k++) {
                const float gi = gl.v[k] * scale;
                ml.v[k] = beta1 * ml.v[k] + (1.0f - beta1) * gi;
                vl.v[k] = beta2 * vl.v[k] + (1.0f - beta2) * gi * gi;
                w.v[k] = w.v[k] * decay - step_size * ml.v[k] / (sqrtf(vl.v[k]) / bc2_sqrt + eps);
            }
            store_floats<L>(e.m + j, ml);
            store_floats<L>(e.v + j, vl);
            if (e.master) store_floats<L>(e.master + j, w);
            store_floats<L>(e.p + j, w);
        });
    }
}

}  // namespace

void global_norm_sq(const Ctx& c, Tensor out, const std::vector<Tensor>& grads) {
    auto* partial = static_cast<float*>(c.scratch(0, kNormBlocks * sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(partial, 0, kNormBlocks * sizeof(float), c.stream));
    in_lists<NormList, kNormList>(
        grads, [](const Tensor& t) { return t.dtype; },
        [](auto& list, const Tensor& t) -> size_t {
            using T = typename std::decay_t<decltype(list)>::type;
            if (t.numel() == 0) return 0;
            list.t[list.count++] = {t.ptr<T>(), size_t(t.numel()), aligned16(t.data)};
            return size_t(t.numel());
        },
        [&](const auto& list, size_t elements) {
            using T = typename std::decay_t<decltype(list)>::type;
            const unsigned blocks =
                std::min<unsigned>(kNormBlocks, blocks_for(elements, 4 * Pack<T>::N * 256));
            sumsq_partial_kernel<T><<<blocks, 256, 0, c.stream>>>(partial, list);
            CUDA_LAUNCH_CHECK();
        });
    sumsq_finish_kernel<<<1, kNormBlocks, 0, c.stream>>>(out.ptr<float>(), partial);
    CUDA_LAUNCH_CHECK();
}

void adamw(const Ctx& c, const std::vector<ParamSlot>& slots, const AdamWArgs& a, Tensor norm_sq) {
    const float bc1 = 1.0f - std::pow(a.beta1, float(a.step));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(a.beta2, float(a.step)));
    in_lists<AdamList, kAdamList>(
        slots, [](const ParamSlot& s) { return s.param.dtype; },
        [](auto& list, const ParamSlot& s) -> size_t {
            using T = typename std::decay_t<decltype(list)>::type;
            const size_t n = size_t(s.param.numel());
            if (n == 0) return 0;
            ANVIL_CHECK(s.param.dtype == DType::F32 || !s.master.empty(),
                        "adamw: {} parameters need f32 master weights", dtype_name(s.param.dtype));
            float* master = s.master.empty() ? nullptr : s.master.ptr<float>();
            list.t[list.count++] = {
                s.param.ptr<T>(), s.grad.ptr<T>(),
                s.m.ptr<float>(), s.v.ptr<float>(),
                master,           n,
                s.weight_decay,   aligned16(s.param.data, s.grad.data, s.m.data, s.v.data, master)};
            return n;
        },
        [&](const auto& list, size_t elements) {
            using T = typename std::decay_t<decltype(list)>::type;
            const unsigned grid = std::min<unsigned>(blocks_for(elements, 4 * 256), unsigned(c.sm_count) * 8);
            adamw_kernel<T><<<grid, 256, 0, c.stream>>>(list, a.lr, a.beta1, a.beta2, a.eps, bc1, bc2_sqrt,
                                                        a.grad_scale, a.max_grad_norm, norm_sq.ptr<float>());
            CUDA_LAUNCH_CHECK();
        });
}

}  // namespace anvil::cuda
