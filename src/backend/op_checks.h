// The shape contract of every op, shared by the backends: each check returns the sizes the op works on, or
// throws naming the op and the mismatched tensors.
#pragma once

#include <optional>
#include <span>
#include <utility>

#include "backend/backend.h"

namespace anvil {

// Rows and columns of a tensor seen as a matrix (all leading dims folded into rows).
inline int64_t rows(const Tensor& t) {
    return t.numel() / t.shape[t.shape.ndim - 1];
}
inline int64_t cols(const Tensor& t) {
    return t.shape[t.shape.ndim - 1];
}

// The least value that occurs more than once among v[0..n), or none when they are distinct (a decode step's
// rows each in a cache slot of its own: attention_cached_rows' own_slots).
std::optional<int> repeated(const int* v, int n);

void expect_shape(const Tensor& t, std::initializer_list<int64_t> dims, const char* what);
void expect_same_numel(const Tensor& a, const Tensor& b, const char* op);
// Strided views (Tensor::cols) reach only the arguments ops.def says take them; the rest must be contiguous.
void expect_contiguous(std::initializer_list<const Tensor*> ts, const char* op);
// Elementwise ops (residual_fwd, swiglu_fwd, swiglu_bwd): arguments of one element count, or, where any is a
// strided view, of one shape (rows and columns).
void check_elementwise(std::initializer_list<const Tensor*> ts, const char* op);
// How the backends walk an elementwise op's arguments: every element as one row where all are contiguous
// (flat: C is the element count), else R rows of C, each tensor's rows its own ld() apart.
struct ElementShape {
    bool flat;
    int64_t R, C;
    int64_t ld(const Tensor& t) const { return flat ? C : t.ld(); }
};
ElementShape elementwise_shape(std::initializer_list<const Tensor*> ts);

// FP8 delayed scaling's state: (3, F) f32, F a history's floats (Fp8History::floats). Returns F, the floats
// from one operand's history to the next (0 when scaling is off).
int check_fp8_scaling(const Fp8Scaling& s);

struct EmbDims {
    int B, T, C, V;
};
EmbDims check_embedding(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
// dwte (V,C) and dwpe (maxT,C) may each be empty (frozen).
EmbDims check_embedding_bwd(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

struct RowDims {
    int N, C;
};
RowDims check_layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                        const Tensor& w, const Tensor& b);
RowDims check_layernorm_bwd(const Tensor& din, const Tensor& dw, const Tensor& db, const Tensor& dout,
                            const Tensor& in);

struct MatDims {
    int N, C, OC;
};
MatDims check_matmul_fwd(const Tensor& out, const Tensor& in, const Tensor& w, WLayout layout,
                         const Tensor& bias, const Tensor& pre_gelu);
MatDims check_matmul_bwd(const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                         const Tensor& w, WLayout layout);

// int8 weights: q (I8) shaped as matmul's W, scale (OC) f32; embedding tables (V,C) I8 with scale (V).
MatDims check_matmul_q8(const Tensor& out, const Tensor& in, const Tensor& q, const Tensor& scale,
                        WLayout layout, const Tensor& bias, const Tensor& pre_gelu);
EmbDims check_embedding_q8(const Tensor& out, const Tensor& tokens, const Tensor& q, const Tensor& scale,
                           const Tensor& wpe);

struct AttnShape {
    int B, T, C, NH, KVH;  // C = NH HS; qkv (B, T, C + 2 KVH HS)
};
// qkv (B,T,(NH + 2 KVH) HS) and the output-like `o` (B,T,NH HS) (out, or dout in the backward): KVH from
// what qkv holds beyond the queries; KVH divides NH
AttnShape check_attention(const Tensor& qkv, const Tensor& o, int NH);
// attention's dropout rate in [0, 1)
void check_attention_dropout(const AttnDropout& drop);

RowDims check_rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w);
RowDims check_rmsnorm_bwd(const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                          const Tensor& rstd);

struct RopeDims {
    int B, T, H, HS;  // x (B, T, H * HS)
};
RopeDims check_rope(const Tensor& x, const Tensor& inv_freq, int H);

struct HeadDims {
    int N, NH, KVH, KH, HS;  // dqkv (N, (NH + 2 KH) HS), KH = KVH or NH
};
HeadDims check_qkv_unpack(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv, int NH);

struct CachedDims {
    int Tq, KVH, HS;
};
// qkv (Tq, (NH + 2 KVH) HS), caches (maxT, KVH HS), out (Tq, NH HS)
CachedDims check_attention_cached(const Tensor& out, const Tensor& qkv, const Tensor& kcache,
                                  const Tensor& vcache, int pos0, int NH);
struct CachedRowsDims {
    int B, S, P, page, PPS, KVH, HS;
};
// qkv (B, (NH + 2 KVH) HS), caches (P, page, KVH HS), pages (S, PPS) i32, out (B, NH HS); B slots in [0, S)
// and positions in [0, PPS page), no pair twice (with own_slots, no slot twice). The row integers are (B)
// i32; their values are checked where the host can read them (a CPU tensor), a device's kernels guarding them
// instead.
CachedRowsDims check_attention_cached_rows(const Tensor& out, const Tensor& qkv, const Tensor& kcache,
                                           const Tensor& vcache, const Tensor& pages, const Tensor& slot,
                                           const Tensor& pos, int NH, bool own_slots = false);
// rope_rows: x (B, T, H HS) and B non-negative positions (B) i32
RopeDims check_rope_rows(const Tensor& x, const Tensor& inv_freq, int H, const Tensor& pos);
// embedding_rows_add: out (B, C), table (R, C), rows (B) i32 in [0, R); returns C
int check_embedding_rows_add(const Tensor& out, const Tensor& table, const Tensor& rows);
// neftune_noise: out (B, T, C), lengths (B, T) i32, alpha >= 0; returns (B*T, C)
std::pair<int64_t, int> check_neftune(const Tensor& out, const Tensor& lengths, float alpha);

struct ClsDims {
    int N, Vp;
};
ClsDims check_classifier(const Tensor& losses, const Tensor& logits, const Tensor& targets, int vocab_real);
struct LogprobDims {
    int N, Vp, K;
};
LogprobDims check_token_logprobs(const Tensor& lp, const Tensor& top_ids, const Tensor& top_lp,
                                 const Tensor& logits, const Tensor& targets, int V);

// Each listed op's rule (ops.def) as a function, check_op_<name>(its parameters): the CUDA backend's
// generated members call it, and a CPU member may. A rule need not read every parameter.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define ANVIL_OP(name, params, args, rule, label, bytes) \
    inline void check_op_##name params {                 \
        rule;                                            \
    }
#include "backend/ops.def"
#pragma GCC diagnostic pop

}  // namespace anvil
