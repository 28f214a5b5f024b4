// Elementwise ops (dtype conversion, residual add, GELU forward and backward with 16-byte accesses; scale,
// dropout), and the deterministic column sum used for bias gradients.
#include <cuda_fp8.h>

#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/dropout_mask.h"

namespace anvil::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
    const float th = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
}

// Applies f to n elements: packs of 16 bytes where the count allows, the tail element by element.
template <typename T, typename F>
__device__ __forceinline__ void for_each_pack(size_t n, F&& f) {
    constexpr int V = Pack<T>::N;
    const size_t packs = n / V;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t p = size_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) f(p * V, V);
    for (size_t i = packs * V + size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i, 1);
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = from_f<D>(to_f(src[i]));
}

template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, size_t n) {
    for_each_pack<T>(n, [&](size_t i, int len) {
        if (len > 1) {
            const Pack<T> x = load16(a + i), y = load16(b + i);
            Pack<T> o;
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++) o.v[k] = from_f<T>(to_f(x.v[k]) + to_f(y.v[k]));
            store16(out + i, o);
        } else {
            out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
        }
    });
}

template <typename T>
__global__ void gelu_fwd_kernel(T* out, const T* in, size_t n) {
    for_each_pack<T>(n, [&](size_t i, int len) {
        if (len > 1) {
            const Pack<T> x = load16(in + i);
            Pack<T> o;
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++) o.v[k] = from_f<T>(gelu(to_f(x.v[k])));
            store16(out + i, o);
        } else {
            out[i] = from_f<T>(gelu(to_f(in[i])));
        }
    });
}

template <typename T>
__global__ void gelu_bwd_kernel(T* din, const T* dout, const T* in, size_t n) {
    for_each_pack<T>(n, [&](size_t i, int len) {
        if (len > 1) {
            const Pack<T> x = load16(in + i), d = load16(dout + i);
            Pack<T> o;
#pragma unroll
            for (int k = 0; k < Pack<T>::N; k++) o.v[k] = from_f<T>(to_f(d.v[k]) * gelu_grad(to_f(x.v[k])));
            store16(din + i, o);
        } else {
            din[i] = from_f<T>(to_f(dout[i]) * gelu_grad(to_f(in[i])));
        }
    });
}

// Column sums in two stages, each in a fixed order: (32 columns x 8 row lanes) blocks write per-chunk
// partials, then one thread per column adds the chunks in order.
constexpr int kColChunks = 64;

template <typename T>
__global__ void colsum_partial_kernel(float* partial, const T* in, int R, int C) {
    __shared__ float s[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int rows_per_chunk = (R + kColChunks - 1) / kColChunks;
    const int r0 = blockIdx.y * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
    float acc = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += to_f(in[size_t(r) * C + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += s[y][threadIdx.x];
        partial[size_t(blockIdx.y) * C + c] = t;
    }
}

template <typename T>
__global__ void colsum_finish_kernel(T* out, const float* partial, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = to_f(out[c]);
    for (int k = 0; k < kColChunks; k++) t += partial[size_t(k) * C + c];
    out[c] = from_f<T>(t);
}

template <typename T>
__global__ void scale_kernel(T* x, size_t n, float s) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = from_f<T>(to_f(x[i]) * s);
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* in, size_t n, uint64_t seed, uint32_t threshold, float keep_scale) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        out[i] = dropout_keep(seed, i, threshold) ? from_f<T>(to_f(in[i]) * keep_scale) : from_f<T>(0.0f);
}

// Values in [-1, 1) from a hash of the index: random bits would make NaN and Inf for float types.
template <typename T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint32_t seed) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t x = uint32_t(i) * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = T(float(x) / 2147483648.0f - 1.0f);
    }
}

// out = silu(gate) * up
template <typename T>
__global__ void swiglu_fwd_kernel(T* out, const T* gate, const T* up, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = to_f(gate[i]);
        out[i] = from_f<T>(g / (1.0f + __expf(-g)) * to_f(up[i]));
    }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate)
template <typename T>
__global__ void swiglu_bwd_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = to_f(gate[i]), s = 1.0f / (1.0f + __expf(-g)), d = to_f(dout[i]);
        dgate[i] = from_f<T>(d * to_f(up[i]) * s * (1.0f + g * (1.0f - s)));
        dup[i] = from_f<T>(d * g * s);
    }
}

unsigned grid_for(size_t n, const Ctx& c) {
    return unsigned(std::min<size_t>((n + 255) / 256, size_t(c.sm_count) * 16));
}

}  // namespace

