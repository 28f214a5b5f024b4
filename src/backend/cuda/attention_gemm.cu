// Causal self-attention on the tensor cores: the two products of each head (Q K^T and P V, and the four of
// the backward) through cuBLASLt, batched over a group of heads, with the softmax and its backward as
// memory-bound kernels between them. The probabilities P (B,NH,T,T) are kept for the backward in the
// activation dtype; the scores and their gradient pass through fp32 scratch (one group of heads at a time in
// the backend's workspace), so the softmax sees unrounded scores. Products cover the full T x T square; the
// causal mask is applied by the softmax, which writes zeros above the diagonal, and every later product
// then ignores those positions by arithmetic. Dropout on the probabilities: the softmax also writes the
// dropped ones, which multiply V, over the scores' scratch; the backward makes them again from P and the
// mask's hash for dV, and takes dP through the mask before the softmax's backward.
#include <algorithm>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/lt_gemm.h"
#include "backend/device_sizes.h"
#include "backend/dropout_mask.h"

namespace anvil::cuda {

namespace {

// Dropout on the probabilities of a pass's heads from h0 of sequence b: keep() is the mask's factor of (row r
// of the pass, key k). The dropped probabilities Pd are P where kept and 0 elsewhere, P's values exactly: the
// kept ones' scale 1 / (1 - p) goes into the products that read Pd (their alpha), in f32, not into Pd before
// its rounding to the dtype (4/3 is 1.3359375 in bf16: every output 0.2% off what the backward assumes).
struct GroupDrop {
    AttnDropMask m;
    int b, h0, Tn;
    __device__ float keep(int r, int k) const { return m.factor(m.head_seed(h0 + r / Tn), b, r % Tn, k, Tn); }
};

// The softmax of one row without dropout, T a multiple of 4: a lane takes 4 consecutive keys a round (the
// scores in 16-byte loads, the probabilities in 8- or 16-byte stores).
template <typename T>
__device__ void causal_softmax_row4(T* p, const float* s, int t, int Tn, int lane) {
    float m = -INFINITY, l = 0.0f;
    for (int k0 = lane * 4; k0 <= t; k0 += 128) {
        const Floats<4> e = load_floats<4>(s + k0);
        float pm = e.v[0];  // key k0 <= t is always in
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (k0 + i <= t) pm = fmaxf(pm, e.v[i]);
        const float m_new = fmaxf(m, pm);
        l *= __expf(m - m_new);
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (k0 + i <= t) l += __expf(e.v[i] - m_new);
        m = m_new;
    }
    const float M = warp_max(m);
    l = warp_sum(m == -INFINITY ? 0.0f : l * __expf(m - M));
    const float inv = 1.0f / l;
    for (int k0 = lane * 4; k0 < Tn; k0 += 128) {
        Floats<4> q = {};  // zeros above the diagonal
        if (k0 <= t) {
            const Floats<4> e = load_floats<4>(s + k0);
#pragma unroll
            for (int i = 0; i < 4; i++) q.v[i] = k0 + i <= t ? __expf(e.v[i] - M) * inv : 0.0f;
        }
        store_floats<4>(p + k0, q);
    }
}

// One warp per query row r of a group: row t = r % T of head (r / T). S fp32 (rows, T) -> P (rows, T).
// With dropout, the probabilities that multiply V, Pd = P * keep (P as rounded, so the backward remakes
// them exactly from P), go over S in place: row r at S's row r (dropped_ld elements a row).
template <typename T>
__global__ void causal_softmax_kernel(T* P, float* S, int rows, int Tn, GroupDrop dr) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int t = r % Tn;
    const float* s = S + size_t(r) * Tn;
    if (!dr.m.on() && Tn % 4 == 0) return causal_softmax_row4(P + size_t(r) * Tn, s, t, Tn, lane);
    float m = -INFINITY, l = 0.0f;  // online max and sum over keys 0..t
    for (int k = lane; k <= t; k += 32) {
        const float v = s[k];
        const float m_new = fmaxf(m, v);
        l = l * __expf(m - m_new) + __expf(v - m_new);
        m = m_new;
    }
    const float M = warp_max(m);
    l = warp_sum(m == -INFINITY ? 0.0f : l * __expf(m - M));
    const float inv = 1.0f / l;
    T* p = P + size_t(r) * Tn;
    if (!dr.m.on()) {
        for (int k = lane; k < Tn; k += 32) p[k] = from_f<T>(k <= t ? __expf(s[k] - M) * inv : 0.0f);
        return;
    }
    // Pd's row overlaps S's: each round reads its 32 scores before any lane writes (__syncwarp), and the
    // elements it writes lie over scores of this round or earlier ones (T no wider than f32)
    T* pd = reinterpret_cast<T*>(S + size_t(r) * Tn);
    for (int k0 = 0; k0 < Tn; k0 += 32) {
        const int k = k0 + lane;
        const float v = k <= t ? __expf(s[k] - M) * inv : 0.0f;
        __syncwarp();
        if (k < Tn) {
            const T pv = from_f<T>(v);
            p[k] = pv;
            pd[k] = k <= t && dr.keep(r, k) > 0.0f ? pv : from_f<T>(0.0f);
        }
    }
}

// Pd (rows, ldd) = P where kept, the probabilities that multiplied V in the forward (below the diagonal),
// less the scale.
template <typename T>
__global__ void dropped_probs_kernel(T* Pd, const T* P, int rows, int Tn, GroupDrop dr, int ldd) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int t = r % Tn;
    const T* p = P + size_t(r) * Tn;
    T* pd = Pd + size_t(r) * ldd;
    for (int k = lane; k < Tn; k += 32) pd[k] = k <= t && dr.keep(r, k) > 0.0f ? p[k] : from_f<T>(0.0f);
}

