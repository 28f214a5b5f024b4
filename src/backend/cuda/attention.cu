// Causal self-attention on the CUDA cores, anvil's own kernels (fp32, and --attention flash-simt; bf16 and
// fp16 go to the tensor-core kernels of attention_tc.cu): flash-style, the softmax computed online and only
// its log-sum-exp (B,NH,T) kept for the backward. Dropout on the probabilities (AttnGeom::keep) applies to
// what multiplies the values and, in the backward, to the probabilities' gradient; the row sums and the
// row term D = sum dO*O are those of the undropped softmax and of the output as it was, as in
// FlashAttention.
// Tiles of 32 keys live in shared memory, rows padded by one float so lanes reading their own row hit
// distinct banks. The backward runs one kernel for dK/dV (a lane per key) and one for dQ (a lane per query)
// so nothing is accumulated with atomics: the result is deterministic. Head size up to 128.
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/ops.h"
#include "backend/device_sizes.h"

namespace anvil::cuda {

namespace {

constexpr int kTile = 32;        // keys (or queries) per tile: one per lane
constexpr int kWarps = 4;        // forward: warps per block
constexpr int kRowsPerWarp = 4;  // forward: query rows per warp
constexpr int kRows = kWarps * kRowsPerWarp;

using Geom = AttnGeom;

// Loads `rows` rows of HS elements (stride `stride` apart in global memory, from `src`) into shared rows of
// D+1 floats; rows past the end become zero.
template <typename T, int D>
__device__ void load_rows(float (*dst)[D + 1], const T* src, size_t stride, int rows, int valid, int HS) {
    for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        dst[r][d] = r < valid && d < HS ? to_f(src[size_t(r) * stride + d]) : 0.0f;
    }
}

template <typename T, int D>
__global__ void attn_fwd_kernel(T* out, float* lse, const T* qkv, Geom g) {
    __shared__ float Ks[kTile][D + 1], Vs[kTile][D + 1], Qs[kRows][D + 1];
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int row0 = blockIdx.x * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    load_rows<T, D>(Qs, qkv + g.q(b, row0, h), g.ld(), kRows, min(kRows, g.T - row0), g.HS);
    float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][D / 32];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < D / 32; j++) o[i][j] = 0.0f;
    }
    const int last_row = min(g.T, row0 + kRows) - 1;
    const uint64_t hs = g.drop.head_seed(h);
    for (int kt = 0; kt * kTile <= last_row; kt++) {
        __syncthreads();
        const int k0 = kt * kTile, kvalid = min(kTile, g.T - k0);
        load_rows<T, D>(Ks, qkv + g.k(b, k0, h), g.ld(), kTile, kvalid, g.HS);
        load_rows<T, D>(Vs, qkv + g.v(b, k0, h), g.ld(), kTile, kvalid, g.HS);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; i++) {
            const int r = warp * kRowsPerWarp + i, t = row0 + r;
            if (t >= g.T || k0 > t) continue;
            const int key = k0 + lane;
            const bool valid = key <= t && key < g.T;
            float s = 0.0f;
            for (int d = 0; d < g.HS; d++) s += Qs[r][d] * Ks[lane][d];
            s = valid ? s * g.scale : -INFINITY;
            const float m_new = fmaxf(m[i], warp_max(s));
            const float p = valid ? __expf(s - m_new) : 0.0f;
            const float corr = __expf(m[i] - m_new);  // 0 when m was -inf
            l[i] = l[i] * corr + warp_sum(p);
            const float pd =
                valid ? p * g.drop.factor(hs, b, t, key, g.T) : 0.0f;  // what multiplies the value
#pragma unroll
            for (int j = 0; j < D / 32; j++) o[i][j] *= corr;
            for (int kk = 0; kk < kTile; kk++) {
                const float pk = __shfl_sync(0xffffffffu, pd, kk);
#pragma unroll
                for (int j = 0; j < D / 32; j++) o[i][j] += pk * Vs[kk][lane + 32 * j];
            }
            m[i] = m_new;
        }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
        const int t = row0 + warp * kRowsPerWarp + i;
        if (t >= g.T) continue;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int j = 0; j < D / 32; j++) {
            const int d = lane + 32 * j;
            if (d < g.HS) out[g.o(b, t, h) + d] = from_f<T>(o[i][j] * inv);
        }
        if (lane == 0) lse[g.row(b, h, t)] = m[i] + logf(l[i]);
    }
}

