// Every op's backward against central finite differences of its forward, on the CPU backend (the spec).
// Inputs are fresh random draws each run (seed printed on failure, ANVIL_TEST_SEED replays one).
#include <cmath>

#include "backend/cpu/vec_math.h"
#include "harness.h"

namespace anvil::test {
namespace {

class OpsGrad : public ::testing::Test {
protected:
    void SetUp() override {
        be = make_backend({Device::CPU, 2, 0});
        gen.seed(test_seed());
    }
    std::unique_ptr<Backend> be;
    std::mt19937_64 gen;
};

constexpr double kEps = 1e-2, kRtol = 2e-2, kAtol = 2e-3;

TEST_F(OpsGrad, Embedding) {
    const int B = 2, T = 5, C = 6, V = 7;
    std::vector<int32_t> tok(B * T);
    for (auto& t : tok) t = int32_t(gen() % V);
    std::vector<float> wte = randn(gen, V * C), wpe = randn(gen, T * C), r = randn(gen, B * T * C);
    DevTensor dtok = upload_i32(*be, tok, {B, T});
    auto loss = [&] {
        DevTensor out(*be, {B, T, C});
        DevTensor w = upload(*be, wte, {V, C}), p = upload(*be, wpe, {T, C});
        be->embedding_fwd(out, dtok, w, p);
        return dot(download(*be, out), r);
    };
    DevTensor dw(*be, {V, C}), dp(*be, {T, C});
    DevTensor dout = upload(*be, r, {B, T, C});
    be->embedding_bwd(dw, dp, dout, dtok);
    EXPECT_TRUE(check_grad(wte, download(*be, dw), loss, "wte", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(wpe, download(*be, dp), loss, "wpe", kEps, kRtol, kAtol));
}

TEST_F(OpsGrad, LayerNorm) {
    const int N = 6, C = 16;
    std::vector<float> x = randn(gen, N * C, 2.0f), w = randn(gen, C), b = randn(gen, C),
                       r = randn(gen, N * C);
    for (int i = 0; i < N * C; i++) x[size_t(i)] += 0.5f * float(i % C);  // nonzero mean per row
    DevTensor mean(*be, {N}), rstd(*be, {N});
    auto loss = [&] {
        DevTensor out(*be, {N, C});
        be->layernorm_fwd(out, mean, rstd, upload(*be, x, {N, C}), upload(*be, w, {C}), upload(*be, b, {C}));
        return dot(download(*be, out), r);
    };
    loss();
    const std::vector<float> din0 = randn(gen, N * C);  // din accumulates: start from something nonzero
    DevTensor din = upload(*be, din0, {N, C}), dw(*be, {C}), db(*be, {C});
    be->layernorm_bwd(din, dw, db, upload(*be, r, {N, C}), upload(*be, x, {N, C}), upload(*be, w, {C}), mean,
                      rstd);
    std::vector<float> g = download(*be, din);
    for (size_t i = 0; i < g.size(); i++) g[i] -= din0[i];
    EXPECT_TRUE(check_grad(x, g, loss, "layernorm x", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(w, download(*be, dw), loss, "layernorm w", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(b, download(*be, db), loss, "layernorm b", kEps, kRtol, kAtol));
}

class MatmulGrad : public OpsGrad, public ::testing::WithParamInterface<WLayout> {};

TEST_P(MatmulGrad, WithBias) {
    const WLayout layout = GetParam();
    const int N = 5, C = 8, OC = 12;
    const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
    std::vector<float> x = randn(gen, N * C), w = randn(gen, C * OC, 0.5f), b = randn(gen, OC),
                       r = randn(gen, N * OC);
    auto loss = [&] {
        DevTensor out(*be, {N, OC});
        be->matmul_fwd(out, upload(*be, x, {N, C}), upload(*be, w, ws), layout, upload(*be, b, {OC}), {});
        return dot(download(*be, out), r);
    };
    const std::vector<float> dw0 = randn(gen, C * OC), db0 = randn(gen, OC);  // parameter grads accumulate
    DevTensor dx(*be, {N, C}), dw = upload(*be, dw0, ws), db = upload(*be, db0, {OC});
    be->matmul_bwd(dx, dw, db, upload(*be, r, {N, OC}), upload(*be, x, {N, C}), upload(*be, w, ws), layout,
                   {});
    std::vector<float> gw = download(*be, dw), gb = download(*be, db);
    for (size_t i = 0; i < gw.size(); i++) gw[i] -= dw0[i];
    for (size_t i = 0; i < gb.size(); i++) gb[i] -= db0[i];
    EXPECT_TRUE(check_grad(x, download(*be, dx), loss, "matmul x", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(w, gw, loss, "matmul w", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(b, gb, loss, "matmul bias", kEps, kRtol, kAtol));
}

INSTANTIATE_TEST_SUITE_P(Layouts, MatmulGrad, ::testing::Values(WLayout::InOut, WLayout::OutIn));

// The MLP pattern: h = gelu(x W1 + b1) through the fused epilogue, y = h W2 + b2; the second backward
// takes its input gradient through the GELU.
TEST_F(OpsGrad, MatmulGeluEpilogue) {
    const int N = 4, C = 6, H = 10, OC = 5;
    std::vector<float> x = randn(gen, N * C), w1 = randn(gen, C * H, 0.5f), b1 = randn(gen, H);
    std::vector<float> w2 = randn(gen, H * OC, 0.5f), b2 = randn(gen, OC), r = randn(gen, N * OC);
    DevTensor pre(*be, {N, H}), h(*be, {N, H});
    auto loss = [&] {
        DevTensor out(*be, {N, OC});
        be->matmul_fwd(h, upload(*be, x, {N, C}), upload(*be, w1, {C, H}), WLayout::InOut,
                       upload(*be, b1, {H}), pre);
        be->matmul_fwd(out, h, upload(*be, w2, {H, OC}), WLayout::InOut, upload(*be, b2, {OC}), {});
        return dot(download(*be, out), r);
    };
    loss();
    DevTensor dpre(*be, {N, H}), dx(*be, {N, C}), dw1(*be, {C, H}), db1(*be, {H}), dw2(*be, {H, OC}),
        db2(*be, {OC});
    DevTensor W1 = upload(*be, w1, {C, H}), W2 = upload(*be, w2, {H, OC});
    be->matmul_bwd(dpre, dw2, db2, upload(*be, r, {N, OC}), h, W2, WLayout::InOut, pre);
    be->matmul_bwd(dx, dw1, db1, dpre, upload(*be, x, {N, C}), W1, WLayout::InOut, {});
    EXPECT_TRUE(check_grad(x, download(*be, dx), loss, "mlp x", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(w1, download(*be, dw1), loss, "mlp w1", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(b1, download(*be, db1), loss, "mlp b1", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(w2, download(*be, dw2), loss, "mlp w2", kEps, kRtol, kAtol));
    EXPECT_TRUE(check_grad(b2, download(*be, db2), loss, "mlp b2", kEps, kRtol, kAtol));
}

TEST_F(OpsGrad, Gelu) {
    const int n = 64;
    std::vector<float> x = randn(gen, n, 2.0f), r = randn(gen, n);
    auto loss = [&] {
        DevTensor out(*be, {n});
        be->gelu_fwd(out, upload(*be, x, {n}));
        return dot(download(*be, out), r);
    };
    DevTensor dx(*be, {n});
    be->gelu_bwd(dx, upload(*be, r, {n}), upload(*be, x, {n}));
    EXPECT_TRUE(check_grad(x, download(*be, dx), loss, "gelu", 1e-3, kRtol, kAtol));
    // forward against the closed form in double
    DevTensor out(*be, {n});
    be->gelu_fwd(out, upload(*be, x, {n}));
    std::vector<float> ref(n);
    for (int i = 0; i < n; i++) {
        const double v = x[size_t(i)];
        ref[size_t(i)] = float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    }
    EXPECT_TRUE(all_close(download(*be, out), ref, 1e-6, 1e-6, "gelu forward"));
}

TEST_F(OpsGrad, ExpApprox) {
    for (float x = -87.0f; x < 88.0f; x += 0.37f) {
        const double want = std::exp(double(x));
        EXPECT_NEAR(cpu::vexp(x) / want, 1.0, 3e-7) << "x=" << x;
    }
}

TEST_F(OpsGrad, Attention) {
    const int B = 2, T = 6, C = 8, NH = 2;
    std::vector<float> qkv = randn(gen, B * T * 3 * C), r = randn(gen, B * T * C);
    const AttnDims ad{B, T, NH, C / NH};
    DevTensor saved(*be, {int64_t(be->attention_saved_elems(ad))});
    DevTensor scratch(*be, {int64_t(be->attention_scratch_elems(ad))});
    DevTensor out(*be, {B, T, C});
    auto loss = [&] {
        be->attention_fwd(out, saved, upload(*be, qkv, {B, T, 3 * C}), NH);
        return dot(download(*be, out), r);
    };
    loss();
    DevTensor dqkv(*be, {B, T, 3 * C});
    be->attention_bwd(dqkv, scratch, upload(*be, r, {B, T, C}), upload(*be, qkv, {B, T, 3 * C}), out, saved,
                      NH);
    EXPECT_TRUE(check_grad(qkv, download(*be, dqkv), loss, "attention qkv", kEps, kRtol, kAtol));
}

// Causality and the reference semantics: out[t] must not change when later positions change.
TEST_F(OpsGrad, AttentionIsCausal) {
    const int B = 1, T = 7, C = 8, NH = 2;
    std::vector<float> qkv = randn(gen, B * T * 3 * C);
    const AttnDims ad{B, T, NH, C / NH};
    DevTensor saved(*be, {int64_t(be->attention_saved_elems(ad))}), out(*be, {B, T, C});
    be->attention_fwd(out, saved, upload(*be, qkv, {B, T, 3 * C}), NH);
    const std::vector<float> a = download(*be, out);
    for (int c = 0; c < 3 * C; c++)
        qkv[size_t((T - 1) * 3 * C + c)] += 1.0f;  // change only the last position
    be->attention_fwd(out, saved, upload(*be, qkv, {B, T, 3 * C}), NH);
    const std::vector<float> b = download(*be, out);
    for (int i = 0; i < (T - 1) * C; i++) EXPECT_EQ(a[size_t(i)], b[size_t(i)]) << "position " << i / C;
}

// The KV-cached path gives the same outputs as the batch forward: prefill then one position at a time.
TEST_F(OpsGrad, AttentionCachedMatchesForward) {
    const int T = 9, C = 12, NH = 3, prefill = 4;
    std::vector<float> qkv = randn(gen, T * 3 * C);
    const AttnDims ad{1, T, NH, C / NH};
    DevTensor saved(*be, {int64_t(be->attention_saved_elems(ad))}), full(*be, {1, T, C});
    be->attention_fwd(full, saved, upload(*be, qkv, {1, T, 3 * C}), NH);
    DevTensor kc(*be, {T, C}), vc(*be, {T, C});
    std::vector<float> got;
    for (int pos = 0; pos < T;) {
        const int n = pos == 0 ? prefill : 1;
        std::vector<float> part(qkv.begin() + pos * 3 * C, qkv.begin() + (pos + n) * 3 * C);
        DevTensor out(*be, {n, C});
        be->attention_cached(out, upload(*be, part, {n, 3 * C}), kc, vc, pos, NH);
        const auto o = download(*be, out);
        got.insert(got.end(), o.begin(), o.end());
        pos += n;
    }
    EXPECT_TRUE(all_close(got, download(*be, full), 1e-5, 1e-6, "cached attention"));
}

TEST_F(OpsGrad, Residual) {
    const int n = 33;
    const std::vector<float> a = randn(gen, n), b = randn(gen, n);
    DevTensor out(*be, {n});
    be->residual_fwd(out, upload(*be, a, {n}), upload(*be, b, {n}));
    std::vector<float> want(n);
    for (int i = 0; i < n; i++) want[size_t(i)] = a[size_t(i)] + b[size_t(i)];
    EXPECT_TRUE(all_close(download(*be, out), want, 0, 0, "residual"));
}

TEST_F(OpsGrad, Classifier) {
    const int N = 6, Vp = 12, V = 10;  // two padded columns
    std::vector<float> logits = randn(gen, N * Vp, 3.0f);
    std::vector<int32_t> tgt(N);
    for (auto& t : tgt) t = int32_t(gen() % V);
    tgt[2] = -1;  // ignored row
    DevTensor dt = upload_i32(*be, tgt, {N});
    const float dloss = 0.37f;
    auto losses_of = [&](const std::vector<float>& lg) {
        DevTensor l(*be, {N}), x = upload(*be, lg, {N, Vp});
        be->classifier(l, x, dt, 0.0f, V);
        return download(*be, l);
    };
    auto loss = [&] {
        double s = 0.0;
        for (float v : losses_of(logits)) s += v;
        return s * dloss;
    };
    // forward against log-softmax in double over the real columns
    const std::vector<float> got = losses_of(logits);
    for (int n = 0; n < N; n++) {
        if (tgt[size_t(n)] < 0) {
            EXPECT_EQ(got[size_t(n)], 0.0f);
            continue;
        }
        double mx = -1e300, s = 0.0;
        for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[size_t(n * Vp + j)]));
        for (int j = 0; j < V; j++) s += std::exp(double(logits[size_t(n * Vp + j)]) - mx);
        EXPECT_NEAR(got[size_t(n)], mx + std::log(s) - logits[size_t(n * Vp + tgt[size_t(n)])], 1e-5);
    }
    DevTensor l(*be, {N}), x = upload(*be, logits, {N, Vp});
    be->classifier(l, x, dt, dloss, V);
    const std::vector<float> g = download(*be, x);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) EXPECT_EQ(g[size_t(n * Vp + j)], 0.0f) << "padded column";
    for (int j = 0; j < Vp; j++) EXPECT_EQ(g[size_t(2 * Vp + j)], 0.0f) << "ignored row";
    EXPECT_TRUE(check_grad(logits, g, loss, "classifier", 1e-2, kRtol, 1e-3));
}

}  // namespace
}  // namespace anvil::test
