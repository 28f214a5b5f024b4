// Fused softmax + cross-entropy: one block per row finds the row's max and log-sum-exp, writes the loss, and,
// when a gradient is wanted, overwrites the logits with dloss * (softmax - onehot), moving the row in 16-byte
// packs (memory-bound: a GPT-2 batch's logits are 1.6 GB in bf16). Where two rows fit an SM's shared memory
// (GPT-2's 50304 bf16 logits: 98 KiB a row), it is read from global memory once and kept there for every
// pass (the least traffic: one read, one write); else it is read twice. Either way an online pass finds the
// log-sum-exp, then one writes the gradient. The probabilities are never stored. The same row pass gives a
// server its log-probabilities (token_logprobs).
#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

// The log-sum-exp of a row's first V values, in one online pass of the block, four 16-byte loads in flight a
// thread (every thread gets it). stage: where the values are also stored (the row in shared memory), or null.
template <typename T>
__device__ float row_lse(const T* x, int V, float* red, T* stage = nullptr) {
    float m = -INFINITY, s = 0.0f;
    block_row_loaded<4>(x, V, [&](int j, const auto& f) {
        constexpr int L = sizeof(f.v) / sizeof(float);
        if (stage) store_floats<L>(stage + j, f);  // (T to f32 and back: the same bits)
        float pm = f.v[0];
#pragma unroll
        for (int k = 1; k < L; k++) pm = fmaxf(pm, f.v[k]);
        if (pm > m) {  // rescale once per pack, not per element
            s *= __expf(m - pm);
            m = pm;
        }
        if (m == -INFINITY) return;  // nothing above -inf yet: every exp would be 0 (and -inf - -inf NaN)
#pragma unroll
        for (int k = 0; k < L; k++) s += __expf(f.v[k] - m);
    });
    const float M = block_max(m, red);  // (its barriers also make stage's values every thread's)
    s = m == -INFINITY ? 0.0f : s * __expf(m - M);
    return M + logf(block_sum(s, red));
}

// One block of kRowThreads per row. Staged: the log-sum-exp pass, reading the row x[0..V) from global memory,
// also stores it in dynamic shared memory, where the gradient pass reads it, so the logits are read from
// global memory once; else both passes read x. The first pass computes on each pack while the thread's next
// loads are in flight (was: the whole row copied in first with cp.async, then the passes, each block's
// loads and its exponentials one after the other).
constexpr int kRowThreads = 512;
template <typename T, bool Staged>
__global__ void __launch_bounds__(kRowThreads)
    classifier_kernel(float* losses, T* logits, const int32_t* targets, float dloss, int Vp, int V) {
    extern __shared__ __align__(16) float row_smem[];  // Staged: the row
    __shared__ float red[32];
    const int row = blockIdx.x;
    T* x = logits + size_t(row) * Vp;
    const int tgt = targets[row];
    if (tgt < 0 || tgt >= V) {  // ignored row (the CPU backend rejects ids >= V before this point)
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (dloss != 0.0f)
            block_row(x, Vp, [&](int j, auto len) {
                constexpr int L = decltype(len)::value;
                store_floats<L>(x + j, Floats<L>{});
            });
        return;
    }
    T* stage = Staged ? reinterpret_cast<T*>(row_smem) : nullptr;
    const float lse = row_lse(x, V, red, stage);
    const T* src = Staged ? stage : x;
    const float target_logit = to_f(src[tgt]);
    __syncthreads();  // every thread has read x[tgt] before anyone overwrites it
    if (threadIdx.x == 0) losses[row] = lse - target_logit;
    if (dloss != 0.0f)  // the gradient over the logits: softmax - onehot, zero in the padding
        block_row(x, Vp, [&](int j, auto len) {
            constexpr int L = decltype(len)::value;
            Floats<L> f = j < V ? load_floats<L>(src + j) : Floats<L>{};  // (stage holds the first V)
#pragma unroll
            for (int k = 0; k < L; k++) {
                float g = j + k < V ? __expf(f.v[k] - lse) : 0.0f;
                if (j + k == tgt) g -= 1.0f;
                f.v[k] = g * dloss;
            }
            store_floats<L>(x + j, f);
        });
}

