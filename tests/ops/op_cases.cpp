// The op table: every Backend op as a case (op_cases.h); the products and attention have files of their own
// (op_case_parts.h). Host references are written from the op contract in backend/backend.h, in double.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "op_case_parts.h"

#include <gtest/gtest.h>

#include "backend/dropout_mask.h"

namespace anvil::test {

using namespace cases;

namespace {

OpCase embedding(const OpSizes& s, int C, bool frozen_wte) {
    OpCase c;
    c.name = fmt::format("embedding C={}{}", C, frozen_wte ? " (frozen token table)" : "");
    c.args = {ids("tokens", {s.B, s.T}, 0, s.V), in("wte", {s.Vp, C}, 1.0f, !frozen_wte), in("wpe", {s.T, C}),
              out("out", {s.B, s.T, C}), grad("dwpe", {s.T, C}, true)};
    if (!frozen_wte) c.args.push_back(grad("dwte", {s.Vp, C}, true));
    c.forward = [](Backend& be, const Args& a) {
        be.embedding_fwd(a["out"], a["tokens"], a["wte"], a["wpe"]);
    };
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
            for (int k = 0; k < C; k++)
                o[size_t(i) * C + k] = h.at("wte")[size_t(h.at("tokens")[size_t(i)]) * C + k];
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

// x (rows, W) rotated in place by the reference's rotation: columns [first, first + H HS) of every row, row r
// at position first_pos[r / T] + r % T.
void ref_rope(Vec& x, const Vec& inv_freq, const std::vector<int>& first_pos, int T, int W, int first, int H,
              int HS) {
    const int half = HS / 2;
    for (size_t r = 0; r < x.size() / size_t(W); r++)
        for (int hh = 0; hh < H; hh++)
            for (int i = 0; i < half; i++) {
                const size_t o = r * size_t(W) + size_t(first) + size_t(hh) * HS;
                const int pos = first_pos[r / size_t(T)] + int(r % size_t(T));
                const double a = double(float(pos) * inv_freq[size_t(i)]);
                const double x1 = x[o + i], x2 = x[o + i + half];
                x[o + i] = float(x1 * std::cos(a) - x2 * std::sin(a));
                x[o + i + half] = float(x2 * std::cos(a) + x1 * std::sin(a));
            }
}

// Rotary embedding on (B, T, H*HS) at positions pos0..; its backward is the inverse rotation of the gradient.
// per_row: rope_rows with row b at pos0 + 5 b (a decode step's rows at their own positions)
OpCase rope_case(const OpSizes& s, int H, int HS, int pos0, bool per_row = false) {
    OpCase c;
    c.name = fmt::format("rope{} H={} HS={} pos0={}", per_row ? "_rows" : "", H, HS, pos0);
    Arg f = f32(in("inv_freq", {HS / 2}, 0.3f, false));
    f.positive = true;
    c.args = {in("x", {s.B, s.T, H * HS}), f, out("y", {s.B, s.T, H * HS}),
              grad("dx", {s.B, s.T, H * HS}, false)};
    std::vector<int> first(size_t(s.B), pos0);
    if (per_row) {
        for (int b = 0; b < s.B; b++) first[size_t(b)] = pos0 + 5 * b;
        Arg pos = ids("pos", {s.B}, 0, pos0 + 5 * s.B);
        pos.fixed_ints = first;
        c.args.push_back(pos);
    }
    const auto turn = [=](Backend& be, const Args& a, Tensor x, bool inverse) {
        if (per_row) return be.rope_rows(x, a["inv_freq"], H, a["pos"], inverse);
        be.rope(x, a["inv_freq"], H, pos0, inverse);
    };
    c.forward = [=](Backend& be, const Args& a) {
        be.convert(a["y"], a["x"]);  // the op works in place
        turn(be, a, a["y"], false);
    };
    c.backward = [=](Backend& be, const Args& a) {
        be.convert(a["dx"], a["dy"]);
        turn(be, a, a["dx"], true);
    };
    const int T = s.T;
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec y = h.at("x");
        ref_rope(y, h.at("inv_freq"), first, T, H * HS, 0, H, HS);
        want["y"] = y;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

// rope on a strided view, as the model turns q and k inside the packed qkv: columns [first, first + H HS) of
// x (B, T, W) in place, the rest untouched.
OpCase rope_strided(const OpSizes& s, int H, int HS, int first, int W, bool per_row) {
    OpCase c;
    c.name =
        fmt::format("rope{} H={} HS={} strided: columns {}.. of {}", per_row ? "_rows" : "", H, HS, first, W);
    Arg f = f32(in("inv_freq", {HS / 2}, 0.3f, false));
    f.positive = true;
    c.args = {f, arg("x", {s.B, s.T, W}, Role::InOut)};
    std::vector<int> pos(size_t(s.B), 3);
    if (per_row) {
        for (int b = 0; b < s.B; b++) pos[size_t(b)] = 3 + 7 * b;
        Arg p = ids("pos", {s.B}, 0, 3 + 7 * s.B);
        p.fixed_ints = pos;
        c.args.push_back(p);
    }
    c.forward = [=](Backend& be, const Args& a) {
        const Tensor x = a["x"].cols(first, H * HS);
        if (per_row) return be.rope_rows(x, a["inv_freq"], H, a["pos"], false);
        be.rope(x, a["inv_freq"], H, pos[0], false);
    };
    const int T = s.T;
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec x = h.at("x");
        ref_rope(x, h.at("inv_freq"), pos, T, W, first, H, HS);
        want["x"] = x;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

OpCase swiglu(const OpSizes& s) {
    OpCase c;
    const int n = s.B * s.T * 3 * s.C + 5;
    c.name = fmt::format("swiglu n={}", n);
    c.args = {in("gate", {n}, 2.0f), in("up", {n}), out("out", {n}), grad("dgate", {n}, false),
              grad("dup", {n}, false)};
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

// SwiGLU on strided views, as Llama's gate and up projections run as one product (LinearGroup): gate and up
// are columns [g0, g0 + H) and [u0, u0 + H) of gu (N, W), their gradients the same columns of dgu, whose
// other columns must stay as drawn; the forward's output and the backward's seed are contiguous.
OpCase swiglu_strided(const OpSizes& s, int H, int g0, int u0, int W) {
    OpCase c;
    const int N = s.B * s.T;
    c.name = fmt::format("swiglu strided: gate columns {}.., up {}.. of {} (H={})", g0, u0, W, H);
    c.args = {in("gu", {N, W}, 2.0f, false), in("dout", {N, H}, 1.0f, false), out("out", {N, H}),
              arg("dgu", {N, W}, Role::InOut)};
    c.forward = [=](Backend& be, const Args& a) {
        const Tensor gu = a["gu"], dgu = a["dgu"];
        be.swiglu_fwd(a["out"], gu.cols(g0, H), gu.cols(u0, H));
        be.swiglu_bwd(dgu.cols(g0, H), dgu.cols(u0, H), a["dout"], gu.cols(g0, H), gu.cols(u0, H));
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        const Vec &gu = h.at("gu"), &dout = h.at("dout");
        Vec o(size_t(N) * H), dgu = h.at("dgu");
        for (int n = 0; n < N; n++)
            for (int j = 0; j < H; j++) {
                const double g = gu[size_t(n) * W + g0 + j], u = gu[size_t(n) * W + u0 + j],
                             d = dout[size_t(n) * H + j], sg = 1.0 / (1.0 + std::exp(-g));
                o[size_t(n) * H + j] = float(g * sg * u);
                dgu[size_t(n) * W + g0 + j] = float(d * u * sg * (1.0 + g * (1.0 - sg)));
                dgu[size_t(n) * W + u0 + j] = float(d * g * sg);
            }
        want["out"] = o, want["dgu"] = dgu;
    };
    return c;
}

OpCase layernorm(const OpSizes& s, int C, bool frozen, int rows = 0) {
    OpCase c;
    const int N = rows > 0 ? rows : s.B * s.T;
    c.name = fmt::format("layernorm C={}{}{}", C, rows > 0 ? fmt::format(" N={}", N) : "",
                         frozen ? " (frozen gain and bias)" : "");
    Arg x = in("x", {N, C}, 2.0f);
    x.offset = 0.5f;  // rows with a nonzero mean
    c.args = {x,
              in("w", {C}, 1.0f, !frozen),
              in("b", {C}, 1.0f, !frozen),
              out("out", {N, C}),
              f32(out("mean", {N}, false)),
              f32(out("rstd", {N}, false)),
              grad("dx", {N, C}, true)};
    if (!frozen) c.args.insert(c.args.end(), {grad("dw", {C}, true), grad("db", {C}, true)});
    c.forward = [](Backend& be, const Args& a) {
        be.layernorm_fwd(a["out"], a["mean"], a["rstd"], a["x"], a["w"], a["b"]);
    };
    c.backward = [frozen](Backend& be, const Args& a) {
        be.layernorm_bwd(a["dx"], frozen ? Tensor{} : a["dw"], frozen ? Tensor{} : a["db"], a["dout"], a["x"],
                         a["w"], a["mean"], a["rstd"]);
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

// The residual add fused into the norm after it: sum = a + b, out = norm(sum) (LayerNorm, or RMSNorm without
// mean and bias). Its backward is the norm's on the stored sum, accumulated into d(sum): the gradient of a
// and of b.
OpCase add_norm(const OpSizes& s, int C, bool rms) {
    OpCase c;
    const int N = s.B * s.T;
    constexpr float kRmsEps = 1e-6f;
    c.name = fmt::format("add+{} C={}", rms ? "rmsnorm" : "layernorm", C);
    Arg x = in("a", {N, C}, 2.0f);
    x.offset = 0.5f;  // rows with a nonzero mean
    Arg w = in("w", {C}, 0.5f);
    w.offset = 1.0f;
    // the statistics are the stored (rounded) sum's
    const auto stat = [](const char* name, int n) {
        Arg a = f32(out(name, {n}, false));
        a.of_rounded = true;
        return a;
    };
    c.args = {x,
              in("b", {N, C}),
              w,
              out("sum", {N, C}),
              out("out", {N, C}),
              stat("rstd", N),
              grad("da", {N, C}, false),
              grad("db", {N, C}, false),
              grad("dw", {C}, true)};
    if (!rms) c.args.insert(c.args.end(), {in("bias", {C}), stat("mean", N), grad("dbias", {C}, true)});
    const float eps = rms ? kRmsEps : 1e-5f;
    c.forward = [rms, eps](Backend& be, const Args& a) {
        be.add_norm_fwd(a["sum"], a["out"], rms ? Tensor{} : a["mean"], a["rstd"], a["a"], a["b"], a["w"],
                        rms ? Tensor{} : a["bias"], eps);
    };
    c.backward = [rms](Backend& be, const Args& a) {
        be.convert(a["da"], a["dsum"]);  // d(sum) from above, plus the norm's
        if (rms)
            be.rmsnorm_bwd(a["da"], a["dw"], a["dout"], a["sum"], a["w"], a["rstd"]);
        else
            be.layernorm_bwd(a["da"], a["dw"], a["dbias"], a["dout"], a["sum"], a["w"], a["mean"], a["rstd"]);
        be.convert(a["db"], a["da"]);
    };
    c.reference = [N, C, rms, eps](const HostArgs& h, HostArgs& want) {
        Vec sum(size_t(N) * C), o(size_t(N) * C);
        for (size_t i = 0; i < sum.size(); i++) sum[i] = h.at("a")[i] + h.at("b")[i];
        for (int n = 0; n < N; n++) {
            const float* x = sum.data() + size_t(n) * C;
            double m = 0, v = 0;
            if (!rms) {
                for (int k = 0; k < C; k++) m += x[k];
                m /= C;
            }
            for (int k = 0; k < C; k++) v += std::pow(x[k] - m, 2);
            const double r = 1.0 / std::sqrt(v / C + eps);
            for (int k = 0; k < C; k++)
                o[size_t(n) * C + k] =
                    float((x[k] - m) * r * h.at("w")[size_t(k)] + (rms ? 0.0 : h.at("bias")[size_t(k)]));
        }
        want["sum"] = sum;
        want["out"] = o;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
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

// The residual add on strided views, as a LoRA adapter adds its delta into a projection's columns of the
// packed qkv: out[:, first:first+C] += a, the rest untouched; b read through a view of its own.
OpCase residual_strided(const OpSizes& s, int first, int W) {
    OpCase c;
    const int N = s.B * s.T, C = s.C + 3;
    c.name = fmt::format("residual strided: columns {}..{} of {}", first, first + C, W);
    c.args = {in("a", {N, C + 5}), arg("out", {N, W}, Role::InOut)};
    c.forward = [=](Backend& be, const Args& a) {
        const Tensor o = a["out"].cols(first, C);
        be.residual_fwd(o, o, a["a"].cols(5, C));
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec o = h.at("out");
        for (int n = 0; n < N; n++)
            for (int j = 0; j < C; j++)
                o[size_t(n) * W + first + j] += h.at("a")[size_t(n) * (C + 5) + 5 + j];
        want["out"] = o;
    };
    c.reference_rtol = c.reference_atol = 0;
    return c;
}

// A product case whose output `name` (rows, OC) is written into columns [first, first + OC) of a wider (rows,
// W) tensor, as the QKV split's projections write the packed qkv: the rest must stay as drawn. The backward
// (unchanged) reads its seed as an input; the gradients were checked by finite differences in the plain case.
OpCase strided_output(OpCase c, const std::string& name, int first, int W) {
    auto at = std::find_if(c.args.begin(), c.args.end(), [&](const Arg& a) { return a.name == name; });
    ANVIL_CHECK(at != c.args.end() && at->role == Role::Out, "strided_output: {} is not an output", name);
    const Shape plain = at->shape;
    const int64_t OC = plain[plain.ndim - 1], R = plain.numel() / OC;
    const bool seeded = bool(c.backward) && at->loss;
    Arg wide = arg(name + "_wide", plain, Role::InOut);
    wide.shape.dims[size_t(plain.ndim - 1)] = W;
    *at = wide;
    if (seeded) c.args.push_back(in("d" + name, plain, 1.0f, false));
    for (Arg& a : c.args) a.diff = false;
    c.name += fmt::format(" strided: columns {}.. of {}", first, W);
    const auto forward = c.forward;
    c.forward = [=](Backend& be, const Args& a) {
        Args v = a;
        v.t[name] = a[name + "_wide"].cols(first, OC);
        forward(be, v);
    };
    if (c.reference) {
        const auto reference = c.reference;
        c.reference = [=](const HostArgs& h, HostArgs& want) {
            reference(h, want);
            Vec w = h.at(name + "_wide");
            const Vec& o = want.at(name);
            for (int64_t r = 0; r < R; r++)
                for (int64_t j = 0; j < OC; j++) w[size_t(r * W + first + j)] = o[size_t(r * OC + j)];
            want.erase(name);
            want[name + "_wide"] = w;
        };
    }
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
        EXPECT_NEAR(double(kept) / double(y.size()), 1.0 - kP, 0.01)
            << "the mask keeps 1 - p of the elements";
        want["y"] = y;
    };
    return c;
}

// NEFTune's noise on embeddings: rows of records of several lengths (1 among them), each position's noise
// uniform within +-alpha / sqrt(len C), from the same hash on every backend. Its backward is the identity.
OpCase neftune_case(const OpSizes& s, int C) {
    OpCase c;
    const int B = s.B, T = s.T;
    constexpr float kAlpha = 5.0f;
    constexpr uint64_t kSeed = 0x5eed0fa11ull;
    std::vector<int> lens;  // (B, T): each position's record length, records of 1, 3, 5, ... tokens cut at T
    for (int b = 0; b < B; b++)
        for (int t = 0, L = 1 + 2 * b; t < T; L += 2) {
            const int n = std::min(L, T - t);
            lens.insert(lens.end(), size_t(n), n);
            t += n;
        }
    c.name = fmt::format("neftune_noise alpha={} B={} T={} C={}", kAlpha, B, T, C);
    Arg lengths = ids("lengths", {B, T}, 1, T + 1);
    lengths.fixed_ints = lens;
    c.args = {lengths, arg("out", {B, T, C}, Role::InOut)};
    c.forward = [](Backend& be, const Args& a) { be.neftune_noise(a["out"], a["lengths"], kAlpha, kSeed); };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec out = h.at("out");
        double sum = 0, sq = 0;
        for (size_t r = 0; r < lens.size(); r++) {
            const float scale = kAlpha / std::sqrt(float(lens[r]) * float(C));
            for (size_t i = r * size_t(C); i < (r + 1) * size_t(C); i++) {
                const float u = counter_uniform_pm1(kSeed, i);
                EXPECT_TRUE(u >= -1.0f && u < 1.0f) << "noise " << u << " at " << i;
                out[i] += u * scale;
                sum += u, sq += double(u) * u;
            }
        }
        const double n = double(out.size());
        EXPECT_NEAR(sum / n, 0.0, 0.1) << "the noise is centred";
        EXPECT_NEAR(sq / n, 1.0 / 3.0, 0.05) << "uniform on [-1, 1): variance 1/3";
        want["out"] = out;
    };
    return c;
}

// A decode step's learned positions: row b of out gets row rows[b] of the table added (rows out of order, a
// repeat, the first and the last).
OpCase embedding_rows_add_case(const OpSizes& s) {
    OpCase c;
    const int B = 5, C = s.C, R = s.T;
    const std::vector<int> rows = {R - 1, 0, 3 % R, 3 % R, R / 2};
    c.name = fmt::format("embedding_rows_add B={} C={} R={}", B, C, R);
    Arg r = ids("rows", {B}, 0, R);
    r.fixed_ints = rows;
    c.args = {in("table", {R, C}, 1.0f, false), arg("out", {B, C}, Role::InOut), r};
    c.forward = [=](Backend& be, const Args& a) { be.embedding_rows_add(a["out"], a["table"], a["rows"]); };
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

OpCase classifier(const OpSizes& s, int V, int Vp) {
    OpCase c;
    const int N = s.B * s.T;
    constexpr float kDloss = 0.37f;
    c.name = fmt::format("classifier N={} V={} (padded to {})", N, V, Vp);
    Arg losses = f32(out("losses", {N}));
    losses.seed_const = kDloss;  // the op takes one scalar for d(sum of losses)
    c.args = {in("logits", {N, Vp}, 3.0f), ids("targets", {N}, -1, V), losses,
              f32(out("losses2", {N}, false)), grad("dlogits", {N, Vp}, false)};
    c.forward = [V](Backend& be, const Args& a) {
        be.classifier(a["losses"], a["logits"], a["targets"], 0.0f, V);
    };
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
    c.args = {in("g1", {s.B * s.T, s.C}, 1.0f, false), in("g2", {s.C + 5}, 1.0f, false),
              f32(out("nsq", {1}, false))};
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
    // the second tensor not a whole number of 4-element packs: the kernels' element-by-element tail
    const Arg p1 = arg("p1", {N, C}, Role::InOut), p2 = arg("p2", {C + 3}, Role::InOut);
    c.args = {p1,
              p2,
              in("g1", {N, C}, 8.0f, false),
              in("g2", {C + 3}, 8.0f, false),
              state("m1", {N, C}, false),
              state("m2", {C + 3}, false),
              state("v1", {N, C}, true),
              state("v2", {C + 3}, true),
              f32(out("nsq", {1}, false))};
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
        be.adamw({ParamSlot{a["p1"], a["g1"], a["m1"], a["v1"], {}, hp.wd},
                  ParamSlot{a["p2"], a["g2"], a["m2"], a["v2"], {}, 0.0f}},
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
            Vec p = h.at(std::string("p") + k), m = h.at(std::string("m") + k),
                v = h.at(std::string("v") + k);
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

bool few_row_float_product(const OpCase& c) {
    return c.product_rows >= 1 && c.product_rows <= 8 && c.name.find("int8") == std::string::npos &&
           c.name.find("fp8") == std::string::npos;
}

std::vector<OpCase> op_cases(const OpSizes& s) {
    const int N = s.B * s.T;
    const auto rows = [&](int n, int C) {  // a product over n rows of width C
        OpSizes z = s;
        z.B = 1, z.T = n, z.C = C;
        return z;
    };
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
        // the QKV split: a projection's output as columns of the packed qkv
        strided_output(matmul(s, s.C, WLayout::OutIn, true, false), "out", 0, 2 * s.C),
        strided_output(matmul(s, s.C / 2, WLayout::OutIn, false, false), "out", s.C, 2 * s.C),
        strided_output(matmul(s, s.C + 8, WLayout::InOut, true, false), "out", 3, 2 * s.C + 16),
        mlp(s, true),
        mlp(s, false),
        // decoding's products, a token a row (cuBLASLt, or the CUDA backend's direct kernels with
        // BackendOptions::direct_products): c_attn at one row and at eight, the tied classifier, the MLP
        matmul(rows(1, s.C), 3 * s.C, WLayout::InOut, true, false),
        matmul(rows(8, s.C), 3 * s.C, WLayout::InOut, true, false),
        matmul(rows(1, s.C), s.Vp, WLayout::OutIn, false, false),
        mlp(rows(1, s.C), true),
        // multiples of 16: the FP8 kernels; at a model's sizes (the op bench) all N rows, so its time stands
        // beside the bf16 product's of the same shape above
        matmul_fp8(N % 16 == 0 ? N : s.B * 16, s.C, 3 * s.C, WLayout::InOut, true),
        matmul_fp8(s.B * 16, s.C, s.C + 16, WLayout::OutIn, false),
        matmul_fp8(N, s.C, s.C + 8, WLayout::InOut,
                   true),  // not: the same arithmetic in the activations' dtype
        strided_output(matmul_fp8(s.B * 16, s.C, s.C, WLayout::OutIn, true), "out", s.C / 2, 2 * s.C),
        strided_output(matmul_fp8(N, s.C, s.C + 8, WLayout::OutIn, false), "out", 8, 2 * s.C + 16),
        matmul_q8(3, s.C, 3 * s.C, WLayout::InOut, true),  // decoding: the direct kernels
        matmul_q8(1, s.C + 8, s.Vp, WLayout::OutIn, false),
        matmul_q8(1, s.C, s.Vp, WLayout::OutIn, false),  // the tied classifier's rows whole 16-byte runs
        mlp_q8(5, s.C),
        matmul_q8(N, s.C, 3 * s.C, WLayout::InOut, true),  // many rows: dequantized panels
        matmul_q8(N, s.C, s.Vp, WLayout::OutIn, false),
        strided_output(matmul_q8(3, s.C, s.C, WLayout::OutIn, true), "out", s.C / 2, 2 * s.C),  // direct
        strided_output(matmul_q8(2, s.C, s.C, WLayout::InOut, false), "out", 0, 2 * s.C),
        strided_output(matmul_q8(N, s.C, s.C, WLayout::OutIn, true), "out", s.C, 2 * s.C),  // panels
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
        neftune_case(s, s.C),
        neftune_case(s, s.C + 1),  // not whole 16-byte packs
        attention(s, s.B, s.T, s.NH, s.C / s.NH),
        attention(s, s.B, s.T, s.NH, s.C / s.NH, {0.25f, 77, 0}),
        attention_cached(s, s.NH),
        attention_cached(s, s.NH / 2),
        attention_cached_rows(s, s.NH, 4, std::min(s.T, 40)),
        attention_cached_rows(s, s.NH / 2, 4, std::min(s.T, 40)),
        attention_cached_rows(s, s.NH / 2, 4, std::min(s.T, 40), false, false),  // the write kernel's path
        attention_cached_rows(s, s.NH / 2, 0, std::min(s.T, 40), true),
        embedding_tokens(s, s.C),
        embedding_rows_add_case(s),
        rmsnorm(s, s.C, false),
        rmsnorm(s, s.C + 1, false),
        rmsnorm(s, s.C, true),
        add_norm(s, s.C, false),
        add_norm(s, s.C + 1, false),  // not whole 16-byte packs: the kernel's element-wise walk
        add_norm(s, s.C, true),
        add_norm(s, s.C + 1, true),
        rope_case(s, s.NH, s.C / s.NH, 0),
        rope_case(s, 2, 16, 7),
        rope_case(s, 2, 16, 7, true),
        rope_strided(s, 2, 16, 0, 2 * 16 + 2 * 16, false),  // q in [q | k | v]: GQA, one key/value head
        rope_strided(s, 1, 16, 32, 64, true),               // k, a decode step's rows
        residual_strided(s, 7, s.C + 20),
        swiglu(s),
        swiglu_strided(s, 2 * s.C, 0, 2 * s.C, 4 * s.C),       // [gate | up], whole packs
        swiglu_strided(s, s.C + 3, 1, s.C + 9, 2 * s.C + 16),  // odd widths and offsets: element by element
        qkv_unpack_case(s, s.NH, s.NH / 2, true),
        qkv_unpack_case(s, s.NH, s.NH / 2, false),
        qkv_unpack_case(s, s.NH, s.NH, true),
        qkv_unpack_case(s, s.NH, s.NH / 2, true, true),
        classifier(s, s.V, s.Vp),
        token_logprobs_case(std::min(s.B * s.T, 1024), s.V, s.Vp, 5),
        token_logprobs_case(3, s.V, s.Vp, 0),
        global_norm(s),
        adamw(s),
        convert(s),
    };
    if (s.T > 64) {  // the benchmarks: attention at llm.c's micro-batch too, where the kernels fill the card
        t.push_back(attention(s, 64, s.T, s.NH, s.C / s.NH));
        // and a serving decode step: 64 sequences in flight, one new token each, up to s.T positions cached
        t.push_back(attention_cached_rows(s, s.NH, 64, s.T));
    }
    if (s.T <= 64) {  // the tests: attention shapes the CUDA kernels treat differently (tiles, head sizes)
        // CUDA's fused norm backward (rows of up to 32 P packs, P a lane: LayerNorm's P <= 5, RMSNorm's 8),
        // rows over several chunks, the last one short: 512 is P = 2 in 16-bit types and 4 in f32; 768 is
        // bf16/f16's P = 3 (GPT-2 124M)
        t.push_back(layernorm(s, 512, false, 200));
        t.push_back(layernorm(s, 768, false, 130));
        // the norms from registers (up to 8 packs a lane) at wider rows: 1280 is GPT-2 774M's five 16-bit
        // packs a lane, LayerNorm's widest fused backward; 1600 (GPT-2 1.5B) is 200 packs, the seventh on 8
        // lanes only (its backward unfused); 2048 (the Llama 1B-class) eight, RMSNorm's widest fused
        // backward, and in f32 past the registers' reach
        t.push_back(layernorm(s, 1280, false, 40));
        t.push_back(add_norm(s, 1600, false));
        t.push_back(add_norm(s, 2048, true));
        t.push_back(rmsnorm(s, 2048, false));
        // the direct kernels' paths (gemv.cu): W (OC, C) rows of 129 (bf16, f16) or 258 (f32) 16-byte runs
        // (four loads in flight a lane, then the rest) and rows not whole runs (36 wide in 16-bit types; 40
        // of int8); W (C, OC) rows cut into four slices that the strip's last block adds, a strip of 8
        // columns short of 32, and 100 columns (not whole 8-column loads: plain); an output strided in qkv
        t.push_back(matmul(rows(1, 1032), 24, WLayout::OutIn, true, false));
        t.push_back(matmul(rows(2, 36), 20, WLayout::OutIn, false, false));
        t.push_back(matmul(rows(5, 1024), 64, WLayout::InOut, true, false));
        t.push_back(matmul(rows(3, 40), 72, WLayout::InOut, false, false));
        t.push_back(matmul(rows(7, 300), 100, WLayout::InOut, true, false));
        t.push_back(strided_output(matmul(rows(4, 64), 40, WLayout::OutIn, true, false), "out", 16, 72));
        t.push_back(mlp(rows(8, 64), true));
        t.push_back(matmul_q8(2, 2128, 40, WLayout::OutIn, true));
        t.push_back(matmul_q8(4, 1024, 200, WLayout::InOut, false));
        t.push_back(matmul_q8(6, 1024, 96, WLayout::OutIn, false));
        t.push_back(attention(s, 1, 70, 2, 16));
        t.push_back(attention(s, 2, 33, 1, 80));
        t.push_back(attention(s, 1, 130, 2, 64));     // tensor cores: three tiles of 64, the last one partial
        t.push_back(attention(s, 2, 40, 2, 20));      // rows not whole 16-byte packs: element loads
        t.push_back(attention(s, 1, 40, 2, 25));      // an odd head size: the last column pair half outside
        t.push_back(attention_gqa(2, 70, 4, 2, 16));  // key/value heads shared by two query heads
        t.push_back(attention_gqa(1, 130, 4, 1, 64));  // one key/value head for four: tensor-core tiles
        t.push_back(attention_gqa(2, 40, 6, 2, 20));   // groups of three, rows not whole 16-byte packs
        // dropout on the probabilities: every path's mask, a rank's heads numbered from head0 (tensor
        // parallel)
        t.push_back(attention(s, 1, 130, 2, 64, {0.3f, 5, 3}));
        t.push_back(attention(s, 2, 40, 2, 20, {0.2f, 9, 0}));
        t.push_back(attention_gqa(2, 70, 4, 2, 16, {0.25f, 11, 1}));
        t.push_back(attention_cached_rows(s, s.NH / 2, 300, 6));  // past the rows one CUDA launch takes
        // decoding at the head sizes the CUDA kernel loads as whole vectors (32, 64, 128: a lane's 4, 8, 16
        // dimensions) and at one it does not (20), over more keys than its sixteen groups take in one step
        const auto sized = [&](int C, int NH, int B = 0, int T = 0) {
            OpSizes z = s;
            z.C = C, z.NH = NH;
            if (B > 0) z.B = B, z.T = T;
            return z;
        };
        t.push_back(attention_cached(sized(128, 2), 1, 70));
        t.push_back(attention_cached(sized(64, 2), 2, 40));
        t.push_back(attention_cached(sized(256, 2), 1, 40));
        t.push_back(attention_cached(sized(40, 2), 1, 40));
        t.push_back(attention_cached_rows(sized(256, 4), 2, 5, 70));
        t.push_back(token_logprobs_case(2, 50257, 50304, 20));  // GPT-2's vocabulary, OpenAI's most
        // the loss at GPT-2's vocabulary: each thread's packs four loads at a time, a row in shared memory in
        // 16-bit types, the last real pack partly padding
        t.push_back(classifier(sized(s.C, s.NH, 1, 3), 50257, 50304));
        t.push_back(classifier(s, s.V, s.V));  // rows not all 16-byte aligned: the CUDA kernel's element path
        // whole 32 x 64 tiles: the CUDA backend's packed transposing FP8 rounding
        t.push_back(matmul_fp8(64, 64, 128, WLayout::InOut, true));
        t.push_back(matmul_fp8(64, 128, 64, WLayout::OutIn, false));
        t.push_back(token_logprobs_case(5, s.V, s.V, 3));
        // four tiles of 64, every warp's rows real: more tiles than the flash kernels keep in flight (head
        // size 80: one stage in flight in the backward on Ada's shared memory)
        t.push_back(attention(s, 1, 200, 2, 80));
    }
    return t;
}

}  // namespace anvil::test