// Drow[b,h,t] = sum over d of dO * O (the softmax backward's row term)
template <typename T>
__global__ void attn_bwd_rowdot_kernel(float* Drow, const T* dout, const T* out, Geom g) {
    const int idx = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (idx >= g.B * g.NH * g.T) return;
    const int t = idx % g.T, h = (idx / g.T) % g.NH, b = idx / (g.T * g.NH);
    float s = 0.0f;
    for (int d = lane; d < g.HS; d += 32) s += to_f(dout[g.o(b, t, h) + d]) * to_f(out[g.o(b, t, h) + d]);
    s = warp_sum(s);
    if (lane == 0) Drow[g.row(b, h, t)] = s;
}

// dK, dV for a tile of 32 keys (one warp, a lane per key), over every later query row.
template <typename T, int D>
__global__ void attn_bwd_kv_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                                   Geom g) {
    extern __shared__ float smem[];
    auto* Ks = reinterpret_cast<float(*)[D + 1]>(smem);
    auto* Vs = Ks + kTile;
    auto* dKs = Vs + kTile;
    auto* dVs = dKs + kTile;
    float* qrow = reinterpret_cast<float*>(dVs + kTile);  // D
    float* dorow = qrow + D;                              // D
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH, lane = threadIdx.x;
    const int k0 = blockIdx.x * kTile, key = k0 + lane, kvalid = min(kTile, g.T - k0);
    load_rows<T, D>(Ks, qkv + g.k(b, k0, h), g.ld(), kTile, kvalid, g.HS);
    load_rows<T, D>(Vs, qkv + g.v(b, k0, h), g.ld(), kTile, kvalid, g.HS);
    for (int d = 0; d < D; d++) dKs[lane][d] = dVs[lane][d] = 0.0f;
    const uint64_t hs = g.drop.head_seed(h);
    __syncwarp();
    for (int t = k0; t < g.T; t++) {
        for (int d = lane; d < D; d += 32) {
            qrow[d] = d < g.HS ? to_f(qkv[g.q(b, t, h) + d]) : 0.0f;
            dorow[d] = d < g.HS ? to_f(dout[g.o(b, t, h) + d]) : 0.0f;
        }
        __syncwarp();
        const bool valid = key <= t && key < g.T;
        if (valid) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < g.HS; d++) {
                s += qrow[d] * Ks[lane][d];
                dp += dorow[d] * Vs[lane][d];
            }
            const float p = __expf(s * g.scale - lse[g.row(b, h, t)]), kp = g.drop.factor(hs, b, t, key, g.T);
            const float ds = p * (dp * kp - Drow[g.row(b, h, t)]) * g.scale;
            for (int d = 0; d < g.HS; d++) {
                dVs[lane][d] += p * kp * dorow[d];
                dKs[lane][d] += ds * qrow[d];
            }
        }
        __syncwarp();
    }
    if (key < g.T)
        for (int d = 0; d < g.HS; d++) {
            dqkv[g.dk(b, key, h) + d] = from_f<T>(dKs[lane][d]);
            dqkv[g.dv(b, key, h) + d] = from_f<T>(dVs[lane][d]);
        }
}

