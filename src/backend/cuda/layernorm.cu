// The norms, LayerNorm (eps 1e-5) and RMSNorm: the forward, one kernel for both, alone or after a residual
// add (add_norm_fwd), and the backward, one fused kernel and one unfused pair for both; statistics in f32.
// One warp per row with 16-byte accesses; the weight and bias gradients are reduced over rows in two
// fixed-order stages (no atomics: deterministic).
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr float kLnEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // one warp per row

// Rounds f as a store to T and a load back would: what a later pass over a stored row reads.
template <typename T, int L>
__device__ __forceinline__ Floats<L> as_stored(Floats<L> f) {
#pragma unroll
    for (int k = 0; k < L; k++) f.v[k] = to_f(from_f<T>(f.v[k]));
    return f;
}

// The norms' forward, one warp a row: out = LayerNorm (layer) or RMSNorm of the row x, times w (plus bias for
// LayerNorm). x is a's row, or (b given: add_norm_fwd) a + b, rounded to T and stored in sum, and normed as
// stored. LayerNorm takes the mean, then the squared deviations (two exact passes); RMSNorm the mean square
// (the same pass with the mean 0). P > 0 (rows of whole 16-byte packs, at most 32 P of them): the lane's
// packs p * 32 + lane are read once into registers and every pass works there; P = 0: each pass reads the row
// again (after the add, the sum as stored, from L1). Each lane takes its elements in warp_row's order on
// either path, so every path gives the same sums in the same order: the same bits, whichever op ran.
template <typename T, int P>
__global__ void norm_fwd_kernel(T* out, float* mean, float* rstd, T* sum, const T* a, const T* b, const T* w,
                                const T* bias, int N, int C, float eps, bool layer) {
    constexpr int V = Pack<T>::N;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const size_t o = size_t(row) * C;
    Floats<V> held[P > 0 ? P : 1] = {};  // (the lanes past the row never read theirs)
    if constexpr (P > 0) {
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int c = (p * 32 + lane) * V;
            if (c >= C) continue;  // (the row's last 32 packs may be fewer)
            held[p] = load_floats<V>(a + o + c);
            if (!b) continue;
            const Floats<V> fb = load_floats<V>(b + o + c);
#pragma unroll
            for (int k = 0; k < V; k++) held[p].v[k] += fb.v[k];
            store_floats<V>(sum + o + c, held[p]);
            held[p] = as_stored<T>(held[p]);
        }
    } else if (b) {
        warp_row<T>(C, lane, [&](int c, auto len) {
            constexpr int L = decltype(len)::value;
            Floats<L> y = load_floats<L>(a + o + c);
            const Floats<L> fb = load_floats<L>(b + o + c);
#pragma unroll
            for (int k = 0; k < L; k++) y.v[k] += fb.v[k];
            store_floats<L>(sum + o + c, y);
        });
    }
    const T* x = (b ? sum : a) + o;  // the row the passes read (P = 0); each lane its own columns: no barrier
    // f(c, floats): the lane's elements from column c, in warp_row's order
    const auto each = [&](auto&& f) {
        if constexpr (P > 0) {
#pragma unroll
            for (int p = 0; p < P; p++)
                if ((p * 32 + lane) * V < C) f((p * 32 + lane) * V, held[p]);
        } else {
            warp_row<T>(C, lane, [&](int c, auto len) {
                Floats<decltype(len)::value> v = load_floats<decltype(len)::value>(x + c);
                f(c, v);
            });
        }
    };
    float m = 0.0f;
    if (layer) {
        float s = 0.0f;
        each([&](int, const auto& f) {
#pragma unroll
            for (float e : f.v) s += e;
        });
        m = warp_sum(s) / float(C);
    }
    float v = 0.0f;
    each([&](int, const auto& f) {
#pragma unroll
        for (float e : f.v) v += (e - m) * (e - m);
    });
    const float r = rsqrtf(warp_sum(v) / float(C) + eps);
    T* y = out + o;
    each([&](int c, const auto& f) {
        constexpr int L = sizeof(f.v) / sizeof(float);
        const Floats<L> fw = load_floats<L>(w + c);
        Floats<L> z;
        if (layer) {
            const Floats<L> fb = load_floats<L>(bias + c);
#pragma unroll
            for (int k = 0; k < L; k++) z.v[k] = (f.v[k] - m) * r * fw.v[k] + fb.v[k];
        } else {
#pragma unroll
            for (int k = 0; k < L; k++) z.v[k] = f.v[k] * r * fw.v[k];
        }
        store_floats<L>(y + c, z);
    });
    if (lane == 0) {
        if (layer) mean[row] = m;
        rstd[row] = r;
    }
}