void convert(const Ctx& c, Tensor dst, Tensor src) {
    ANVIL_CHECK(dst.numel() == src.numel(), "convert: {} elements into {}", src.numel(), dst.numel());
    const size_t n = size_t(src.numel());
    if (n == 0) return;
    if (dst.dtype == src.dtype) {
        CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, c.stream));
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

void residual(const Ctx& c, Tensor out, Tensor a, Tensor b) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        residual_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), a.ptr<T>(), b.ptr<T>(), n);
        CUDA_LAUNCH_CHECK();
    });
}

void gelu_fwd(const Ctx& c, Tensor out, Tensor in) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        gelu_fwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), in.ptr<T>(), n);
        CUDA_LAUNCH_CHECK();
    });
}

void gelu_bwd(const Ctx& c, Tensor din, Tensor dout, Tensor in) {
    const size_t n = size_t(din.numel());
    if (n == 0) return;
    dispatch(din.dtype, [&](auto tag) {
        using T = decltype(tag);
        gelu_bwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(din.ptr<T>(), dout.ptr<T>(), in.ptr<T>(), n);
        CUDA_LAUNCH_CHECK();
    });
}

void swiglu_fwd(const Ctx& c, Tensor out, Tensor gate, Tensor up) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        swiglu_fwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), gate.ptr<T>(), up.ptr<T>(), n);
        CUDA_LAUNCH_CHECK();
    });
}

void swiglu_bwd(const Ctx& c, Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
    const size_t n = size_t(gate.numel());
    if (n == 0) return;
    dispatch(gate.dtype, [&](auto tag) {
        using T = decltype(tag);
        swiglu_bwd_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(dgate.ptr<T>(), dup.ptr<T>(), dout.ptr<T>(),
                                                                    gate.ptr<T>(), up.ptr<T>(), n);
        CUDA_LAUNCH_CHECK();
    });
}

void scale(const Ctx& c, Tensor x, float s) {
    const size_t n = size_t(x.numel());
    if (n == 0) return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        scale_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(x.ptr<T>(), n, s);
        CUDA_LAUNCH_CHECK();
    });
}

void dropout(const Ctx& c, Tensor out, Tensor in, float p, uint64_t seed) {
    const size_t n = size_t(out.numel());
    if (n == 0) return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        dropout_kernel<T><<<grid_for(n, c), 256, 0, c.stream>>>(out.ptr<T>(), in.ptr<T>(), n, seed,
                                                                 dropout_threshold(p), 1.0f / (1.0f - p));
        CUDA_LAUNCH_CHECK();
    });
}

void colsum_accumulate(const Ctx& c, Tensor out, Tensor in) {
    const int C = int(out.numel());
    const int R = int(in.numel() / C);
    ANVIL_CHECK(int64_t(R) * C == in.numel(), "column sum: {} into {} columns", in.shape.str(), C);
    auto* partial = static_cast<float*>(c.scratch(0, size_t(kColChunks) * C * sizeof(float)));
    dispatch(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        colsum_partial_kernel<T><<<dim3((C + 31) / 32, kColChunks), dim3(32, 8), 0, c.stream>>>(partial, in.ptr<T>(),
                                                                                                R, C);
        CUDA_LAUNCH_CHECK();
        colsum_finish_kernel<T><<<(C + 255) / 256, 256, 0, c.stream>>>(out.ptr<T>(), partial, C);
        CUDA_LAUNCH_CHECK();
    });
}

void fill_uniform(cudaStream_t s, void* p, size_t n, cudaDataType_t type, uint32_t seed) {
    switch (type) {
        case CUDA_R_32F: fill_uniform_kernel<float><<<1024, 256, 0, s>>>(static_cast<float*>(p), n, seed); break;
        case CUDA_R_16BF: fill_uniform_kernel<bf16_t><<<1024, 256, 0, s>>>(static_cast<bf16_t*>(p), n, seed); break;
        case CUDA_R_16F: fill_uniform_kernel<f16_t><<<1024, 256, 0, s>>>(static_cast<f16_t*>(p), n, seed); break;
        case CUDA_R_8F_E4M3:
            fill_uniform_kernel<__nv_fp8_e4m3><<<1024, 256, 0, s>>>(static_cast<__nv_fp8_e4m3*>(p), n, seed);
            break;
        default: ::anvil::fail("fill_uniform: cuda data type {} is not supported", int(type));
    }
    CUDA_LAUNCH_CHECK();
}

}  // namespace anvil::cuda
