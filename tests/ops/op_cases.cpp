// The op table: every Backend op as a case (op_cases.h). Host references are written from the op contract
// in backend/backend.h, in double.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "op_cases.h"

#include <gtest/gtest.h>

#include "backend/dropout_mask.h"

namespace anvil::test {

namespace {

using Vec = std::vector<float>;

Arg arg(std::string name, Shape s, Role role) {
    Arg a;
    a.name = std::move(name);
    a.shape = s;
    a.role = role;
    return a;
}
Arg in(std::string name, Shape s, float scale = 1.0f, bool diff = true) {
    Arg a = arg(std::move(name), s, Role::In);
    a.scale = scale;
    a.diff = diff;
    return a;
}
Arg out(std::string name, Shape s, bool loss = true) {
    Arg a = arg(std::move(name), s, Role::Out);
    a.loss = loss;
    return a;
}
Arg grad(std::string name, Shape s, bool accumulates) {
    Arg a = arg(std::move(name), s, Role::GradIn);
    a.accumulates = accumulates;
    return a;
}
Arg ids(std::string name, Shape s, int lo, int hi) {
    Arg a = arg(std::move(name), s, Role::Int);
    a.int_min = lo;
    a.int_max = hi;
    a.f32 = true;
    return a;
}
Arg f32(Arg a) {
    a.f32 = true;
    return a;
}

double gelu(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// Causal self-attention in double: qkv (B, T, 3C) -> (B, T, C).
Vec ref_attention(const Vec& qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    Vec out(size_t(B) * T * C);
    std::vector<double> p(static_cast<size_t>(T));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float* q = &qkv[(size_t(b) * T + t) * 3 * C + size_t(h) * HS];
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float* k = &qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * HS];
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += double(q[d]) * k[d];
                    p[size_t(j)] = s / std::sqrt(double(HS));
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (int j = 0; j <= t; j++) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += p[size_t(j)] / sum * qkv[(size_t(b) * T + j) * 3 * C + 2 * C + size_t(h) * HS + d];
                    out[(size_t(b) * T + t) * C + size_t(h) * HS + d] = float(o);
                }
            }
    return out;
}

// out (N, OC) = x (N, C) @ W + b, W (C, OC) or (OC, C)
Vec ref_matmul(const Vec& x, const Vec& w, const Vec* b, int N, int C, int OC, WLayout layout) {
    Vec out(size_t(N) * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? (*b)[size_t(o)] : 0.0;
            for (int c = 0; c < C; c++)
                s += double(x[size_t(n) * C + c]) *
                     w[layout == WLayout::InOut ? size_t(c) * OC + o : size_t(o) * C + c];
            out[size_t(n) * OC + o] = float(s);
        }
    return out;
}

OpCase embedding(const OpSizes& s, int C, bool frozen_wte) {
    OpCase c;
    c.name = fmt::format("embedding C={}{}", C, frozen_wte ? " (frozen token table)" : "");
    c.args = {ids("tokens", {s.B, s.T}, 0, s.V), in("wte", {s.Vp, C}, 1.0f, !frozen_wte), in("wpe", {s.T, C}),
              out("out", {s.B, s.T, C}), grad("dwpe", {s.T, C}, true)};
    if (!frozen_wte) c.args.push_back(grad("dwte", {s.Vp, C}, true));
    c.forward = [](Backend& be, const Args& a) { be.embedding_fwd(a["out"], a["tokens"], a["wte"], a["wpe"]); };
    c.backward = [frozen_wte](Backend& be, const Args& a) {
        be.embedding_bwd(frozen_wte ? Tensor{} : a["dwte"], a["dwpe"], a["dout"], a["tokens"]);
    };
    const int B = s.B, T = s.T;
    c.reference = [B, T, C](const HostArgs& h, HostArgs& want) {
        Vec o(size_t(B) * T * C);
        for (int i = 0; i < B * T; i++)
            for (int k = 0; k < C; k++)
                o[size_t(i) * C + k] = h.at("wte")[size_t(h.at("tokens")[size_t(i)]) * C + k] +
                                       h.at("wpe")[size_t(i % T) * C + k];
        want["out"] = o;
    };
    return c;
}

// Token embedding alone (rotary models: no position table).
OpCase embedding_tokens(const OpSizes& s, int C) {
    OpCase c;
    c.name = fmt::format("embedding C={} (no positions)", C);
    c.args = {ids("tokens", {s.B, s.T}, 0, s.V), in("wte", {s.Vp, C}), out("out", {s.B, s.T, C}),
              grad("dwte", {s.Vp, C}, true)};
    c.forward = [](Backend& be, const Args& a) { be.embedding_fwd(a["out"], a["tokens"], a["wte"], {}); };
    c.backward = [](Backend& be, const Args& a) { be.embedding_bwd(a["dwte"], {}, a["dout"], a["tokens"]); };
    const int N = s.B * s.T;
    c.reference = [N, C](const HostArgs& h, HostArgs& want) {
        Vec o(size_t(N) * C);
        for (int i = 0; i < N; i++)
            for (int k = 0; k < C; k++) o[size_t(i) * C + k] = h.at("wte")[size_t(h.at("tokens")[size_t(i)]) * C + k];
        want["out"] = o;
    };
    return c;
}

