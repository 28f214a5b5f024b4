// Causal self-attention on the tensor cores (bf16 and f16), flash-style: the T x T scores never reach global
// memory, only the log-sum-exp (B, NH, T) is kept for the backward (the same saved tensor and row term as the
// CUDA-core kernels of attention.cu, which remain for fp32 and --attention flash-simt).
//
// The products run through WMMA (16 x 16 x 16 tiles, fp32 accumulation); the softmax, its rescaling and its
// backward run on the CUDA cores over per-warp fp32 tiles in shared memory, so no kernel depends on the
// register layout of a fragment. A block is 4 warps on 64 rows (16 rows a warp) and walks tiles of 64 keys
// (forward, dQ) or of 64 queries (dK/dV); the probabilities and their gradient are rounded to the input dtype
// before they are multiplied, as in FlashAttention-2. Tiles are zero-padded up to D (32, 64 or 128) columns,
// so any head size up to 128 works. The backward is two kernels (dK/dV per key tile, dQ per query tile):
// nothing is accumulated with atomics, runs repeat bit for bit. Dropout on the probabilities (AttnGeom::keep)
// as in attention.cu.
//
// Shared-memory strides: 16-bit tiles D + 8 elements, fp32 tiles width + 4, so every fragment pointer is
// 32-byte aligned (WMMA's rule) and rows start in different banks.
#include <mma.h>

#include <algorithm>

#include "backend/cuda/attention.cuh"

namespace anvil::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileRows = 64;  // rows of a block (queries; keys in dK/dV) and of every tile it walks
constexpr int kWarps = 4;      // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kSld = kTileRows + 4;  // fp32 score tile (16, 64) stride
constexpr int kPld = kTileRows + 8;  // 16-bit probability tile (16, 64) stride

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int D>
struct Sizes {
    static constexpr int ld = D + 8;                        // 16-bit (64, D) tile stride
    static constexpr size_t tile = size_t(kTileRows) * ld;  // elements of one such tile
    static constexpr int ldo = D + 4;                       // fp32 (16, D) tile stride
};

// Rows [0, 64) of HS elements (`stride` apart, from `src`) into a (64, D + 8) tile; rows from `valid` on and
// columns from HS on become zero. 16-byte loads when every row is 16-byte aligned (`vec`).
template <typename T, int D>
__device__ void load_tile(T* dst, const T* src, size_t stride, int valid, int HS, bool vec) {
    constexpr int ld = Sizes<D>::ld;
    if (vec) {
        constexpr int P = D / 8;  // 8 elements of 16 bits per pack
        for (int idx = threadIdx.x; idx < kTileRows * P; idx += blockDim.x) {
            const int r = idx / P, c = idx % P * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < valid && c < HS) v = *reinterpret_cast<const uint4*>(src + size_t(r) * stride + c);
            *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
        }
        return;
    }
    for (int idx = threadIdx.x; idx < kTileRows * D; idx += blockDim.x) {
        const int r = idx / D, c = idx % D;
        dst[r * ld + c] = r < valid && c < HS ? src[size_t(r) * stride + c] : from_f<T>(0.0f);
    }
}

// out (16, n*16) fp32 at `s` (stride kSld) = a (16, D) x b^T, b rows of D at `b` (stride D + 8): n tiles.
template <typename T, int D>
__device__ void product_abt(float* s, const T* a, const T* b, int n) {
    constexpr int ld = Sizes<D>::ld;
    FragA<T> fa[D / 16];
#pragma unroll
    for (int k = 0; k < D / 16; k++) wmma::load_matrix_sync(fa[k], a + k * 16, ld);
    for (int j = 0; j < n; j++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            FragBCol<T> fb;  // element (d, key) of b^T at b[key * ld + d]
            wmma::load_matrix_sync(fb, b + j * 16 * ld + k * 16, ld);
            wmma::mma_sync(acc, fa[k], fb, acc);
        }
        wmma::store_matrix_sync(s + j * 16, acc, kSld, wmma::mem_row_major);
    }
}

