// Matrix products through cuBLASLt: bf16/fp16/fp32 operands with fp32 accumulation (tensor cores for the
// 16-bit types), the bias and (16-bit) the GELU fused as epilogues in the forward and the GELU's derivative
// in the backward. Row-major tensors are column-major transposes, so each op below is stated as the
// column-major product cuBLASLt computes.
#include "backend/cuda/common.cuh"
#include "backend/cuda/lt_gemm.h"

namespace anvil::cuda {

namespace {

// out (rows, OC), its rows ld apart: every row += bias
template <typename T>
__global__ void bias_add_kernel(T* out, const T* bias, size_t n, int OC, size_t ld) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T* o = out + (i / OC) * ld + i % OC;
    *o = from_f<T>(to_f(*o) + to_f(bias[i % OC]));
}

}  // namespace

void bias_add(const Ctx& c, Tensor out, Tensor bias) {
    const int OC = int(out.cols());
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch(bias_add_kernel<T>, size_t(out.numel()), 256, c.stream, out.row0<T>(), bias.ptr<T>(),
               size_t(out.numel()), OC, size_t(out.ld()));
    });
}

// out (N,OC) = in (N,C) @ W (+ bias) [-> gelu]. Column-major: out^T (OC x N) = W' (OC x C) . in^T (C x N),
// where W' is W's storage read as (OC x C): directly for InOut (C,OC) row-major, transposed for OutIn. out
// may be a strided view (its leading dimension is then the row stride).
void matmul_fwd(const Ctx& c, Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(out.shape[out.shape.ndim - 1]);
    if (c.direct_products && N <= kDirectRows)
        return matmul_direct(c, out, in, w, {}, layout, bias, pre_gelu);
    Gemm g;
    g.a_type = g.b_type = g.d = in.dtype;
    g.m = OC, g.n = N, g.k = C;
    g.A = w.data, g.ta = layout == WLayout::OutIn, g.lda = layout == WLayout::InOut ? OC : C;
    g.B = in.data, g.ldb = C;
    g.bias = bias.empty() ? nullptr : bias.data;
    // With a GELU in 16 bits: cuBLASLt's GELU_AUX(_BIAS) epilogue writes out = gelu(product + bias) from the
    // f32 accumulator and pre_gelu = product + bias beside it, one pass over the output instead of a GELU
    // kernel reading pre_gelu back (matmul_fwd's definition: the GELU of the unrounded value; the CPU's
    // tensors are f32, where the two are one). The backward's recomputation (--recompute) runs this product
    // again (Linear::recompute_gelu), so its bits are the forward's. In f32 the GELU stays anvil's kernel
    // (cuBLASLt's f32 GELU derivative differed from the CPU's by up to 5e-5 on an H100, see matmul_bwd).
    const bool epilogue = !pre_gelu.empty() && in.dtype != DType::F32 && c.gelu_epilogue && out.ld() == OC &&
                          OC % 8 == 0 && aligned16(out.data, pre_gelu.data);
    if (epilogue) {
        Gemm f = g;
        f.D = out.data, f.ldd = OC;
        f.epi = bias.empty() ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        f.aux = pre_gelu.data, f.ld_aux = OC;
        if (lt_gemm(c, f)) return;
    }
    // Otherwise the product (and bias) goes to pre_gelu and the GELU runs as a kernel on that saved value
    // (within one rounding of the definition in 16 bits, the same bits when recomputed).
    Tensor target = pre_gelu.empty() ? out : pre_gelu;
    g.D = target.data, g.ldd = int(target.ld());
    if (!bias.empty()) g.epi = CUBLASLT_EPILOGUE_BIAS;
    if (!lt_gemm(c, g)) {
        // No fused algorithm for this shape: the plain product, then the bias as a kernel.
        Gemm plain = g;
        plain.epi = CUBLASLT_EPILOGUE_DEFAULT, plain.bias = nullptr;
        lt_gemm_or_fail(c, plain);
        if (!bias.empty()) bias_add(c, target, bias);
    }
    if (!pre_gelu.empty()) gelu_fwd(c, out, pre_gelu);
}

void matmul_bwd(const Ctx& c, Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                WLayout layout, Tensor in_pre_gelu) {
    const int C = int(in.shape[in.shape.ndim - 1]), N = int(in.numel() / C);
    const int OC = int(dout.shape[dout.shape.ndim - 1]);
    const DType dt = in.dtype;
    if (!din.empty()) {
        // din^T (C x N) = W'' (C x OC) . dout^T (OC x N); W'' is W's storage read as (C x OC)
        Gemm g;
        g.a_type = g.b_type = g.d = dt;
        g.m = C, g.n = N, g.k = OC;
        g.A = w.data, g.ta = layout == WLayout::InOut, g.lda = layout == WLayout::InOut ? OC : C;
        g.B = dout.data, g.ldb = OC;
        g.D = din.data, g.ldd = C;
        // GELU's derivative in cuBLASLt's epilogue for 16-bit types (from the f32 accumulator, before the
        // rounding); in f32 anvil's kernel, exactly the CPU's function: the epilogue's own approximation
        // differed by up to 5e-5 (absolute) from it on an H100 (cuBLASLt 13.1), above the f32 tolerance.
        const bool fuse = !in_pre_gelu.empty() && dt != DType::F32;
        if (fuse) g.epi = CUBLASLT_EPILOGUE_DGELU, g.aux = in_pre_gelu.data, g.ld_aux = C;
        if (!fuse || !lt_gemm(c, g)) {  // the plain product, then the derivative as a kernel
            g.epi = CUBLASLT_EPILOGUE_DEFAULT, g.aux = nullptr, g.ld_aux = 0;
            lt_gemm_or_fail(c, g);
            if (!in_pre_gelu.empty()) gelu_bwd(c, din, din, in_pre_gelu);
        }
    }
    if (!dbias.empty()) colsum_accumulate(c, dbias, dout);
    if (dw.empty()) return;  // a frozen weight
    // weight gradient, accumulated (beta 1)
    Gemm g;
    g.a_type = g.b_type = g.d = dt;
    g.beta = 1.0f;
    if (layout == WLayout::InOut) {  // dW (C,OC) row-major = (OC x C): dout^T (OC x N) . in (N x C)
        g.m = OC, g.n = C, g.k = N;
        g.A = dout.data, g.lda = OC;
        g.B = in.data, g.tb = true, g.ldb = C;
        g.D = dw.data, g.ldd = OC;
    } else {  // dW (OC,C) row-major = (C x OC): in^T (C x N) . dout (N x OC)
        g.m = C, g.n = OC, g.k = N;
        g.A = in.data, g.lda = C;
        g.B = dout.data, g.tb = true, g.ldb = OC;
        g.D = dw.data, g.ldd = C;
    }
    lt_gemm_or_fail(c, g);
}

}  // namespace anvil::cuda
