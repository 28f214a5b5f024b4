// Products with int8 weights (weight-only quantization): W = q * scale[o], one scale per output channel.
//
// Decoding (a few rows) is bound by reading the weight, so those rows read the int8 bytes directly, a quarter
// of the f32 weight's traffic, converting each byte to f32 in the vector loop. Many rows (prefill,
// evaluation, training) are bound by arithmetic instead: the weight is dequantized a panel of output channels
// at a time into f32 and the panel multiplied through BLAS, so the int8 model runs at the f32 model's speed
// there.
#include <cblas.h>

#include <algorithm>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

namespace {

constexpr int kDirectRows = 8;  // up to this many rows: the direct kernels
constexpr int kColBlock = 64;   // output channels one thread accumulates at a time (W (in, out))
constexpr int64_t kPanelElems = int64_t(1) << 20;  // f32 elements of one dequantized panel (4 MB)

// Output channels per panel for an input width C.
int panel_width(int C, int OC) {
    const int64_t w = std::max<int64_t>(16, kPanelElems / C / 16 * 16);
    return int(std::min<int64_t>(w, OC));
}

// Output channels [o0, o1) of W, dequantized to f32 in the weight's own layout: (o1 - o0, C) for W (out, in),
// (C, o1 - o0) for W (in, out).
void dequant_panel(float* P, const int8_t* q, const float* scale, int C, int OC, WLayout layout, int o0,
                   int o1) {
    const int w = o1 - o0;
    if (layout == WLayout::OutIn) {
#pragma omp parallel for schedule(static)
        for (int o = o0; o < o1; o++) {
            const int8_t* src = q + size_t(o) * C;
            float* dst = P + size_t(o - o0) * C;
            const float s = scale[o];
#pragma omp simd
            for (int i = 0; i < C; i++) dst[i] = s * float(src[i]);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < C; i++) {
        const int8_t* src = q + size_t(i) * OC + o0;
        float* dst = P + size_t(i) * w;
#pragma omp simd
        for (int j = 0; j < w; j++) dst[j] = scale[o0 + j] * float(src[j]);
    }
}

// out (N, OC) = in @ W + bias for N <= kDirectRows, straight from the int8 weight.
void forward_direct(float* out, int ldo, const float* in, const int8_t* q, const float* scale,
                    const float* bias, int N, int C, int OC, WLayout layout) {
    if (layout == WLayout::OutIn) {  // each output channel is one row of the weight: N dot products
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            const int8_t* w = q + size_t(o) * C;
            for (int n = 0; n < N; n++) {
                const float* x = in + size_t(n) * C;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int i = 0; i < C; i++) acc += x[i] * float(w[i]);
                out[size_t(n) * ldo + o] = (bias ? bias[o] : 0.0f) + scale[o] * acc;
            }
        }
        return;
    }
    // W (in, out): each thread owns a block of output channels and walks the input rows of the weight
    const int blocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        const int o0 = blk * kColBlock, len = std::min(kColBlock, OC - o0);
        float acc[kDirectRows][kColBlock] = {};
        for (int i = 0; i < C; i++) {
            const int8_t* w = q + size_t(i) * OC + o0;
            for (int n = 0; n < N; n++) {
                const float x = in[size_t(n) * C + i];
                float* a = acc[n];
#pragma omp simd
                for (int j = 0; j < len; j++) a[j] += x * float(w[j]);
            }
        }
        for (int n = 0; n < N; n++)
            for (int j = 0; j < len; j++)
                out[size_t(n) * ldo + o0 + j] = (bias ? bias[o0 + j] : 0.0f) + scale[o0 + j] * acc[n][j];
    }
}

}  // namespace

void matmul_q8_forward(float* out, int ldo, const float* in, const int8_t* q, const float* scale,
                       const float* bias, int N, int C, int OC, WLayout layout, std::vector<float>& scratch) {
    if (N <= kDirectRows) return forward_direct(out, ldo, in, q, scale, bias, N, C, OC, layout);
    const int pw = panel_width(C, OC);
    scratch.resize(size_t(pw) * C);
    float* P = scratch.data();
    for (int o0 = 0; o0 < OC; o0 += pw) {
        const int o1 = std::min(OC, o0 + pw), w = o1 - o0;
        dequant_panel(P, q, scale, C, OC, layout, o0, o1);
        float beta = 0.0f;
        if (bias) {
#pragma omp parallel for schedule(static)
            for (int n = 0; n < N; n++) std::copy_n(bias + o0, w, out + size_t(n) * ldo + o0);
            beta = 1.0f;
        }
        if (layout == WLayout::OutIn)  // out[:, o0:o1] = in (N, C) @ P^T, P (w, C)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, w, C, 1.0f, in, C, P, C, beta, out + o0,
                        ldo);
        else  // P (C, w)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, w, C, 1.0f, in, C, P, w, beta, out + o0,
                        ldo);
    }
}

void matmul_q8_backward(float* din, const float* dout, const int8_t* q, const float* scale, int N, int C,
                        int OC, WLayout layout, std::vector<float>& scratch) {
    const int pw = panel_width(C, OC);
    scratch.resize(size_t(pw) * C);
    float* P = scratch.data();
    for (int o0 = 0; o0 < OC; o0 += pw) {  // din = sum over panels of dout[:, o0:o1] @ (the panel)^T
        const int o1 = std::min(OC, o0 + pw), w = o1 - o0;
        const float beta = o0 == 0 ? 0.0f : 1.0f;
        dequant_panel(P, q, scale, C, OC, layout, o0, o1);
        if (layout == WLayout::OutIn)  // P (w, C)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, w, 1.0f, dout + o0, OC, P, C, beta,
                        din, C);
        else  // P (C, w)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, w, 1.0f, dout + o0, OC, P, w, beta,
                        din, C);
    }
}

void embedding_q8_forward(float* out, const int32_t* tokens, const int8_t* q, const float* scale,
                          const float* wpe, int B, int T, int C, int V) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const int32_t tok = tokens[b * T + t];
            float* o = out + (size_t(b) * T + t) * C;
            if (tok < 0 || tok >= V) {  // checked by the backend before
                for (int c = 0; c < C; c++) o[c] = __builtin_nanf("");
                continue;
            }
            const int8_t* e = q + size_t(tok) * C;
            const float s = scale[tok];
            const float* p = wpe ? wpe + size_t(t) * C : nullptr;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = s * float(e[c]) + (p ? p[c] : 0.0f);
        }
    }
}

}  // namespace anvil::cpu
