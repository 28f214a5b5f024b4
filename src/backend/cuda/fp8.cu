// FP8 products (--precision fp8) on Hopper/Ada tensor cores through cuBLASLt. Each operand gets its amax (a
// pass of partial maxima in 16-byte packs, then one warp reduces them), a power-of-two scale from it
// (fp8_scale_exp, the CPU backend's rule), and is rounded to E4M3/E5M2 in the orientation cuBLASLt's FP8
// kernels take: A transposed and B not ("TN"), so some operands are written transposed (a 32x32 tile through
// shared memory keeps both the reads and the writes coalesced). The inverse scales go to cuBLASLt as its A
// and B scales. Shapes FP8's kernels cannot take (a dimension not a multiple of 16) or f32 activations run
// the same arithmetic in the activations' dtype: the rounded operands scaled back (exact) and an ordinary
// product.
#include <cuda_fp8.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/lt_gemm.h"
#include "backend/device_sizes.h"
#include "core/fp8.h"

namespace anvil::cuda {

namespace {

constexpr int kParts = 1024;  // at most this many blocks in the amax pass (partial maxima)
constexpr int kUnroll = 4;    // 16-byte loads in flight a thread of the amax pass
// Where 2^-k sits after 2^k (floats): 256 bytes on, as aligned as any pointer cuBLASLt is given. At 4 bytes
// past a 256-byte boundary, the first H100 run (cuBLASLt 13.1) had every FP8 product refused at run time
// (CUBLAS_STATUS_NOT_SUPPORTED) while `anvil bench`'s FP8 product, with no scale pointers, ran.
constexpr int kDequantAt = 64;
static_assert(kDequantAt == Fp8History::kDequant, "a history's scales sit where scale_of writes them");
constexpr unsigned kThreads = 256;
constexpr int kTile = 32;

// x * s rounded to the format, the bits fp8_round gives (the CPU's rule) where x * s is within the format's
// range, and saturated to the max past it where x is finite (fp8_fake_quantize_scaled: delayed scaling's
// scale may be outgrown). The conversion is the saturating one because only that one is an instruction
// (`cvt.rn.satfinite`, sm_89+, two values at a time): without saturation cuda_fp8.h converts in software,
// through a double and 64-bit integer arithmetic (each rounding kernel about four times the PTX, with
// double conversions in it; docs/cuda.md), likely holding the rounding passes under the copy rate. It also
// turns Inf into the max, so an infinite x is put back as the non-saturating conversion makes it (NaN in
// E4M3, Inf in E5M2): a non-finite operand stays non-finite for the NaN guard.
template <DType F>
__device__ __forceinline__ uint8_t inf_bits(float x) {
    return uint8_t((F == DType::F8E4M3 ? 0x7Fu : 0x7Cu) | (signbit(x) ? 0x80u : 0u));
}
template <DType F>
__device__ __forceinline__ uint8_t to_fp8(float x, float s) {
    const uint8_t q =
        __nv_cvt_float_to_fp8(x * s, __NV_SATFINITE, F == DType::F8E4M3 ? __NV_E4M3 : __NV_E5M2);
    return isinf(x) ? inf_bits<F>(x) : q;
}
// L values (a pack's) times s into L bytes, two a conversion
template <DType F, int L>
__device__ __forceinline__ Vec<uint8_t, L> to_fp8_pack(const float (&v)[L], float s) {
    Vec<uint8_t, L> b;
#pragma unroll
    for (int k = 0; k + 1 < L; k += 2) {
        const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(
            make_float2(v[k] * s, v[k + 1] * s), __NV_SATFINITE, F == DType::F8E4M3 ? __NV_E4M3 : __NV_E5M2);
        b.v[k] = isinf(v[k]) ? inf_bits<F>(v[k]) : uint8_t(q & 0xFFu);
        b.v[k + 1] = isinf(v[k + 1]) ? inf_bits<F>(v[k + 1]) : uint8_t(q >> 8);
    }
    if constexpr (L % 2 == 1) b.v[L - 1] = to_fp8<F>(v[L - 1], s);
    return b;
}
// max |v| over a pack (NaN skipped, as fmaxf does)
template <int L>
__device__ __forceinline__ float pack_amax(float m, const float (&v)[L]) {
#pragma unroll
    for (int k = 0; k < L; k++) m = fmaxf(m, fabsf(v[k]));
    return m;
}
// A rounding block's amax into a recording use's history (delayed scaling; `amax` null: none): the block's
// maximum, then one atomic a block. Non-negative floats order as their bits, so the maximum is exact in any
// order.
__device__ __forceinline__ void note_amax(float* amax, float m) {
    __shared__ float red[32];
    m = block_reduce(m, red, 0.0f, MaxOp{});
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

template <DType F>
__device__ __forceinline__ float from_fp8(uint8_t q) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q, F == DType::F8E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}

// The amax pass and the scale from it, in one launch: each block's max |x| (16-byte packs, kUnroll of them in
// flight a thread; NaN skipped, as fmaxf does) goes to partial[block], and the block that finishes last
// reduces those to scale[0] = 2^k and scale[kDequantAt] = 2^-k (fp8_scale_exp, the CPU backend's rule): the
// factor the quantizing kernels multiply by, and the one cuBLASLt scales the product back with. `done` counts
// the finished blocks; it is 0 before the pass (the scratch is zeroed when allocated) and the last block sets
// it back to 0. The maximum is exact in any order, so the grid's size cannot change a bit.
//
// Delayed scaling (`hist`, an operand's Fp8History, which `scale` then points into): every block first reads
// whether the ring holds an amax; if it does, no block reads x, and the last block begins the use from the
// ring instead (fp8_history_begin: the pending amax into the ring, the scale from the ring's largest, with
// `record` this use's amax pending at 0 for the roundings to raise); if not, the pass runs as above and its
// amax is the pending one. (The ring is written only by the last block, after every block has read it.)
template <typename T, DType F>
__global__ void amax_scale_kernel(float* scale, float* partial, unsigned* done, const T* x, size_t n,
                                  bool packed, float* hist, bool record) {
    __shared__ float red[32];
    __shared__ bool last;
    const bool ring = hist && fp8_history_recorded(hist);
    float m = 0.0f;
    if (!ring)
        for_each_loaded<kUnroll>(x, n, packed, [&](const auto& f) {
            for (const float v : f.v) m = fmaxf(m, fabsf(v));
        });
    m = block_reduce(m, red, 0.0f, MaxOp{});
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = m;
        __threadfence();  // the maximum is visible to every block before this block counts as done
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    float g = 0.0f;
    if (ring) {
        if (threadIdx.x == 0) fp8_history_push(hist);
        __syncthreads();
        const int H = int(hist[Fp8History::kLength]);
        for (int i = int(threadIdx.x); i < H; i += int(blockDim.x)) g = fmaxf(g, hist[Fp8History::kRing + i]);
    } else {
        for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
            g = fmaxf(g, static_cast<const volatile float*>(partial)[i]);  // past L1: other blocks wrote them
    }
    g = block_reduce(g, red, 0.0f, MaxOp{});
    if (threadIdx.x == 0) {
        if (hist) {
            fp8_history_scale(hist, g, F, !ring, record);
        } else {
            const int k = fp8_scale_exp(g, F);
            scale[0] = ldexpf(1.0f, k);
            scale[kDequantAt] = ldexpf(1.0f, -k);
        }
        *done = 0;
    }
}

// q = fp8(x * 2^k), same layout: 16-byte packs in, 4 or 8 bytes out; with `amax`, x's amax noted there
template <typename T, DType F>
__global__ void quantize_kernel(uint8_t* q, const T* x, size_t n, const float* scale, bool packed,
                                float* amax) {
    const float s = scale[0];
    float m = 0.0f;
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> f = load_floats<L>(x + i);
        // a pack's L bytes: one 4- or 8-byte store
        *reinterpret_cast<Vec<uint8_t, L>*>(q + i) = to_fp8_pack<F>(f.v, s);
        m = pack_amax(m, f.v);
    });
    if (amax) note_amax(amax, m);
}