// acc[D/16] (16, D) += p (16, n*16) x b (n*16, D): p at `p` (stride kPld), b rows at `b` (stride D + 8).
template <typename T, int D>
__device__ void product_ab_acc(FragC (&acc)[D / 16], const T* p, const T* b, int n) {
    constexpr int ld = Sizes<D>::ld;
    for (int k = 0; k < n; k++) {
        FragA<T> fa;
        wmma::load_matrix_sync(fa, p + k * 16, kPld);
#pragma unroll
        for (int j = 0; j < D / 16; j++) {
            FragBRow<T> fb;
            wmma::load_matrix_sync(fb, b + k * 16 * ld + j * 16, ld);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
    }
}

// A warp writes the fp32 tile `stage` (16, D + 4) to 16 rows of HS elements at `dst` (stride `stride`),
// rows from `valid` on skipped, the warp's lanes along each row (coalesced).
template <typename T, int D>
__device__ void write_stage(T* dst, size_t stride, const float* stage, int valid, int HS) {
    for (int idx = threadIdx.x % 32; idx < 16 * HS; idx += 32) {
        const int r = idx / HS, d = idx % HS;
        if (r < valid) dst[size_t(r) * stride + d] = from_f<T>(stage[r * Sizes<D>::ldo + d]);
    }
}

// The same for a warp's (16, D) accumulators, stored to `stage` first.
template <typename T, int D>
__device__ void write_rows(T* dst, size_t stride, const FragC (&acc)[D / 16], float* stage, int valid,
                           int HS) {
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        wmma::store_matrix_sync(stage + j * 16, acc[j], Sizes<D>::ldo, wmma::mem_row_major);
    __syncwarp();
    write_stage<T, D>(dst, stride, stage, valid, HS);
}

// Forward: block (64 queries from row0, head); warp w owns queries row0 + 16w .. + 15. Shared: Q, K, V tiles,
// then per warp the fp32 scores (16, 64), the fp32 output (16, D) and the 16-bit probabilities (16, 64).
template <typename T, int D>
size_t fwd_smem() {
    return 3 * Sizes<D>::tile * sizeof(T) +
           kWarps * (16 * kSld * sizeof(float) + 16 * Sizes<D>::ldo * sizeof(float) + 16 * kPld * sizeof(T));
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_tc_fwd_kernel(T* out, float* lse, const T* qkv, AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr int ld = Sizes<D>::ld, ldo = Sizes<D>::ldo;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    T* Qs = reinterpret_cast<T*>(smem);
    T* Ks = Qs + Sizes<D>::tile;
    T* Vs = Ks + Sizes<D>::tile;
    float* Sw = reinterpret_cast<float*>(Vs + Sizes<D>::tile) + warp * 16 * (kSld + ldo);
    float* Ow = Sw + 16 * kSld;
    T* Pw = reinterpret_cast<T*>(reinterpret_cast<float*>(Vs + Sizes<D>::tile) + kWarps * 16 * (kSld + ldo)) +
            warp * 16 * kPld;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;  // the longest rows first
    const size_t qstride = g.ld();
    const T *K0 = qkv + g.k(b, 0, h), *V0 = qkv + g.v(b, 0, h);  // this head's keys and values, row 0
    load_tile<T, D>(Qs, qkv + g.q(b, row0, h), qstride, min(kTileRows, g.T - row0), g.HS, vec);
    for (int i = lane; i < 16 * ldo; i += 32) Ow[i] = 0.0f;
    // lane: row r of the warp's 16, keys half*32 .. +31 of each tile (and columns half*D/2 .. of the output)
    const int r = lane / 2, half = lane % 2, t = row0 + warp * 16 + r;
    const int warp_last = min(g.T - 1, row0 + warp * 16 + 15);  // the last key any of its rows sees
    const uint64_t hs = g.drop.head_seed(h);
    float m = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 <= min(g.T - 1, row0 + kTileRows - 1); k0 += kTileRows) {
        __syncthreads();  // the previous tile's K and V are no longer read
        load_tile<T, D>(Ks, K0 + size_t(k0) * qstride, qstride, min(kTileRows, g.T - k0), g.HS, vec);
        load_tile<T, D>(Vs, V0 + size_t(k0) * qstride, qstride, min(kTileRows, g.T - k0), g.HS, vec);
        __syncthreads();
        if (warp_last < k0) continue;                                  // rows past T
        const int n = min(kTileRows / 16, (warp_last - k0) / 16 + 1);  // key tiles of 16 not wholly masked
        product_abt<T, D>(Sw, Qs + warp * 16 * ld, Ks, n);
        __syncwarp();
        // online softmax of row r over this tile: scores s * scale, keys past t masked
        float s[32], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int key = k0 + half * 32 + c;
            s[c] = t < g.T && key <= t ? Sw[r * kSld + half * 32 + c] * g.scale : -INFINITY;
            mx = fmaxf(mx, s[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m, mx);
        const bool none = m_new == -INFINITY;  // a row past T
        const float corr = none ? 1.0f : __expf(m - m_new);
        float psum = 0.0f;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const float p = none || s[c] == -INFINITY ? 0.0f : __expf(s[c] - m_new);
            psum += p;  // the row sum is the undropped softmax's; what multiplies V, the dropout's
            Pw[r * kPld + half * 32 + c] =
                from_f<T>(p > 0.0f ? p * g.drop.factor(hs, b, t, k0 + half * 32 + c, g.T) : 0.0f);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * corr + psum;
        m = m_new;
        for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++) Ow[r * ldo + d] *= corr;
        __syncwarp();
        FragC acc[D / 16];
#pragma unroll
        for (int j = 0; j < D / 16; j++)
            wmma::load_matrix_sync(acc[j], Ow + j * 16, ldo, wmma::mem_row_major);
        product_ab_acc<T, D>(acc, Pw, Vs, n);
#pragma unroll
        for (int j = 0; j < D / 16; j++)
            wmma::store_matrix_sync(Ow + j * 16, acc[j], ldo, wmma::mem_row_major);
        __syncwarp();
    }
    // normalise, then write the warp's rows (coalesced) and their log-sum-exp
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++) Ow[r * ldo + d] *= inv;
    if (half == 0 && t < g.T) lse[g.row(b, h, t)] = m + logf(l);
    __syncwarp();
    const int rows = min(16, g.T - (row0 + warp * 16));
    if (rows > 0) write_stage<T, D>(out + g.o(b, row0 + warp * 16, h), size_t(g.C), Ow, rows, g.HS);
}