OpCase rmsnorm(const OpSizes& s, int C, bool frozen) {
    OpCase c;
    const int N = s.B * s.T;
    constexpr float kEps = 1e-6f;
    c.name = fmt::format("rmsnorm C={}{}", C, frozen ? " (frozen gain)" : "");
    Arg x = in("x", {N, C}, 2.0f);
    x.offset = 0.5f;
    Arg w = in("w", {C}, 0.5f, !frozen);
    w.offset = 1.0f;
    c.args = {x, w, out("out", {N, C}), f32(out("rstd", {N}, false)), grad("dx", {N, C}, true)};
    if (!frozen) c.args.push_back(grad("dw", {C}, true));
    c.forward = [](Backend& be, const Args& a) { be.rmsnorm_fwd(a["out"], a["rstd"], a["x"], a["w"], kEps); };
    c.backward = [frozen](Backend& be, const Args& a) {
        be.rmsnorm_bwd(a["dx"], frozen ? Tensor{} : a["dw"], a["dout"], a["x"], a["w"], a["rstd"]);
    };
    c.reference = [N, C](const HostArgs& h, HostArgs& want) {
        Vec o(size_t(N) * C);
        for (int n = 0; n < N; n++) {
            double ms = 0;
            for (int k = 0; k < C; k++) ms += std::pow(h.at("x")[size_t(n) * C + k], 2);
            const double r = 1.0 / std::sqrt(ms / C + kEps);
            for (int k = 0; k < C; k++)
                o[size_t(n) * C + k] = float(h.at("x")[size_t(n) * C + k] * r * h.at("w")[size_t(k)]);
        }
        want["out"] = o;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

// Rotary embedding on (B, T, H*HS) at positions pos0..; its backward is the inverse rotation of the gradient.
// per_row: rope_rows with row b at pos0 + 5 b (a decode step's rows at their own positions)
OpCase rope_case(const OpSizes& s, int H, int HS, int pos0, bool per_row = false) {
    OpCase c;
    c.name = fmt::format("rope{} H={} HS={} pos0={}", per_row ? "_rows" : "", H, HS, pos0);
    Arg f = f32(in("inv_freq", {HS / 2}, 0.3f, false));
    f.positive = true;
    c.args = {in("x", {s.B, s.T, H * HS}), f, out("y", {s.B, s.T, H * HS}), grad("dx", {s.B, s.T, H * HS}, false)};
    std::vector<int> first(size_t(s.B), pos0);
    if (per_row)
        for (int b = 0; b < s.B; b++) first[size_t(b)] = pos0 + 5 * b;
    const auto turn = [=](Backend& be, Tensor x, Tensor inv_freq, bool inverse) {
        if (per_row) return be.rope_rows(x, inv_freq, H, first, inverse);
        be.rope(x, inv_freq, H, pos0, inverse);
    };
    c.forward = [=](Backend& be, const Args& a) {
        be.convert(a["y"], a["x"]);  // the op works in place
        turn(be, a["y"], a["inv_freq"], false);
    };
    c.backward = [=](Backend& be, const Args& a) {
        be.convert(a["dx"], a["dy"]);
        turn(be, a["dx"], a["inv_freq"], true);
    };
    const int B = s.B, T = s.T;
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec y = h.at("x");
        const int half = HS / 2;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int hh = 0; hh < H; hh++)
                    for (int i = 0; i < half; i++) {
                        const size_t o = ((size_t(b) * T + t) * H + hh) * HS;
                        const double a = double(float(first[size_t(b)] + t) * h.at("inv_freq")[size_t(i)]);
                        const double x1 = h.at("x")[o + i], x2 = h.at("x")[o + i + half];
                        y[o + i] = float(x1 * std::cos(a) - x2 * std::sin(a));
                        y[o + i + half] = float(x2 * std::cos(a) + x1 * std::sin(a));
                    }
        want["y"] = y;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

OpCase swiglu(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * 3 * s.C + 5;
    c.name = fmt::format("swiglu n={}", n);
    c.args = {in("gate", {n}, 2.0f), in("up", {n}), out("out", {n}), grad("dgate", {n}, false), grad("dup", {n}, false)};
    c.forward = [](Backend& be, const Args& a) { be.swiglu_fwd(a["out"], a["gate"], a["up"]); };
    c.backward = [](Backend& be, const Args& a) {
        be.swiglu_bwd(a["dgate"], a["dup"], a["dout"], a["gate"], a["up"]);
    };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        Vec o(h.at("gate").size());
        for (size_t i = 0; i < o.size(); i++) {
            const double g = h.at("gate")[i];
            o[i] = float(g / (1.0 + std::exp(-g)) * h.at("up")[i]);
        }
        want["out"] = o;
    };
    c.fd_eps = 1e-3;
    return c;
}

// Grouped-query heads into attention's layout: NH query heads, KVH key/value heads, packed as KH heads.
OpCase qkv_pack_case(const OpSizes& s, int NH, int KVH, bool expand) {
    OpCase c;
    const int N = s.B * s.T, HS = s.C / s.NH, KH = expand ? NH : KVH;
    c.name = fmt::format("qkv_pack NH={} KVH={}{}", NH, KVH, expand ? " (repeated)" : "");
    c.args = {in("q", {N, NH * HS}), in("k", {N, KVH * HS}), in("v", {N, KVH * HS}),
              out("qkv", {N, (NH + 2 * KH) * HS}), grad("dq", {N, NH * HS}, false), grad("dk", {N, KVH * HS}, false),
              grad("dv", {N, KVH * HS}, false)};
    c.forward = [NH](Backend& be, const Args& a) { be.qkv_pack(a["qkv"], a["q"], a["k"], a["v"], NH); };
    c.backward = [NH](Backend& be, const Args& a) { be.qkv_unpack(a["dq"], a["dk"], a["dv"], a["dqkv"], NH); };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        const int W = (NH + 2 * KH) * HS, group = KH / KVH;
        Vec o(size_t(N) * W);
        for (int n = 0; n < N; n++)
            for (int hh = 0; hh < NH + 2 * KH; hh++)
                for (int d = 0; d < HS; d++) {
                    const char* src = hh < NH ? "q" : hh < NH + KH ? "k" : "v";
                    const int sh = hh < NH ? hh : (hh < NH + KH ? hh - NH : hh - NH - KH) / group;
                    const int sw = hh < NH ? NH : KVH;
                    o[size_t(n) * W + size_t(hh) * HS + d] = h.at(src)[(size_t(n) * sw + sh) * HS + d];
                }
        want["qkv"] = o;
    };
    c.reference_rtol = c.reference_atol = 0;
    return c;
}

