// Causal self-attention on the tensor cores (bf16 and f16), FlashAttention-2 style: the T x T scores never
// reach global memory, only the log-sum-exp (B, NH, T) is kept for the backward (the same saved tensor and
// row term as the CUDA-core kernels of attention.cu, which remain for fp32 and --attention flash-simt).
//
// The products are PTX mma.sync (m16n8k16, fp32 accumulation) on fragments in registers, their operands read
// from shared memory by ldmatrix (mma.cuh); the softmax, its rescaling and its backward run on the
// accumulators in registers, whose layout is the next product's A operand once rounded, so no score or
// probability passes through shared memory. A block is 4 warps on 64 rows (16 rows a warp) and walks tiles of
// 64 keys (forward, dQ) or of 64 queries (dK/dV), which come in by cp.async two stages deep (the next tile's
// copies in flight while one is used; the backward one stage where two do not fit the device's shared
// memory); the probabilities and their gradient are rounded to the input dtype before they are multiplied,
// as in FlashAttention-2. Tiles are zero-padded up to D (32, 64 or 128) columns, so any head size up to 128
// works. The backward is two kernels (dK/dV per key tile, dQ per query tile): nothing is accumulated with
// atomics, runs repeat bit for bit. Dropout on the probabilities (AttnGeom::drop) as in attention.cu.
//
// Shared-memory tiles have a stride of D + 8 elements: every ldmatrix row is 16-byte aligned and the 8 rows
// of one 8 x 8 matrix start in different banks.
#include <algorithm>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/mma.cuh"