// Per-warp scratch of the backward kernels: two fp32 (16, 64) tiles and two 16-bit (16, 64) tiles.
template <typename T>
constexpr size_t bwd_warp_bytes() {
    return 2 * 16 * kSld * sizeof(float) + 2 * 16 * kPld * sizeof(T);
}
template <typename T, int D>
size_t bwd_smem() {
    return 4 * Sizes<D>::tile * sizeof(T) + 2 * kTileRows * sizeof(float) + kWarps * bwd_warp_bytes<T>();
}

// The backward kernels' shared memory: four (64, D + 8) tiles, a tile's lse and Drow (64 each), then per warp
// two fp32 (16, 64) tiles and two 16-bit (16, 64) tiles.
template <typename T, int D>
struct BwdSmem {
    T* tile[4];
    float *lse, *Drow, *f0, *f1;
    T *h0, *h1;
    __device__ BwdSmem(float* smem, int warp) {
        tile[0] = reinterpret_cast<T*>(smem);
        for (int i = 1; i < 4; i++) tile[i] = tile[i - 1] + Sizes<D>::tile;
        lse = reinterpret_cast<float*>(tile[3] + Sizes<D>::tile);
        Drow = lse + kTileRows;
        f0 = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(Drow + kTileRows) +
                                      warp * bwd_warp_bytes<T>());
        f1 = f0 + 16 * kSld;
        h0 = reinterpret_cast<T*>(f1 + 16 * kSld);
        h1 = h0 + 16 * kPld;
    }
    // the 64 rows' lse and Drow from row t0 (zero past T)
    __device__ void load_stats(const float* lse_g, const float* Drow_g, const AttnGeom& g, int b, int h,
                               int t0) const {
        for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
            lse[i] = t0 + i < g.T ? lse_g[g.row(b, h, t0 + i)] : 0.0f;
            Drow[i] = t0 + i < g.T ? Drow_g[g.row(b, h, t0 + i)] : 0.0f;
        }
    }
};

