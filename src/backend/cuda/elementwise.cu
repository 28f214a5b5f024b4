// Elementwise ops (residual add, GELU and SwiGLU forward and backward, scale, dropout, NEFTune noise: 16-byte
// accesses where the tensors are aligned; dtype conversion), and the deterministic column sum used for bias
// gradients.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/dropout_mask.h"

namespace anvil::cuda {

namespace {

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = from_f<D>(to_f(src[i]));
}

struct AddOp {
    __device__ float operator()(float x, float y) const { return x + y; }
};
struct SwigluOp {  // silu(gate) * up
    __device__ float operator()(float g, float u) const { return g / (1.0f + __expf(-g)) * u; }
};

template <typename T>
__global__ void gelu_fwd_kernel(T* out, const T* in, size_t n, bool packed) {
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> x = load_floats<L>(in + i);
#pragma unroll
        for (int k = 0; k < L; k++) x.v[k] = gelu(x.v[k]);
        store_floats<L>(out + i, x);
    });
}

template <typename T>
__global__ void gelu_bwd_kernel(T* din, const T* dout, const T* in, size_t n, bool packed) {
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> x = load_floats<L>(in + i);
        Floats<L> d = load_floats<L>(dout + i);
#pragma unroll
        for (int k = 0; k < L; k++) d.v[k] *= gelu_grad(x.v[k]);
        store_floats<L>(din + i, d);
    });
}

// A column sum's term: the rows themselves.
template <typename T>
struct RowsTerm {
    const T* in;
    int C;
    template <int L>
    __device__ void operator()(int r, int c, Len<L>, float (&q)[1][L]) const {
        const Floats<L> f = load_floats<L>(in + size_t(r) * C + c);
#pragma unroll
        for (int k = 0; k < L; k++) q[0][k] = f.v[k];
    }
};

template <typename T>
__global__ void scale_kernel(T* x, size_t n, float s, bool packed) {
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> f = load_floats<L>(x + i);
#pragma unroll
        for (int k = 0; k < L; k++) f.v[k] *= s;
        store_floats<L>(x + i, f);
    });
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* in, size_t n, uint64_t seed, uint32_t threshold,
                               float keep_scale, bool packed) {
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> f = load_floats<L>(in + i);
#pragma unroll
        for (int k = 0; k < L; k++)
            f.v[k] = dropout_keep(seed, i + k, threshold) ? f.v[k] * keep_scale : 0.0f;
        store_floats<L>(out + i, f);
    });
}

// NEFTune: element i's noise from the hash of i, as on the CPU; a position's length is clamped to 1 here
// (the CPU reference refuses 0).
template <typename T>
__global__ void neftune_kernel(T* out, const int32_t* lengths, size_t n, int C, float alpha, uint64_t seed,
                               bool packed) {
    for_each_pack<T>(n, packed, [&](size_t i, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> f = load_floats<L>(out + i);
#pragma unroll
        for (int k = 0; k < L; k++) {
            const int positions = max(lengths[(i + k) / size_t(C)], 1);
            f.v[k] += counter_uniform_pm1(seed, i + k) * (alpha / sqrtf(float(positions) * float(C)));
        }
        store_floats<L>(out + i, f);
    });
}

// Values in [-1, 1) from a hash of the index: random bits would make NaN and Inf for float types.
template <typename T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint32_t seed) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        uint32_t x = uint32_t(i) * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = T(float(x) / 2147483648.0f - 1.0f);
    }
}