// q (C, R) = fp8(x (R, C) * 2^k) transposed; a 32 x 32 tile per block of 256 threads (32 x 8)
template <typename T, DType F>
__global__ void quantize_t_kernel(uint8_t* q, const T* x, int R, int C, const float* scale, float* amax) {
    __shared__ float tile[kTile][kTile + 1];
    const float s = scale[0];
    const int tx = int(threadIdx.x) % kTile, ty = int(threadIdx.x) / kTile, rows = int(blockDim.x) / kTile;
    const int c0 = int(blockIdx.x) * kTile, r0 = int(blockIdx.y) * kTile;
    float m = 0.0f;
    for (int j = ty; j < kTile; j += rows)
        if (r0 + j < R && c0 + tx < C) {
            tile[j][tx] = to_f(x[size_t(r0 + j) * C + c0 + tx]);
            m = fmaxf(m, fabsf(tile[j][tx]));
        }
    __syncthreads();
    for (int j = ty; j < kTile; j += rows)
        if (c0 + j < C && r0 + tx < R) q[size_t(c0 + j) * R + r0 + tx] = to_fp8<F>(tile[tx][j], s);
    if (amax) note_amax(amax, m);
}

// The same, wider: a tile of 32 rows x 8 packs (64 columns of bf16/f16, 32 of f32) per block of 256 threads,
// read a 16-byte pack a thread, rounded on the way into shared memory (transposed, as bytes), written 8 bytes
// a thread (32 rows of one column are 32 bytes of q). With q_rows, the same bytes also untransposed (a pack's
// N bytes in one store), so an operand needed both ways is read once. For R % 32 == 0 and C a whole number of
// tiles.
constexpr int kTRows = 32;
static_assert(kThreads == kTRows * 8, "a thread per 16-byte pack of the tile");
template <typename T, DType F>
__global__ void quantize_t_packed_kernel(uint8_t* q, uint8_t* q_rows, const T* x, int R, int C,
                                         const float* scale, float* amax) {
    constexpr int N = Pack<T>::N, kCols = 8 * N;
    alignas(8) __shared__ uint8_t tile[kCols][kTRows + 8];  // rows of 40 bytes keep 8-byte alignment
    const float s = scale[0];
    const int t = int(threadIdx.x), c0 = int(blockIdx.x) * kCols, r0 = int(blockIdx.y) * kTRows;
    float m = 0.0f;
    {
        const int row = t / 8, col = (t % 8) * N;
        const Floats<N> f = load_floats<N>(x + size_t(r0 + row) * C + c0 + col);
        const Vec<uint8_t, N> b = to_fp8_pack<F>(f.v, s);
#pragma unroll
        for (int k = 0; k < N; k++) tile[col + k][row] = b.v[k];
        if (q_rows) *reinterpret_cast<Vec<uint8_t, N>*>(q_rows + size_t(r0 + row) * C + c0 + col) = b;
        m = pack_amax(m, f.v);
    }
    __syncthreads();
    if (t < kCols * 4) {  // 4 threads a column, 8 bytes each
        const int col = t / 4, part = (t % 4) * 8;
        *reinterpret_cast<uint2*>(q + size_t(c0 + col) * R + r0 + part) =
            *reinterpret_cast<const uint2*>(&tile[col][part]);
    }
    if (amax) note_amax(amax, m);
}