namespace anvil::cuda {

namespace {

constexpr int kTileRows = 64;  // rows of a block (queries; keys in dK/dV) and of every tile it walks
constexpr int kWarps = 4;      // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kFwdStages = 2;  // K/V tile pairs in flight in the forward

template <int D>
struct Sizes {
    static constexpr int ld = D + 8;                        // 16-bit (64, D) tile stride
    static constexpr size_t tile = size_t(kTileRows) * ld;  // elements of one such tile
};

// Rows [0, 64) of HS elements (`stride` apart, from `src`) into a (64, D + 8) tile; rows from `valid` on and
// columns from HS on become zero. When every row is 16-byte aligned (`vec`): 16-byte cp.async copies, in
// flight until a cp_async_wait covers the group the caller commits them to; else element loads and stores,
// done on return.
template <typename T, int D>
__device__ void load_tile(T* dst, const T* src, size_t stride, int valid, int HS, bool vec) {
    constexpr int ld = Sizes<D>::ld;
    if (vec) {
        constexpr int P = D / 8;  // 8 elements of 16 bits per pack
        for (int idx = threadIdx.x; idx < kTileRows * P; idx += blockDim.x) {
            const int r = idx / P, c = idx % P * 8;
            const bool in = r < valid && c < HS;
            cp_async16(dst + r * ld + c, in ? src + size_t(r) * stride + c : src, in ? 16 : 0);
        }
        return;
    }
    for (int idx = threadIdx.x; idx < kTileRows * D; idx += blockDim.x) {
        const int r = idx / D, c = idx % D;
        dst[r * ld + c] = r < valid && c < HS ? src[size_t(r) * stride + c] : from_f<T>(0.0f);
    }
}

// ldmatrix addressing (mma.cuh): lane 8j + r names row r of 8 x 8 matrix j. These are the lane offsets (rows
// `ld` apart) of an A operand (16 x 16), which a B operand pair read with the transposing load shares (two
// 8-column groups of a row-major (k, n) tile, k = 16 rows), and of a B operand pair read as it is (two 8-row
// groups of a row-major (n, k) tile, k = 16 columns).
template <int ld>
__device__ __forceinline__ int a_offset(int lane) {
    return (lane % 8 + 8 * (lane / 8 % 2)) * ld + 8 * (lane / 16);
}
template <int ld>
__device__ __forceinline__ int b_offset(int lane) {
    return (lane % 8 + 8 * (lane / 16)) * ld + 8 * (lane / 8 % 2);
}

// A warp's rows in the forward: MT tiles of 16 (m-tile mt: the block's rows 64 mt + 16 w .. + 15), their
// output accumulators, and lane (g, q)'s rows g and g + 8's running max (in log2 units: scores times
// scale * log2(e)) and (its own columns') sum.
template <int D, int MT>
struct FwdRows {
    float o[MT][D / 8][4] = {};
    float m[MT][2], l[MT][2];
    __device__ FwdRows() {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    }
};

// Where a warp's m-tiles sit against the key tiles: first and last row (last: at most T - 1), and lane
// (g, q)'s two rows t.
template <int MT>
struct FwdSpan {
    int first[MT], last[MT], t[MT][2];
    // key groups of 16 from k0 (up to 4) with a key at or before m-tile mt's last row; none past T
    __device__ int groups(int mt, int k0, int T) const {
        return first[mt] >= T || last[mt] < k0 ? 0 : min(kTileRows / 16, (last[mt] - k0) / 16 + 1);
    }
};

// One key tile (keys from k0, K and V in shared memory) for a warp's MT m-tiles: S = Q K^T into 8
// accumulator tiles (16 x 8) per m-tile, each K fragment read once for all of them; the online softmax on
// them in registers (row maxima over the 4 lanes of a group by shuffles; exp2 of scores already in log2
// units); then O += P V with P, rounded to T, already in A's layout, each V fragment read once for all
// m-tiles. With Drop, the kept probabilities multiply V (the row sums are the undropped softmax's; the kept
// ones' scale is the output's, at the end).
template <typename T, int D, int MT, bool Drop>
__device__ __forceinline__ void fwd_tile(FwdRows<D, MT>& st, const uint32_t (&qf)[MT][D / 16][4], const T* Ks,
                                         const T* Vs, int k0, const FwdSpan<MT>& sp, const AttnGeom& g,
                                         float scale_log2, int b, uint64_t hs) {
    constexpr int ld = Sizes<D>::ld;
    const int lane = threadIdx.x % 32, tq = lane % 4;
    int n16[MT], nmax = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) n16[mt] = sp.groups(mt, k0, g.T), nmax = max(nmax, n16[mt]);
    float s[MT][8][4] = {};  // S: keys k0 + 8j .. + 7
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
        if (jj >= nmax) break;
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            uint32_t kf[4];  // B: keys 16jj .. + 7 and + 8 .. + 15, columns 16k .. + 15
            mma::ldsm_x4(kf, Ks + jj * 16 * ld + k * 16 + b_offset<ld>(lane));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (jj >= n16[mt]) continue;
                mma::m16n8k16<T>(s[mt][2 * jj], qf[mt][k], {kf[0], kf[1]});
                mma::m16n8k16<T>(s[mt][2 * jj + 1], qf[mt][k], {kf[2], kf[3]});
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (n16[mt] == 0) continue;  // no key of this tile at or before the m-tile's rows (warp-uniform)
        // to log2 units; on the diagonal, keys past each row (and rows past T) masked
        const bool diag = k0 + kTileRows - 1 > sp.first[mt];
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = k0 + 8 * j + 2 * tq + i % 2, r = i / 2;
                const bool live =
                    j / 2 < n16[mt] && (!diag || (key <= sp.t[mt][r] && sp.t[mt][r] < g.T));
                s[mt][j][i] = live ? s[mt][j][i] * scale_log2 : -INFINITY;
                mx[r] = fmaxf(mx[r], s[mt][j][i]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(st.m[mt][r], mx[r]);
            corr[r] = m_new == -INFINITY ? 1.0f : mma::exp2_approx(st.m[mt][r] - m_new);  // -inf: past T
            st.m[mt][r] = m_new;
            st.l[mt][r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) st.o[mt][n][i] *= corr[i / 2];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i / 2;
                // exp2(-inf) is 0: masked keys, and whole rows past T (their max stays -inf: -inf - -inf is
                // NaN, hence the test)
                const float p =
                    st.m[mt][r] == -INFINITY ? 0.0f : mma::exp2_approx(s[mt][j][i] - st.m[mt][r]);
                st.l[mt][r] += p;
                if constexpr (Drop)  // kept or not; the kept ones' scale 1 / (1 - p) is the output's, in f32
                    s[mt][j][i] = p > 0.0f && g.drop.factor(hs, b, sp.t[mt][r], k0 + 8 * j + 2 * tq + i % 2,
                                                            g.T) > 0.0f
                                      ? p
                                      : 0.0f;
                else
                    s[mt][j][i] = p;
            }
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (kk >= nmax) break;
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mma::to_a<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
            uint32_t vf[4];  // B: keys 16kk .. + 15, columns 16dn .. + 7 and + 8 .. + 15
            mma::ldsm_x4_trans(vf, Vs + kk * 16 * ld + dn * 16 + a_offset<ld>(lane));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (kk >= n16[mt]) continue;
                mma::m16n8k16<T>(st.o[mt][2 * dn], pa[mt], {vf[0], vf[1]});
                mma::m16n8k16<T>(st.o[mt][2 * dn + 1], pa[mt], {vf[2], vf[3]});
            }
        }
    }
}

