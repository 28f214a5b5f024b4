// The CPU reference ops: plain f32 loops (OpenMP across rows) and BLAS for matrix products. These are the
// specification of each op; CpuBackend wraps them with shape and dtype checks, and the CUDA backend is
// tested against them. Shapes are in the comments; N = B*T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace anvil::cpu {

// A matrix whose rows are ld elements apart: a strided view's rows (Tensor::cols), or contiguous ones.
template <typename T>
struct Rows {
    T* p;
    int64_t ld;
    T& operator()(int64_t r, int64_t j) const { return p[r * ld + j]; }
    T* row(int64_t r) const { return p + r * ld; }
};

// embedding.cpp
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V);  // out (B,T,C)
void embedding_rows_add(float* out, const float* table, const int* rows, int B,
                        int C);  // out (B,C) += table[rows]
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C);

// layernorm.cpp
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                       int N, int C);
void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                        const float* mean, const float* rstd, int N, int C);
// One row (C) of each norm's forward, the loops the whole-tensor forwards run: the residual add fused into a
// norm (CpuBackend::add_norm_fwd) normalises the rows it has just summed with them.
void layernorm_row(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                   int C, float eps);
void rmsnorm_row(float* out, float* rstd, const float* in, const float* w, int C, float eps);

// A row-major product with CBLAS's arguments (alpha 1): C (M,N) = op(A) op(B), plus C when `accumulate`;
// op(A) (M,K) from A stored (M,lda) or, transposed, (K,lda); op(B) (K,N) from B stored (K,ldb) or,
// transposed, (N,ldb). The matrix products below run cblas_sgemm unless given another (matmul_bf16.h's bf16
// products).
class Gemm {
public:
    virtual ~Gemm() = default;
    virtual void operator()(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                            int ldb, bool accumulate, float* C, int ldc) = 0;
};
// oneDNN's bf16 products (matmul_bf16.h); null where anvil was built without oneDNN
std::unique_ptr<Gemm> make_bf16_gemm();

// matmul.cpp: out (N,OC) = in (N,C) @ W + bias, W (C,OC) InOut or (OC,C) OutIn; out's rows ldo apart (OC, or
// more for a strided view); `gemm` null: cblas_sgemm
void matmul_forward(float* out, int ldo, const float* in, const float* w, const float* bias, int N, int C,
                    int OC, WLayout layout, Gemm* gemm = nullptr);
void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                     int N, int C, int OC, WLayout layout, Gemm* gemm = nullptr);

// matmul_q8.cpp: int8 weights, W = q * scale[o] (q in `layout` as above, scale (OC)); `scratch` holds the f32
// panels of the weight that products over many rows dequantize into.
void matmul_q8_forward(float* out, int ldo, const float* in, const int8_t* q, const float* scale,
                       const float* bias, int N, int C, int OC, WLayout layout, std::vector<float>& scratch);
void matmul_q8_backward(float* din, const float* dout, const int8_t* q, const float* scale, int N, int C,
                        int OC, WLayout layout, std::vector<float>& scratch);  // din (N,C) overwritten
// q (V,C) I8, scale (V); wpe (maxT,C) or null
void embedding_q8_forward(float* out, const int32_t* tokens, const int8_t* q, const float* scale,
                          const float* wpe, int B, int T, int C, int V);

// gelu.cpp (tanh form)
void gelu_forward(float* out, const float* in, size_t n);
void gelu_backward(float* din, const float* dout, const float* in, size_t n);  // din may alias dout

// attention.cpp: qkv (B,T,C + 2 KVH HS) -> out (B,T,C), C = NH HS, query head h reading key/value head
// h / (NH / KVH); att (B,NH,T,T) keeps the softmax for the backward. dqkv (B,T,3C): q's gradient, then
// each query head's share of its key/value head's (qkv_unpack sums the shares)
// `drop`: dropout on the probabilities (dropout_mask.h), the backward given the forward's
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int KVH,
                       const AttnDropout& drop);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int B, int T, int C, int NH, int KVH, int threads,
                        const AttnDropout& drop);  // scratch: threads*T*T floats
// qkv (Tq, (NH + 2 KVH) HS); caches (maxT, KVH HS): query head h reads key/value head h / (NH / KVH)
void attention_cached(float* out, const float* qkv, float* kcache, float* vcache, int Tq, int pos0, int NH,
                      int KVH, int HS);
// B rows, row b at position pos[b] of slot slot[b]; caches (P, page, KVH HS), pages (S, PPS): position p of
// slot s is row p % page of page pages[s PPS + p / page]
void attention_cached_rows(float* out, const float* qkv, float* kcache, float* vcache, const int* pages,
                           int B, const int* slot, const int* pos, int page, int PPS, int NH, int KVH,
                           int HS);

// rmsnorm.cpp: out (N,C) = in * rstd * w; rstd (N)
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* w, int N, int C, float eps);
void rmsnorm_backward(float* din, float* dw, const float* dout, const float* in, const float* w,
                      const float* rstd, int N, int C);  // din accumulates; dw may be null

// rope.cpp: x (B,T,H,HS) rotated in place, its (b, t) rows ldx apart (H HS, or more for a strided view), row
// b at positions row_pos[b].. when row_pos is given; the grouped-query gradients' unpacking (KH = KVH or NH)
void rope(float* x, int64_t ldx, const float* inv_freq, int B, int T, int H, int HS, int pos0, bool inverse,
          const int* row_pos = nullptr);
// (dq, dk and dv's rows their own ld apart: column views of one tensor, or contiguous)
void qkv_unpack(Rows<float> dq, Rows<float> dk, Rows<float> dv, const float* dqkv, int N, int NH, int KVH,
                int KH, int HS);

// swiglu.cpp: out = silu(gate) * up over R rows of C
void swiglu_forward(Rows<float> out, Rows<const float> gate, Rows<const float> up, int64_t R, int64_t C);
void swiglu_backward(Rows<float> dgate, Rows<float> dup, Rows<const float> dout, Rows<const float> gate,
                     Rows<const float> up, int64_t R, int64_t C);

// classifier.cpp: fused softmax + cross-entropy, logits (N,Vp), first V columns real
void classifier(float* losses, float* logits, const int32_t* targets, float dloss, int N, int Vp, int V);

// optimizer.cpp
double sum_squares(const float* x, size_t n);
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float wd, int step, float grad_scale);

int max_threads();

}  // namespace anvil::cpu