// out = fp8 value * 2^-k in T: the rounded operand for a product FP8's kernels cannot take (exact in
// bf16/f32)
template <typename T, DType F>
__global__ void dequantize_kernel(T* out, const uint8_t* q, size_t n, const float* dequant) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<T>(from_fp8<F>(q[i]) * *dequant);
}

// alpha_beta[0] = a_scale b_scale (what the product's scale pointers would multiply it by), alpha_beta[64] =
// beta: the device floats of cuBLASLt's POINTER_MODE_DEVICE, each on its own 256-byte boundary.
__global__ void alpha_beta_kernel(float* alpha_beta, const float* a_scale, const float* b_scale, float beta) {
    alpha_beta[0] = *a_scale * *b_scale;
    alpha_beta[64] = beta;
}

// Sub-buffers of one call's scratch, 256-aligned, after its first 256 bytes: the amax passes' count of
// finished blocks, 0 between passes.
struct Carve {
    explicit Carve(void* scratch)
        : done(static_cast<unsigned*>(scratch)), p(static_cast<char*>(scratch) + 256) {}
    unsigned* done;
    char* p;
    template <typename T>
    T* take(size_t count) {
        T* r = reinterpret_cast<T*>(p);
        p += (count * sizeof(T) + 255) / 256 * 256;
        return r;
    }
};

// An operand as the product reads it: stored k x (m or n) column-major, i.e. row-major (m or n, k) rows of
// the contraction; FP8 (q, fmt, 2^-k) or, after dequantize(), plain values of the activations' dtype.
struct Operand {
    const void* data = nullptr;
    DType type = DType::F8E4M3;
    const float* dequant = nullptr;
    size_t n = 0;
};