// One row of the input gradient by one warp, in two passes over the lane's columns: LayerNorm's din +=
// (dout*w - mean(dout*w) - norm * mean(dout*w*norm)) * rstd with norm = (x - mean) * rstd, or (!layer)
// RMSNorm's, the same with the mean 0 and no mean(dout*w) term (x * rstd^2 * mean(dout*w*x) is norm *
// mean(dout*w*norm)). walk(f) calls f(c, Len<L>{}, slot) for the L columns from c (slot: which of the lane's
// packs, for the caller's registers); each(slot, k, dout, norm) sees every element of the second pass.
template <typename T, typename Walk, typename Each>
__device__ __forceinline__ void norm_bwd_row(T* di, const T* d, const T* x, const T* w, float m, float r,
                                             int C, bool layer, Walk walk, Each each) {
    float a = 0.0f, bsum = 0.0f;
    walk([&](int c, auto len, int) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float dn = fd.v[k] * fw.v[k];
            if (layer) a += dn;
            bsum += dn * (fx.v[k] - m) * r;
        }
    });
    const float dnorm_mean = layer ? warp_sum(a) / float(C) : 0.0f,
                dnorm_norm_mean = warp_sum(bsum) / float(C);
    walk([&](int c, auto len, int slot) {
        constexpr int L = decltype(len)::value;
        const Floats<L> fx = load_floats<L>(x + c), fd = load_floats<L>(d + c), fw = load_floats<L>(w + c);
        Floats<L> g = load_floats<L>(di + c);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float norm = (fx.v[k] - m) * r;
            g.v[k] += (fd.v[k] * fw.v[k] - dnorm_mean - norm * dnorm_norm_mean) * r;
            each(slot, k, fd.v[k], norm);
        }
        store_floats<L>(di + c, g);
    });
}

// The input gradient alone, one warp per row (any width; the parameter gradients by col_sums after it);
// LayerNorm where mean is given, else RMSNorm
template <typename T>
__global__ void norm_bwd_input_kernel(T* din, const T* dout, const T* in, const T* w, const float* mean,
                                      const float* rstd, int N, int C) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const size_t o = size_t(row) * C;
    norm_bwd_row(
        din + o, dout + o, in + o, w, mean ? mean[row] : 0.0f, rstd[row], C, mean != nullptr,
        [&](auto f) { warp_row<T>(C, lane, [&](int c, auto len) { f(c, len, 0); }); },
        [](int, int, float, float) {});
}

