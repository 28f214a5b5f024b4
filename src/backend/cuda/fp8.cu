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
constexpr unsigned kThreads = 256;
constexpr int kTile = 32;

template <DType F>
__device__ __forceinline__ uint8_t to_fp8(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_NOSAT, F == DType::F8E4M3 ? __NV_E4M3 : __NV_E5M2);
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
template <typename T, DType F>
__global__ void amax_scale_kernel(float* scale, float* partial, unsigned* done, const T* x, size_t n,
                                  bool packed) {
    __shared__ float red[32];
    __shared__ bool last;
    float m = 0.0f;
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
    for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
        g = fmaxf(g, static_cast<const volatile float*>(partial)[i]);  // past L1: other blocks wrote them
    g = block_reduce(g, red, 0.0f, MaxOp{});
    if (threadIdx.x == 0) {
        const int k = fp8_scale_exp(g, F);
        scale[0] = ldexpf(1.0f, k);
        scale[kDequantAt] = ldexpf(1.0f, -k);
        *done = 0;
    }
}

// q = fp8(x * 2^k), same layout: 16-byte packs in, 4 or 8 bytes out
template <typename T, DType F>
__global__ void quantize_kernel(uint8_t* q, const T* x, size_t n, const float* scale, bool packed) {
    const float s = scale[0];
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> f = load_floats<L>(x + i);
        Vec<uint8_t, L> b;  // a pack's L bytes: one 4- or 8-byte store
#pragma unroll
        for (int k = 0; k < L; k++) b.v[k] = to_fp8<F>(f.v[k] * s);
        *reinterpret_cast<Vec<uint8_t, L>*>(q + i) = b;
    });
}