// dS = P * (dP - sum_k P*dP) * scale, written over P (one warp per row; zeros above the diagonal stay zero).
// With dropout dP is the gradient of what multiplied V, taken through the mask first (in place: each lane
// rereads only what it wrote).
template <typename T>
__global__ void causal_softmax_bwd_kernel(T* P, float* dP, int rows, int Tn, float scale, GroupDrop dr) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int t = r % Tn;
    T* p = P + size_t(r) * Tn;
    float* dp = dP + size_t(r) * Tn;
    float d = 0.0f;
    if (!dr.m.on() && Tn % 4 == 0) {  // 4 consecutive keys a lane, as causal_softmax_row4
        for (int k0 = lane * 4; k0 <= t; k0 += 128) {
            const Floats<4> q = load_floats<4>(p + k0), g = load_floats<4>(dp + k0);
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (k0 + i <= t) d += q.v[i] * g.v[i];
        }
        d = warp_sum(d);
        for (int k0 = lane * 4; k0 <= t; k0 += 128) {
            Floats<4> q = load_floats<4>(p + k0);
            const Floats<4> g = load_floats<4>(dp + k0);
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (k0 + i <= t) q.v[i] = q.v[i] * (g.v[i] - d) * scale;
            store_floats<4>(p + k0, q);  // keys past t: their P (0) rounds back to itself
        }
        return;
    }
    for (int k = lane; k <= t; k += 32) {
        if (dr.m.on()) dp[k] *= dr.keep(r, k);
        d += to_f(p[k]) * dp[k];
    }
    d = warp_sum(d);
    for (int k = lane; k <= t; k += 32) p[k] = from_f<T>(to_f(p[k]) * (dp[k] - d) * scale);
}

// qkv (B, T, W): NH query heads, then KVH key and KVH value heads (W = C + 2 KC); query head h reads
// key/value head h / kv_group. The gradient dqkv is (B, T, 3C), each query head's share of its key/value
// head's gradient (qkv_unpack sums them).
struct Geo {
    int B, T, C, NH, HS, KC, kv_group;
    int group;  // heads per pass, so that group * T * T fp32 scores fit the workspace
    int64_t ld() const { return int64_t(C) + 2 * int64_t(KC); }
    int64_t dld() const { return 3 * int64_t(C); }
    // the heads of one pass from h0: within one key/value head when they share it (its K and V then read
    // with a batch stride of 0), any run of heads otherwise
    int heads_from(int h0) const {
        const int n = std::min(group, NH - h0);
        return kv_group == 1 ? n : std::min(n, kv_group - h0 % kv_group);
    }
    int64_t kv_stride() const { return kv_group == 1 ? HS : 0; }
    // where query head h0 and its key/value head start in sequence b of qkv
    struct Heads {
        const char *q, *k, *v;
    };
    Heads pointers(const Tensor& qkv, int b, int h0) const {
        const size_t es = dtype_size(qkv.dtype);
        const char* row = static_cast<const char*>(qkv.data) + size_t(b) * T * size_t(ld()) * es;
        const char* k = row + (size_t(C) + size_t(h0 / kv_group) * HS) * es;
        return {row + size_t(h0) * HS * es, k, k + size_t(KC) * es};
    }
};

Geo geo(const Ctx& c, const AttnShape& s) {
    Geo g;
    g.B = s.B, g.T = s.T, g.C = s.C, g.NH = s.NH, g.HS = s.C / s.NH;
    g.KC = s.KVH * g.HS, g.kv_group = s.NH / s.KVH;
    g.group = int(std::min<size_t>(size_t(s.NH), c.workspace_bytes / (size_t(g.T) * g.T * sizeof(float))));
    ANVIL_ASSERT(g.group > 0);
    return g;
}

