// Every CUDA op against the CPU backend (the spec) on fresh random inputs, in f32, bf16 and f16. Outputs
// are poisoned with NaN first so every element must be written; accumulated outputs (parameter gradients,
// layernorm's din) start from random values on both sides. The seed is printed on failure and
// ANVIL_TEST_SEED replays it.
#include <cmath>

#include "gpu_harness.h"

namespace anvil::test {
namespace {

class CudaOps : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { gen.seed(test_seed() ^ uint64_t(GetParam())); }
    DType dt() const { return GetParam(); }
    Tol tol() const { return tol_for(GetParam()); }
    // Random values already rounded to the dtype under test.
    std::vector<float> rnd(size_t n, float scale = 1.0f) { return rounded(randn(gen, n, scale), dt()); }
    Backend& cpu() { return *be.cpu; }
    Backend& gpu() { return *be.gpu; }
    Backends be;
    std::mt19937_64 gen;
};

TEST_P(CudaOps, Embedding) {
    for (int C : {64, 20}) {  // a multiple of a 16-byte pack, and not
        SCOPED_TRACE("C=" + std::to_string(C));
        const int B = 3, T = 37, V = 50;
        std::vector<int32_t> tok(B * T);
        for (auto& t : tok) t = int32_t(gen() % 7 == 0 ? 3 : gen() % V);  // token 3 repeats often
        const std::vector<float> wte = rnd(size_t(V) * C), wpe = rnd(size_t(T) * C),
                                 dout = rnd(size_t(B) * T * C);
        const std::vector<float> dwte0 = rnd(size_t(V) * C), dwpe0 = rnd(size_t(T) * C);

        DevTensor out_c(cpu(), {B, T, C}), dwte_c = upload(cpu(), dwte0, {V, C}),
                                           dwpe_c = upload(cpu(), dwpe0, {T, C});
        DevTensor tok_c = upload_i32(cpu(), tok, {B, T});
        cpu().embedding_fwd(out_c, tok_c, upload(cpu(), wte, {V, C}), upload(cpu(), wpe, {T, C}));
        cpu().embedding_bwd(dwte_c, dwpe_c, upload(cpu(), dout, {B, T, C}), tok_c);

        DevTensor out_g = poisoned(gpu(), {B, T, C}, dt()), tok_g = upload_i32(gpu(), tok, {B, T});
        gpu().embedding_fwd(out_g, tok_g, put(gpu(), wte, {V, C}, dt()), put(gpu(), wpe, {T, C}, dt()));
        EXPECT_TRUE(close(get(gpu(), out_g), download(cpu(), out_c), tol(), "embedding out"));
        DevTensor dout_g = put(gpu(), dout, {B, T, C}, dt());
        std::vector<uint8_t> first_dwte;
        for (int run = 0; run < 2; run++) {  // twice: the backward must be bitwise deterministic
            DevTensor dwte_g = put(gpu(), dwte0, {V, C}, dt()), dwpe_g = put(gpu(), dwpe0, {T, C}, dt());
            gpu().embedding_bwd(dwte_g, dwpe_g, dout_g, tok_g);
            if (run == 0) {
                EXPECT_TRUE(close(get(gpu(), dwte_g), download(cpu(), dwte_c), tol(), "embedding dwte"));
                EXPECT_TRUE(close(get(gpu(), dwpe_g), download(cpu(), dwpe_c), tol(), "embedding dwpe"));
                first_dwte = bytes(gpu(), dwte_g);
            } else {
                EXPECT_TRUE(first_dwte == bytes(gpu(), dwte_g)) << "embedding backward is not deterministic";
            }
        }
    }
}

TEST_P(CudaOps, LayerNorm) {
    for (int C : {768, 33}) {
        SCOPED_TRACE("C=" + std::to_string(C));
        const int N = 70;
        std::vector<float> x = randn(gen, size_t(N) * C, 2.0f);
        for (size_t i = 0; i < x.size(); i++) x[i] += 0.3f * float(i % 5);  // rows with nonzero means
        x = rounded(x, dt());
        const std::vector<float> w = rnd(size_t(C)), b = rnd(size_t(C)), dout = rnd(size_t(N) * C);
        const std::vector<float> din0 = rnd(size_t(N) * C), dw0 = rnd(size_t(C)), db0 = rnd(size_t(C));

        DevTensor out_c(cpu(), {N, C}), mean_c(cpu(), {N}), rstd_c(cpu(), {N});
        DevTensor x_c = upload(cpu(), x, {N, C}), w_c = upload(cpu(), w, {C});
        cpu().layernorm_fwd(out_c, mean_c, rstd_c, x_c, w_c, upload(cpu(), b, {C}));
        DevTensor din_c = upload(cpu(), din0, {N, C}), dw_c = upload(cpu(), dw0, {C}),
                  db_c = upload(cpu(), db0, {C});
        cpu().layernorm_bwd(din_c, dw_c, db_c, upload(cpu(), dout, {N, C}), x_c, w_c, mean_c, rstd_c);

        DevTensor out_g = poisoned(gpu(), {N, C}, dt()), mean_g = poisoned(gpu(), {N}, DType::F32),
                  rstd_g = poisoned(gpu(), {N}, DType::F32);
        DevTensor x_g = put(gpu(), x, {N, C}, dt()), w_g = put(gpu(), w, {C}, dt());
        gpu().layernorm_fwd(out_g, mean_g, rstd_g, x_g, w_g, put(gpu(), b, {C}, dt()));
        EXPECT_TRUE(close(get(gpu(), out_g), download(cpu(), out_c), tol(), "layernorm out"));
        EXPECT_TRUE(
            close(get(gpu(), mean_g), download(cpu(), mean_c), tol_for(DType::F32), "layernorm mean"));
        EXPECT_TRUE(
            close(get(gpu(), rstd_g), download(cpu(), rstd_c), tol_for(DType::F32), "layernorm rstd"));
        DevTensor din_g = put(gpu(), din0, {N, C}, dt()), dw_g = put(gpu(), dw0, {C}, dt()),
                  db_g = put(gpu(), db0, {C}, dt());
        gpu().layernorm_bwd(din_g, dw_g, db_g, put(gpu(), dout, {N, C}, dt()), x_g, w_g, mean_g, rstd_g);
        EXPECT_TRUE(close(get(gpu(), din_g), download(cpu(), din_c), tol(), "layernorm din"));
        EXPECT_TRUE(close(get(gpu(), dw_g), download(cpu(), dw_c), tol(), "layernorm dw"));
        EXPECT_TRUE(close(get(gpu(), db_g), download(cpu(), db_c), tol(), "layernorm db"));
    }
}

struct MatCase {
    int N, C, OC;
    WLayout layout;
    bool bias, gelu;
};

TEST_P(CudaOps, Matmul) {
    const std::vector<MatCase> cases = {
        {64, 96, 160, WLayout::InOut, true, false},  {64, 96, 160, WLayout::InOut, true, true},
        {64, 96, 160, WLayout::OutIn, false, false}, {128, 64, 256, WLayout::InOut, false, true},
        {40, 24, 48, WLayout::InOut, true, true},    {37, 24, 40, WLayout::OutIn, false, false},
    };
    for (const MatCase& m : cases) {
        SCOPED_TRACE(::testing::Message() << "N=" << m.N << " C=" << m.C << " OC=" << m.OC
                                          << " layout=" << (m.layout == WLayout::InOut ? "in,out" : "out,in")
                                          << " bias=" << m.bias << " gelu=" << m.gelu);
        const Shape ws = m.layout == WLayout::InOut ? Shape{m.C, m.OC} : Shape{m.OC, m.C};
        const std::vector<float> x = rnd(size_t(m.N) * m.C), w = rnd(size_t(m.C) * m.OC, 0.2f),
                                 b = rnd(size_t(m.OC)), dout = rnd(size_t(m.N) * m.OC);
        const std::vector<float> dw0 = rnd(size_t(m.C) * m.OC), db0 = rnd(size_t(m.OC));
        // CPU: the reference
        DevTensor x_c = upload(cpu(), x, {m.N, m.C}), w_c = upload(cpu(), w, ws), out_c(cpu(), {m.N, m.OC});
        DevTensor b_c = upload(cpu(), b, {m.OC}), pre_c(cpu(), {m.N, m.OC});
        cpu().matmul_fwd(out_c, x_c, w_c, m.layout, m.bias ? b_c.t : Tensor{}, m.gelu ? pre_c.t : Tensor{});
        DevTensor dx_c(cpu(), {m.N, m.C}), dw_c = upload(cpu(), dw0, ws), db_c = upload(cpu(), db0, {m.OC});
        cpu().matmul_bwd(dx_c, dw_c, m.bias ? db_c.t : Tensor{}, upload(cpu(), dout, {m.N, m.OC}), x_c, w_c,
                         m.layout, {});
        // GPU
        DevTensor x_g = put(gpu(), x, {m.N, m.C}, dt()), w_g = put(gpu(), w, ws, dt());
        DevTensor out_g = poisoned(gpu(), {m.N, m.OC}, dt()), pre_g = poisoned(gpu(), {m.N, m.OC}, dt());
        DevTensor b_g = put(gpu(), b, {m.OC}, dt());
        gpu().matmul_fwd(out_g, x_g, w_g, m.layout, m.bias ? b_g.t : Tensor{}, m.gelu ? pre_g.t : Tensor{});
        EXPECT_TRUE(close(get(gpu(), out_g), download(cpu(), out_c), tol(), "matmul out"));
        if (m.gelu) {
            EXPECT_TRUE(close(get(gpu(), pre_g), download(cpu(), pre_c), tol(), "matmul pre-gelu"));
        }
        DevTensor dx_g = poisoned(gpu(), {m.N, m.C}, dt()), dw_g = put(gpu(), dw0, ws, dt());
        DevTensor db_g = put(gpu(), db0, {m.OC}, dt());
        gpu().matmul_bwd(dx_g, dw_g, m.bias ? db_g.t : Tensor{}, put(gpu(), dout, {m.N, m.OC}, dt()), x_g,
                         w_g, m.layout, {});
        EXPECT_TRUE(close(get(gpu(), dx_g), download(cpu(), dx_c), tol(), "matmul din"));
        EXPECT_TRUE(close(get(gpu(), dw_g), download(cpu(), dw_c), tol(), "matmul dw"));
        if (m.bias) {
            EXPECT_TRUE(close(get(gpu(), db_g), download(cpu(), db_c), tol(), "matmul dbias"));
        }
    }
}

// matmul_bwd with in_pre_gelu: din is taken through the GELU (cuBLASLt's DGELU epilogue).
TEST_P(CudaOps, MatmulBackwardThroughGelu) {
    const int N = 64, C = 128, OC = 96;
    const std::vector<float> pre = rnd(size_t(N) * C, 1.5f), w = rnd(size_t(C) * OC, 0.2f),
                             dout = rnd(size_t(N) * OC);
    // the layer's input is gelu(pre)
    DevTensor pre_c = upload(cpu(), pre, {N, C}), in_c(cpu(), {N, C});
    cpu().gelu_fwd(in_c, pre_c);
    const std::vector<float> in = rounded(download(cpu(), in_c), dt());
    in_c = upload(cpu(), in, {N, C});
    DevTensor w_c = upload(cpu(), w, {C, OC}), dx_c(cpu(), {N, C}), dw_c(cpu(), {C, OC});
    cpu().matmul_bwd(dx_c, dw_c, {}, upload(cpu(), dout, {N, OC}), in_c, w_c, WLayout::InOut, pre_c);

    DevTensor dx_g = poisoned(gpu(), {N, C}, dt()),
              dw_g = put(gpu(), std::vector<float>(size_t(C) * OC), {C, OC}, dt());
    gpu().matmul_bwd(dx_g, dw_g, {}, put(gpu(), dout, {N, OC}, dt()), put(gpu(), in, {N, C}, dt()),
                     put(gpu(), w, {C, OC}, dt()), WLayout::InOut, put(gpu(), pre, {N, C}, dt()));
    EXPECT_TRUE(close(get(gpu(), dx_g), download(cpu(), dx_c), tol(), "matmul din through gelu"));
    EXPECT_TRUE(close(get(gpu(), dw_g), download(cpu(), dw_c), tol(), "matmul dw"));
}

TEST_P(CudaOps, GeluAndResidual) {
    for (int n : {4096, 1001}) {  // whole 16-byte packs, and a tail
        SCOPED_TRACE("n=" + std::to_string(n));
        const std::vector<float> x = rnd(size_t(n), 2.0f), y = rnd(size_t(n)), d = rnd(size_t(n));
        DevTensor x_c = upload(cpu(), x, {n}), o_c(cpu(), {n}), di_c(cpu(), {n}), r_c(cpu(), {n});
        cpu().gelu_fwd(o_c, x_c);
        cpu().gelu_bwd(di_c, upload(cpu(), d, {n}), x_c);
        cpu().residual_fwd(r_c, x_c, upload(cpu(), y, {n}));
        DevTensor x_g = put(gpu(), x, {n}, dt()), o_g = poisoned(gpu(), {n}, dt()),
                  di_g = poisoned(gpu(), {n}, dt());
        DevTensor r_g = poisoned(gpu(), {n}, dt());
        gpu().gelu_fwd(o_g, x_g);
        gpu().gelu_bwd(di_g, put(gpu(), d, {n}, dt()), x_g);
        gpu().residual_fwd(r_g, x_g, put(gpu(), y, {n}, dt()));
        EXPECT_TRUE(close(get(gpu(), o_g), download(cpu(), o_c), tol(), "gelu"));
        EXPECT_TRUE(close(get(gpu(), di_g), download(cpu(), di_c), tol(), "gelu backward"));
        EXPECT_TRUE(close(get(gpu(), r_g), download(cpu(), r_c), tol(), "residual"));
        // in place, as the model calls it
        DevTensor io_g = put(gpu(), d, {n}, dt());
        gpu().gelu_bwd(io_g, io_g, x_g);
        EXPECT_TRUE(close(get(gpu(), io_g), download(cpu(), di_c), tol(), "gelu backward in place"));
    }
}

struct AttnCase {
    int B, T, NH, HS;
};

// Both CUDA implementations: cuBLASLt products + softmax kernels (gemm) and the tiled kernels (flash).
TEST_P(CudaOps, Attention) {
    const std::vector<AttnCase> cases = {{2, 70, 3, 16}, {1, 64, 2, 64}, {2, 33, 2, 80}, {1, 100, 1, 128}};
    for (AttentionImpl impl : {AttentionImpl::Gemm, AttentionImpl::Flash}) {
        auto gpu = make_backend({Device::CUDA, 0, 0, impl});
        for (const AttnCase& a : cases) {
            SCOPED_TRACE(::testing::Message() << (impl == AttentionImpl::Gemm ? "gemm" : "flash") << " B="
                                              << a.B << " T=" << a.T << " NH=" << a.NH << " HS=" << a.HS);
            const int C = a.NH * a.HS;
            const AttnDims d{a.B, a.T, a.NH, a.HS};
            const std::vector<float> qkv = rnd(size_t(a.B) * a.T * 3 * C), dout = rnd(size_t(a.B) * a.T * C);
            DevTensor qkv_c = upload(cpu(), qkv, {a.B, a.T, 3 * C}), out_c(cpu(), {a.B, a.T, C});
            DevTensor saved_c(cpu(), {int64_t(cpu().attention_saved_elems(d))});
            DevTensor scratch_c(cpu(), {int64_t(cpu().attention_scratch_elems(d))}),
                dqkv_c(cpu(), {a.B, a.T, 3 * C});
            cpu().attention_fwd(out_c, saved_c, qkv_c, a.NH);
            cpu().attention_bwd(dqkv_c, scratch_c, upload(cpu(), dout, {a.B, a.T, C}), qkv_c, out_c, saved_c,
                                a.NH);

            DevTensor qkv_g = put(*gpu, qkv, {a.B, a.T, 3 * C}, dt()),
                      out_g = poisoned(*gpu, {a.B, a.T, C}, dt());
            DevTensor saved_g = poisoned(*gpu, {int64_t(gpu->attention_saved_elems(d))}, dt());
            DevTensor scratch_g = poisoned(*gpu, {int64_t(gpu->attention_scratch_elems(d))}, dt());
            DevTensor dqkv_g = poisoned(*gpu, {a.B, a.T, 3 * C}, dt());
            gpu->attention_fwd(out_g, saved_g, qkv_g, a.NH);
            EXPECT_TRUE(close(get(*gpu, out_g), download(cpu(), out_c), tol(), "attention out"));
            // the backward sees the GPU's own (rounded) output, as in training
            gpu->attention_bwd(dqkv_g, scratch_g, put(*gpu, dout, {a.B, a.T, C}, dt()), qkv_g, out_g, saved_g,
                               a.NH);
            EXPECT_TRUE(close(get(*gpu, dqkv_g), download(cpu(), dqkv_c), tol(), "attention dqkv"));
        }
    }
}

// Generation's incremental attention: a prompt, then one token at a time, against the CPU's.
TEST_P(CudaOps, AttentionCached) {
    const int NH = 4, HS = 32, C = NH * HS, maxT = 40;
    DevTensor kc_c(cpu(), {maxT, C}), vc_c(cpu(), {maxT, C});
    DevTensor kc_g = poisoned(gpu(), {maxT, C}, dt()),
              vc_g = poisoned(gpu(), {maxT, C}, dt());  // unread rows
    int pos = 0;
    for (int Tq : {9, 1, 1, 5, 1}) {
        SCOPED_TRACE("pos=" + std::to_string(pos));
        const std::vector<float> qkv = rnd(size_t(Tq) * 3 * C);
        DevTensor out_c(cpu(), {Tq, C}), out_g = poisoned(gpu(), {Tq, C}, dt());
        cpu().attention_cached(out_c, upload(cpu(), qkv, {Tq, 3 * C}), kc_c, vc_c, pos, NH);
        gpu().attention_cached(out_g, put(gpu(), qkv, {Tq, 3 * C}, dt()), kc_g, vc_g, pos, NH);
        EXPECT_TRUE(close(get(gpu(), out_g), download(cpu(), out_c), tol(), "cached attention out"));
        pos += Tq;
    }
}

TEST_P(CudaOps, Classifier) {
    const int N = 37, V = 130, Vp = 136;  // padded vocabulary: the last 6 columns are not tokens
    std::vector<float> logits = randn(gen, size_t(N) * Vp, 3.0f);
    for (int j = 0; j < Vp; j++) logits[size_t(5) * Vp + size_t(j)] += 60.0f;  // a row with large logits
    logits = rounded(logits, dt());
    std::vector<int32_t> tgt(N);
    for (int i = 0; i < N; i++) tgt[size_t(i)] = i % 6 == 2 ? -1 : int32_t(gen() % V);
    for (float dloss : {0.0f, 1.0f / 29.0f}) {
        SCOPED_TRACE("dloss=" + std::to_string(dloss));
        DevTensor lg_c = upload(cpu(), logits, {N, Vp}), loss_c(cpu(), {N});
        cpu().classifier(loss_c, lg_c, upload_i32(cpu(), tgt, {N}), dloss, V);
        DevTensor lg_g = put(gpu(), logits, {N, Vp}, dt()), loss_g = poisoned(gpu(), {N}, DType::F32);
        gpu().classifier(loss_g, lg_g, upload_i32(gpu(), tgt, {N}), dloss, V);
        // the loss is f32 from a f32 log-sum-exp whatever the logits' type
        EXPECT_TRUE(
            close(get(gpu(), loss_g), download(cpu(), loss_c), tol_for(DType::F32), "classifier losses"));
        EXPECT_TRUE(close(get(gpu(), lg_g), download(cpu(), lg_c), tol(),
                          dloss != 0 ? "logit gradient" : "logits kept"));
    }
}

TEST_P(CudaOps, GlobalNormAndAdamW) {
    const std::vector<Shape> shapes = {{64, 48}, {48}, {1000}, {7, 9}};
    std::vector<std::vector<float>> p, g, m, v;
    for (const Shape& s : shapes) {
        const size_t n = size_t(s.numel());
        p.push_back(randn(gen, n));  // unrounded: the f32 master weights
        g.push_back(rnd(n, 8.0f));   // scaled by 8, as an fp16 loss scale would
        m.push_back(randn(gen, n, 0.1f));
        std::vector<float> vv = randn(gen, n, 0.1f);
        for (float& x : vv) x = x * x;
        v.push_back(vv);
    }
    const bool master = dt() != DType::F32;
    auto make_slots = [&](Backend& be, DType pdt, std::vector<DevTensor>& keep) {
        std::vector<ParamSlot> slots;
        for (size_t i = 0; i < shapes.size(); i++) {
            ParamSlot s;
            keep.push_back(put(be, p[i], shapes[i], pdt));
            s.param = keep.back();
            keep.push_back(put(be, g[i], shapes[i], pdt));
            s.grad = keep.back();
            keep.push_back(put(be, m[i], shapes[i], DType::F32));
            s.m = keep.back();
            keep.push_back(put(be, v[i], shapes[i], DType::F32));
            s.v = keep.back();
            if (pdt != DType::F32) {
                keep.push_back(put(be, p[i], shapes[i], DType::F32));
                s.master = keep.back();
            }
            s.weight_decay = shapes[i].ndim >= 2 ? 0.1f : 0.0f;
            slots.push_back(s);
        }
        return slots;
    };
    std::vector<DevTensor> keep_c, keep_g;
    // The CPU reference updates f32 weights equal to the GPU's master copy.
    std::vector<ParamSlot> sc = make_slots(cpu(), DType::F32, keep_c), sg = make_slots(gpu(), dt(), keep_g);
    std::vector<Tensor> gc, gg;
    for (size_t i = 0; i < sc.size(); i++) gc.push_back(sc[i].grad), gg.push_back(sg[i].grad);
    DevTensor n_c(cpu(), {1}), n_g = poisoned(gpu(), {1}, DType::F32);
    cpu().global_norm_sq(n_c, gc);
    gpu().global_norm_sq(n_g, gg);
    EXPECT_TRUE(close(get(gpu(), n_g), download(cpu(), n_c), tol_for(DType::F32), "global norm^2"));

    AdamWArgs args;
    args.lr = 1e-2f, args.step = 3, args.grad_scale = 0.125f;
    args.max_grad_norm = 0.5f * std::sqrt(download(cpu(), n_c)[0]) * args.grad_scale;  // clipping is active
    cpu().adamw(sc, args, n_c);
    gpu().adamw(sg, args, n_g);
    for (size_t i = 0; i < sc.size(); i++) {
        SCOPED_TRACE("tensor " + std::to_string(i));
        const std::vector<float> want = download(cpu(), sc[i].param);
        EXPECT_TRUE(close(get(gpu(), sg[i].m), download(cpu(), sc[i].m), tol_for(DType::F32), "adamw m"));
        EXPECT_TRUE(close(get(gpu(), sg[i].v), download(cpu(), sc[i].v), tol_for(DType::F32), "adamw v"));
        if (master) {
            EXPECT_TRUE(close(get(gpu(), sg[i].master), want, tol_for(DType::F32), "adamw master"));
        }
        // the parameters are the master weights rounded once
        EXPECT_TRUE(close(get(gpu(), sg[i].param), master ? rounded(want, dt()) : want, tol_for(DType::F32),
                          "adamw params"));
    }

    // A non-finite norm skips the update: not one byte of parameters or moments changes.
    std::vector<std::vector<uint8_t>> before;
    for (const ParamSlot& s : sg) {
        before.push_back(bytes(gpu(), s.param));
        before.push_back(bytes(gpu(), s.m));
        before.push_back(bytes(gpu(), s.v));
    }
    DevTensor nan_norm = put(gpu(), {std::nanf("")}, {1}, DType::F32);
    gpu().adamw(sg, args, nan_norm);
    for (size_t i = 0; i < sg.size(); i++) {
        EXPECT_TRUE(before[3 * i] == bytes(gpu(), sg[i].param)) << "params written on a skipped step";
        EXPECT_TRUE(before[3 * i + 1] == bytes(gpu(), sg[i].m)) << "m written on a skipped step";
        EXPECT_TRUE(before[3 * i + 2] == bytes(gpu(), sg[i].v)) << "v written on a skipped step";
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_param_name);

// Conversions round to nearest even exactly as the host's, specials included.
TEST(CudaBackend, ConvertMatchesHost) {
    Backends be;
    std::mt19937_64 gen(test_seed());
    std::vector<float> x = randn(gen, 999, 100.0f);
    const float specials[] = {0.0f,    -0.0f,    INFINITY, -INFINITY, std::nanf(""),     1e-40f,
                              -3e-39f, 70000.0f, 65519.0f, 65520.0f,  1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                              6e-8f,   3e38f};
    x.insert(x.end(), std::begin(specials), std::end(specials));
    const int n = int(x.size());
    for (DType to : {DType::BF16, DType::F16}) {
        SCOPED_TRACE(std::string(dtype_name(to)));
        DevTensor src = put(*be.gpu, x, {n}, DType::F32), dst = poisoned(*be.gpu, {n}, to);
        be.gpu->convert(dst, src);
        std::vector<uint8_t> want(size_t(n) * 2);
        convert_from_f32(want.data(), to, x.data(), x.size());
        const std::vector<uint8_t> got = bytes(*be.gpu, dst);
        for (int i = 0; i < n; i++) {
            uint16_t a, b;
            std::memcpy(&a, got.data() + 2 * i, 2);
            std::memcpy(&b, want.data() + 2 * i, 2);
            const bool both_nan =
                std::isnan(x[size_t(i)]) && (a & 0x7fff) > (to == DType::BF16 ? 0x7f80 : 0x7c00);
            EXPECT_TRUE(a == b || both_nan)
                << "element " << i << " (" << x[size_t(i)] << "): 0x" << std::hex << a << " vs host 0x" << b;
        }
        // and back, and across the 16-bit types
        DevTensor back = poisoned(*be.gpu, {n}, DType::F32);
        be.gpu->convert(back, dst);
        const std::vector<float> r = get(*be.gpu, back), want_r = rounded(x, to);
        for (int i = 0; i < n; i++)
            EXPECT_TRUE(r[size_t(i)] == want_r[size_t(i)] ||
                        (std::isnan(r[size_t(i)]) && std::isnan(want_r[size_t(i)])))
                << "element " << i;
    }
}

TEST(CudaBackend, AllocZeroesAndHonoursTheMemoryLimit) {
    Backends be;
    DevTensor t(*be.gpu, {1 << 20});
    for (float x : get(*be.gpu, t)) ASSERT_EQ(x, 0.0f);
    EXPECT_GE(be.gpu->memory_peak(), be.gpu->memory_in_use());
    be.gpu->set_memory_limit(be.gpu->memory_in_use() + (size_t(1) << 20));
    EXPECT_THROW(DevTensor(*be.gpu, {1 << 20}), OutOfMemory);  // 4 MiB past a 1 MiB allowance
    be.gpu->set_memory_limit(0);
    EXPECT_NO_THROW(DevTensor(*be.gpu, {1 << 20}));
}

}  // namespace
}  // namespace anvil::test