template <typename F>
void dispatch_fp8(DType fmt, F&& f) {
    if (fmt == DType::F8E4M3) return f(std::integral_constant<DType, DType::F8E4M3>{});
    f(std::integral_constant<DType, DType::F8E5M2>{});
}

// x's scale for fmt from its amax: 2^k and, kDequantAt floats on, 2^-k, on the device (at `into`, or in the
// scratch). With `hist` (delayed scaling: an operand's Fp8History, where the scale then goes), the use begins
// there instead (amax_scale_kernel), and with `record` its amax is pending.
const float* scale_of(const Ctx& c, Carve& sc, Tensor x, DType fmt, float* into = nullptr,
                      float* hist = nullptr, bool record = false) {
    float* partial = sc.take<float>(kParts);
    float* scale = hist ? hist : into ? into : sc.take<float>(kDequantAt + 1);
    const size_t n = size_t(x.numel());
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        // a block for each kUnroll packs a thread, up to 4 blocks an SM (8.6 MiB of loads in flight on 132
        // SMs)
        const size_t per_block = size_t(kUnroll) * Pack<T>::N * kThreads;
        const size_t most = std::max<size_t>(1, std::min<size_t>(kParts, 4 * size_t(c.sm_count)));
        const unsigned parts = unsigned(std::clamp<size_t>((n + per_block - 1) / per_block, 1, most));
        dispatch_fp8(fmt, [&](auto f) {
            amax_scale_kernel<T, decltype(f)::value><<<parts, kThreads, 0, c.stream>>>(
                scale, partial, sc.done, x.ptr<T>(), n, aligned16(x.data), hist, record);
            CUDA_LAUNCH_CHECK();
        });
    });
    return scale;
}

// Whether quantize(..., transpose, as_is) writes both orientations in one pass: the packed transposing
// kernel's shapes (R % 32 == 0, C whole tiles of 8 packs, 16-byte aligned).
bool both_in_one_pass(Tensor x, int R, int C) {
    bool ok = false;
    dispatch(x.dtype, [&](auto tag) { ok = R % kTRows == 0 && C % (8 * Pack<decltype(tag)>::N) == 0; });
    return ok && aligned16(x.data);
}

// What quantize() is given beyond the operand, all optional.
struct Rounding {
    const float* scale = nullptr;  // from scale_of (null: found here from x's amax)
    Operand* as_is = nullptr;      // transposing, where both_in_one_pass: the untransposed rounding too
    uint8_t* into = nullptr;       // where the rounding goes (null: the scratch)
    uint8_t* as_is_into = nullptr;
    float* amax = nullptr;  // delayed scaling, a recording use: x's amax noted here (its history's kAmax)
};

// x (R, C) rounded to fmt with the scale from scale_of, as is or transposed to (C, R); with r.as_is the
// untransposed rounding is written too.
Operand quantize(const Ctx& c, Carve& sc, Tensor x, int R, int C, DType fmt, bool transpose,
                 Rounding r = {}) {
    const float* scale = r.scale ? r.scale : scale_of(c, sc, x, fmt);
    uint8_t* q = r.into ? r.into : sc.take<uint8_t>(size_t(x.numel()));
    const size_t n = size_t(x.numel());
    uint8_t* q_rows = nullptr;
    if (r.as_is) {
        ANVIL_ASSERT(transpose && both_in_one_pass(x, R, C));
        q_rows = r.as_is_into ? r.as_is_into : sc.take<uint8_t>(n);
        *r.as_is = {q_rows, fmt, scale + kDequantAt, n};
    }
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_fp8(fmt, [&](auto f) {
            constexpr DType F = decltype(f)::value;
            constexpr int kCols = 8 * Pack<T>::N;
            if (transpose && both_in_one_pass(x, R, C)) {  // the packed transposing kernel's shapes
                const dim3 grid(C / kCols, R / kTRows);
                quantize_t_packed_kernel<T, F>
                    <<<grid, kThreads, 0, c.stream>>>(q, q_rows, x.ptr<T>(), R, C, scale, r.amax);
            } else if (transpose) {
                const dim3 grid((C + kTile - 1) / kTile, (R + kTile - 1) / kTile);
                quantize_t_kernel<T, F><<<grid, kThreads, 0, c.stream>>>(q, x.ptr<T>(), R, C, scale, r.amax);
            } else {
                const unsigned blocks =
                    std::min(blocks_for(n, Pack<T>::N * kThreads), 8u * unsigned(c.sm_count));
                // q is 256-aligned in the scratch, so a pack of x lands on a whole 4 or 8 bytes of it
                quantize_kernel<T, F><<<blocks, kThreads, 0, c.stream>>>(q, x.ptr<T>(), n, scale,
                                                                         aligned16(x.data, q), r.amax);
            }
            CUDA_LAUNCH_CHECK();
        });
    });
    return {q, fmt, scale + kDequantAt, n};
}