// The input gradient and the parameter gradients' column sums in one pass over the rows, for rows of whole
// 16-byte packs, up to 32 P of them, P a lane (GPT-2 124M's 768 in bf16 is P = 3; 1600 is 200 packs, P = 7,
// the last on 8 lanes). Block b takes chunk b of the rows (col_chunks: the same chunking as col_sums), warp w
// its rows w, w + 8, ...; each lane keeps its columns' terms in registers across its rows (the gain's, and
// LayerNorm's bias's: Q of them), the block adds its warps in order through shared memory and writes the
// chunk's partial sums for col_finish_kernel: dout and x are read once (the second pass over a row from L1),
// where the unfused path reads them again for the column sums.
template <typename T, int P, bool Layer>
__global__ void __launch_bounds__(256)
    norm_bwd_fused_kernel(T* din, float* partial, const T* dout, const T* in, const T* w, const float* mean,
                          const float* rstd, int N, int C, int chunks) {
    constexpr int V = Pack<T>::N, Q = Layer ? 2 : 1;
    __shared__ float red[Q][32 * V * P];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int per = (N + chunks - 1) / chunks, r0 = blockIdx.x * per, r1 = min(N, r0 + per);
    float acc[Q][P][V] = {};
    for (int row = r0 + warp; row < r1; row += kRowsPerBlock) {
        const size_t o = size_t(row) * C;
        norm_bwd_row(
            din + o, dout + o, in + o, w, Layer ? mean[row] : 0.0f, rstd[row], C, Layer,
            [&](auto f) {
#pragma unroll
                for (int p = 0; p < P; p++)
                    if ((p * 32 + lane) * V < C) f((p * 32 + lane) * V, Len<V>{}, p);
            },
            [&](int p, int k, float d, float norm) {
                acc[0][p][k] += d * norm;
                if constexpr (Layer) acc[1][p][k] += d;
            });
    }
    for (int wi = 0; wi < kRowsPerBlock; wi++) {  // the warps in order
        if (warp == wi)
#pragma unroll
            for (int p = 0; p < P; p++)
                if ((p * 32 + lane) * V < C)
#pragma unroll
                    for (int k = 0; k < V; k++)
#pragma unroll
                        for (int q = 0; q < Q; q++) {
                            const int c = (p * 32 + lane) * V + k;
                            red[q][c] = (wi == 0 ? 0.0f : red[q][c]) + acc[q][p][k];
                        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x)
#pragma unroll
        for (int q = 0; q < Q; q++) partial[(size_t(blockIdx.x) * Q + q) * C + c] = red[q][c];
}

// Packs a lane for the forward from registers: P = ceil(C / V / 32) for rows of whole 16-byte packs up to 32
// P of them, P <= 8 (bf16/f16 up to 2048 wide, f32 up to 1024), or 0 (the general path).
constexpr int kMaxHeldPacks = 8;
template <typename T>
int held_packs(int C) {
    constexpr int V = Pack<T>::N;
    const int P = (C / V + 31) / 32;
    return C % V == 0 && P <= kMaxHeldPacks ? P : 0;
}

// Packs a lane for the fused backward: held_packs's, up to kMaxFusedLn for LayerNorm (two column terms a
// lane's element in registers) and kMaxHeldPacks for RMSNorm (one), or 0 (the unfused path). Both at most 128
// registers a thread in 16-bit types (nvcc 13, sm_90), so two blocks an SM as at the measured P = 3;
// LayerNorm at P = 6, 7, 8 takes 163, 185, 174 (one block an SM) and stays unfused until a card says which
// is faster.
constexpr int kMaxFusedLn = 5;
template <typename T>
int fused_packs(int C, bool layer) {
    const int P = held_packs<T>(C);
    return P <= (layer ? kMaxFusedLn : kMaxHeldPacks) ? P : 0;
}

// Calls f(std::integral_constant<int, P>) for P in 1..Max, or with 0 for any other P (the general path).
template <int Max, typename F>
void with_packs(int P, F&& f) {
    if constexpr (Max == 0)
        f(std::integral_constant<int, 0>{});
    else if (P == Max)
        f(std::integral_constant<int, Max>{});
    else
        with_packs<Max - 1>(P, f);
}

// norm_fwd_kernel's launch: LayerNorm where mean is given, RMSNorm where it is not; after the add where b is.
template <typename T>
void norm_fwd(const Ctx& c, Tensor out, Tensor mean, Tensor rstd, Tensor sum, Tensor a, Tensor b, Tensor w,
              Tensor bias, float eps) {
    const int C = int(a.shape[a.shape.ndim - 1]), N = int(a.numel() / C);
    const bool add = !b.empty(), layer = !mean.empty();
    const bool aligned = aligned16(out.data, a.data, w.data) && (!add || aligned16(sum.data, b.data)) &&
                         (!layer || aligned16(bias.data));
    with_packs<kMaxHeldPacks>(aligned ? held_packs<T>(C) : 0, [&](auto packs) {
        norm_fwd_kernel<T, decltype(packs)::value>
            <<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
                out.ptr<T>(), layer ? mean.ptr<float>() : nullptr, rstd.ptr<float>(),
                add ? sum.ptr<T>() : nullptr, a.ptr<T>(), add ? b.ptr<T>() : nullptr, w.ptr<T>(),
                layer ? bias.ptr<T>() : nullptr, N, C, eps, layer);
    });
    CUDA_LAUNCH_CHECK();
}

// The parameter gradients' column terms: dout * norm for the gain, dout for LayerNorm's bias (Q = 2; RMSNorm:
// mean null, Q = 1).
template <typename T, int Q>
struct NormParamTerm {
    const T *dout, *in;
    const float *mean, *rstd;
    int C;
    template <int L>
    __device__ void operator()(int r, int c, Len<L>, float (&q)[Q][L]) const {
        const Floats<L> d = load_floats<L>(dout + size_t(r) * C + c),
                        x = load_floats<L>(in + size_t(r) * C + c);
        const float m = mean ? mean[r] : 0.0f, rs = rstd[r];
#pragma unroll
        for (int k = 0; k < L; k++) {
            q[0][k] = d.v[k] * (x.v[k] - m) * rs;
            if constexpr (Q == 2) q[1][k] = d.v[k];
        }
    }
};