// dK, dV: block (64 keys from k0, head); warp w owns keys k0 + 16w .. + 15 and walks the query tiles from k0
// on: S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - Drow) scale, then
// dV += P^T dO and dK += dS^T Q. Shared: K, V, Q, dO tiles, the tile's lse and Drow, per-warp scratch.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_tc_bwd_kv_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                          AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr int ld = Sizes<D>::ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const BwdSmem<T, D> sm(smem, warp);
    T *Ks = sm.tile[0], *Vs = sm.tile[1], *Qs = sm.tile[2], *dOs = sm.tile[3];
    const float *lse_s = sm.lse, *D_s = sm.Drow;
    float *St = sm.f0, *dPt = sm.f1;
    T *Pt = sm.h0, *dSt = sm.h1;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int k0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;  // the longest walks first
    const size_t qstride = g.ld();
    load_tile<T, D>(Ks, qkv + g.k(b, k0, h), qstride, min(kTileRows, g.T - k0), g.HS, vec);
    load_tile<T, D>(Vs, qkv + g.v(b, k0, h), qstride, min(kTileRows, g.T - k0), g.HS, vec);
    const T *Q0 = qkv + g.q(b, 0, h),
            *dO0 = dout + g.o(b, 0, h);  // this head's queries and their gradient, row 0
    FragC dk[D / 16], dv[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        wmma::fill_fragment(dk[j], 0.0f);
        wmma::fill_fragment(dv[j], 0.0f);
    }
    const int r = lane / 2, half = lane % 2, key = k0 + warp * 16 + r, warp_first = k0 + warp * 16;
    const uint64_t hs = g.drop.head_seed(h);
    for (int q0 = k0; q0 < g.T; q0 += kTileRows) {
        __syncthreads();  // the previous tile's Q, dO and row terms are no longer read
        load_tile<T, D>(Qs, Q0 + size_t(q0) * qstride, qstride, min(kTileRows, g.T - q0), g.HS, vec);
        load_tile<T, D>(dOs, dO0 + size_t(q0) * g.C, size_t(g.C), min(kTileRows, g.T - q0), g.HS, vec);
        sm.load_stats(lse, Drow, g, b, h, q0);
        __syncthreads();
        if (warp_first >= g.T) continue;  // keys past T
        // query tiles of 16 before the warp's first key are wholly masked (only on the diagonal tile)
        const int lo = max(0, (warp_first - q0) / 16);
        product_abt<T, D>(St + lo * 16, Ks + warp * 16 * ld, Qs + lo * 16 * ld, kTileRows / 16 - lo);
        product_abt<T, D>(dPt + lo * 16, Vs + warp * 16 * ld, dOs + lo * 16 * ld, kTileRows / 16 - lo);
        __syncwarp();
#pragma unroll 4
        for (int c = 0; c < 32; c++) {
            const int qi = half * 32 + c, q = q0 + qi;
            float p = 0.0f, ds = 0.0f, kp = 1.0f;
            if (q < g.T && key <= q) {
                p = __expf(St[r * kSld + qi] * g.scale - lse_s[qi]);
                kp = g.drop.factor(hs, b, q, key, g.T);
                ds = p * (dPt[r * kSld + qi] * kp - D_s[qi]) * g.scale;
            }
            Pt[r * kPld + qi] = from_f<T>(p * kp);  // what multiplied dO's row in the forward
            dSt[r * kPld + qi] = from_f<T>(ds);
        }
        __syncwarp();
        product_ab_acc<T, D>(dv, Pt + lo * 16, dOs + lo * 16 * ld, kTileRows / 16 - lo);
        product_ab_acc<T, D>(dk, dSt + lo * 16, Qs + lo * 16 * ld, kTileRows / 16 - lo);
    }
    // the Q and dO tiles' space becomes the warps' fp32 staging (4 x (16, D + 4) fits in 2 x (64, D + 8) x 16
    // bits)
    __syncthreads();
    float* stage = reinterpret_cast<float*>(Qs) + warp * 16 * Sizes<D>::ldo;
    const int valid = min(16, g.T - warp_first);
    if (valid <= 0) return;
    write_rows<T, D>(dqkv + g.dv(b, warp_first, h), g.dld(), dv, stage, valid, g.HS);
    __syncwarp();
    write_rows<T, D>(dqkv + g.dk(b, warp_first, h), g.dld(), dk, stage, valid, g.HS);
}