// Forward, FlashAttention-2 style with the fragments in registers (mma.cuh): block (64 MT queries from row0,
// head); warp w owns MT m-tiles of 16 queries, rows row0 + 64 mt + 16 w .. + 15 (lane (g, q): rows g and
// g + 8 of each). MT = 2 (128 rows a block, as FlashAttention-2 runs head size 64) reads each K and V
// fragment from shared memory once for two m-tiles and each key tile from global memory once for 128 rows,
// at twice the registers; MT = 1 is what the H100 run of 6f80acc measured (Ctx::attn_fwd_rows chooses).
// Shared: the Q tiles (MT of (64, D + 8)), read once into registers, and kFwdStages stages of a K and a V
// tile: while a tile is used, the next one's copies are in flight (cp.async). Keys past an m-tile's last
// row are skipped 16 at a time, and only diagonal tiles are masked; the row sums are added over a group's
// lanes at the end.
template <typename T, int D, int MT>
size_t fwd_smem() {
    return (MT + 2 * kFwdStages) * Sizes<D>::tile * sizeof(T);
}

// Columns d and d + 1 (d even) of a row, those below HS: one 4-byte store when `vec` (HS a multiple of 8 and
// the rows 16-byte aligned, so both are in and the pair 4-byte aligned), else element by element.
template <typename T>
__device__ __forceinline__ void store_pair(T* row, int d, float lo, float hi, int HS, bool vec) {
    if (vec) {
        if (d < HS) *reinterpret_cast<uint32_t*>(row + d) = mma::pack2<T>(lo, hi);
    } else {
        if (d < HS) row[d] = from_f<T>(lo);
        if (d + 1 < HS) row[d + 1] = from_f<T>(hi);
    }
}

template <int D, int MT>
constexpr int fwd_min_blocks() {  // blocks an SM should hold: what bounds the registers a thread may take
    return MT == 2 ? 2 : D <= 64 ? 3 : 1;
}

template <typename T, int D, int MT, bool Drop>
__global__ void __launch_bounds__(kThreads, fwd_min_blocks<D, MT>())
    attn_tc_fwd_kernel(T* out, float* lse, const T* qkv, AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr size_t tile = Sizes<D>::tile;
    constexpr int kRows = kTileRows * MT;  // a block's queries
    T* Qs = reinterpret_cast<T*>(smem);    // m-tile mt's rows of every warp: tile mt
    T* KV = Qs + MT * tile;                // stage s: K at KV + 2s tiles, V after it
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // the longest rows first
    const size_t qstride = g.ld();
    const T *K0 = qkv + g.k(b, 0, h), *V0 = qkv + g.v(b, 0, h);  // this head's keys and values, row 0
    const int ntiles = min(g.T - 1, row0 + kRows - 1) / kTileRows + 1;  // key tiles up to the diagonal
    auto issue = [&](int it) {  // key tile `it` into stage it % kFwdStages
        if (it < ntiles) {
            const int k0 = it * kTileRows, rows = min(kTileRows, g.T - k0);
            T* Kst = KV + 2 * (it % kFwdStages) * tile;
            load_tile<T, D>(Kst, K0 + size_t(k0) * qstride, qstride, rows, g.HS, vec);
            load_tile<T, D>(Kst + tile, V0 + size_t(k0) * qstride, qstride, rows, g.HS, vec);
        }
        cp_async_commit();  // empty past the last tile: the count of groups in flight stays fixed
    };
    for (int mt = 0; mt < MT; mt++) {  // tile 0's group
        const int r0 = row0 + mt * kTileRows;
        load_tile<T, D>(Qs + mt * tile, qkv + g.q(b, min(r0, g.T - 1), h), qstride, max(0, min(kTileRows, g.T - r0)),
                        g.HS, vec);
    }
    for (int s = 0; s < kFwdStages; s++) issue(s);
    cp_async_wait<kFwdStages - 1>();
    __syncthreads();             // Q landed
    uint32_t qf[MT][D / 16][4];  // A: m-tile mt's 16 rows, columns 16k .. 16k + 15
    FwdSpan<MT> sp;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int k = 0; k < D / 16; k++)
            mma::ldsm_x4(qf[mt][k],
                         Qs + mt * tile + warp * 16 * Sizes<D>::ld + k * 16 + a_offset<Sizes<D>::ld>(lane));
        sp.first[mt] = row0 + mt * kTileRows + warp * 16;
        sp.last[mt] = min(g.T - 1, sp.first[mt] + 15);
        sp.t[mt][0] = sp.first[mt] + gq, sp.t[mt][1] = sp.first[mt] + gq + 8;
    }
    const uint64_t hs = Drop ? g.drop.head_seed(h) : 0;
    const float scale_log2 = g.scale * float(M_LOG2E);
    FwdRows<D, MT> st;
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<kFwdStages - 1>();
        __syncthreads();  // key tile `it` landed, every thread's copies of it
        const T* Ks = KV + 2 * (it % kFwdStages) * tile;
        fwd_tile<T, D, MT, Drop>(st, qf, Ks, Ks + tile, it * kTileRows, sp, g, scale_log2, b, hs);
        __syncthreads();  // no warp reads that stage any more
        issue(it + kFwdStages);
    }
    cp_async_wait<0>();
    // normalise; write the rows and their log-sum-exp (natural units: m ln 2 + ln l)
    const int tq = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = st.l[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = sp.t[mt][r];
            if (row >= g.T) continue;
            if (tq == 0) lse[g.row(b, h, row)] = st.m[mt][r] * float(M_LN2) + logf(l);
            // with dropout, the kept probabilities' scale here, not in P before its rounding to T: scaled
            // there (4/3 is 1.3359375 in bf16), every output would be 0.2% off what the backward's dP assumes
            const float inv = l > 0.0f ? (Drop ? g.drop.scale : 1.0f) / l : 0.0f;
            T* dst = out + g.o(b, row, h);
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                store_pair(dst, 8 * n + 2 * tq, st.o[mt][n][2 * r] * inv, st.o[mt][n][2 * r + 1] * inv, g.HS,
                           vec);
        }
}