// out = op(a, b) over R rows of C, every tensor's rows its own ld apart (a contiguous tensor: one row of all
// its elements): the residual add and SwiGLU's forward
template <typename T, typename Op>
__global__ void binary_rows_kernel(RowsOf<T> out, RowsOf<const T> a, RowsOf<const T> b, size_t R, size_t C,
                                   bool packed, Op op) {
    for_each_pack_rows<T>(R, C, packed, [&](size_t r, size_t j, auto len) {
        constexpr int L = decltype(len)::value;
        Floats<L> x = load_floats<L>(a.at(r, j));
        const Floats<L> y = load_floats<L>(b.at(r, j));
#pragma unroll
        for (int k = 0; k < L; k++) x.v[k] = op(x.v[k], y.v[k]);
        store_floats<L>(out.at(r, j), x);
    });
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate)
template <typename T>
__global__ void swiglu_bwd_kernel(RowsOf<T> dgate, RowsOf<T> dup, RowsOf<const T> dout, RowsOf<const T> gate,
                                  RowsOf<const T> up, size_t R, size_t C, bool packed) {
    for_each_pack_rows<T>(R, C, packed, [&](size_t r, size_t j, auto len) {
        constexpr int L = decltype(len)::value;
        const Floats<L> g = load_floats<L>(gate.at(r, j)), u = load_floats<L>(up.at(r, j)),
                        d = load_floats<L>(dout.at(r, j));
        Floats<L> dg, du;
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float s = 1.0f / (1.0f + __expf(-g.v[k]));
            dg.v[k] = d.v[k] * u.v[k] * s * (1.0f + g.v[k] * (1.0f - s));
            du.v[k] = d.v[k] * g.v[k] * s;
        }
        store_floats<L>(dgate.at(r, j), dg);
        store_floats<L>(dup.at(r, j), du);
    });
}

// The elementwise row walk for these arguments (elementwise_shape): the grid (x over a row's packs, y over
// rows, at most sm_count * 16 blocks) and whether the walk may take 16-byte packs
struct ElementRows {
    ElementShape shape;
    size_t R, C;  // shape's, for the kernels
    bool packed = true;
    dim3 grid;
    ElementRows(const Ctx& c, std::initializer_list<const Tensor*> ts)
        : shape(elementwise_shape(ts)), R(size_t(shape.R)), C(size_t(shape.C)) {
        const int V = int(16 / dtype_size((*ts.begin())->dtype));
        for (const Tensor* t : ts)
            packed = packed && aligned16(t->data) && (shape.flat || shape.ld(*t) % V == 0);
        const size_t blocks = size_t(c.sm_count) * 16,
                     x = std::clamp<size_t>((C / (packed ? V : 1) + 255) / 256, 1, blocks);
        grid = dim3(unsigned(x), unsigned(std::min<size_t>({R, std::max<size_t>(blocks / x, 1), 65535})));
    }
    template <typename T>
    RowsOf<T> of(const Tensor& t) const {
        return {t.row0<T>(), size_t(shape.ld(t))};
    }
};

unsigned grid_for(size_t n, const Ctx& c) {
    return unsigned(std::min<size_t>((n + 255) / 256, size_t(c.sm_count) * 16));
}

}  // namespace

void convert(const Ctx& c, Tensor dst, Tensor src) {
    ANVIL_CHECK(dst.numel() == src.numel(), "convert: {} elements into {}", src.numel(), dst.numel());
    const size_t n = size_t(src.numel());
    if (n == 0) return;
    if (dst.dtype == src.dtype) {
        CUDA_CHECK(cudaMemcpyAsync(dst.ptr<void>(), src.ptr<void>(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                   c.stream));
        return;
    }
    dispatch(dst.dtype, [&](auto d) {
        using D = decltype(d);
        dispatch(src.dtype, [&](auto s) {
            using S = decltype(s);
            convert_kernel<D, S><<<grid_for(n, c), 256, 0, c.stream>>>(dst.ptr<D>(), src.ptr<S>(), n);
            CUDA_LAUNCH_CHECK();
        });
    });
}

// out, a, b: contiguous or strided views (a LoRA delta into q's columns of the packed qkv)
void residual_fwd(const Ctx& c, Tensor out, Tensor a, Tensor b) {
    if (out.numel() == 0) return;
    const ElementRows e(c, {&out, &a, &b});
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        binary_rows_kernel<T, AddOp><<<e.grid, 256, 0, c.stream>>>(
            e.of<T>(out), e.of<const T>(a), e.of<const T>(b), e.R, e.C, e.packed, AddOp{});
        CUDA_LAUNCH_CHECK();
    });
}

void gelu_fwd(const Ctx& c, Tensor out, Tensor in) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        gelu_fwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), in.ptr<T>(), n,
                                                                 aligned16(out.data, in.data));
        CUDA_LAUNCH_CHECK();
    });
}