// The same operand's values (fp8 * 2^-k) in dtype t.
Operand dequantize(const Ctx& c, Carve& sc, const Operand& o, DType t) {
    void* out = sc.take<char>(o.n * dtype_size(t));
    dispatch(t, [&](auto tag) {
        using T = decltype(tag);
        dispatch_fp8(o.type, [&](auto f) {
            launch(dequantize_kernel<T, decltype(f)::value>, o.n, kThreads, c.stream, static_cast<T*>(out),
                   static_cast<const uint8_t*>(o.data), o.n, o.dequant);
        });
    });
    return {out, t, nullptr, o.n};
}

bool fp8_kernels_take(DType t, int N, int C, int OC) {
    return sizes::cuda_fp8_kernels_take(N, C, OC, t);
}

// d (m x n column-major, i.e. row-major (n, m)) = beta d + A^T B (+ bias), A stored k x m and B k x n (the TN
// form), in FP8 on the tensor cores or, for shapes they cannot take, on the operands scaled back.
void product(const Ctx& c, Carve& sc, bool fp8, Operand a, Operand b, int m, int n, int k, Tensor d,
             float beta, Tensor bias, bool fast_accum = false) {
    if (!fp8) a = dequantize(c, sc, a, d.dtype), b = dequantize(c, sc, b, d.dtype);
    Gemm g;
    g.ta = true;
    g.m = m, g.n = n, g.k = k;
    g.A = a.data, g.lda = k, g.a_type = a.type, g.a_scale = a.dequant;
    g.B = b.data, g.ldb = k, g.b_type = b.type, g.b_scale = b.dequant;
    g.D = d.data, g.ldd = int(d.ld()), g.d = d.dtype;  // m, or a strided view's row stride
    g.beta = beta;
    g.fast_accum = fp8 && fast_accum;
    // the product with the bias as its epilogue, else plain with the bias as a kernel after it
    const auto attempt = [&](Gemm h) {
        if (!bias.empty()) h.epi = CUBLASLT_EPILOGUE_BIAS, h.bias = bias.data;
        if (lt_gemm(c, h)) return true;
        h.epi = CUBLASLT_EPILOGUE_DEFAULT, h.bias = nullptr;
        if (!lt_gemm(c, h)) return false;
        if (!bias.empty()) bias_add(c, d, bias);
        return true;
    };
    if (attempt(g)) return;
    if (fp8) {
        // cuBLASLt refused the scale pointers (as 13.1 did on the first H100 run, which ran FP8 products
        // without them): their product as alpha instead, a device float beside beta
        float* ab = sc.take<float>(65);
        alpha_beta_kernel<<<1, 1, 0, c.stream>>>(ab, a.dequant, b.dequant, beta);
        CUDA_LAUNCH_CHECK();
        Gemm h = g;
        h.a_scale = h.b_scale = nullptr;
        h.alpha_dev = ab, h.beta_dev = ab + 64;
        if (attempt(h)) return;
    }
    // (the device has FP8 tensor cores: check_fp8 said so before any of this ran)
    ::anvil::fail(
        "cuBLASLt (version {}) offered no {} algorithm it would run for a {}x{}x{} product on this GPU{}",
        cublasLtGetVersion(), fp8 ? "FP8" : dtype_name(d.dtype), m, n, k,
        fp8 ? " (with scale pointers, nor with the scales as a device alpha); train with --precision "
              "bf16, and report `anvil doctor`'s output with this message"
            : "");
}