// The backward kernels' shared memory: two tiles loaded once (K and V; Q and dO), S stages of the two tiles
// streamed (Q and dO; K and V), and S stages of the lse and Drow of 64 rows (the dK/dV kernel's streamed
// query tiles; the dQ kernel keeps its own rows' in the first).
template <typename T, int D, int S>
size_t bwd_smem() {
    return (2 + 2 * S) * Sizes<D>::tile * sizeof(T) + 2 * S * kTileRows * sizeof(float);
}

template <typename T, int D, int S>
struct BwdSmem {
    T* fixed;      // the two tiles loaded once, one after the other
    float* stats;  // stage s: lse at stats + 128 s, Drow after it
    __device__ explicit BwdSmem(float* smem)
        : fixed(reinterpret_cast<T*>(smem)),
          stats(reinterpret_cast<float*>(fixed + (2 + 2 * S) * Sizes<D>::tile)) {}
    __device__ T* fixed_tile(int i) const { return fixed + i * Sizes<D>::tile; }
    __device__ T* streamed(int stage, int i) const { return fixed + (2 + 2 * stage + i) * Sizes<D>::tile; }
    __device__ float* lse(int stage) const { return stats + 2 * kTileRows * stage; }
    __device__ float* Drow(int stage) const { return lse(stage) + kTileRows; }
    // the 64 rows' lse (in log2 units: times log2 e, as the scores' exponent takes it) and Drow from row t0
    // (zero past T), plain stores
    __device__ void load_stats(int stage, const float* lse_g, const float* Drow_g, const AttnGeom& g, int b,
                               int h, int t0) const {
        for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
            lse(stage)[i] = t0 + i < g.T ? lse_g[g.row(b, h, t0 + i)] * float(M_LOG2E) : 0.0f;
            Drow(stage)[i] = t0 + i < g.T ? Drow_g[g.row(b, h, t0 + i)] : 0.0f;
        }
    }
};

// A warp's (16, D) fp32 accumulator tiles (rows g and g + 8 of lane (g, q)) to `dst` rows (stride `stride`),
// rows from `valid` on and columns from HS on left out.
template <typename T, int D>
__device__ void write_acc(T* dst, size_t stride, const float (&acc)[D / 8][4], int valid, int HS, bool vec) {
    const int lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (gq + 8 * r >= valid) continue;
        T* row = dst + size_t(gq + 8 * r) * stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            store_pair(row, 8 * n + 2 * tq, acc[n][2 * r], acc[n][2 * r + 1], HS, vec);
    }
}

// The A operands (16 x 16, columns 16k .. + 15) of a dK/dV warp's 16 keys and values, from their rows in
// shared memory (Ka, Va: this lane's ldmatrix addresses). At head sizes up to 64 read into registers once
// (hold()), so a query tile's products read only Q and dO from shared memory (an ldmatrix for two mma
// instead of three for four), within the 168 registers that keep three blocks an SM; at 128 they would not
// fit, and each is read again where it is used.
template <typename T, int D>
struct KvFrags {
    static constexpr bool kHeld = D <= 64;
    const T *Ka, *Va;
    uint32_t k[kHeld ? D / 16 : 1][4], v[kHeld ? D / 16 : 1][4];
    __device__ KvFrags(const T* ka, const T* va) : Ka(ka), Va(va) {}
    __device__ void hold() {
        if constexpr (kHeld)
#pragma unroll
            for (int i = 0; i < D / 16; i++) {
                mma::ldsm_x4(k[i], Ka + i * 16);
                mma::ldsm_x4(v[i], Va + i * 16);
            }
    }
    __device__ __forceinline__ void get(int i, uint32_t (&ka)[4], uint32_t (&va)[4]) const {
        if constexpr (kHeld) {
#pragma unroll
            for (int r = 0; r < 4; r++) ka[r] = k[i][r], va[r] = v[i][r];
        } else {
            mma::ldsm_x4(ka, Ka + i * 16);
            mma::ldsm_x4(va, Va + i * 16);
        }
    }
};