// dQ for a tile of 32 query rows (one warp, a lane per row), over every earlier key.
template <typename T, int D>
__global__ void attn_bwd_q_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                                  Geom g) {
    extern __shared__ float smem[];
    auto* Qs = reinterpret_cast<float(*)[D + 1]>(smem);
    auto* dOs = Qs + kTile;
    auto* dQs = dOs + kTile;
    auto* Ks = dQs + kTile;
    auto* Vs = Ks + kTile;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH, lane = threadIdx.x;
    const int q0 = blockIdx.x * kTile, t = q0 + lane, qvalid = min(kTile, g.T - q0);
    load_rows<T, D>(Qs, qkv + g.q(b, q0, h), g.ld(), kTile, qvalid, g.HS);
    // dO rows are (B,T,C): stride C
    for (int idx = lane; idx < kTile * D; idx += 32) {
        const int r = idx / D, d = idx % D;
        dOs[r][d] = r < qvalid && d < g.HS ? to_f(dout[g.o(b, q0 + r, h) + d]) : 0.0f;
    }
    for (int d = 0; d < D; d++) dQs[lane][d] = 0.0f;
    const float my_lse = t < g.T ? lse[g.row(b, h, t)] : 0.0f, my_D = t < g.T ? Drow[g.row(b, h, t)] : 0.0f;
    const int last = min(g.T, q0 + kTile) - 1;
    const uint64_t hs = g.drop.head_seed(h);
    for (int k0 = 0; k0 <= last; k0 += kTile) {
        __syncwarp();
        const int kvalid = min(kTile, g.T - k0);
        load_rows<T, D>(Ks, qkv + g.k(b, k0, h), g.ld(), kTile, kvalid, g.HS);
        load_rows<T, D>(Vs, qkv + g.v(b, k0, h), g.ld(), kTile, kvalid, g.HS);
        __syncwarp();
        for (int kk = 0; kk < kTile; kk++) {
            const int key = k0 + kk;
            if (t >= g.T || key > t || key >= g.T) continue;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < g.HS; d++) {
                s += Qs[lane][d] * Ks[kk][d];
                dp += dOs[lane][d] * Vs[kk][d];
            }
            const float p = __expf(s * g.scale - my_lse);
            const float ds = p * (dp * g.drop.factor(hs, b, t, key, g.T) - my_D) * g.scale;
            for (int d = 0; d < g.HS; d++) dQs[lane][d] += ds * Ks[kk][d];
        }
    }
    if (t < g.T)
        for (int d = 0; d < g.HS; d++) dqkv[g.dq(b, t, h) + d] = from_f<T>(dQs[lane][d]);
}

// Where each new query's key and value go, and which cached positions it reads: positions 0..last(i),
// position j of query i's sequence in cache row row(i, j). One sequence: query i is position pos0 + i of the
// one slot given, its rows in order.
struct SeqRows {
    int pos0;
    __device__ bool ok(int) const { return true; }  // (checked by the backend)
    __device__ size_t row(int, int j) const { return size_t(j); }
    __device__ int last(int i) const { return pos0 + i; }
};
// A decode step: query i is position pos[i] of slot slot[i] (read from device memory, so that a recorded step
// replays with the next step's); the caches (P, page, KC) in pages, position j of slot s in row j % page of
// page pages[s PPS + j / page]. A row whose slot or position is out of range (S slots, PPS page positions)
// writes nothing and reads nothing (its output 0): the host cannot check device values.
struct SlotRows {
    const int* pages;
    int page, PPS, S;
    const int *slot, *pos;
    __device__ bool ok(int i) const {
        return slot[i] >= 0 && slot[i] < S && pos[i] >= 0 && pos[i] < PPS * page;
    }
    __device__ size_t row(int i, int j) const {
        return size_t(pages[size_t(slot[i]) * PPS + j / page]) * page + size_t(j % page);
    }
    __device__ int last(int i) const { return pos[i]; }
};

// qkv rows (QC + 2 KC): the new keys and values into the caches (rows of KC)
template <typename T, typename Rows>
__global__ void kv_cache_write_kernel(T* kc, T* vc, const T* qkv, int Tq, Rows r, int QC, int KC) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(Tq) * KC) return;
    const int i = int(idx / KC), c = int(idx % KC);
    if (!r.ok(i)) return;
    const size_t row = size_t(i) * (QC + 2 * KC), at = r.row(i, r.last(i)) * KC + c;
    kc[at] = qkv[row + QC + c];
    vc[at] = qkv[row + QC + KC + c];
}

