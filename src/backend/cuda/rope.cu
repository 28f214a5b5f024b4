// Rotary position embeddings (Hugging Face's rotate_half layout) in place, and the grouped-query gradients
// out of attention's packed (q, k, v) layout. Memory-bound: one thread per element pair or per element.
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

// The position of row b's first token: pos0 for every row, or each row's own (a decode step, in device
// memory).
struct FromPos0 {
    int pos0;
    __device__ int at(int) const { return pos0; }
};
struct RowPos {  // read from device memory: a recorded decode step replays with the next step's
    const int* pos;
    __device__ int at(int b) const { return pos[b]; }
};

// x (B*T, H, HS), rows ld apart: thread per (row, head, i < HS/2); angle (first + t) * inv_freq[i] in f32
template <typename T, typename Pos>
__global__ void rope_kernel(T* x, size_t ld, const float* inv_freq, int rows, int T_, int H, int HS,
                            Pos first, float sign) {
    const int half = HS / 2;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(rows) * H * half) return;
    const int i = int(idx % half);
    const size_t rh = idx / half;  // row * H + head
    const int t = int((rh / H) % T_), b = int(rh / H / T_);
    const float a = float(first.at(b) + t) * inv_freq[i];
    float s, c;
    sincosf(a, &s, &c);
    s *= sign;
    T* v = x + (rh / H) * ld + (rh % H) * HS;
    const float x1 = to_f(v[i]), x2 = to_f(v[i + half]);
    v[i] = from_f<T>(x1 * c - x2 * s);
    v[i + half] = from_f<T>(x2 * c + x1 * s);
}

// dq, dk, dv overwritten from dqkv; a key/value head sums its repeats in order; thread per output element.
// dq, dk and dv's rows are their own ld apart (column views of one tensor, or contiguous).
template <typename T>
__global__ void qkv_unpack_kernel(RowsOf<T> dq, RowsOf<T> dk, RowsOf<T> dv, const T* dqkv, int N, int NH,
                                  int KVH, int KH, int HS) {
    const int W = (NH + 2 * KH) * HS, group = KH / KVH, U = (NH + 2 * KVH) * HS;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(N) * U) return;
    const int n = int(idx / U), c = int(idx % U), head = c / HS, d = c % HS;
    const T* g = dqkv + size_t(n) * W;
    if (head < NH) {
        *dq.at(n, head * HS + d) = g[size_t(head) * HS + d];
        return;
    }
    const bool is_k = head < NH + KVH;
    const int kh = is_k ? head - NH : head - NH - KVH, base = is_k ? NH : NH + KH;
    float acc = 0.0f;
    for (int r = 0; r < group; r++) acc += to_f(g[size_t(base + kh * group + r) * HS + d]);
    *(is_k ? dk : dv).at(n, kh * HS + d) = from_f<T>(acc);
}

}  // namespace

void rope(const Ctx& c, Tensor x, Tensor inv_freq, int B, int T_, int H, int HS, int pos0, bool inverse) {
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(rope_kernel<T, FromPos0>, size_t(B) * T_ * H * (HS / 2), 256, c.stream, x.row0<T>(),
               size_t(x.ld()), inv_freq.ptr<float>(), B * T_, T_, H, HS, FromPos0{pos0},
               inverse ? -1.0f : 1.0f);
    });
}

void rope_rows(const Ctx& c, Tensor x, Tensor inv_freq, int B, int T_, int H, int HS, Tensor pos,
               bool inverse) {
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(rope_kernel<T, RowPos>, size_t(B) * T_ * H * (HS / 2), 256, c.stream, x.row0<T>(),
               size_t(x.ld()), inv_freq.ptr<float>(), B * T_, T_, H, HS, RowPos{pos.ptr<int32_t>()},
               inverse ? -1.0f : 1.0f);
    });
}

void qkv_unpack(const Ctx& c, Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int N, int NH, int KVH, int KH,
                int HS) {
    dispatch(dqkv.dtype, [&](auto tag) {
        using T = decltype(tag);
        const auto rows = [](const Tensor& t) { return RowsOf<T>{t.row0<T>(), size_t(t.ld())}; };
        launch(qkv_unpack_kernel<T>, size_t(N) * (NH + 2 * KVH) * HS, 256, c.stream, rows(dq), rows(dk),
               rows(dv), dqkv.ptr<T>(), N, NH, KVH, KH, HS);
    });
}

}  // namespace anvil::cuda