// One query tile (queries from q0: Q, dO, their lse and Drow in shared memory) of the dK/dV kernel for a
// warp's 16 keys (this lane's: key[0], key[1]; K and V as A operands from Ka, Va), 16 queries at a time:
// S^T = K Q^T and dP^T = V dO^T (16 x 16 each, in registers), P^T = exp(S^T scale - lse),
// dS^T = P^T (dP^T - Drow) scale, then dV += P^T dO and dK += dS^T Q with P^T and dS^T as A operands straight
// from the accumulators. P's exponent in log2 units (lse_s is; scale_log2 = scale log2 e).
template <typename T, int D, bool Drop>
__device__ __forceinline__ void bwd_kv_tile(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                            const KvFrags<T, D>& kv, const T* Qs, const T* dOs, const float* lse_s,
                                            const float* D_s, int q0, int warp_first, const int (&key)[2],
                                            const AttnGeom& g, float scale_log2, int b, uint64_t hs) {
    constexpr int ld = Sizes<D>::ld;
    const int lane = threadIdx.x % 32, tq = lane % 4;
    // queries before the warp's first key are wholly masked (only on the diagonal tile), those from T on
    // absent
    const int lo = max(0, (warp_first - q0) / 16), hi = min(kTileRows / 16, (g.T - q0 + 15) / 16);
    for (int jj = lo; jj < hi; jj++) {
        float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            uint32_t ka[4], va[4], qb[4], ob[4];  // B: queries 16jj .. + 7 and + 8 .. + 15
            kv.get(k, ka, va);
            mma::ldsm_x4(qb, Qs + jj * 16 * ld + k * 16 + b_offset<ld>(lane));
            mma::ldsm_x4(ob, dOs + jj * 16 * ld + k * 16 + b_offset<ld>(lane));
            mma::m16n8k16<T>(s[0], ka, {qb[0], qb[1]});
            mma::m16n8k16<T>(s[1], ka, {qb[2], qb[3]});
            mma::m16n8k16<T>(dp[0], va, {ob[0], ob[1]});
            mma::m16n8k16<T>(dp[1], va, {ob[2], ob[3]});
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int qi = 16 * jj + 8 * n + 2 * tq + i % 2, q = q0 + qi, r = i / 2;
                float p = 0.0f, ds = 0.0f, kp = 1.0f;
                if (q < g.T && key[r] <= q) {
                    p = mma::exp2_approx(s[n][i] * scale_log2 - lse_s[qi]);
                    if constexpr (Drop) kp = g.drop.factor(hs, b, q, key[r], g.T);
                    ds = p * ((Drop ? dp[n][i] * kp : dp[n][i]) - D_s[qi]) * g.scale;
                }
                s[n][i] = kp > 0.0f ? p : 0.0f;  // what multiplied dO's row in the forward, less the scale
                dp[n][i] = ds;
            }
        uint32_t pa[4], da[4];
        mma::to_a<T>(pa, s[0], s[1]);
        mma::to_a<T>(da, dp[0], dp[1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
            uint32_t ob[4], qb[4];  // B: queries 16jj .. + 15, columns 16dn .. + 7 and + 8 .. + 15
            mma::ldsm_x4_trans(ob, dOs + jj * 16 * ld + dn * 16 + a_offset<ld>(lane));
            mma::ldsm_x4_trans(qb, Qs + jj * 16 * ld + dn * 16 + a_offset<ld>(lane));
            mma::m16n8k16<T>(dv[2 * dn], pa, {ob[0], ob[1]});
            mma::m16n8k16<T>(dv[2 * dn + 1], pa, {ob[2], ob[3]});
            mma::m16n8k16<T>(dk[2 * dn], da, {qb[0], qb[1]});
            mma::m16n8k16<T>(dk[2 * dn + 1], da, {qb[2], qb[3]});
        }
    }
}