// What the forward leaves in `kept` for the backward (sizes::cuda_fp8_kept_elems's layout): the input's
// rounding transposed, as the weight gradient takes it, and the weight's rounding in the input gradient's
// orientation, each with its scale (2^k, and 2^-k kDequantAt floats on). Only where FP8's kernels take the
// product, and each part only where one pass can round its operand both ways; the forward and the backward
// decide alike from the same shapes.
struct Kept {
    float *in_scale = nullptr, *w_scale = nullptr;
    uint8_t *in_t = nullptr, *w_bwd = nullptr;
    bool in = false, w = false;  // the parts kept
};
Kept kept_parts(void* kept, Tensor in, Tensor w, int N, int C, int OC, WLayout layout) {
    Kept k;
    if (!kept || !fp8_kernels_take(in.dtype, N, C, OC)) return k;
    auto* base = static_cast<uint8_t*>(kept);
    k.in_scale = reinterpret_cast<float*>(base);
    k.w_scale = reinterpret_cast<float*>(base + 512);
    k.w_bwd = base + sizes::kCudaFp8KeptHeader;
    k.in_t = k.w_bwd + sizes::cuda_fp8_kept_weight_bytes(C, OC);
    k.in = both_in_one_pass(in, N, C);
    k.w = layout == WLayout::InOut ? both_in_one_pass(w, C, OC) : both_in_one_pass(w, OC, C);
    return k;
}

}  // namespace

size_t matmul_fp8_scratch_bytes(int N, int C, int OC, DType t) {
    const size_t per_operand = kParts * sizeof(float) + 4 * 256;  // partial maxima, scales, rounding up
    const size_t elems = 2 * size_t(N) * OC + size_t(N) * C + size_t(C) * OC;  // the backward's operands
    const size_t dequantized = fp8_kernels_take(t, N, C, OC) ? 0 : elems * dtype_size(t) + 4 * 256;
    // + a product's alpha and beta where cuBLASLt refuses the scale pointers (2 x 256 bytes)
    // + the amax passes' counter (256 bytes before the rest)
    return 256 + 4 * per_operand + elems + 4 * 256 + dequantized + 2 * 256;
}

// An operand's scale in a product: from its own amax (current scaling), or its history's (delayed scaling:
// a use begun here, or with `again` the scale its first run took), with the amax the roundings note.
struct OperandScale {
    float* hist = nullptr;  // its Fp8History, delayed scaling
    bool begin = false, record = false;
    float* into = nullptr;  // current scaling: where the scale goes (null: the scratch)
    // the scale: a pass over x where one is needed (current scaling, or a history's first use)
    const float* of(const Ctx& c, Carve& sc, Tensor x, DType fmt) const {
        if (hist && !begin) return hist;
        return scale_of(c, sc, x, fmt, into, hist, record);
    }
    float* amax() const { return hist && begin && record ? hist + Fp8History::kAmax : nullptr; }
};

// out (N,OC) = fp8(in) (N,C) @ fp8(W) + bias [-> gelu]. Column-major: out^T (OC x N) = W'^T . in^T with W'
// stored C x OC (row-major (OC, C): OutIn as is, InOut transposed) and in^T stored C x N (in as is). With
// `kept`, in and W are each rounded both ways in one pass, the backward's roundings left there.
void matmul_fp8_fwd(const Ctx& c, void* scratch, void* kept, Tensor out, Tensor in, Tensor w, WLayout layout,
                    Tensor bias, Tensor pre_gelu, const Fp8Hist& h) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    Carve sc(scratch);
    const Kept k = kept_parts(kept, in, w, N, C, OC, layout);
    constexpr DType E4M3 = DType::F8E4M3;
    const OperandScale si{h.of(0), !h.again, h.record, k.in_scale},
        sw{h.of(1), !h.again, h.record, k.w_scale};
    Operand qin, qw;
    if (k.in)  // both ways: as is for this product, transposed into `kept`
        quantize(c, sc, in, N, C, E4M3, true,
                 {.scale = si.of(c, sc, in, E4M3), .as_is = &qin, .into = k.in_t, .amax = si.amax()});
    else
        qin = quantize(c, sc, in, N, C, E4M3, false, {.scale = si.of(c, sc, in, E4M3), .amax = si.amax()});
    // W' stored C x OC: InOut transposed (the backward's, as is, into `kept`), OutIn as is (the backward's,
    // transposed, into `kept`)
    const float* w_scale = sw.of(c, sc, w, E4M3);
    Operand w_bwd;  // (in `kept`: the backward reads it from there)
    if (layout == WLayout::InOut)
        qw = k.w ? quantize(c, sc, w, C, OC, E4M3, true,
                            {.scale = w_scale, .as_is = &w_bwd, .as_is_into = k.w_bwd, .amax = sw.amax()})
                 : quantize(c, sc, w, C, OC, E4M3, true, {.scale = w_scale, .amax = sw.amax()});
    else if (k.w)
        quantize(c, sc, w, OC, C, E4M3, true,
                 {.scale = w_scale, .as_is = &qw, .into = k.w_bwd, .amax = sw.amax()});
    else
        qw = quantize(c, sc, w, OC, C, E4M3, false, {.scale = w_scale, .amax = sw.amax()});
    const Tensor target = pre_gelu.empty() ? out : pre_gelu;
    product(c, sc, fp8_kernels_take(in.dtype, N, C, OC), qw, qin, OC, N, C, target, 0.0f, bias,
            /*fast_accum=*/true);
    if (!pre_gelu.empty()) gelu_fwd(c, out, pre_gelu);
}