// A block of kCachedWarps warps per (new query, head): online softmax over the cached keys 0..its position.
// Eight lanes share a key, each holding E = D / 8 of its dimensions (one 16-byte load of K and one of V at
// head size 64 in bf16), so a warp reads four keys' rows at once and the block sixteen; the dot product is
// summed across the eight lanes with three shuffles. Each group of eight keeps its own running maximum, sum
// and output over its keys (key = group, group + 16, ...); the block merges the sixteen at the end through
// shared memory. (It was one warp per (query, head), a lane per key reading its key's row element by element:
// at batch 1 a dozen warps on the whole card, each walking the cache serially.) Query head h reads key/value
// head h / group (grouped-query attention; group 1 for GPT-2). qkv rows (QC + 2 KC), out rows QC. `vec`: head
// size D and the caches' rows 16-byte aligned, so a lane's dimensions load as whole vectors.
// Own (every row in a slot of its own, a decode step): the caches do not hold the rows' new keys and values
// yet. Each block takes its row's from qkv, and the block of each key/value head's first query head writes
// them into the caches: no other block of this launch reads that position (its row's other blocks take it
// from qkv too, and every other row is in another slot), so one launch does what the write kernel and this
// one did. The keys' values are the same bits either way.
constexpr int kCachedWarps = 4, kKeyLanes = 8, kGroups = kCachedWarps * 32 / kKeyLanes;

// E consecutive elements of a row from p (those from `valid` on are 0): vector loads where `vec`.
template <int E, typename T>
__device__ __forceinline__ void load_dims(float* dst, const T* p, bool vec, int valid) {
    constexpr int L = E * int(sizeof(T)) >= 16 ? 16 / int(sizeof(T)) : E;
    if (vec) {
#pragma unroll
        for (int e = 0; e < E; e += L) {
            const Floats<L> f = load_floats<L>(p + e);
#pragma unroll
            for (int k = 0; k < L; k++) dst[e + k] = f.v[k];
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; e++) dst[e] = e < valid ? to_f(p[e]) : 0.0f;
    }
}

template <typename T, int D, typename Rows, bool Own>
__global__ void __launch_bounds__(kCachedWarps * 32)
    attn_cached_kernel(T* out, const T* qkv, T* kc, T* vc, Rows r, int QC, int KC, int HS, int group,
                       float scale, bool vec) {
    constexpr int E = D / kKeyLanes, G = 32 / kKeyLanes;  // a lane's dimensions; key groups a warp
    __shared__ float gm[kGroups], gl[kGroups], go[kGroups][D + 1];
    const int i = blockIdx.x, h = blockIdx.y, last = r.ok(i) ? r.last(i) : -1;  // -1: no key
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, sub = lane % kKeyLanes;
    const int grp = warp * G + lane / kKeyLanes;  // this lane's group: keys grp, grp + kGroups, ...
    const int d0 = sub * E, valid = HS - d0;      // its dimensions d0..d0 + E - 1, those below HS real
    const size_t kv_off = size_t(h / group) * HS + size_t(d0);
    const T* qrow = qkv + size_t(i) * (QC + 2 * KC);
    if (Own && last >= 0 && h % group == 0) {  // this row's key and value into the caches
        const size_t at = r.row(i, last) * KC + size_t(h / group) * HS;
        for (int d = int(threadIdx.x); d < HS; d += int(blockDim.x)) {
            kc[at + d] = qrow[QC + size_t(h / group) * HS + d];
            vc[at + d] = qrow[QC + KC + size_t(h / group) * HS + d];
        }
    }
    float q[E], o[E];
    load_dims<E>(q, qrow + size_t(h) * HS + d0, false, valid);
    float m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = 0.0f;
        // The warp's lanes walk together (the shuffles need all 32); a group past the last key reads the last
        // one again and sits the step out, so the loads do not wait on a branch and two steps' are in flight
        // at once.
#pragma unroll 2
    for (int k0 = warp * G; k0 <= last; k0 += kGroups) {
        const int key = k0 + lane / kKeyLanes;
        const bool real = key <= last;
        // Own: the row's own position from qkv (not yet in the caches), element by element
        const bool own = Own && (!real || key == last);
        const size_t row = own ? 0 : r.row(i, real ? key : last) * KC + kv_off;
        const T* kp = own ? qrow + QC + kv_off : kc + row;
        float k[E], v[E];
        load_dims<E>(k, kp, vec && !own, valid);
        load_dims<E>(v, own ? kp + KC : vc + row, vec && !own, valid);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) s += q[e] * k[e];
#pragma unroll
        for (int x = 1; x < kKeyLanes; x *= 2) s += __shfl_xor_sync(0xffffffffu, s, x);
        if (real) {
            s *= scale;
            const float m_new = fmaxf(m, s), corr = __expf(m - m_new), p = __expf(s - m_new);
            l = l * corr + p;
#pragma unroll
            for (int e = 0; e < E; e++) o[e] = o[e] * corr + p * v[e];
            m = m_new;
        }
    }
    if (sub == 0) gm[grp] = m, gl[grp] = l;