// dQ: block (64 queries from q0, head); warp w owns queries q0 + 16w .. + 15 and walks the key tiles up to
// its diagonal: S = Q K^T, dP = dO V^T, dS = P (dP - Drow) scale, dQ += dS K.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_tc_bwd_q_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                         AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr int ld = Sizes<D>::ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const BwdSmem<T, D> sm(smem, warp);
    T *Qs = sm.tile[0], *dOs = sm.tile[1], *Ks = sm.tile[2], *Vs = sm.tile[3];
    const float *lse_s = sm.lse, *D_s = sm.Drow;
    float *Sw = sm.f0, *dPw = sm.f1;
    T* dSw = sm.h0;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;
    const size_t qstride = g.ld();
    const T *K0 = qkv + g.k(b, 0, h), *V0 = qkv + g.v(b, 0, h);  // this head's keys and values, row 0
    load_tile<T, D>(Qs, qkv + g.q(b, q0, h), qstride, min(kTileRows, g.T - q0), g.HS, vec);
    load_tile<T, D>(dOs, dout + g.o(b, q0, h), size_t(g.C), min(kTileRows, g.T - q0), g.HS, vec);
    sm.load_stats(lse, Drow, g, b, h, q0);
    FragC dq[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++) wmma::fill_fragment(dq[j], 0.0f);
    const int r = lane / 2, half = lane % 2, qr = warp * 16 + r, t = q0 + qr;
    const int warp_last = min(g.T - 1, q0 + warp * 16 + 15);
    const uint64_t hs = g.drop.head_seed(h);
    for (int k0 = 0; k0 <= min(g.T - 1, q0 + kTileRows - 1); k0 += kTileRows) {
        __syncthreads();
        load_tile<T, D>(Ks, K0 + size_t(k0) * qstride, qstride, min(kTileRows, g.T - k0), g.HS, vec);
        load_tile<T, D>(Vs, V0 + size_t(k0) * qstride, qstride, min(kTileRows, g.T - k0), g.HS, vec);
        __syncthreads();
        if (warp_last < k0) continue;
        const int n = min(kTileRows / 16, (warp_last - k0) / 16 + 1);
        product_abt<T, D>(Sw, Qs + warp * 16 * ld, Ks, n);
        product_abt<T, D>(dPw, dOs + warp * 16 * ld, Vs, n);
        __syncwarp();
#pragma unroll 4
        for (int c = 0; c < 32; c++) {
            const int kj = half * 32 + c, key = k0 + kj;
            float ds = 0.0f;
            if (t < g.T && key <= t) {
                const float p = __expf(Sw[r * kSld + kj] * g.scale - lse_s[qr]);
                ds = p * (dPw[r * kSld + kj] * g.drop.factor(hs, b, t, key, g.T) - D_s[qr]) * g.scale;
            }
            dSw[r * kPld + kj] = from_f<T>(ds);
        }
        __syncwarp();
        product_ab_acc<T, D>(dq, dSw, Ks, n);
    }
    __syncthreads();  // the K and V tiles' space becomes the warps' fp32 staging
    float* stage = reinterpret_cast<float*>(Ks) + warp * 16 * Sizes<D>::ldo;
    const int valid = min(16, g.T - (q0 + warp * 16));
    if (valid > 0) write_rows<T, D>(dqkv + g.dq(b, q0 + warp * 16, h), g.dld(), dq, stage, valid, g.HS);
}

