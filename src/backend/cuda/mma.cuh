// The tensor cores' warp-level instructions, for kernels that keep their fragments in registers and work on
// them element by element (the register-resident softmax of attention_tc.cu), which WMMA's opaque fragments
// do not allow: PTX `mma.sync.aligned.m16n8k16` (16-bit inputs, fp32 accumulation) and `ldmatrix` (four 8 x 8
// 16-bit matrices from shared memory into the operand layouts). Fragment layouts (PTX ISA, "Matrix Fragments
// for mma.m16n8k16"): lane l is in group g = l / 4 at position q = l % 4, a 32-bit register holds two 16-bit
// elements, the lower column in its low half.
//
//   A (16 x 16, row-major): a[0] = (g, 2q..2q+1), a[1] = (g + 8, 2q..), a[2] = (g, 2q + 8..),
//                           a[3] = (g + 8, 2q + 8..)
//   B (16 x 8, k x n):      b[0] = (2q..2q+1, g), b[1] = (2q + 8.., g)
//   C (16 x 8, fp32):       c[0..1] = (g, 2q..2q+1), c[2..3] = (g + 8, 2q..2q+1)
//
// C's two 16 x 8 tiles side by side are, rounded and paired, A's layout for the next product (how
// FlashAttention 2 feeds the probabilities to P V without shared memory). Under cuemu (tests/cuemu) the same
// calls run the emulator's model of these layouts, which is written from the PTX ISA, not from these kernels.
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace anvil::cuda::mma {

// d (16 x 8) += a (16 x 16) b (16 x 8), fp32 accumulation; T is bf16_t or f16_t.
template <typename T>
__device__ __forceinline__ void m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(ANVIL_CUEMU)
    ::cuemu::mma_m16n8k16<T>(d, a, b);
#else
    if constexpr (std::is_same_v<T, bf16_t>)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8 x 8 matrices of 16-bit elements from shared memory: lane 8j + r passes the address of row r of
// matrix j (16 bytes, 16-byte aligned); register j of lane l gets row l / 4, elements 2(l % 4)..+1 of matrix
// j.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
#if defined(ANVIL_CUEMU)
    ::cuemu::ldmatrix_x4(r, row, false);
#else
    const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// The same, each matrix transposed: register j of lane l gets elements (2(l % 4)..+1, l / 4) of matrix j.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(ANVIL_CUEMU)
    ::cuemu::ldmatrix_x4(r, row, true);
#else
    const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// Two floats rounded to T, `lo` in the low half: one register of an A or B fragment.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if constexpr (std::is_same_v<T, bf16_t>)
        return uint32_t(__bfloat16_as_ushort(from_f<T>(lo))) | uint32_t(__bfloat16_as_ushort(from_f<T>(hi)))
                                                                   << 16;
    else
        return uint32_t(__half_as_ushort(from_f<T>(lo))) | uint32_t(__half_as_ushort(from_f<T>(hi))) << 16;
}

// Two accumulator tiles side by side (16 x 8 each, `left` the lower columns) rounded to T: the A operand
// (16 x 16) of the next product.
template <typename T>
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
    a[0] = pack2<T>(left[0], left[1]);
    a[1] = pack2<T>(left[2], left[3]);
    a[2] = pack2<T>(right[0], right[1]);
    a[3] = pack2<T>(right[2], right[3]);
}

// 2^x by the special-function unit (`ex2.approx.ftz.f32`, what __expf runs after its multiply by log2 e):
// kernels that keep scores in log2 units fold that multiply into their scaling. 2^-inf is 0.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(ANVIL_CUEMU)
    return std::exp2(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

}  // namespace anvil::cuda::mma