#pragma unroll
    for (int e = 0; e < E; e++) go[grp][d0 + e] = o[e];
    __syncthreads();
    // the groups merged: weights exp(m_g - M) (a group that had no key has l = 0 and m = -inf: weight 0)
    float M = -INFINITY;
    for (int g = 0; g < kGroups; g++) M = fmaxf(M, gm[g]);
    float L = 0.0f;
    for (int g = 0; g < kGroups; g++) L += gl[g] > 0.0f ? gl[g] * __expf(gm[g] - M) : 0.0f;
    for (int d = int(threadIdx.x); d < HS; d += int(blockDim.x)) {
        float acc = 0.0f;
        for (int g = 0; g < kGroups; g++) acc += gl[g] > 0.0f ? go[g][d] * __expf(gm[g] - M) : 0.0f;
        out[size_t(i) * QC + size_t(h) * HS + d] = from_f<T>(L > 0.0f ? acc / L : 0.0f);
    }
}

}  // namespace

size_t attention_flash_saved_bytes(const AttnDims& d) {
    return sizes::cuda_flash_saved_bytes(d);
}
size_t attention_flash_scratch_bytes(const AttnDims& d) {
    return sizes::cuda_flash_scratch_bytes(d);
}

void attention_rowdot(const Ctx& c, float* Drow, const Tensor& dout, const Tensor& out, const AttnGeom& g) {
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const int rows = g.B * g.NH * g.T;
        attn_bwd_rowdot_kernel<T><<<(rows + 7) / 8, 256, 0, c.stream>>>(Drow, dout.ptr<T>(), out.ptr<T>(), g);
        CUDA_LAUNCH_CHECK();
    });
}

namespace {
// the one test of where the tensor-core kernels run: a 16-bit dtype, a head size whose tiles fit the device
bool tc_takes(const Ctx& c, DType t, int HS) {
    return t != DType::F32 && HS <= 128 && attention_tc_fits(c, HS);
}
}  // namespace

bool attention_flash_tc_takes(const Ctx& c, const AttnDims& d) {
    return tc_takes(c, d.dtype, d.HS);
}

void attention_flash_fwd(const Ctx& c, const AttnShape& s, Tensor out, Tensor saved, Tensor qkv,
                         bool tensor_cores, const AttnDropout& drop) {
    const Geom g = attn_geom(s, drop);
    if (tensor_cores && tc_takes(c, qkv.dtype, g.HS))
        return attention_tc_fwd(c, out, static_cast<float*>(saved.data), qkv, g);
    dispatch(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            attn_fwd_kernel<T, D><<<dim3((g.T + kRows - 1) / kRows, g.B * g.NH), kWarps * 32, 0, c.stream>>>(
                out.ptr<T>(), static_cast<float*>(saved.data), qkv.ptr<T>(), g);
            CUDA_LAUNCH_CHECK();
        });
    });
}