// din (N,C) = fp8(dout) @ fp8(W)^T [* gelu'], dW += fp8(in)^T @ fp8(dout), dbias += column sums of dout.
// Under delayed scaling, in and W take their forward's scales from their histories and dout begins a use.
void matmul_fp8_bwd(const Ctx& c, void* scratch, void* kept, Tensor din, Tensor dw, Tensor dbias, Tensor dout,
                    Tensor in, Tensor w, WLayout layout, Tensor in_pre_gelu, const Fp8Hist& h) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(dout.shape[dout.shape.ndim - 1]);
    const bool fp8 = fp8_kernels_take(in.dtype, N, C, OC);
    Carve sc(scratch);
    const Kept k = kept_parts(kept, in, w, N, C, OC, layout);
    constexpr DType E4M3 = DType::F8E4M3, E5M2 = DType::F8E5M2;
    // the forward's scales of in and W (where it kept their roundings, or in their histories)
    const float* in_scale = h.on() ? h.of(0) : k.in_scale;
    const float* w_scale = h.on() ? h.of(1) : k.w_scale;
    // dout's one scale serves both of its roundings; where both are needed and the shape allows, one pass
    // writes both (dout is the largest operand: read once instead of twice). What stays below `mark` is kept
    // for the weight gradient; above it the scratch starts over.
    const OperandScale sd{h.of(2), true, h.record};
    const Rounding rd{.scale = sd.of(c, sc, dout, E5M2), .amax = sd.amax()};
    Operand qdout, tdout;
    if (!din.empty() && !dw.empty() && both_in_one_pass(dout, N, OC)) {
        Rounding both = rd;
        both.as_is = &qdout;
        tdout = quantize(c, sc, dout, N, OC, E5M2, true, both);
    }
    char* const mark = sc.p;
    if (!din.empty()) {
        // din^T (C x N) = W''^T . dout^T: W'' stored OC x C (row-major (C, OC): InOut as is), dout^T stored
        // OC x N
        if (!qdout.data) qdout = quantize(c, sc, dout, N, OC, E5M2, false, rd);
        const Rounding rw{.scale = h.on() ? w_scale : nullptr};
        const Operand qw = k.w ? Operand{k.w_bwd, E4M3, w_scale + kDequantAt, size_t(C) * OC}
                           : layout == WLayout::InOut ? quantize(c, sc, w, C, OC, E4M3, false, rw)
                                                      : quantize(c, sc, w, OC, C, E4M3, true, rw);
        product(c, sc, fp8, qw, qdout, C, N, OC, din, 0.0f, {});
        if (!in_pre_gelu.empty()) gelu_bwd(c, din, din, in_pre_gelu);
    }
    if (!dbias.empty()) colsum_accumulate(c, dbias, dout);
    if (dw.empty()) return;  // a frozen weight
    // the contraction runs over the N rows: dout^T (OC, N) and in^T (C, N), both written transposed; in's
    // from the forward where it kept it
    sc.p = mark;
    if (!tdout.data) tdout = quantize(c, sc, dout, N, OC, E5M2, true, rd);
    const Operand tin = k.in ? Operand{k.in_t, E4M3, in_scale + kDequantAt, size_t(N) * C}
                             : quantize(c, sc, in, N, C, E4M3, true, {.scale = h.on() ? in_scale : nullptr});
    if (layout == WLayout::InOut)  // dW (C,OC) row-major = (OC x C): dout^T stored N x OC, in^T stored N x C
        product(c, sc, fp8, tdout, tin, OC, C, N, dw, 1.0f, {});
    else  // dW (OC,C) row-major = (C x OC)
        product(c, sc, fp8, tin, tdout, C, OC, N, dw, 1.0f, {});
}

}  // namespace anvil::cuda