OpCase layernorm(const OpSizes& s, int C, bool frozen) {
    OpCase c;
    const int N = s.B * s.T;
    c.name = fmt::format("layernorm C={}{}", C, frozen ? " (frozen gain and bias)" : "");
    Arg x = in("x", {N, C}, 2.0f);
    x.offset = 0.5f;  // rows with a nonzero mean
    c.args = {x, in("w", {C}, 1.0f, !frozen), in("b", {C}, 1.0f, !frozen), out("out", {N, C}),
              f32(out("mean", {N}, false)), f32(out("rstd", {N}, false)), grad("dx", {N, C}, true)};
    if (!frozen) c.args.insert(c.args.end(), {grad("dw", {C}, true), grad("db", {C}, true)});
    c.forward = [](Backend& be, const Args& a) {
        be.layernorm_fwd(a["out"], a["mean"], a["rstd"], a["x"], a["w"], a["b"]);
    };
    c.backward = [frozen](Backend& be, const Args& a) {
        be.layernorm_bwd(a["dx"], frozen ? Tensor{} : a["dw"], frozen ? Tensor{} : a["db"], a["dout"], a["x"], a["w"],
                         a["mean"], a["rstd"]);
    };
    c.reference = [N, C](const HostArgs& h, HostArgs& want) {
        Vec o(size_t(N) * C);
        for (int n = 0; n < N; n++) {
            double m = 0, v = 0;
            for (int k = 0; k < C; k++) m += h.at("x")[size_t(n) * C + k];
            m /= C;
            for (int k = 0; k < C; k++) v += std::pow(h.at("x")[size_t(n) * C + k] - m, 2);
            const double r = 1.0 / std::sqrt(v / C + 1e-5);
            for (int k = 0; k < C; k++)
                o[size_t(n) * C + k] = float((h.at("x")[size_t(n) * C + k] - m) * r * h.at("w")[size_t(k)] +
                                             h.at("b")[size_t(k)]);
        }
        want["out"] = o;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

OpCase matmul(const OpSizes& s, int OC, WLayout layout, bool bias, bool frozen_w) {
    OpCase c;
    const int N = s.B * s.T, C = s.C;
    c.name = fmt::format("matmul {}x{}>{} {}{}{}", N, C, OC, layout == WLayout::InOut ? "W(in,out)" : "W(out,in)",
                         bias ? " +bias" : "", frozen_w ? " (frozen weight)" : "");
    const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
    c.args = {in("x", {N, C}), in("w", ws, 0.5f, !frozen_w), out("out", {N, OC}), grad("dx", {N, C}, false)};
    if (!frozen_w) c.args.push_back(grad("dw", ws, true));
    if (bias) c.args.insert(c.args.end(), {in("b", {OC}), grad("db", {OC}, true)});
    c.forward = [layout, bias](Backend& be, const Args& a) {
        be.matmul_fwd(a["out"], a["x"], a["w"], layout, bias ? a["b"] : Tensor{}, {});
    };
    c.backward = [layout, bias, frozen_w](Backend& be, const Args& a) {
        be.matmul_bwd(a["dx"], frozen_w ? Tensor{} : a["dw"], bias ? a["db"] : Tensor{}, a["dout"], a["x"], a["w"],
                      layout, {});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        want["out"] = ref_matmul(h.at("x"), h.at("w"), bias ? &h.at("b") : nullptr, N, C, OC, layout);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = (frozen_w ? 4.0 : 6.0) * N * C * OC;  // forward, input gradient, weight gradient
    return c;
}

// matmul_fp8_fwd/_bwd: x and W in E4M3, the output gradient in E5M2. N, C and OC multiples of 16 take cuBLASLt's
// FP8 kernels on a GPU (bf16, f16); other shapes and f32 the same arithmetic on the rounded values.
OpCase matmul_fp8(int N, int C, int OC, WLayout layout, bool bias) {
    OpCase c;
    c.name = fmt::format("matmul fp8 {}x{}>{} {}{}", N, C, OC, layout == WLayout::InOut ? "W(in,out)" : "W(out,in)",
                         bias ? " +bias" : "");
    const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
    // no finite differences: the backward is FP8's (rounded operands), not the derivative of the rounded forward
    c.args = {in("x", {N, C}, 1.0f, false), in("w", ws, 0.5f, false), out("out", {N, OC}), grad("dx", {N, C}, false),
              grad("dw", ws, true)};
    if (bias) c.args.insert(c.args.end(), {in("b", {OC}, 1.0f, false), grad("db", {OC}, true)});
    c.forward = [layout, bias](Backend& be, const Args& a) {
        be.matmul_fp8_fwd(a["out"], a["x"], a["w"], layout, bias ? a["b"] : Tensor{}, {});
    };
    c.backward = [layout, bias](Backend& be, const Args& a) {
        be.matmul_fp8_bwd(a["dx"], a["dw"], bias ? a["db"] : Tensor{}, a["dout"], a["x"], a["w"], layout, {});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        const Fp8Grid e4(DType::F8E4M3), e5(DType::F8E5M2);
        const Vec x = e4.quantize(h.at("x")), w = e4.quantize(h.at("w")), dout = e5.quantize(h.at("dout"));
        want["out"] = ref_matmul(x, w, bias ? &h.at("b") : nullptr, N, C, OC, layout);
        // dx (N,C) = dout W^T: the same product with W read the other way round
        want["dx"] = ref_matmul(dout, w, nullptr, N, OC, C, layout == WLayout::InOut ? WLayout::OutIn : WLayout::InOut);
        Vec dw = h.at("dw");
        for (int i = 0; i < C; i++)
            for (int o = 0; o < OC; o++) {
                double s = 0;
                for (int n = 0; n < N; n++) s += double(x[size_t(n) * C + i]) * dout[size_t(n) * OC + o];
                dw[layout == WLayout::InOut ? size_t(i) * OC + o : size_t(o) * C + i] += float(s);
            }
        want["dw"] = dw;
        if (!bias) return;
        Vec db = h.at("db");  // from the unrounded gradient
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) db[size_t(o)] += h.at("dout")[size_t(n) * OC + o];
        want["db"] = db;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 6.0 * N * C * OC;
    return c;
}

// int8 weights (weight-only): W = q * scale[o], q uniform in [-127, 127], scales f32 per output channel. The
// backward is the input gradient only (an int8 weight is a frozen base). `N` rows: a few take the direct kernels,
// many the dequantized panels (several panels when C is wide).
Arg q8(std::string name, Shape s) {
    Arg a = arg(std::move(name), s, Role::Int);
    a.int_min = -127, a.int_max = 128;
    a.int_dtype = DType::I8;
    return a;
}
// q * scale[o] for a weight of C inputs and OC output channels in `layout`.
Vec dequant(const Vec& q, const Vec& scale, int C, int OC, WLayout layout) {
    Vec w(q.size());
    for (size_t i = 0; i < q.size(); i++) w[i] = q[i] * scale[layout == WLayout::InOut ? i % size_t(OC) : i / size_t(C)];
    return w;
}
Arg scales(std::string name, int n, float scale) {
    Arg a = f32(in(std::move(name), {n}, scale, false));
    a.positive = true;
    return a;
}

OpCase matmul_q8(int N, int C, int OC, WLayout layout, bool bias) {
    OpCase c;
    c.name = fmt::format("matmul int8 {}x{}>{} {}{}", N, C, OC, layout == WLayout::InOut ? "W(in,out)" : "W(out,in)",
                         bias ? " +bias" : "");
    const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
    const float sc = 1.0f / (127.0f * std::sqrt(float(C)));  // outputs of order one
    c.args = {in("x", {N, C}), q8("q", ws), scales("scale", OC, sc), out("out", {N, OC}), grad("dx", {N, C}, false)};
    if (bias) c.args.push_back(in("b", {OC}, 1.0f, false));
    c.forward = [layout, bias](Backend& be, const Args& a) {
        be.matmul_q8_fwd(a["out"], a["x"], a["q"], a["scale"], layout, bias ? a["b"] : Tensor{}, {});
    };
    c.backward = [layout](Backend& be, const Args& a) {
        be.matmul_q8_bwd(a["dx"], a["dout"], a["q"], a["scale"], layout, {});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        want["out"] = ref_matmul(h.at("x"), dequant(h.at("q"), h.at("scale"), C, OC, layout), bias ? &h.at("b") : nullptr,
                                 N, C, OC, layout);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 4.0 * N * C * OC;  // forward and input gradient
    return c;
}

// The MLP's pattern on int8 weights: h = gelu(x W1 + b1) through the fused epilogue, out = h W2 + b2, and the
// second product's input gradient taken through the GELU.
OpCase mlp_q8(int N, int C) {
    OpCase c;
    const int H = 4 * C;
    c.name = fmt::format("matmul+gelu MLP int8 {}x{}>{}>{}", N, C, H, C);
    c.args = {in("x", {N, C}),
              q8("q1", {C, H}),
              scales("s1", H, 1.0f / (127.0f * std::sqrt(float(C)))),
              in("b1", {H}, 1.0f, false),
              q8("q2", {H, C}),
              scales("s2", C, 1.0f / (127.0f * std::sqrt(float(H)))),
              in("b2", {C}, 1.0f, false),
              out("pre", {N, H}, false),
              out("h", {N, H}, false),
              out("out", {N, C}),
              grad("dpre", {N, H}, false),
              grad("dx", {N, C}, false)};
    c.forward = [](Backend& be, const Args& a) {
        be.matmul_q8_fwd(a["h"], a["x"], a["q1"], a["s1"], WLayout::InOut, a["b1"], a["pre"]);
        be.matmul_q8_fwd(a["out"], a["h"], a["q2"], a["s2"], WLayout::InOut, a["b2"], {});
    };
    c.backward = [](Backend& be, const Args& a) {
        be.matmul_q8_bwd(a["dpre"], a["dout"], a["q2"], a["s2"], WLayout::InOut, a["pre"]);
        be.matmul_q8_bwd(a["dx"], a["dpre"], a["q1"], a["s1"], WLayout::InOut, {});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        const Vec w1 = dequant(h.at("q1"), h.at("s1"), C, H, WLayout::InOut);
        const Vec w2 = dequant(h.at("q2"), h.at("s2"), H, C, WLayout::InOut);
        Vec pre = ref_matmul(h.at("x"), w1, &h.at("b1"), N, C, H, WLayout::InOut), act(pre.size());
        for (size_t i = 0; i < pre.size(); i++) act[i] = float(gelu(pre[i]));
        want["pre"] = pre;
        want["h"] = act;
        want["out"] = ref_matmul(act, w2, &h.at("b2"), N, H, C, WLayout::InOut);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-4;
    c.flops = 8.0 * N * C * H;
    return c;
}

// The int8 token table: out = q[token] * scale[token] + wpe[t]; no gradient.
OpCase embedding_q8(const OpSizes& s, bool positions) {
    OpCase c;
    const int B = s.B, T = s.T, C = s.C;
    c.name = fmt::format("embedding int8 C={}{}", C, positions ? "" : " (no positions)");
    c.args = {ids("tokens", {B, T}, 0, s.V), q8("q", {s.Vp, C}), scales("scale", s.Vp, 0.01f), out("out", {B, T, C})};
    if (positions) c.args.push_back(in("wpe", {T, C}, 1.0f, false));
    c.forward = [positions](Backend& be, const Args& a) {
        be.embedding_q8_fwd(a["out"], a["tokens"], a["q"], a["scale"], positions ? a["wpe"] : Tensor{});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec o(size_t(B) * T * C);
        for (int i = 0; i < B * T; i++) {
            const size_t tok = size_t(h.at("tokens")[size_t(i)]);
            for (int k = 0; k < C; k++)
                o[size_t(i) * C + k] = h.at("q")[tok * C + k] * h.at("scale")[tok] +
                                       (positions ? h.at("wpe")[size_t(i % T) * C + k] : 0.0f);
        }
        want["out"] = o;
    };
    return c;
}

// The MLP's pattern: h = gelu(x W1 + b1) through the fused epilogue, out = h W2 + b2; the second product's
// backward takes its input gradient through the GELU.
OpCase mlp(const OpSizes& s) {
    OpCase c;
    const int N = s.B * s.T, C = s.C, H = 4 * s.C;
    c.name = fmt::format("matmul+gelu MLP {}x{}>{}>{}", N, C, H, C);
    c.args = {in("x", {N, C}),
              in("w1", {C, H}, 0.5f),
              in("b1", {H}),
              in("w2", {H, C}, 0.5f),
              in("b2", {C}),
              out("pre", {N, H}, false),
              out("h", {N, H}, false),
              out("out", {N, C}),
              grad("dpre", {N, H}, false),
              grad("dx", {N, C}, false),
              grad("dw1", {C, H}, true),
              grad("db1", {H}, true),
              grad("dw2", {H, C}, true),
              grad("db2", {C}, true)};
    c.forward = [](Backend& be, const Args& a) {
        be.matmul_fwd(a["h"], a["x"], a["w1"], WLayout::InOut, a["b1"], a["pre"]);
        be.matmul_fwd(a["out"], a["h"], a["w2"], WLayout::InOut, a["b2"], {});
    };
    c.backward = [](Backend& be, const Args& a) {
        be.matmul_bwd(a["dpre"], a["dw2"], a["db2"], a["dout"], a["h"], a["w2"], WLayout::InOut, a["pre"]);
        be.matmul_bwd(a["dx"], a["dw1"], a["db1"], a["dpre"], a["x"], a["w1"], WLayout::InOut, {});
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec pre = ref_matmul(h.at("x"), h.at("w1"), &h.at("b1"), N, C, H, WLayout::InOut), act(pre.size());
        for (size_t i = 0; i < pre.size(); i++) act[i] = float(gelu(pre[i]));
        want["pre"] = pre;
        want["h"] = act;
        want["out"] = ref_matmul(act, h.at("w2"), &h.at("b2"), N, H, C, WLayout::InOut);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-4;
    c.flops = 12.0 * N * C * H;
    // x's gradient sums 128 hidden terms of order 1 that nearly cancel, while the float32 forward's rounding
    // moves the objective by ~2e-5 whatever the step: at a step of 1e-2 that noise, divided by the step, beat
    // the tolerance on 9 of 2000 seeds (ANVIL_TEST_SEED=126635836566685 read -0.01425 for -0.01148); at 5e-2,
    // Richardson's extrapolation still cancels the curvature, and 0 of 2000 failed.
    c.fd_eps = 5e-2;
    return c;
}

OpCase gelu_case(const OpSizes& s, int n, bool in_place) {
    OpCase c;
    c.name = fmt::format("gelu n={}{}", n, in_place ? " (backward in place)" : "");
    c.args = {in("x", {n}, 2.0f), out("out", {n}), grad("dx", {n}, false)};
    c.forward = [](Backend& be, const Args& a) { be.gelu_fwd(a["out"], a["x"]); };
    c.backward = [in_place](Backend& be, const Args& a) {
        if (!in_place) return be.gelu_bwd(a["dx"], a["dout"], a["x"]);
        be.convert(a["dx"], a["dout"]);  // a copy, then din = dout * gelu'(x) where din aliases dout
        be.gelu_bwd(a["dx"], a["dx"], a["x"]);
    };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        Vec o(h.at("x").size());
        for (size_t i = 0; i < o.size(); i++) o[i] = float(gelu(h.at("x")[i]));
        want["out"] = o;
    };
    c.fd_eps = 1e-3;
    (void)s;
    return c;
}

OpCase residual(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * s.C + 3;  // a tail past the last 16-byte pack
    c.name = fmt::format("residual n={}", n);
    c.args = {in("a", {n}), in("b", {n}), out("out", {n})};
    c.forward = [](Backend& be, const Args& a) { be.residual_fwd(a["out"], a["a"], a["b"]); };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        Vec o(h.at("a").size());
        for (size_t i = 0; i < o.size(); i++) o[i] = h.at("a")[i] + h.at("b")[i];
        want["out"] = o;
    };
    c.reference_rtol = c.reference_atol = 0;
    return c;
}

OpCase scale_case(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * s.C + 3;
    c.name = fmt::format("scale n={}", n);
    constexpr float kS = -0.375f;
    c.args = {in("x", {n}, 1.0f, false), out("y", {n})};
    c.forward = [](Backend& be, const Args& a) {
        be.convert(a["y"], a["x"]);  // the op works in place
        be.scale(a["y"], kS);
    };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        Vec y = h.at("x");
        for (float& v : y) v *= kS;
        want["y"] = y;
    };
    return c;
}

// Its own backward: the same mask on the gradient. The mask is a hash of (seed, element) on every backend.
OpCase dropout_case(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * 4 * s.C + 5;
    constexpr float kP = 0.3f;
    constexpr uint64_t kSeed = 0x1234abcd5678ull;
    c.name = fmt::format("dropout p={} n={}", kP, n);
    c.args = {in("x", {n}), out("y", {n}), grad("dx", {n}, false)};
    c.forward = [](Backend& be, const Args& a) { be.dropout(a["y"], a["x"], kP, kSeed); };
    c.backward = [](Backend& be, const Args& a) { be.dropout(a["dx"], a["dy"], kP, kSeed); };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        Vec y = h.at("x");
        size_t kept = 0;
        for (size_t i = 0; i < y.size(); i++) {
            const bool keep = dropout_keep(kSeed, i, dropout_threshold(kP));
            y[i] = keep ? y[i] / (1.0f - kP) : 0.0f;
            kept += keep;
        }
        EXPECT_NEAR(double(kept) / double(y.size()), 1.0 - kP, 0.01) << "the mask keeps 1 - p of the elements";
        want["y"] = y;
    };
    return c;
}

OpCase attention(const OpSizes& s, int B, int T, int NH, int HS) {
    OpCase c;
    const int C = NH * HS;
    c.name = fmt::format("attention B={} T={} NH={} HS={}", B, T, NH, HS);
    const AttnDims d{B, T, NH, HS};
    Arg saved = out("saved", {1}, false), scratch = out("scratch", {1}, false);
    saved.elems = [d](const Backend& be) { return int64_t(be.attention_saved_elems(d)); };
    scratch.elems = [d](const Backend& be) { return int64_t(be.attention_scratch_elems(d)); };
    saved.compare = scratch.compare = false;  // each backend keeps its own statistics
    c.args = {in("qkv", {B, T, 3 * C}), out("out", {B, T, C}), saved, scratch, grad("dqkv", {B, T, 3 * C}, false)};
    c.forward = [NH](Backend& be, const Args& a) { be.attention_fwd(a["out"], a["saved"], a["qkv"], NH); };
    c.backward = [NH](Backend& be, const Args& a) {
        be.attention_bwd(a["dqkv"], a["scratch"], a["dout"], a["qkv"], a["out"], a["saved"], NH);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) { want["out"] = ref_attention(h.at("qkv"), B, T, C, NH); };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 12.0 * B * double(T) * T * C;
    c.attention = true;
    (void)s;
    return c;
}

// Grouped-query attention as Llama runs it: q (NH heads), k and v (KVH heads) packed once each
// (qkv_pack), attention over the packed qkv, then the backward's per-query-head shares (B, T, 3C) summed back
// into dk and dv (qkv_unpack). Checked against multi-head attention on the key/value heads repeated.
OpCase attention_gqa(int B, int T, int NH, int KVH, int HS) {
    OpCase c;
    const int C = NH * HS, KC = KVH * HS, group = NH / KVH;
    c.name = fmt::format("attention_gqa B={} T={} NH={} KVH={} HS={}", B, T, NH, KVH, HS);
    const AttnDims d{B, T, NH, HS};
    Arg saved = out("saved", {1}, false), scratch = out("scratch", {1}, false);
    saved.elems = [d](const Backend& be) { return int64_t(be.attention_saved_elems(d)); };
    scratch.elems = [d](const Backend& be) { return int64_t(be.attention_scratch_elems(d)); };
    saved.compare = scratch.compare = false;  // each backend keeps its own statistics
    c.args = {in("q", {B, T, C}),
              in("k", {B, T, KC}),
              in("v", {B, T, KC}),
              out("qkv", {B, T, C + 2 * KC}, false),
              out("out", {B, T, C}),
              saved,
              scratch,
              out("shares", {B, T, 3 * C}, false),
              grad("dq", {B, T, C}, false),
              grad("dk", {B, T, KC}, false),
              grad("dv", {B, T, KC}, false)};
    c.forward = [NH](Backend& be, const Args& a) {
        be.qkv_pack(a["qkv"], a["q"], a["k"], a["v"], NH);
        be.attention_fwd(a["out"], a["saved"], a["qkv"], NH);
    };
    c.backward = [NH](Backend& be, const Args& a) {
        be.attention_bwd(a["shares"], a["scratch"], a["dout"], a["qkv"], a["out"], a["saved"], NH);
        be.qkv_unpack(a["dq"], a["dk"], a["dv"], a["shares"], NH);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec mha(size_t(B) * T * 3 * C);  // every query head with its own copy of its key/value head
        for (size_t r = 0; r < size_t(B) * T; r++)
            for (int hh = 0; hh < NH; hh++)
                for (int e = 0; e < HS; e++) {
                    const size_t at = r * 3 * C + size_t(hh) * HS + e,
                                 kv = r * KC + size_t(hh / group) * HS + e;
                    mha[at] = h.at("q")[r * C + size_t(hh) * HS + e];
                    mha[at + C] = h.at("k")[kv];
                    mha[at + 2 * C] = h.at("v")[kv];
                }
        want["out"] = ref_attention(mha, B, T, C, NH);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 12.0 * B * double(T) * T * C;
    c.attention = true;
    return c;
}

// Generation's incremental attention: a prompt, then one position at a time, appending to the caches. With
// KVH < NH, grouped-query: the caches hold KVH heads.
OpCase attention_cached(const OpSizes& s, int KVH) {
    OpCase c;
    const int T = std::min(s.T, 40), NH = s.NH, C = s.C, prefill = T / 3, HS = C / NH, KC = KVH * HS;
    const int W = C + 2 * KC;
    c.name = fmt::format("attention_cached T={} NH={} KVH={} C={}", T, NH, KVH, C);
    c.args = {in("qkv", {1, T, W}, 1.0f, false), out("out", {T, C}), out("k", {T, KC}, false),
              out("v", {T, KC}, false)};
    c.forward = [=](Backend& be, const Args& a) {
        for (int pos = 0; pos < T;) {
            const int n = pos == 0 ? prefill : 1;
            Tensor q = a["qkv"], o = a["out"];
            q.data = static_cast<char*>(q.data) + size_t(pos) * W * dtype_size(q.dtype);
            q.shape = Shape{n, W};
            o.data = static_cast<char*>(o.data) + size_t(pos) * C * dtype_size(o.dtype);
            o.shape = Shape{n, C};
            be.attention_cached(o, q, a["k"], a["v"], pos, NH);
            pos += n;
        }
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec mha(size_t(T) * 3 * C);  // each key/value head repeated for its query heads
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 3 * C; k++) {
                const int part = k / C, hh = (k % C) / HS, d = k % HS;
                const size_t src = part == 0 ? size_t(k) : size_t(C + (part - 1) * KC + (hh / (NH / KVH)) * HS + d);
                mha[size_t(t) * 3 * C + k] = h.at("qkv")[size_t(t) * W + src];
            }
        want["out"] = ref_attention(mha, 1, T, C, NH);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

// Continuous batching's decode step: B rows, each one new position in its own slot of the paged caches (P,
// page, KVH HS), in one call; slots out of order with one left idle, positions from 0 to the last. The slots'
// page tables are a shuffle of the pages (pages of 4 positions, so rows cross pages; some pages in no table).
// The caches' other positions hold earlier keys and values (drawn); the new ones must land at (slot, pos)'s
// page row and nowhere else. packed: a packed prefill beside decode rows: two pieces of prompts (rows of one
// slot at consecutive positions, one after cached positions, one from position 0) and two one-token rows.
OpCase attention_cached_rows(const OpSizes& s, int KVH, int B, int maxT, bool packed = false) {
    OpCase c;
    std::vector<int> slot(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
    for (int b = 0; b < B; b++) {
        slot[size_t(b)] = (B + 2 - b) % (B + 1);  // a permutation of B + 1 slots but one
        pos[size_t(b)] = b == 0 ? maxT - 1 : (b * 7) % maxT;
    }
    if (packed) {
        slot = {2, 2, 2, 2, 4, 3, 0, 0, 0};
        pos = {3, 4, 5, 6, maxT - 1, 2, 0, 1, 2};
        B = int(slot.size());
    }
    const int NH = s.NH, C = s.C, HS = C / NH, KC = KVH * HS, W = C + 2 * KC, group = NH / KVH;
    const int S = *std::max_element(slot.begin(), slot.end()) + 2;
    constexpr int page = 4;
    const int PPS = (maxT + page - 1) / page, P = S * PPS + 3;
    std::vector<int> table(static_cast<size_t>(P));
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 shuffle{uint32_t(P)};
    std::shuffle(table.begin(), table.end(), shuffle);
    table.resize(size_t(S) * PPS);
    const auto row = [=](int sl, int p) {
        return size_t(table[size_t(sl) * PPS + size_t(p / page)]) * page + size_t(p % page);
    };
    c.name = fmt::format("attention_cached_rows{} B={} maxT={} NH={} KVH={} C={} pages={}x{}",
                         packed ? "_packed" : "", B, maxT, NH, KVH, C, P, page);
    Arg pages = ids("pages", {S, PPS}, 0, P);
    pages.fixed_ints = table;
    c.args = {in("qkv", {B, W}, 1.0f, false), out("out", {B, C}), arg("k", {P, page, KC}, Role::InOut),
              arg("v", {P, page, KC}, Role::InOut), pages};
    c.forward = [=](Backend& be, const Args& a) {
        be.attention_cached_rows(a["out"], a["qkv"], a["k"], a["v"], a["pages"], slot, pos, NH);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec k = h.at("k"), v = h.at("v"), out(size_t(B) * C);
        const Vec& qkv = h.at("qkv");
        for (int b = 0; b < B; b++)
            for (int j = 0; j < KC; j++) {
                const size_t at = row(slot[size_t(b)], pos[size_t(b)]) * KC + size_t(j);
                k[at] = qkv[size_t(b) * W + C + j];
                v[at] = qkv[size_t(b) * W + C + KC + j];
            }
        std::vector<double> p(static_cast<size_t>(maxT));
        for (int b = 0; b < B; b++)
            for (int hh = 0; hh < NH; hh++) {
                const size_t head = size_t(hh / group) * HS;
                const int last = pos[size_t(b)], sl = slot[size_t(b)];
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= last; j++) {
                    double sc = 0;
                    for (int d = 0; d < HS; d++)
                        sc +=
                            double(qkv[size_t(b) * W + size_t(hh) * HS + d]) * k[row(sl, j) * KC + head + d];
                    p[size_t(j)] = sc / std::sqrt(double(HS));
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (int j = 0; j <= last; j++) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j <= last; j++) o += p[size_t(j)] / sum * v[row(sl, j) * KC + head + d];
                    out[size_t(b) * C + size_t(hh) * HS + d] = float(o);
                }
            }
        want["out"] = out, want["k"] = k, want["v"] = v;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

// A decode step's learned positions: row b of out gets row rows[b] of the table added (rows out of order, a
// repeat, the first and the last).
OpCase embedding_rows_add_case(const OpSizes& s) {
    OpCase c;
    const int B = 5, C = s.C, R = s.T;
    const std::vector<int> rows = {R - 1, 0, 3 % R, 3 % R, R / 2};
    c.name = fmt::format("embedding_rows_add B={} C={} R={}", B, C, R);
    c.args = {in("table", {R, C}, 1.0f, false), arg("out", {B, C}, Role::InOut)};
    c.forward = [=](Backend& be, const Args& a) { be.embedding_rows_add(a["out"], a["table"], rows); };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec out = h.at("out");
        for (int b = 0; b < B; b++)
            for (int k = 0; k < C; k++)
                out[size_t(b) * C + k] += h.at("table")[size_t(rows[size_t(b)]) * C + k];
        want["out"] = out;
    };
    return c;
}

// A server's log-probabilities of rows of logits: the target's and the K likeliest (ties to the lower id,
// which bf16's and f16's rounding makes common), from a reference that sorts every id.
OpCase token_logprobs_case(int N, int V, int Vp, int K) {
    OpCase c;
    c.name = fmt::format("token_logprobs N={} V={} (padded to {}) top {}", N, V, Vp, K);
    Arg top_ids = out("top_ids", {N, K}, false);
    top_ids.ints = true;
    c.args = {in("logits", {N, Vp}, 3.0f, false), ids("targets", {N}, 0, V), f32(out("lp", {N}, false)),
              top_ids, f32(out("top_lp", {N, K}, false))};
    c.forward = [V](Backend& be, const Args& a) {
        be.token_logprobs(a["lp"], a["top_ids"], a["top_lp"], a["logits"], a["targets"], V);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec lp(static_cast<size_t>(N)), ids(size_t(N) * K), top(size_t(N) * K);
        for (int n = 0; n < N; n++) {
            const float* row = &h.at("logits")[size_t(n) * Vp];
            double mx = -1e300, sum = 0;
            for (int j = 0; j < V; j++) mx = std::max(mx, double(row[j]));
            for (int j = 0; j < V; j++) sum += std::exp(row[j] - mx);
            const double lse = mx + std::log(sum);
            lp[size_t(n)] = float(row[int(h.at("targets")[size_t(n)])] - lse);
            std::vector<int> order(static_cast<size_t>(V));
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
            for (int k = 0; k < K; k++) {
                ids[size_t(n) * K + k] = float(order[size_t(k)]);
                top[size_t(n) * K + k] = float(row[order[size_t(k)]] - lse);
            }
        }
        want["lp"] = lp, want["top_ids"] = ids, want["top_lp"] = top;
    };
    return c;
}

OpCase classifier(const OpSizes& s) {
    OpCase c;
    const int N = s.B * s.T, V = s.V, Vp = s.Vp;
    constexpr float kDloss = 0.37f;
    c.name = fmt::format("classifier N={} V={} (padded to {})", N, V, Vp);
    Arg losses = f32(out("losses", {N}));
    losses.seed_const = kDloss;  // the op takes one scalar for d(sum of losses)
    c.args = {in("logits", {N, Vp}, 3.0f), ids("targets", {N}, -1, V), losses, f32(out("losses2", {N}, false)),
              grad("dlogits", {N, Vp}, false)};
    c.forward = [V](Backend& be, const Args& a) { be.classifier(a["losses"], a["logits"], a["targets"], 0.0f, V); };
    c.backward = [V](Backend& be, const Args& a) {
        be.convert(a["dlogits"], a["logits"]);  // the op writes the gradient over the logits it is given
        be.classifier(a["losses2"], a["dlogits"], a["targets"], kDloss, V);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {  // -log softmax over the real columns
        Vec l(static_cast<size_t>(N));
        for (int n = 0; n < N; n++) {
            const int t = int(h.at("targets")[size_t(n)]);
            if (t < 0) continue;  // ignored rows lose nothing
            const float* row = &h.at("logits")[size_t(n) * Vp];
            double mx = -1e300, sum = 0;
            for (int j = 0; j < V; j++) mx = std::max(mx, double(row[j]));
            for (int j = 0; j < V; j++) sum += std::exp(row[j] - mx);
            l[size_t(n)] = float(mx + std::log(sum) - row[t]);
        }
        want["losses"] = l;
    };
    c.fd_atol = 1e-3;
    return c;
}

OpCase global_norm(const OpSizes& s) {
    OpCase c;
    c.name = "global_norm_sq";
    c.args = {in("g1", {s.B * s.T, s.C}, 1.0f, false), in("g2", {s.C + 5}, 1.0f, false), f32(out("nsq", {1}, false))};
    c.forward = [](Backend& be, const Args& a) { be.global_norm_sq(a["nsq"], {a["g1"], a["g2"]}); };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        double sum = 0;
        for (const char* k : {"g1", "g2"})
            for (float x : h.at(k)) sum += double(x) * x;
        want["nsq"] = {float(sum)};
    };
    c.reference_rtol = 1e-5;
    return c;
}

// AdamW as PyTorch computes it, with decoupled decay on one tensor, gradients scaled by 1/8 and clipped.
OpCase adamw(const OpSizes& s) {
    OpCase c;
    const int N = s.B * s.T, C = s.C;
    c.name = "adamw (with clipping)";
    auto state = [](std::string n, Shape sh, bool positive) {
        Arg a = arg(std::move(n), sh, Role::InOut);
        a.f32 = true;  // the moments are f32 at every precision (the master-weight path: CudaBackend tests)
        a.scale = 0.1f;
        a.positive = positive;
        return a;
    };
    const Arg p1 = arg("p1", {N, C}, Role::InOut), p2 = arg("p2", {C}, Role::InOut);
    c.args = {p1, p2, in("g1", {N, C}, 8.0f, false), in("g2", {C}, 8.0f, false), state("m1", {N, C}, false),
              state("m2", {C}, false), state("v1", {N, C}, true), state("v2", {C}, true), f32(out("nsq", {1}, false))};
    struct Hyper {
        float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.125f, clip = 1.0f;
        int step = 3;
    };
    c.forward = [](Backend& be, const Args& a) {
        const Hyper hp;
        be.global_norm_sq(a["nsq"], {a["g1"], a["g2"]});
        AdamWArgs args;
        args.lr = hp.lr, args.beta1 = hp.b1, args.beta2 = hp.b2, args.eps = hp.eps, args.step = hp.step;
        args.grad_scale = hp.scale, args.max_grad_norm = hp.clip;
        be.adamw({ParamSlot{a["p1"], a["g1"], a["m1"], a["v1"], {}, hp.wd}, ParamSlot{a["p2"], a["g2"], a["m2"], a["v2"], {}, 0.0f}},
                 args, a["nsq"]);
    };
    c.reference = [](const HostArgs& h, HostArgs& want) {
        const Hyper hp;
        double nsq = 0;
        for (const char* k : {"g1", "g2"})
            for (float x : h.at(k)) nsq += double(x) * x;
        const double norm = std::sqrt(nsq) * hp.scale;
        const double scale = hp.scale * (norm > hp.clip ? hp.clip / (norm + 1e-6) : 1.0);
        for (const char* k : {"1", "2"}) {
            Vec p = h.at(std::string("p") + k), m = h.at(std::string("m") + k), v = h.at(std::string("v") + k);
            const Vec& g = h.at(std::string("g") + k);
            const double wd = k[0] == '1' ? hp.wd : 0.0;
            for (size_t i = 0; i < p.size(); i++) {
                const double gi = g[i] * scale;
                const double mi = hp.b1 * m[i] + (1 - hp.b1) * gi, vi = hp.b2 * v[i] + (1 - hp.b2) * gi * gi;
                const double bc1 = 1 - std::pow(hp.b1, hp.step), bc2 = 1 - std::pow(hp.b2, hp.step);
                p[i] = float(p[i] * (1 - hp.lr * wd) - hp.lr * (mi / bc1) / (std::sqrt(vi / bc2) + hp.eps));
                m[i] = float(mi), v[i] = float(vi);
            }
            want[std::string("p") + k] = p, want[std::string("m") + k] = m, want[std::string("v") + k] = v;
        }
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-6;
    c.low_precision = false;
    return c;
}

OpCase convert(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * s.C + 7;
    c.name = fmt::format("convert n={} from f32", n);
    c.args = {f32(in("x", {n}, 100.0f, false)), out("y", {n}, false)};
    c.forward = [](Backend& be, const Args& a) { be.convert(a["y"], a["x"]); };
    c.reference = [](const HostArgs& h, HostArgs& want) { want["y"] = h.at("x"); };
    c.reference_rtol = c.reference_atol = 0;
    return c;
}

}  // namespace

std::vector<OpCase> op_cases(const OpSizes& s) {
    const int N = s.B * s.T;
    std::vector<OpCase> t = {
        embedding(s, s.C, false),
        embedding(s, s.C * 5 / 8 + 1, false),  // a width that is not a whole number of 16-byte packs
        embedding(s, s.C, true),
        layernorm(s, s.C, false),
        layernorm(s, s.C + 1, false),
        layernorm(s, s.C, true),
        matmul(s, 3 * s.C, WLayout::InOut, true, false),
        matmul(s, s.C + 8, WLayout::OutIn, false, false),
        matmul(s, s.Vp, WLayout::OutIn, false, false),  // the tied classifier's product
        matmul(s, 4 * s.C, WLayout::InOut, true, true),
        mlp(s),
        matmul_fp8(s.B * 16, s.C, 3 * s.C, WLayout::InOut, true),  // multiples of 16: the FP8 kernels
        matmul_fp8(s.B * 16, s.C, s.C + 16, WLayout::OutIn, false),
        matmul_fp8(N, s.C, s.C + 8, WLayout::InOut, true),  // not: the same arithmetic in the activations' dtype
        matmul_q8(3, s.C, 3 * s.C, WLayout::InOut, true),  // decoding: the direct kernels
        matmul_q8(1, s.C + 8, s.Vp, WLayout::OutIn, false),
        mlp_q8(5, s.C),
        matmul_q8(N, s.C, 3 * s.C, WLayout::InOut, true),  // many rows: dequantized panels
        matmul_q8(N, s.C, s.Vp, WLayout::OutIn, false),
        mlp_q8(N, s.C),
        matmul_q8(N, 2048, 1100, WLayout::InOut, true),  // wide: three panels
        matmul_q8(N, 2048, 1100, WLayout::OutIn, false),
        embedding_q8(s, true),
        embedding_q8(s, false),
        gelu_case(s, N * 4 * s.C, false),
        gelu_case(s, N * 4 * s.C + 5, true),
        residual(s),
        scale_case(s),
        dropout_case(s),
        attention(s, s.B, s.T, s.NH, s.C / s.NH),
        attention_cached(s, s.NH),
        attention_cached(s, s.NH / 2),
        attention_cached_rows(s, s.NH, 4, std::min(s.T, 40)),
        attention_cached_rows(s, s.NH / 2, 4, std::min(s.T, 40)),
        attention_cached_rows(s, s.NH / 2, 0, std::min(s.T, 40), true),
        embedding_tokens(s, s.C),
        embedding_rows_add_case(s),
        rmsnorm(s, s.C, false),
        rmsnorm(s, s.C + 1, false),
        rmsnorm(s, s.C, true),
        rope_case(s, s.NH, s.C / s.NH, 0),
        rope_case(s, 2, 16, 7),
        rope_case(s, 2, 16, 7, true),
        swiglu(s),
        qkv_pack_case(s, s.NH, s.NH / 2, true),
        qkv_pack_case(s, s.NH, s.NH / 2, false),
        qkv_pack_case(s, s.NH, s.NH, true),
        classifier(s),
        token_logprobs_case(std::min(s.B * s.T, 1024), s.V, s.Vp, 5),
        token_logprobs_case(3, s.V, s.Vp, 0),
        global_norm(s),
        adamw(s),
        convert(s),
    };
    if (s.T <= 64) {  // the tests: attention shapes the CUDA kernels treat differently (tiles, head sizes)
        t.push_back(attention(s, 1, 70, 2, 16));
        t.push_back(attention(s, 2, 33, 1, 80));
        t.push_back(attention(s, 1, 130, 2, 64));     // tensor cores: three tiles of 64, the last one partial
        t.push_back(attention(s, 2, 40, 2, 20));      // rows not whole 16-byte packs: element loads
        t.push_back(attention_gqa(2, 70, 4, 2, 16));  // key/value heads shared by two query heads
        t.push_back(attention_gqa(1, 130, 4, 1, 64));  // one key/value head for four: tensor-core tiles
        t.push_back(attention_gqa(2, 40, 6, 2, 20));   // groups of three, rows not whole 16-byte packs
        t.push_back(attention_cached_rows(s, s.NH / 2, 300, 6));  // past the rows one CUDA launch takes
        t.push_back(token_logprobs_case(2, 50257, 50304, 20));    // GPT-2's vocabulary, OpenAI's most
    }
    return t;
}

}  // namespace anvil::test