void gelu_bwd(const Ctx& c, Tensor din, Tensor dout, Tensor in) {
    const size_t n = size_t(din.numel());
    if (n == 0) return;
    dispatch(din.dtype, [&](auto tag) {
        using T = decltype(tag);
        gelu_bwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), n,
                                                                 aligned16(din.data, dout.data, in.data));
        CUDA_LAUNCH_CHECK();
    });
}

// every argument contiguous or a strided view (gate and up: column views of one (N, 2 H) product)
void swiglu_fwd(const Ctx& c, Tensor out, Tensor gate, Tensor up) {
    if (out.numel() == 0) return;
    const ElementRows e(c, {&out, &gate, &up});
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        binary_rows_kernel<T, SwigluOp><<<e.grid, 256, 0, c.stream>>>(
            e.of<T>(out), e.of<const T>(gate), e.of<const T>(up), e.R, e.C, e.packed, SwigluOp{});
        CUDA_LAUNCH_CHECK();
    });
}

void swiglu_bwd(const Ctx& c, Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
    if (gate.numel() == 0) return;
    const ElementRows e(c, {&dgate, &dup, &dout, &gate, &up});
    dispatch(gate.dtype, [&](auto tag) {
        using T = decltype(tag);
        swiglu_bwd_kernel<T><<<e.grid, 256, 0, c.stream>>>(e.of<T>(dgate), e.of<T>(dup), e.of<const T>(dout),
                                                           e.of<const T>(gate), e.of<const T>(up), e.R, e.C,
                                                           e.packed);
        CUDA_LAUNCH_CHECK();
    });
}

void scale(const Ctx& c, Tensor x, float s) {
    const size_t n = size_t(x.numel());
    if (n == 0) return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        scale_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(x.ptr<T>(), n, s, aligned16(x.data));
        CUDA_LAUNCH_CHECK();
    });
}

void dropout(const Ctx& c, Tensor out, Tensor in, float p, uint64_t seed) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        dropout_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), in.ptr<T>(), n, seed,
                                                                dropout_threshold(p), 1.0f / (1.0f - p),
                                                                aligned16(out.data, in.data));
        CUDA_LAUNCH_CHECK();
    });
}

void neftune_noise(const Ctx& c, Tensor out, Tensor lengths, float alpha, uint64_t seed) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        neftune_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(
            out.ptr<T>(), lengths.ptr<int32_t>(), n, int(out.dim(2)), alpha, seed, aligned16(out.data));
        CUDA_LAUNCH_CHECK();
    });
}

void colsum_accumulate(const Ctx& c, Tensor out, Tensor in) {
    const int C = int(out.numel());
    const int R = int(in.numel() / C);
    ANVIL_CHECK(int64_t(R) * C == in.numel(), "column sum: {} into {} columns", in.shape.str(), C);
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        col_sums<T, 1>(c, {{out.ptr<T>()}}, R, C, whole_packs<T>(C, in.data), RowsTerm<T>{in.ptr<T>(), C});
    });
}

void fill_uniform(cudaStream_t s, void* p, size_t n, cudaDataType_t type, uint32_t seed) {
    switch (type) {
        case CUDA_R_32F:
            fill_uniform_kernel<float><<<1024, 256, 0, s>>>(static_cast<float*>(p), n, seed);
            break;
        case CUDA_R_16BF:
            fill_uniform_kernel<bf16_t><<<1024, 256, 0, s>>>(static_cast<bf16_t*>(p), n, seed);
            break;
        case CUDA_R_16F:
            fill_uniform_kernel<f16_t><<<1024, 256, 0, s>>>(static_cast<f16_t*>(p), n, seed);
            break;
        case CUDA_R_8F_E4M3:
            fill_uniform_kernel<__nv_fp8_e4m3><<<1024, 256, 0, s>>>(static_cast<__nv_fp8_e4m3*>(p), n, seed);
            break;
        default:
            ::anvil::fail("fill_uniform: cuda data type {} is not supported", int(type));
    }
    CUDA_LAUNCH_CHECK();
}

}  // namespace anvil::cuda