void attention_flash_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, Tensor scratch, Tensor dout,
                         Tensor qkv, Tensor out, Tensor saved, bool tensor_cores, const AttnDropout& drop) {
    const Geom g = attn_geom(s, drop);
    auto* Drow = static_cast<float*>(scratch.data);
    const auto* lse = static_cast<const float*>(saved.data);
    attention_rowdot(c, Drow, dout, out, g);
    if (tensor_cores && tc_takes(c, qkv.dtype, g.HS))
        return attention_tc_bwd(c, dqkv, dout, qkv, lse, Drow, g);
    dispatch(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            const dim3 grid((g.T + kTile - 1) / kTile, g.B * g.NH);
            const size_t kv_smem = (4 * kTile * (D + 1) + 2 * D) * sizeof(float);
            CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_kv_kernel<T, D>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(kv_smem)));
            attn_bwd_kv_kernel<T, D>
                <<<grid, 32, kv_smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(), dout.ptr<T>(), lse, Drow, g);
            CUDA_LAUNCH_CHECK();
            const size_t q_smem = 5 * kTile * (D + 1) * sizeof(float);
            CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_q_kernel<T, D>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(q_smem)));
            attn_bwd_q_kernel<T, D>
                <<<grid, 32, q_smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(), dout.ptr<T>(), lse, Drow, g);
            CUDA_LAUNCH_CHECK();
        });
    });
}

namespace {

// The caches' writes, then the attention, for Tq new queries placed by `rows` (own: every row in a slot of
// its own, the writes done by the attention kernel).
template <typename Rows>
void run_cached(const Ctx& c, void* out, const void* qkv, void* kc, void* vc, DType dt, int Tq,
                const Rows& rows, int QC, int KC, int NH, bool own = false) {
    const int HS = QC / NH, group = NH / (KC / HS);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        if (!own)
            launch(kv_cache_write_kernel<T, Rows>, size_t(Tq) * KC, 256, c.stream, static_cast<T*>(kc),
                   static_cast<T*>(vc), static_cast<const T*>(qkv), Tq, rows, QC, KC);
        dispatch_head(HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            const bool vec = HS == D && aligned16(kc, vc) && (size_t(KC) * sizeof(T)) % 16 == 0;
            const auto run = [&](auto kernel) {
                kernel<<<dim3(Tq, NH), kCachedWarps * 32, 0, c.stream>>>(
                    static_cast<T*>(out), static_cast<const T*>(qkv), static_cast<T*>(kc),
                    static_cast<T*>(vc), rows, QC, KC, HS, group, 1.0f / std::sqrt(float(HS)), vec);
                CUDA_LAUNCH_CHECK();
            };
            if constexpr (std::is_same_v<Rows, SlotRows>)  // (a sequence's rows share its slot)
                if (own) return run(attn_cached_kernel<T, D, Rows, true>);
            run(attn_cached_kernel<T, D, Rows, false>);
        });
    });
}

}  // namespace

void attention_cached(const Ctx& c, Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH) {
    // shapes checked by the backend (check_attention_cached)
    const int W = int(qkv.shape[qkv.shape.ndim - 1]), KC = int(kcache.shape[kcache.shape.ndim - 1]);
    run_cached(c, out.data, qkv.data, kcache.data, vcache.data, qkv.dtype, int(qkv.numel() / W),
               SeqRows{pos0}, W - 2 * KC, KC, NH);
}

void attention_cached_rows(const Ctx& c, Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, Tensor pages,
                           Tensor slot, Tensor pos, int NH, bool own_slots) {
    // shapes checked by the backend (check_attention_cached_rows); slots and positions by the kernels
    // (SlotRows); the pages are the caller's (KvCache checks what it is given)
    const int W = int(qkv.shape[qkv.shape.ndim - 1]), KC = int(kcache.shape[2]), QC = W - 2 * KC;
    const SlotRows rows{static_cast<const int*>(pages.data),
                        int(kcache.shape[1]),
                        int(pages.shape[1]),
                        int(pages.shape[0]),
                        slot.ptr<int32_t>(),
                        pos.ptr<int32_t>()};
    run_cached(c, out.data, qkv.data, kcache.data, vcache.data, qkv.dtype, int(slot.numel()), rows, QC, KC,
               NH, own_slots);
}

}  // namespace anvil::cuda