// A batched product over `heads` heads: strides of HS between heads in the (B,T,W)/(B,T,C) tensors and T*T
// between heads' (T,T) matrices.
Gemm head_gemm(DType dt, int heads) {
    Gemm g;
    g.a_type = g.b_type = g.d = dt;
    g.batch = heads;
    return g;
}

// The batched product, or, where cuBLASLt has no batched algorithm for its strides (a key/value head's
// stride of 0 under grouped-query attention), one product per head.
void heads_gemm(const Ctx& c, const Gemm& g) {
    if (lt_gemm(c, g)) return;
    ANVIL_CHECK(g.batch > 1, "cuBLASLt has no algorithm for a {}x{}x{} {} attention product", g.m, g.n, g.k,
                dtype_name(g.a_type));
    Gemm one = g;
    one.batch = 1;
    for (int i = 0; i < g.batch; i++) {
        one.A = static_cast<const char*>(g.A) + size_t(i) * g.stride_a * dtype_size(g.a_type);
        one.B = static_cast<const char*>(g.B) + size_t(i) * g.stride_b * dtype_size(g.b_type);
        one.D = static_cast<char*>(g.D) + size_t(i) * g.stride_d * dtype_size(g.d);
        lt_gemm_or_fail(c, one);
    }
}

GroupDrop group_drop(const AttnDropout& drop, int b, int h0, int Tn) {
    return GroupDrop{AttnDropMask(drop), b, h0, Tn};
}

// The row width, in elements of dt, of dropped probabilities written over fp32 scratch rows of Tn.
int dropped_ld(DType dt, int Tn) {
    return Tn * int(sizeof(float) / dtype_size(dt));
}

void softmax_rows(const Ctx& c, DType dt, void* P, float* S, int rows, int Tn, const GroupDrop& dr) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        causal_softmax_kernel<T><<<(rows + 7) / 8, 256, 0, c.stream>>>(static_cast<T*>(P), S, rows, Tn, dr);
        CUDA_LAUNCH_CHECK();
    });
}

void dropped_rows(const Ctx& c, DType dt, void* Pd, const void* P, int rows, int Tn, const GroupDrop& dr) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        dropped_probs_kernel<T><<<(rows + 7) / 8, 256, 0, c.stream>>>(
            static_cast<T*>(Pd), static_cast<const T*>(P), rows, Tn, dr, dropped_ld(dt, Tn));
        CUDA_LAUNCH_CHECK();
    });
}

void softmax_bwd_rows(const Ctx& c, DType dt, void* P, float* dP, int rows, int Tn, float scale,
                      const GroupDrop& dr) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        causal_softmax_bwd_kernel<T>
            <<<(rows + 7) / 8, 256, 0, c.stream>>>(static_cast<T*>(P), dP, rows, Tn, scale, dr);
        CUDA_LAUNCH_CHECK();
    });
}

}  // namespace

size_t attention_gemm_saved_elems(const AttnDims& d) {
    return sizes::cuda_gemm_saved_elems(d);
}
bool attention_gemm_fits(const Ctx& c, const AttnDims& d) {
    return size_t(d.T) * d.T * sizeof(float) <= c.workspace_bytes;
}

void attention_gemm_fwd(const Ctx& c, const AttnShape& s, Tensor out, Tensor saved, Tensor qkv,
                        const AttnDropout& drop) {
    const Geo g = geo(c, s);
    const int NH = g.NH;
    const DType dt = qkv.dtype;
    const size_t es = dtype_size(dt), TT = size_t(g.T) * g.T;
    const int ld = int(g.ld());
    auto* S = static_cast<float*>(c.scratch(0, size_t(g.group) * TT * sizeof(float)));
    for (int b = 0; b < g.B; b++)
        for (int h0 = 0, heads; h0 < NH; h0 += heads) {
            heads = g.heads_from(h0);
            const auto [q, k, v] = g.pointers(qkv, b, h0);
            char* P = static_cast<char*>(saved.data) + (size_t(b) * NH + h0) * TT * es;
            // S^T (Tk x Tq) = K . Q^T, scaled, in fp32
            Gemm s = head_gemm(dt, heads);
            s.d = DType::F32;
            s.m = g.T, s.n = g.T, s.k = g.HS;
            s.A = k, s.ta = true, s.lda = ld, s.stride_a = g.kv_stride();
            s.B = q, s.ldb = ld, s.stride_b = g.HS;
            s.D = S, s.ldd = g.T, s.stride_d = int64_t(TT);
            s.alpha = 1.0f / std::sqrt(float(g.HS));
            heads_gemm(c, s);
            softmax_rows(c, dt, P, S, heads * g.T, g.T, group_drop(drop, b, h0, g.T));
            // O^T (HS x Tq) = V^T . P^T (with dropout: the dropped probabilities, over S)
            Gemm o = head_gemm(dt, heads);
            o.m = g.HS, o.n = g.T, o.k = g.T;
            o.A = v, o.lda = ld, o.stride_a = g.kv_stride();
            o.B = P, o.ldb = g.T, o.stride_b = int64_t(TT);
            if (drop.on()) {
                o.B = S, o.ldb = dropped_ld(dt, g.T), o.stride_b = int64_t(TT) * (o.ldb / g.T);
                o.alpha = AttnDropMask(drop).scale;
            }
            o.D = static_cast<char*>(out.data) + (size_t(b) * g.T * g.C + size_t(h0) * g.HS) * es;
            o.ldd = g.C, o.stride_d = g.HS;
            heads_gemm(c, o);
        }
}

