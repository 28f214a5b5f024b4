// What anvil's two flash-style attention kernel families share (attention.cu on the CUDA cores,
// attention_tc.cu on the tensor cores): the addressing of the packed qkv (B, T, C + 2 KC), its gradient (B,
// T, 3C), the output (B, T, C) and the per-row statistics (B, NH, T), and the head-size dispatch.
#pragma once

#include <cmath>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/dropout_mask.h"

namespace anvil::cuda {

// qkv (B, T, W) holds the NH query heads, then KVH key heads and KVH value heads (W = C + 2 KC, C = NH HS,
// KC = KVH HS); query head h reads key/value head h / group. The gradient dqkv is (B, T, 3C): each query
// head's own share of its key/value head's gradient, which qkv_unpack sums (for GPT-2, KVH = NH, the same
// layout as qkv).
struct AttnGeom {
    int B, T, C, NH, HS, KC, group;
    float scale;
    AttnDropMask drop;  // dropout on the probabilities: drop.factor(drop.head_seed(h), b, query, key, T)
    __host__ __device__ size_t ld() const { return size_t(C) + 2 * size_t(KC); }  // qkv row
    __host__ __device__ size_t dld() const { return size_t(3) * C; }              // dqkv row
    __device__ size_t q(int b, int t, int h) const { return (size_t(b) * T + t) * ld() + size_t(h) * HS; }
    __device__ size_t k(int b, int t, int h) const {
        return (size_t(b) * T + t) * ld() + C + size_t(h / group) * HS;
    }
    __device__ size_t v(int b, int t, int h) const { return k(b, t, h) + KC; }
    __device__ size_t dq(int b, int t, int h) const { return (size_t(b) * T + t) * dld() + size_t(h) * HS; }
    __device__ size_t dk(int b, int t, int h) const { return dq(b, t, h) + C; }
    __device__ size_t dv(int b, int t, int h) const { return dq(b, t, h) + 2 * size_t(C); }
    __device__ size_t o(int b, int t, int h) const { return (size_t(b) * T + t) * C + size_t(h) * HS; }
    __device__ size_t row(int b, int h, int t) const { return (size_t(b) * NH + h) * T + t; }
};

// From the shapes the backend checked (check_attention) and the dropout.
inline AttnGeom attn_geom(const AttnShape& s, const AttnDropout& drop) {
    const int HS = s.C / s.NH;
    return AttnGeom{
        s.B, s.T, s.C, s.NH, HS, s.KVH * HS, s.NH / s.KVH, 1.0f / std::sqrt(float(HS)), AttnDropMask(drop)};
}

// Calls f(std::integral_constant<int, D>) with D the head-size bound (32, 64 or 128).
template <typename F>
void dispatch_head(int HS, F&& f) {
    if (HS <= 32)
        f(std::integral_constant<int, 32>{});
    else if (HS <= 64)
        f(std::integral_constant<int, 64>{});
    else if (HS <= 128)
        f(std::integral_constant<int, 128>{});
    else
        ::anvil::fail("attention: head size {} is above the 128 anvil's kernels support", HS);
}

// Drow[b,h,t] = sum over d of dO * O (the softmax backward's row term), one warp per row; attention.cu.
void attention_rowdot(const Ctx& c, float* Drow, const Tensor& dout, const Tensor& out, const AttnGeom& g);

// The tensor-core kernels (attention_tc.cu), for bf16 and f16; same saved log-sum-exp and scratch as
// attention.cu's. The backward reads Drow, already computed. `attention_tc_fits`: their shared memory for
// this head size fits the device (every sm_80+ device has the 85 KiB the largest needs; with less, the
// CUDA-core kernels run).
bool attention_tc_fits(const Ctx& c, int HS);
void attention_tc_fwd(const Ctx& c, Tensor out, float* lse, const Tensor& qkv, const AttnGeom& g);
void attention_tc_bwd(const Ctx& c, Tensor dqkv, const Tensor& dout, const Tensor& qkv, const float* lse,
                      const float* Drow, const AttnGeom& g);

}  // namespace anvil::cuda