// Whether (v, i) comes before (w, j) among a row's tokens: the larger value first, ties to the lower id.
__device__ __forceinline__ bool before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

// The first (in `before` order) of every thread's (v, i); every thread gets it. `sv`, `si`: 32 each.
__device__ void block_first(float& v, int& i, float* sv, int* si) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const auto warp_first = [&] {
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (before(ov, oi, v, i)) v = ov, i = oi;
        }
    };
    warp_first();
    __syncthreads();  // the previous call's reads are done
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    v = lane < warps ? sv[lane] : -INFINITY;
    i = lane < warps ? si[lane] : INT_MAX;
    warp_first();
}

// One block per row: the log-sum-exp of the first V values in one online pass, the target's log-probability,
// then the K likeliest one round each: the first value in `before` order that comes after the one the last
// round took (so nothing taken needs remembering), each round a pass over the row.
template <typename T>
__global__ void token_logprobs_kernel(float* lp, int32_t* top_ids, float* top_lp, const T* logits,
                                      const int32_t* targets, int Vp, int V, int K) {
    __shared__ float red[32];
    __shared__ int red_i[32];
    const int row = blockIdx.x, tid = threadIdx.x;
    const T* x = logits + size_t(row) * Vp;
    const float lse = row_lse(x, V, red);
    const int tgt = targets[row];
    if (tid == 0) lp[row] = tgt >= 0 && tgt < V ? to_f(x[tgt]) - lse : NAN;
    float pv = INFINITY;  // the last round's value and id: every token comes after (inf, -1)
    int pi = -1;
    for (int r = 0; r < K; r++) {
        float v = -INFINITY;
        int i = INT_MAX;
        block_row(x, V, [&](int j, auto len) {
            constexpr int L = decltype(len)::value;
            const Floats<L> f = load_floats<L>(x + j);
#pragma unroll
            for (int k = 0; k < L; k++)
                if (before(pv, pi, f.v[k], j + k) && before(f.v[k], j + k, v, i)) v = f.v[k], i = j + k;
        });
        block_first(v, i, red, red_i);
        if (tid == 0) {
            top_ids[size_t(row) * K + r] = i;
            top_lp[size_t(row) * K + r] = v - lse;
        }
        pv = v, pi = i;
    }
}

}  // namespace

void token_logprobs(const Ctx& c, Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                    int V, int K) {
    const int Vp = int(logits.shape[logits.shape.ndim - 1]), N = int(logits.numel() / Vp);
    dispatch(logits.dtype, [&](auto tag) {
        using T = decltype(tag);
        token_logprobs_kernel<T><<<N, 256, 0, c.stream>>>(lp.ptr<float>(), top_ids.ptr<int32_t>(),
                                                          top_lp.ptr<float>(), logits.ptr<T>(),
                                                          targets.ptr<int32_t>(), Vp, V, K);
        CUDA_LAUNCH_CHECK();
    });
}

void classifier(const Ctx& c, Tensor losses, Tensor logits, Tensor targets, float dloss, int vocab_real) {
    const int Vp = int(logits.shape[logits.shape.ndim - 1]), N = int(logits.numel() / Vp);
    dispatch(logits.dtype, [&](auto tag) {
        using T = decltype(tag);
        const size_t row_bytes = size_t(Vp) * sizeof(T);
        // where two rows fit an SM at once (one alone would leave the SM idle between its load and its writes):
        // GPT-2's and Llama 2's rows in bf16, not fp32's or Llama 3's. (The reduction's 32 floats are static
        // shared memory beside the row.)
        const bool staged = 2 * (row_bytes + 32 * sizeof(float)) <= c.smem_optin;
        if (staged) {
            static const bool allowed = [&] {  // all the device allows, once
                CUDA_CHECK(cudaFuncSetAttribute(classifier_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(c.smem_optin - 32 * sizeof(float))));
                return true;
            }();
            (void)allowed;
            classifier_kernel<T, true><<<N, kRowThreads, row_bytes, c.stream>>>(
                losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), dloss, Vp, vocab_real);
        } else {
            classifier_kernel<T, false><<<N, kRowThreads, 0, c.stream>>>(
                losses.ptr<float>(), logits.ptr<T>(), targets.ptr<int32_t>(), dloss, Vp, vocab_real);
        }
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace anvil::cuda