// q (C, R) = fp8(x (R, C) * 2^k) transposed; a 32 x 32 tile per block of 256 threads (32 x 8)
template <typename T, DType F>
__global__ void quantize_t_kernel(uint8_t* q, const T* x, int R, int C, const float* scale) {
    __shared__ float tile[kTile][kTile + 1];
    const float s = scale[0];
    const int tx = int(threadIdx.x) % kTile, ty = int(threadIdx.x) / kTile, rows = int(blockDim.x) / kTile;
    const int c0 = int(blockIdx.x) * kTile, r0 = int(blockIdx.y) * kTile;
    for (int j = ty; j < kTile; j += rows)
        if (r0 + j < R && c0 + tx < C) tile[j][tx] = to_f(x[size_t(r0 + j) * C + c0 + tx]) * s;
    __syncthreads();
    for (int j = ty; j < kTile; j += rows)
        if (c0 + j < C && r0 + tx < R) q[size_t(c0 + j) * R + r0 + tx] = to_fp8<F>(tile[tx][j]);
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
                                         const float* scale) {
    constexpr int N = Pack<T>::N, kCols = 8 * N;
    alignas(8) __shared__ uint8_t tile[kCols][kTRows + 8];  // rows of 40 bytes keep 8-byte alignment
    const float s = scale[0];
    const int t = int(threadIdx.x), c0 = int(blockIdx.x) * kCols, r0 = int(blockIdx.y) * kTRows;
    {
        const int row = t / 8, col = (t % 8) * N;
        const Floats<N> f = load_floats<N>(x + size_t(r0 + row) * C + c0 + col);
        Vec<uint8_t, N> b;
#pragma unroll
        for (int k = 0; k < N; k++) b.v[k] = to_fp8<F>(f.v[k] * s);
#pragma unroll
        for (int k = 0; k < N; k++) tile[col + k][row] = b.v[k];
        if (q_rows) *reinterpret_cast<Vec<uint8_t, N>*>(q_rows + size_t(r0 + row) * C + c0 + col) = b;
    }
    __syncthreads();
    if (t < kCols * 4) {  // 4 threads a column, 8 bytes each
        const int col = t / 4, part = (t % 4) * 8;
        *reinterpret_cast<uint2*>(q + size_t(c0 + col) * R + r0 + part) =
            *reinterpret_cast<const uint2*>(&tile[col][part]);
    }
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
// scratch).
const float* scale_of(const Ctx& c, Carve& sc, Tensor x, DType fmt, float* into = nullptr) {
    float* partial = sc.take<float>(kParts);
    float* scale = into ? into : sc.take<float>(kDequantAt + 1);
    const size_t n = size_t(x.numel());
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        // a block for each kUnroll packs a thread, up to 4 blocks an SM (8.6 MiB of loads in flight on 132
        // SMs)
        const size_t per_block = size_t(kUnroll) * Pack<T>::N * kThreads;
        const size_t most = std::max<size_t>(1, std::min<size_t>(kParts, 4 * size_t(c.sm_count)));
        const unsigned parts = unsigned(std::clamp<size_t>((n + per_block - 1) / per_block, 1, most));
        dispatch_fp8(fmt, [&](auto f) {
            amax_scale_kernel<T, decltype(f)::value>
                <<<parts, kThreads, 0, c.stream>>>(scale, partial, sc.done, x.ptr<T>(), n, aligned16(x.data));
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

// x (R, C) rounded to fmt with the scale from scale_of (given, or computed here), as is or transposed to (C,
// R), at `into` or in the scratch; with `as_is` (transposing, where both_in_one_pass) the untransposed
// rounding is written too, at `as_is_into` or in the scratch.
Operand quantize(const Ctx& c, Carve& sc, Tensor x, int R, int C, DType fmt, bool transpose,
                 const float* scale = nullptr, Operand* as_is = nullptr, uint8_t* into = nullptr,
                 uint8_t* as_is_into = nullptr) {
    if (!scale) scale = scale_of(c, sc, x, fmt);
    uint8_t* q = into ? into : sc.take<uint8_t>(size_t(x.numel()));
    const size_t n = size_t(x.numel());
    uint8_t* q_rows = nullptr;
    if (as_is) {
        ANVIL_ASSERT(transpose && both_in_one_pass(x, R, C));
        q_rows = as_is_into ? as_is_into : sc.take<uint8_t>(n);
        *as_is = {q_rows, fmt, scale + kDequantAt, n};
    }
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        dispatch_fp8(fmt, [&](auto f) {
            constexpr DType F = decltype(f)::value;
            constexpr int kCols = 8 * Pack<T>::N;
            if (transpose && both_in_one_pass(x, R, C)) {  // the packed transposing kernel's shapes
                const dim3 grid(C / kCols, R / kTRows);
                quantize_t_packed_kernel<T, F>
                    <<<grid, kThreads, 0, c.stream>>>(q, q_rows, x.ptr<T>(), R, C, scale);
            } else if (transpose) {
                const dim3 grid((C + kTile - 1) / kTile, (R + kTile - 1) / kTile);
                quantize_t_kernel<T, F><<<grid, kThreads, 0, c.stream>>>(q, x.ptr<T>(), R, C, scale);
            } else {
                const unsigned blocks =
                    std::min(blocks_for(n, Pack<T>::N * kThreads), 8u * unsigned(c.sm_count));
                // q is 256-aligned in the scratch, so a pack of x lands on a whole 4 or 8 bytes of it
                quantize_kernel<T, F>
                    <<<blocks, kThreads, 0, c.stream>>>(q, x.ptr<T>(), n, scale, aligned16(x.data, q));
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

// out (N,OC) = fp8(in) (N,C) @ fp8(W) + bias [-> gelu]. Column-major: out^T (OC x N) = W'^T . in^T with W'
// stored C x OC (row-major (OC, C): OutIn as is, InOut transposed) and in^T stored C x N (in as is). With
// `kept`, in and W are each rounded both ways in one pass, the backward's roundings left there.
void matmul_fp8_fwd(const Ctx& c, void* scratch, void* kept, Tensor out, Tensor in, Tensor w, WLayout layout,
                    Tensor bias, Tensor pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    Carve sc(scratch);
    const Kept k = kept_parts(kept, in, w, N, C, OC, layout);
    Operand qin, qw;
    if (k.in)  // both ways: as is for this product, transposed into `kept`
        quantize(c, sc, in, N, C, DType::F8E4M3, true, scale_of(c, sc, in, DType::F8E4M3, k.in_scale), &qin,
                 k.in_t);
    else
        qin = quantize(c, sc, in, N, C, DType::F8E4M3, false);
    // W' stored C x OC: InOut transposed (the backward's, as is, into `kept`), OutIn as is (the backward's,
    // transposed, into `kept`)
    const float* w_scale = k.w ? scale_of(c, sc, w, DType::F8E4M3, k.w_scale) : nullptr;
    Operand w_bwd;  // (in `kept`: the backward reads it from there)
    if (layout == WLayout::InOut)
        qw = k.w ? quantize(c, sc, w, C, OC, DType::F8E4M3, true, w_scale, &w_bwd, nullptr, k.w_bwd)
                 : quantize(c, sc, w, C, OC, DType::F8E4M3, true);
    else if (k.w)
        quantize(c, sc, w, OC, C, DType::F8E4M3, true, w_scale, &qw, k.w_bwd);
    else
        qw = quantize(c, sc, w, OC, C, DType::F8E4M3, false);
    const Tensor target = pre_gelu.empty() ? out : pre_gelu;
    product(c, sc, fp8_kernels_take(in.dtype, N, C, OC), qw, qin, OC, N, C, target, 0.0f, bias,
            /*fast_accum=*/true);
    if (!pre_gelu.empty()) gelu_fwd(c, out, pre_gelu);
}

// din (N,C) = fp8(dout) @ fp8(W)^T [* gelu'], dW += fp8(in)^T @ fp8(dout), dbias += column sums of dout.
void matmul_fp8_bwd(const Ctx& c, void* scratch, void* kept, Tensor din, Tensor dw, Tensor dbias, Tensor dout,
                    Tensor in, Tensor w, WLayout layout, Tensor in_pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(dout.shape[dout.shape.ndim - 1]);
    const bool fp8 = fp8_kernels_take(in.dtype, N, C, OC);
    Carve sc(scratch);
    const Kept k = kept_parts(kept, in, w, N, C, OC, layout);
    // dout's one scale serves both of its roundings; where both are needed and the shape allows, one pass
    // writes both (dout is the largest operand: read once instead of twice). What stays below `mark` is kept
    // for the weight gradient; above it the scratch starts over.
    const float* dout_scale = scale_of(c, sc, dout, DType::F8E5M2);
    Operand qdout, tdout;
    if (!din.empty() && !dw.empty() && both_in_one_pass(dout, N, OC))
        tdout = quantize(c, sc, dout, N, OC, DType::F8E5M2, true, dout_scale, &qdout);
    char* const mark = sc.p;
    if (!din.empty()) {
        // din^T (C x N) = W''^T . dout^T: W'' stored OC x C (row-major (C, OC): InOut as is), dout^T stored
        // OC x N
        if (!qdout.data) qdout = quantize(c, sc, dout, N, OC, DType::F8E5M2, false, dout_scale);
        const Operand qw = k.w ? Operand{k.w_bwd, DType::F8E4M3, k.w_scale + kDequantAt, size_t(C) * OC}
                           : layout == WLayout::InOut ? quantize(c, sc, w, C, OC, DType::F8E4M3, false)
                                                      : quantize(c, sc, w, OC, C, DType::F8E4M3, true);
        product(c, sc, fp8, qw, qdout, C, N, OC, din, 0.0f, {});
        if (!in_pre_gelu.empty()) gelu_bwd(c, din, din, in_pre_gelu);
    }
    if (!dbias.empty()) colsum_accumulate(c, dbias, dout);
    if (dw.empty()) return;  // a frozen weight
    // the contraction runs over the N rows: dout^T (OC, N) and in^T (C, N), both written transposed; in's
    // from the forward where it kept it
    sc.p = mark;
    if (!tdout.data) tdout = quantize(c, sc, dout, N, OC, DType::F8E5M2, true, dout_scale);
    const Operand tin = k.in ? Operand{k.in_t, DType::F8E4M3, k.in_scale + kDequantAt, size_t(N) * C}
                             : quantize(c, sc, in, N, C, DType::F8E4M3, true);
    if (layout == WLayout::InOut)  // dW (C,OC) row-major = (OC x C): dout^T stored N x OC, in^T stored N x C
        product(c, sc, fp8, tdout, tin, OC, C, N, dw, 1.0f, {});
    else  // dW (OC,C) row-major = (C x OC)
        product(c, sc, fp8, tin, tdout, C, OC, N, dw, 1.0f, {});
}

}  // namespace anvil::cuda
