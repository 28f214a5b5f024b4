// The op table's parts, internal to tests/ops: the helpers that describe a case's arguments, and the cases of
// the families that have a file of their own (op_cases.cpp builds the table from them and its own cases).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "op_cases.h"

namespace anvil::test::cases {

using Vec = std::vector<float>;

inline Arg arg(std::string name, Shape s, Role role) {
    Arg a;
    a.name = std::move(name);
    a.shape = s;
    a.role = role;
    return a;
}
inline Arg in(std::string name, Shape s, float scale = 1.0f, bool diff = true) {
    Arg a = arg(std::move(name), s, Role::In);
    a.scale = scale;
    a.diff = diff;
    return a;
}
inline Arg out(std::string name, Shape s, bool loss = true) {
    Arg a = arg(std::move(name), s, Role::Out);
    a.loss = loss;
    return a;
}
inline Arg grad(std::string name, Shape s, bool accumulates) {
    Arg a = arg(std::move(name), s, Role::GradIn);
    a.accumulates = accumulates;
    return a;
}
inline Arg ids(std::string name, Shape s, int lo, int hi) {
    Arg a = arg(std::move(name), s, Role::Int);
    a.int_min = lo;
    a.int_max = hi;
    a.f32 = true;
    return a;
}
inline Arg f32(Arg a) {
    a.f32 = true;
    return a;
}

inline double gelu(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// The products (op_cases_matmul.cpp): matmul in both weight layouts, the MLP's fused pattern, FP8 and int8.
OpCase matmul(const OpSizes& s, int OC, WLayout layout, bool bias, bool frozen_w);
OpCase mlp(const OpSizes& s, bool bias1);
OpCase matmul_fp8(int N, int C, int OC, WLayout layout, bool bias);
OpCase matmul_q8(int N, int C, int OC, WLayout layout, bool bias);
OpCase mlp_q8(int N, int C);
OpCase embedding_q8(const OpSizes& s, bool positions);

// Attention (op_cases_attention.cpp): training's, grouped-query, generation's cached and paged forms.
// strided: dq, dk and dv as column views of one (N, (NH + 2 KVH) HS) tensor, as LinearGroup reads them
OpCase qkv_unpack_case(const OpSizes& s, int NH, int KVH, bool shares, bool strided = false);
// `drop`: dropout on the probabilities (dropout_mask.h), the reference applying the mask as documented there
OpCase attention(const OpSizes& s, int B, int T, int NH, int HS, const AttnDropout& drop = {});
OpCase attention_gqa(int B, int T, int NH, int KVH, int HS, const AttnDropout& drop = {});
OpCase attention_cached(const OpSizes& s, int KVH, int T = 0);  // T = 0: min(s.T, 40)
// own: rows in slots of their own (a decode step), said to the op (own_slots); a packed prefill's never are
OpCase attention_cached_rows(const OpSizes& s, int KVH, int B, int maxT, bool packed = false,
                             bool own = true);

}  // namespace anvil::test::cases