// The norms' backward: LayerNorm where mean is given (the gain and bias gradients dw, db), else RMSNorm (dw;
// db empty); a gradient empty where its parameter is frozen. One fused kernel where the row's packs fit a
// lane's registers, else the input gradient, then the column sums.
template <typename T>
void norm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w, Tensor mean,
              Tensor rstd) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const bool layer = !mean.empty();
    const float* m = layer ? mean.ptr<float>() : nullptr;
    const auto params = [&]<int Q>(std::integral_constant<int, Q>) {
        if constexpr (Q == 2)
            return ColOut<T, 2>{{dw.ptr<T>(), db.ptr<T>()}};  // null where frozen
        else
            return ColOut<T, 1>{{dw.ptr<T>()}};
    };
    const int P = aligned16(din.data, dout.data, in.data, w.data) ? fused_packs<T>(C, layer) : 0;
    if ((!dw.empty() || !db.empty()) && P > 0) {
        const ColPartials p = col_partials(c, N, layer ? 2 : 1, C);
        with_packs<kMaxHeldPacks>(P, [&](auto packs) {
            constexpr int PP = decltype(packs)::value;
            const auto run = [&](auto kernel) {
                kernel<<<p.chunks, 32 * kRowsPerBlock, 0, c.stream>>>(din.ptr<T>(), p.partial, dout.ptr<T>(),
                                                                      in.ptr<T>(), w.ptr<T>(), m,
                                                                      rstd.ptr<float>(), N, C, p.chunks);
            };
            if constexpr (PP > 0 && PP <= kMaxFusedLn)
                if (layer) run(norm_bwd_fused_kernel<T, PP, true>);
            if constexpr (PP > 0)
                if (!layer) run(norm_bwd_fused_kernel<T, PP, false>);
        });
        CUDA_LAUNCH_CHECK();
        if (layer)
            col_finish(c, params(std::integral_constant<int, 2>{}), p, C);
        else
            col_finish(c, params(std::integral_constant<int, 1>{}), p, C);
        return;
    }
    norm_bwd_input_kernel<T><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, c.stream>>>(
        din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), w.ptr<T>(), m, rstd.ptr<float>(), N, C);
    CUDA_LAUNCH_CHECK();
    if (dw.empty() && db.empty()) return;  // a frozen norm: no parameter gradients
    const bool packed = whole_packs<T>(C, dout.data, in.data);
    if (layer)
        col_sums<T, 2>(c, params(std::integral_constant<int, 2>{}), N, C, packed,
                       NormParamTerm<T, 2>{dout.ptr<T>(), in.ptr<T>(), m, rstd.ptr<float>(), C});
    else
        col_sums<T, 1>(c, params(std::integral_constant<int, 1>{}), N, C, packed,
                       NormParamTerm<T, 1>{dout.ptr<T>(), in.ptr<T>(), m, rstd.ptr<float>(), C});
}

}  // namespace

void layernorm_fwd(const Ctx& c, Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor w, Tensor b) {
    dispatch(in.dtype,
             [&](auto tag) { norm_fwd<decltype(tag)>(c, out, mean, rstd, {}, in, {}, w, b, kLnEps); });
}

void rmsnorm_fwd(const Ctx& c, Tensor out, Tensor rstd, Tensor in, Tensor w, float eps) {
    dispatch(in.dtype, [&](auto tag) { norm_fwd<decltype(tag)>(c, out, {}, rstd, {}, in, {}, w, {}, eps); });
}

void layernorm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w,
                   Tensor mean, Tensor rstd) {
    dispatch(in.dtype, [&](auto tag) { norm_bwd<decltype(tag)>(c, din, dw, db, dout, in, w, mean, rstd); });
}

void rmsnorm_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) {
    dispatch(in.dtype, [&](auto tag) { norm_bwd<decltype(tag)>(c, din, dw, {}, dout, in, w, {}, rstd); });
}

void add_norm_fwd(const Ctx& c, Tensor sum, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                  Tensor bias, float eps) {
    dispatch(sum.dtype,
             [&](auto tag) { norm_fwd<decltype(tag)>(c, out, mean, rstd, sum, a, b, w, bias, eps); });
}

}  // namespace anvil::cuda
