// What anvil's two flash-style attention kernel families share (attention.cu on the CUDA cores,
// attention_tc.cu on the tensor cores): the addressing of the packed qkv (B, T, 3C), the output (B, T, C)
// and the per-row statistics (B, NH, T), and the head-size dispatch.
#pragma once

#include <cmath>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

struct AttnGeom {
    int B, T, C, NH, HS;
    float scale;
    __device__ size_t q(int b, int t, int h) const { return (size_t(b) * T + t) * 3 * C + size_t(h) * HS; }
    __device__ size_t k(int b, int t, int h) const { return q(b, t, h) + C; }
    __device__ size_t v(int b, int t, int h) const { return q(b, t, h) + 2 * C; }
    __device__ size_t o(int b, int t, int h) const { return (size_t(b) * T + t) * C + size_t(h) * HS; }
    __device__ size_t row(int b, int h, int t) const { return (size_t(b) * NH + h) * T + t; }
};

inline AttnGeom attn_geom(const Tensor& qkv, int NH) {
    const int C = int(qkv.dim(2) / 3), HS = C / NH;
    return AttnGeom{int(qkv.dim(0)), int(qkv.dim(1)), C, NH, HS, 1.0f / std::sqrt(float(HS))};
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
// this head size fits the device (not so at head size 128 on Ada's 99 KiB, where the CUDA-core kernels run).
bool attention_tc_fits(const Ctx& c, const AttnGeom& g);
void attention_tc_fwd(const Ctx& c, Tensor out, float* lse, const Tensor& qkv, const AttnGeom& g);
void attention_tc_bwd(const Ctx& c, Tensor dqkv, const Tensor& dout, const Tensor& qkv, const float* lse,
                      const float* Drow, const AttnGeom& g);

}  // namespace anvil::cuda