// 16-byte tile loads need every row start of what is loaded (qkv rows of C + 2 KC, dO rows of C, head
// offsets, all multiples of HS) on 16 bytes: head sizes that are whole packs and aligned bases.
bool rows_aligned(const AttnGeom& g, const void* p) {
    return g.HS % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The shared memory a kernel needs past 48 KiB, allowed once per kernel (the caller keeps the flag per
// instantiation), not on every launch of the training step.
template <typename K>
bool allow_smem(K kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
}

// Calls f(T{}) for bf16 and f16; the tensor-core kernels take nothing else.
template <typename F>
void dispatch_16bit(DType dt, F&& f) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            ::anvil::fail("attention: the tensor-core kernels take bf16 or f16, not f32");
        else
            f(tag);
    });
}

}  // namespace

bool attention_tc_fits(const Ctx& c, const AttnGeom& g) {
    size_t need = 0;
    dispatch_head(g.HS, [&](auto dtag) {
        constexpr int D = decltype(dtag)::value;
        need = std::max(fwd_smem<bf16_t, D>(), bwd_smem<bf16_t, D>());  // f16 tiles take the same
    });
    return need <= c.smem_optin;
}

void attention_tc_fwd(const Ctx& c, Tensor out, float* lse, const Tensor& qkv, const AttnGeom& g) {
    const bool vec = rows_aligned(g, qkv.data);
    dispatch_16bit(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            const size_t smem = fwd_smem<T, D>();
            static const bool allowed = allow_smem(attn_tc_fwd_kernel<T, D>, smem);
            (void)allowed;
            const dim3 grid((g.T + kTileRows - 1) / kTileRows, g.B * g.NH);
            attn_tc_fwd_kernel<T, D>
                <<<grid, kThreads, smem, c.stream>>>(out.ptr<T>(), lse, qkv.ptr<T>(), g, vec);
            CUDA_LAUNCH_CHECK();
        });
    });
}

void attention_tc_bwd(const Ctx& c, Tensor dqkv, const Tensor& dout, const Tensor& qkv, const float* lse,
                      const float* Drow, const AttnGeom& g) {
    const bool vec = rows_aligned(g, qkv.data) && rows_aligned(g, dout.data);  // dqkv is written by element
    dispatch_16bit(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            const size_t smem = bwd_smem<T, D>();
            const dim3 grid((g.T + kTileRows - 1) / kTileRows, g.B * g.NH);
            static const bool allowed =
                allow_smem(attn_tc_bwd_kv_kernel<T, D>, smem) && allow_smem(attn_tc_bwd_q_kernel<T, D>, smem);
            (void)allowed;
            attn_tc_bwd_kv_kernel<T, D><<<grid, kThreads, smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(),
                                                                            dout.ptr<T>(), lse, Drow, g, vec);
            CUDA_LAUNCH_CHECK();
            attn_tc_bwd_q_kernel<T, D><<<grid, kThreads, smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(),
                                                                           dout.ptr<T>(), lse, Drow, g, vec);
            CUDA_LAUNCH_CHECK();
        });
    });
}

}  // namespace anvil::cuda
