// cuemu's <mma.h>: the WMMA API (nvcuda::wmma) for the 16 x 16 x 16 shape with 16-bit inputs and fp32
// accumulators, which is what anvil's kernels use. On a GPU a fragment is spread over the warp's 32 lanes in
// a layout the API leaves unspecified; here every lane holds the whole tile, so kernels must use fragments
// only through these calls (and fill_fragment), never element by element, which is also the only portable
// way.
//
// The calls are warp-collective as on a GPU: a load reads, then waits for the warp's other lanes, so a store
// that follows (by any lane) cannot change what a slower lane loads; a store writes only the calling lane's
// share of the tile, so what the warp stored needs the kernel's own __syncwarp before its lanes read it, and
// a missing one shows (lanes run one after another between barriers).
// Checked as the hardware demands: pointers 32-byte aligned, strides a multiple of 16 bytes, and tiles inside
// the launch's dynamic shared memory when they point there.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuemu: only WMMA's 16x16x16 shape is emulated");
    float v[16 *
            16];  // (row, col) at v[row * 16 + col]: (M, K) for a, (K, N) for b, (M, N) for the accumulator
};

namespace detail {
inline float to_float(float x) {
    return x;
}
inline float to_float(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
inline float to_float(__half x) {
    return __half2float(x);
}

template <typename T>
void check(const T* p, unsigned ldm, const char* call) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
        ::cuemu::fail(std::string(call) + ": the pointer is not 32-byte aligned");
    if (ldm * sizeof(T) % 16 != 0)
        ::cuemu::fail(std::string(call) + ": the stride " + std::to_string(ldm) +
                      " is not a multiple of 16 bytes");
    // 16 rows (or columns) of 16 elements, `ldm` apart
    ::cuemu::check_smem_span(p, p + size_t(15) * ldm + 16);
}
}  // namespace detail

template <typename Use, typename T, typename Layout, typename S>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const S* p, unsigned ldm) {
    static_assert(!std::is_same_v<Use, accumulator>, "cuemu: an accumulator load names its memory layout");
    detail::check(p, ldm, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.v[r * 16 + c] = detail::to_float(std::is_same_v<Layout, row_major> ? p[size_t(r) * ldm + c]
                                                                                 : p[size_t(c) * ldm + r]);
    ::cuemu::sync_warp(0xffffffffu);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    detail::check(p, ldm, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.v[r * 16 + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
    ::cuemu::sync_warp(0xffffffffu);
}

// Each lane stores its own eighth of the tile (as on a GPU, where it holds only that): a lane that reads
// the tile back without a __syncwarp after the store sees what the warp's later lanes have not yet written.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
    detail::check(p, ldm, "store_matrix_sync");
    const uint3 t = ::cuemu::thread_idx();
    const dim3 b = ::cuemu::block_dim();
    const unsigned lane = (t.x + b.x * (t.y + b.y * t.z)) % 32;
    for (int i = int(lane); i < 16 * 16; i += 32) {
        const int r = i / 16, c = i % 16;
        (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.v[i];
    }
}

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float x) {
    for (float& e : f.v) e = x;
}

// d = a b + c with fp32 accumulation (d may be c)
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
    float out[16 * 16];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.v[r * 16 + k] * b.v[k * 16 + n];
            out[r * 16 + n] = s;
        }
    for (int i = 0; i < 16 * 16; i++) d.v[i] = out[i];
}

}  // namespace nvcuda::wmma