// dK, dV: block (64 keys from k0, head); warp w owns keys k0 + 16w .. + 15 (lane (g, q): keys + g and + g +
// 8) and walks the query tiles from k0 on (bwd_kv_tile), S stages of them in flight. Shared: BwdSmem.
template <typename T, int D, int S, bool Drop>
__global__ void __launch_bounds__(kThreads, D <= 64 ? 3 : 1)
    attn_tc_bwd_kv_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                          AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr int ld = Sizes<D>::ld;
    const BwdSmem<T, D, S> sm(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int k0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;  // the longest walks first
    const size_t qstride = g.ld();
    const T *Q0 = qkv + g.q(b, 0, h), *dO0 = dout + g.o(b, 0, h);  // this head's queries and their gradient
    const int ntiles = (g.T - k0 + kTileRows - 1) / kTileRows;     // query tiles from k0 on
    auto issue = [&](int it) {                                     // query tile `it` into stage it % S
        if (it < ntiles) {
            const int q0 = k0 + it * kTileRows, rows = min(kTileRows, g.T - q0);
            load_tile<T, D>(sm.streamed(it % S, 0), Q0 + size_t(q0) * qstride, qstride, rows, g.HS, vec);
            load_tile<T, D>(sm.streamed(it % S, 1), dO0 + size_t(q0) * g.C, size_t(g.C), rows, g.HS, vec);
            sm.load_stats(it % S, lse, Drow, g, b, h, q0);
        }
        cp_async_commit();
    };
    load_tile<T, D>(sm.fixed_tile(0), qkv + g.k(b, k0, h), qstride, min(kTileRows, g.T - k0), g.HS, vec);
    load_tile<T, D>(sm.fixed_tile(1), qkv + g.v(b, k0, h), qstride, min(kTileRows, g.T - k0), g.HS, vec);
    for (int s = 0; s < S; s++) issue(s);
    const int warp_first = k0 + warp * 16, key[2] = {warp_first + gq, warp_first + gq + 8};
    KvFrags<T, D> kv(sm.fixed_tile(0) + warp * 16 * ld + a_offset<ld>(lane),  // A: the warp's keys
                     sm.fixed_tile(1) + warp * 16 * ld + a_offset<ld>(lane));
    const uint64_t hs = Drop ? g.drop.head_seed(h) : 0;
    const float scale_log2 = g.scale * float(M_LOG2E);
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<S - 1>();
        __syncthreads();  // query tile `it` landed (and K, V with the first)
        if (it == 0) kv.hold();
        if (warp_first < g.T)  // else the warp's keys are past T
            bwd_kv_tile<T, D, Drop>(dk, dv, kv, sm.streamed(it % S, 0), sm.streamed(it % S, 1),
                                    sm.lse(it % S), sm.Drow(it % S), k0 + it * kTileRows, warp_first, key, g,
                                    scale_log2, b, hs);
        __syncthreads();  // no warp reads that stage any more
        issue(it + S);
    }
    cp_async_wait<0>();
    const int valid = min(16, g.T - warp_first);
    if (valid <= 0) return;
    if constexpr (Drop)  // the kept probabilities' scale, in f32 (as the forward's)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) dv[n][i] *= g.drop.scale;
    write_acc<T, D>(dqkv + g.dv(b, warp_first, h), g.dld(), dv, valid, g.HS, vec);
    write_acc<T, D>(dqkv + g.dk(b, warp_first, h), g.dld(), dk, valid, g.HS, vec);
}

// One key tile (keys from k0: K, V in shared memory) of the dQ kernel for a warp's 16 queries (this lane's:
// t[0], t[1], with their lse and Drow; Q and dO as A operands in registers), 16 keys at a time: S = Q K^T,
// dP = dO V^T, dS = P (dP - Drow) scale, dQ += dS K. P's exponent in log2 units, as bwd_kv_tile's.
template <typename T, int D, bool Drop>
__device__ __forceinline__ void bwd_q_tile(float (&dq)[D / 8][4], const uint32_t (&qa)[D / 16][4],
                                           const uint32_t (&oa)[D / 16][4], const T* Ks, const T* Vs, int k0,
                                           int warp_last, const int (&t)[2], const float (&lse_r)[2],
                                           const float (&D_r)[2], const AttnGeom& g, float scale_log2, int b,
                                           uint64_t hs) {
    constexpr int ld = Sizes<D>::ld;
    const int lane = threadIdx.x % 32, tq = lane % 4;
    const int n16 = min(kTileRows / 16, (warp_last - k0) / 16 + 1);  // key groups not wholly masked
    for (int jj = 0; jj < n16; jj++) {
        float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            uint32_t kb[4], vb[4];  // B: keys 16jj .. + 7 and + 8 .. + 15
            mma::ldsm_x4(kb, Ks + jj * 16 * ld + k * 16 + b_offset<ld>(lane));
            mma::ldsm_x4(vb, Vs + jj * 16 * ld + k * 16 + b_offset<ld>(lane));
            mma::m16n8k16<T>(s[0], qa[k], {kb[0], kb[1]});
            mma::m16n8k16<T>(s[1], qa[k], {kb[2], kb[3]});
            mma::m16n8k16<T>(dp[0], oa[k], {vb[0], vb[1]});
            mma::m16n8k16<T>(dp[1], oa[k], {vb[2], vb[3]});
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = k0 + 16 * jj + 8 * n + 2 * tq + i % 2, r = i / 2;
                float ds = 0.0f;
                if (t[r] < g.T && key <= t[r]) {
                    const float p = mma::exp2_approx(s[n][i] * scale_log2 - lse_r[r]);
                    const float dpk = Drop ? dp[n][i] * g.drop.factor(hs, b, t[r], key, g.T) : dp[n][i];
                    ds = p * (dpk - D_r[r]) * g.scale;
                }
                dp[n][i] = ds;
            }
        uint32_t da[4];
        mma::to_a<T>(da, dp[0], dp[1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
            uint32_t kb[4];  // B: keys 16jj .. + 15, columns 16dn .. + 7 and + 8 .. + 15
            mma::ldsm_x4_trans(kb, Ks + jj * 16 * ld + dn * 16 + a_offset<ld>(lane));
            mma::m16n8k16<T>(dq[2 * dn], da, {kb[0], kb[1]});
            mma::m16n8k16<T>(dq[2 * dn + 1], da, {kb[2], kb[3]});
        }
    }
}