void attention_gemm_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, Tensor dout, Tensor qkv, Tensor saved,
                        const AttnDropout& drop) {
    const Geo g = geo(c, s);
    const int NH = g.NH;
    const DType dt = qkv.dtype;
    const size_t es = dtype_size(dt), TT = size_t(g.T) * g.T;
    const int ld = int(g.ld()), dld = int(g.dld());
    auto* dP = static_cast<float*>(c.scratch(0, size_t(g.group) * TT * sizeof(float)));
    for (int b = 0; b < g.B; b++)
        for (int h0 = 0, heads; h0 < NH; h0 += heads) {
            heads = g.heads_from(h0);
            const auto [q, k, v] = g.pointers(qkv, b, h0);
            char* dq = static_cast<char*>(dqkv.data) + (size_t(b) * g.T * dld + size_t(h0) * g.HS) * es;
            char* dk = dq + size_t(g.C) * es;
            char* dv = dq + 2 * size_t(g.C) * es;
            const char* dO =
                static_cast<const char*>(dout.data) + (size_t(b) * g.T * g.C + size_t(h0) * g.HS) * es;
            char* P = static_cast<char*>(saved.data) + (size_t(b) * NH + h0) * TT * es;
            const GroupDrop dr = group_drop(drop, b, h0, g.T);
            // dV^T (HS x Tk) = dO^T . P, each query head's share (with dropout: the forward's dropped
            // probabilities, made again over dP's scratch, which the next product then overwrites)
            Gemm gv = head_gemm(dt, heads);
            gv.m = g.HS, gv.n = g.T, gv.k = g.T;
            gv.A = dO, gv.lda = g.C, gv.stride_a = g.HS;
            gv.B = P, gv.tb = true, gv.ldb = g.T, gv.stride_b = int64_t(TT);
            if (drop.on()) {
                dropped_rows(c, dt, dP, P, heads * g.T, g.T, dr);
                gv.B = dP, gv.ldb = dropped_ld(dt, g.T), gv.stride_b = int64_t(TT) * (gv.ldb / g.T);
                gv.alpha = dr.m.scale;
            }
            gv.D = dv, gv.ldd = dld, gv.stride_d = g.HS;
            heads_gemm(c, gv);
            // dP^T (Tk x Tq) = V . dO^T, in fp32
            Gemm gp = head_gemm(dt, heads);
            gp.d = DType::F32;
            gp.m = g.T, gp.n = g.T, gp.k = g.HS;
            gp.A = v, gp.ta = true, gp.lda = ld, gp.stride_a = g.kv_stride();
            gp.B = dO, gp.ldb = g.C, gp.stride_b = g.HS;
            gp.D = dP, gp.ldd = g.T, gp.stride_d = int64_t(TT);
            heads_gemm(c, gp);
            // P becomes dS (scaled by 1/sqrt(HS), the forward's scale)
            softmax_bwd_rows(c, dt, P, dP, heads * g.T, g.T, 1.0f / std::sqrt(float(g.HS)), dr);
            // dQ^T (HS x Tq) = K^T . dS^T
            Gemm gq = head_gemm(dt, heads);
            gq.m = g.HS, gq.n = g.T, gq.k = g.T;
            gq.A = k, gq.lda = ld, gq.stride_a = g.kv_stride();
            gq.B = P, gq.ldb = g.T, gq.stride_b = int64_t(TT);
            gq.D = dq, gq.ldd = dld, gq.stride_d = g.HS;
            heads_gemm(c, gq);
            // dK^T (HS x Tk) = Q^T . dS, each query head's share
            Gemm gk = head_gemm(dt, heads);
            gk.m = g.HS, gk.n = g.T, gk.k = g.T;
            gk.A = q, gk.lda = ld, gk.stride_a = g.HS;
            gk.B = P, gk.tb = true, gk.ldb = g.T, gk.stride_b = int64_t(TT);
            gk.D = dk, gk.ldd = dld, gk.stride_d = g.HS;
            heads_gemm(c, gk);
        }
}

}  // namespace anvil::cuda