// dQ: block (64 queries from q0, head); warp w owns queries q0 + 16w .. + 15 (their Q and dO fragments in
// registers) and walks the key tiles up to its diagonal (bwd_q_tile), S stages of them in flight.
template <typename T, int D, int S, bool Drop>
__global__ void __launch_bounds__(kThreads)
    attn_tc_bwd_q_kernel(T* dqkv, const T* qkv, const T* dout, const float* lse, const float* Drow,
                         AttnGeom g, bool vec) {
    extern __shared__ __align__(128) float smem[];
    constexpr int ld = Sizes<D>::ld;
    const BwdSmem<T, D, S> sm(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4;
    const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;
    const size_t qstride = g.ld();
    const T *K0 = qkv + g.k(b, 0, h), *V0 = qkv + g.v(b, 0, h);  // this head's keys and values, row 0
    const int ntiles = min(g.T - 1, q0 + kTileRows - 1) / kTileRows + 1;  // key tiles up to the diagonal
    auto issue = [&](int it) {                                            // key tile `it` into stage it % S
        if (it < ntiles) {
            const int k0 = it * kTileRows, rows = min(kTileRows, g.T - k0);
            load_tile<T, D>(sm.streamed(it % S, 0), K0 + size_t(k0) * qstride, qstride, rows, g.HS, vec);
            load_tile<T, D>(sm.streamed(it % S, 1), V0 + size_t(k0) * qstride, qstride, rows, g.HS, vec);
        }
        cp_async_commit();
    };
    load_tile<T, D>(sm.fixed_tile(0), qkv + g.q(b, q0, h), qstride, min(kTileRows, g.T - q0), g.HS, vec);
    load_tile<T, D>(sm.fixed_tile(1), dout + g.o(b, q0, h), size_t(g.C), min(kTileRows, g.T - q0), g.HS, vec);
    sm.load_stats(0, lse, Drow, g, b, h, q0);
    for (int s = 0; s < S; s++) issue(s);
    cp_async_wait<S - 1>();
    __syncthreads();                        // Q, dO and their row terms landed
    uint32_t qa[D / 16][4], oa[D / 16][4];  // A: the warp's queries and their output gradient
#pragma unroll
    for (int k = 0; k < D / 16; k++) {
        mma::ldsm_x4(qa[k], sm.fixed_tile(0) + warp * 16 * ld + k * 16 + a_offset<ld>(lane));
        mma::ldsm_x4(oa[k], sm.fixed_tile(1) + warp * 16 * ld + k * 16 + a_offset<ld>(lane));
    }
    const int warp_first = q0 + warp * 16, warp_last = min(g.T - 1, warp_first + 15);
    const int t[2] = {warp_first + gq, warp_first + gq + 8};
    const float lse_r[2] = {sm.lse(0)[warp * 16 + gq], sm.lse(0)[warp * 16 + gq + 8]};
    const float D_r[2] = {sm.Drow(0)[warp * 16 + gq], sm.Drow(0)[warp * 16 + gq + 8]};
    const uint64_t hs = Drop ? g.drop.head_seed(h) : 0;
    const float scale_log2 = g.scale * float(M_LOG2E);
    float dq[D / 8][4] = {};
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<S - 1>();
        __syncthreads();                  // key tile `it` landed
        if (warp_last >= it * kTileRows)  // else the warp's rows are past T
            bwd_q_tile<T, D, Drop>(dq, qa, oa, sm.streamed(it % S, 0), sm.streamed(it % S, 1), it * kTileRows,
                                   warp_last, t, lse_r, D_r, g, scale_log2, b, hs);
        __syncthreads();  // no warp reads that stage any more
        issue(it + S);
    }
    cp_async_wait<0>();
    const int valid = min(16, g.T - warp_first);
    if (valid > 0) write_acc<T, D>(dqkv + g.dq(b, warp_first, h), g.dld(), dq, valid, g.HS, vec);
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

// Calls f(std::bool_constant<on>): every kernel here is built with dropout and without.
template <typename F>
void dispatch_drop(bool on, F&& f) {
    if (on)
        f(std::true_type{});
    else
        f(std::false_type{});
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

bool attention_tc_fits(const Ctx& c, int HS) {
    size_t need = 0;
    dispatch_head(HS, [&](auto dtag) {
        constexpr int D = decltype(dtag)::value;
        need = std::max(fwd_smem<bf16_t, D, 1>(), bwd_smem<bf16_t, D, 1>());  // f16 tiles take the same
    });
    return need <= c.smem_optin;
}

namespace {

template <typename T, int D, int MT, bool Drop>
void launch_fwd(const Ctx& c, Tensor out, float* lse, const Tensor& qkv, const AttnGeom& g, bool vec) {
    const size_t smem = fwd_smem<T, D, MT>();
    static const bool allowed = allow_smem(attn_tc_fwd_kernel<T, D, MT, Drop>, smem);
    (void)allowed;
    const dim3 grid((g.T + kTileRows * MT - 1) / (kTileRows * MT), g.B * g.NH);
    attn_tc_fwd_kernel<T, D, MT, Drop><<<grid, kThreads, smem, c.stream>>>(out.ptr<T>(), lse, qkv.ptr<T>(), g, vec);
    CUDA_LAUNCH_CHECK();
}

}  // namespace

void attention_tc_fwd(const Ctx& c, Tensor out, float* lse, const Tensor& qkv, const AttnGeom& g) {
    const bool vec = rows_aligned(g, qkv.data) && rows_aligned(g, out.data);
    dispatch_16bit(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            dispatch_drop(g.drop.on(), [&](auto drop) {
                constexpr bool Drop = decltype(drop)::value;
                // 128 rows a block only where its registers fit (head sizes up to 64) and Ctx asks for it
                if constexpr (D <= 64)
                    if (c.attn_fwd_rows == 128 && fwd_smem<T, D, 2>() <= c.smem_optin)
                        return launch_fwd<T, D, 2, Drop>(c, out, lse, qkv, g, vec);
                launch_fwd<T, D, 1, Drop>(c, out, lse, qkv, g, vec);
            });
        });
    });
}

namespace {

// The two backward kernels with S stages of streamed tiles in flight.
template <typename T, int D, int S, bool Drop>
void launch_bwd(const Ctx& c, Tensor dqkv, const Tensor& dout, const Tensor& qkv, const float* lse,
                const float* Drow, const AttnGeom& g, bool vec) {
    const size_t smem = bwd_smem<T, D, S>();
    const dim3 grid((g.T + kTileRows - 1) / kTileRows, g.B * g.NH);
    static const bool allowed = allow_smem(attn_tc_bwd_kv_kernel<T, D, S, Drop>, smem) &&
                                allow_smem(attn_tc_bwd_q_kernel<T, D, S, Drop>, smem);
    (void)allowed;
    attn_tc_bwd_kv_kernel<T, D, S, Drop>
        <<<grid, kThreads, smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(), dout.ptr<T>(), lse, Drow, g, vec);
    CUDA_LAUNCH_CHECK();
    attn_tc_bwd_q_kernel<T, D, S, Drop>
        <<<grid, kThreads, smem, c.stream>>>(dqkv.ptr<T>(), qkv.ptr<T>(), dout.ptr<T>(), lse, Drow, g, vec);
    CUDA_LAUNCH_CHECK();
}

}  // namespace

void attention_tc_bwd(const Ctx& c, Tensor dqkv, const Tensor& dout, const Tensor& qkv, const float* lse,
                      const float* Drow, const AttnGeom& g) {
    const bool vec = rows_aligned(g, qkv.data) && rows_aligned(g, dout.data) && rows_aligned(g, dqkv.data);
    dispatch_16bit(qkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_head(g.HS, [&](auto dtag) {
            constexpr int D = decltype(dtag)::value;
            // two stages of streamed tiles where the device has the shared memory (all but head size 128 on
            // Ada's 99 KiB), else one: loaded after the last one is used
            dispatch_drop(g.drop.on(), [&](auto drop) {
                constexpr bool Drop = decltype(drop)::value;
                if (bwd_smem<T, D, 2>() <= c.smem_optin)
                    launch_bwd<T, D, 2, Drop>(c, dqkv, dout, qkv, lse, Drow, g, vec);
                else
                    launch_bwd<T, D, 1, Drop>(c, dqkv, dout, qkv, lse, Drow, g, vec);
            });
        });
    });
}

}  // namespace anvil::cuda
