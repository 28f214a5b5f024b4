// The op table's second mode (tests/ops/op_cases.h): every CUDA op against the CPU backend (the spec) on
// fresh random inputs in f32, bf16 and f16, outputs poisoned with NaN first, each run twice and required to
// repeat bit for bit; attention with each of anvil's CUDA implementations (gemm, flash on the tensor cores in
// bf16/f16, flash on the CUDA cores) and, in a suite of its own, cuDNN's fused attention. Then
// what is not one op: the optimizer's master weights in low precision and its skipped step, conversions bit
// for bit, allocation and the memory limit. The seed is printed at the start and ANVIL_TEST_SEED replays it.
#include <cmath>
#include <cstdlib>

#include "../ops/op_cases.h"
#include "core/fp8.h"
#include "gpu_harness.h"

namespace anvil::test {
namespace {

class CudaOps : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

// "<index>_<the case's name, letters and digits>_<dtype>"
std::string case_name(const ::testing::TestParamInfo<std::tuple<size_t, DType>>& p) {
    std::string n = op_cases()[std::get<0>(p.param)].name;
    for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return std::to_string(std::get<0>(p.param)) + "_" + n + "_" +
           std::string(dtype_name(std::get<1>(p.param)));
}

TEST_P(CudaOps, MatchTheCpu) {
    const auto [index, dt] = GetParam();
    const OpCase c = op_cases()[index];
    SCOPED_TRACE(c.name);
    if (dt != DType::F32 && !c.low_precision) GTEST_SKIP() << c.name << " runs in f32 only";
    auto cpu = make_backend({Device::CPU, 0, 0});
    struct Impl {
        AttentionImpl impl;
        int fwd_rows;  // BackendOptions::attn_fwd_rows
        const char* name;
    };
    std::vector<Impl> impls = {{AttentionImpl::Auto, 0, ""}};
    if (c.attention)
        impls = {{AttentionImpl::Gemm, 0, "gemm"},
                 {AttentionImpl::Flash, 64, "flash"},
                 {AttentionImpl::Flash, 128, "flash, 128-row forward"},
                 {AttentionImpl::FlashSimt, 0, "flash-simt"}};
    for (const Impl& impl : impls) {
        SCOPED_TRACE(impl.name);
        auto gpu = make_backend({Device::CUDA, 0, 0, impl.impl, impl.fwd_rows});
        const std::string err = compare_backends(c, *cpu, *gpu, dt, test_seed() + index);
        EXPECT_TRUE(err.empty()) << err << "seed " << test_seed();
    }
}

INSTANTIATE_TEST_SUITE_P(Table, CudaOps,
                         ::testing::Combine(::testing::Range(size_t(0), op_cases().size()),
                                            ::testing::Values(DType::F32, DType::BF16, DType::F16)),
                         case_name);

// The op table's products over a few rows (decoding) again with BackendOptions::direct_products: anvil's
// direct kernels (gemv.cu, every path: vector runs and their tails, row slices, plain kernels, a strided
// output, the GELU) instead of cuBLASLt, against the CPU and twice bit for bit. int8 weights take them always
// (CudaOps).
class CudaDirectProducts : public CudaOps {};

std::vector<size_t> few_row_products() {
    std::vector<size_t> v;
    const std::vector<OpCase> all = op_cases();
    for (size_t i = 0; i < all.size(); i++)
        if (few_row_float_product(all[i])) v.push_back(i);
    return v;
}

TEST_P(CudaDirectProducts, MatchTheCpu) {
    const auto [index, dt] = GetParam();
    const OpCase c = op_cases()[index];
    SCOPED_TRACE(c.name);
    auto cpu = make_backend({Device::CPU, 0, 0});
    BackendOptions o;
    o.device = Device::CUDA, o.direct_products = true;
    auto gpu = make_backend(o);
    const std::string err = compare_backends(c, *cpu, *gpu, dt, test_seed() + index);
    EXPECT_TRUE(err.empty()) << err << "seed " << test_seed();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaDirectProducts,
                         ::testing::Combine(::testing::ValuesIn(few_row_products()),
                                            ::testing::Values(DType::F32, DType::BF16, DType::F16)),
                         case_name);

// cuDNN's fused attention (--attention cudnn) on every attention case of the op table: against the CPU where
// it applies (bf16/f16 without dropout, head sizes multiples of 8), the error that names --attention auto
// elsewhere. Its own suite, so the ctests that rerun the attention cases under other devices' shared memory
// or another cp.async timing (which cuDNN's kernels do not depend on) leave it out.
class CudaCudnnAttention : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(CudaCudnnAttention, MatchesTheCpuOrSaysWhyNot) {
#ifndef ANVIL_TEST_CUDNN
    GTEST_SKIP() << "this build has no cuDNN (cudnn_graph.h was not found)";
#endif
    const auto [index, dt] = GetParam();
    const OpCase c = op_cases()[index];
    SCOPED_TRACE(c.name);
    auto cpu = make_backend({Device::CPU, 0, 0});
    auto gpu = make_backend({Device::CUDA, 0, 0, AttentionImpl::Cudnn});
    if (dt == DType::F32 || c.attn_dropout || c.attn.HS % 8 != 0) {
        try {
            compare_backends(c, *cpu, *gpu, dt, test_seed() + index);
            ADD_FAILURE() << "--attention cudnn ran a case cuDNN does not take";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("use --attention auto"), std::string::npos) << e.what();
        }
        return;
    }
    const std::string err = compare_backends(c, *cpu, *gpu, dt, test_seed() + index);
    EXPECT_TRUE(err.empty()) << err << "seed " << test_seed();
}

std::vector<size_t> attention_cases() {
    std::vector<size_t> v;
    for (size_t i = 0; i < op_cases().size(); i++)
        if (op_cases()[i].attention) v.push_back(i);
    return v;
}

INSTANTIATE_TEST_SUITE_P(Cudnn, CudaCudnnAttention,
                         ::testing::Combine(::testing::ValuesIn(attention_cases()),
                                            ::testing::Values(DType::F32, DType::BF16, DType::F16)),
                         case_name);

// Which of cuDNN's engines a plan takes: a deterministic one before any other, so runs repeat bit for bit; an
// engine with a nondeterministic note only under ANVIL_CUDNN_NONDETERMINISTIC=1, and then said on stderr;
// without it, a graph with only such engines is refused with an error that names the switch. cuemu's cuDNN
// offers a nondeterministic engine before the deterministic one (CUEMU_CUDNN_NONDETERMINISTIC=1) or alone
// (=only); the real library's engines are its own, so on a card this runs the first case only.
TEST(CudaCudnnEngines, NondeterministicOnlyWhereAsked) {
#ifndef ANVIL_TEST_CUDNN
    GTEST_SKIP() << "this build has no cuDNN (cudnn_graph.h was not found)";
#endif
    size_t index = op_cases().size();
    for (size_t i : attention_cases())
        if (!op_cases()[i].attn_dropout && op_cases()[i].attn.HS % 8 == 0) {
            index = i;
            break;
        }
    ASSERT_LT(index, op_cases().size());
    const OpCase c = op_cases()[index];
    SCOPED_TRACE(c.name);
    struct Env {  // a variable set for a scope
        const char* name;
        Env(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
        ~Env() { unsetenv(name); }
    };
    auto cpu = make_backend({Device::CPU, 0, 0});
    const auto run = [&](std::string* err) {
        auto gpu = make_backend({Device::CUDA, 0, 0, AttentionImpl::Cudnn});
        ::testing::internal::CaptureStderr();
        try {
            *err = compare_backends(c, *cpu, *gpu, DType::BF16, test_seed() + index);
        } catch (const Error& e) {
            *err = std::string("threw: ") + e.what();
        }
        return ::testing::internal::GetCapturedStderr();
    };
    std::string err;
    {
        const Env both("CUEMU_CUDNN_NONDETERMINISTIC", "1");
        const std::string said = run(&err);
        EXPECT_TRUE(err.empty()) << err;
        EXPECT_EQ(said.find("nondeterministic engine"), std::string::npos) << said;
    }
#ifdef ANVIL_CUDA_EMU
    const Env only("CUEMU_CUDNN_NONDETERMINISTIC", "only");
    run(&err);
    EXPECT_NE(err.find("threw: "), std::string::npos) << err;
    EXPECT_NE(err.find("ANVIL_CUDNN_NONDETERMINISTIC=1"), std::string::npos) << err;
    EXPECT_NE(err.find("use --attention auto"), std::string::npos) << err;
    const Env allowed("ANVIL_CUDNN_NONDETERMINISTIC", "1");
    const std::string said = run(&err);
    EXPECT_TRUE(err.empty()) << err;
    EXPECT_NE(said.find("nondeterministic engine"), std::string::npos) << said;
#endif
}

// The tensor-core forward at 128 query rows a block (two m-tiles a warp) computes every row exactly as at 64:
// the same products in the same order, so the output and the saved log-sum-exp are the same bits. Partial
// blocks (T = 130: a second block with 2 live rows, one m-tile wholly past T), dropout, a head size (80) that
// keeps 64 rows.
class CudaAttentionRows : public ::testing::TestWithParam<DType> {};

TEST_P(CudaAttentionRows, WideForwardRepeatsTheNarrowBitForBit) {
    const DType dt = GetParam();
    auto narrow = make_backend({Device::CUDA, 0, 0, AttentionImpl::Flash, 64});
    auto wide = make_backend({Device::CUDA, 0, 0, AttentionImpl::Flash, 128});
    struct Case {
        int B, T, NH, HS;
        AttnDropout drop;
    };
    const Case cases[] = {{2, 130, 2, 64, {}},
                          {1, 200, 3, 32, {0.2f, 9, 1}},
                          {1, 257, 1, 64, {}},
                          {1, 70, 2, 80, {}},
                          {2, 40, 2, 20, {}}};
    std::mt19937_64 gen(test_seed());
    for (const Case& k : cases) {
        SCOPED_TRACE(fmt::format("B={} T={} NH={} HS={} dropout={}", k.B, k.T, k.NH, k.HS, k.drop.p));
        const int C = k.NH * k.HS;
        const std::vector<float> qkv = randn(gen, size_t(k.B) * k.T * 3 * C);
        const AttnDims d{k.B, k.T, k.NH, k.HS, dt};
        std::vector<uint8_t> got[2][2];  // [backend][out, saved]
        Backend* bes[2] = {narrow.get(), wide.get()};
        for (int i = 0; i < 2; i++) {
            Backend& be = *bes[i];
            DevTensor in = put(be, qkv, {k.B, k.T, 3 * C}, dt);
            DevTensor out = poisoned(be, {k.B, k.T, C}, dt);
            DevTensor saved = poisoned(be, {int64_t(be.attention_saved_elems(d))}, DType::F32);
            be.attention_fwd(out.t, saved.t, in.t, k.NH, k.drop);
            got[i][0] = bytes(be, out.t);
            got[i][1] = bytes(be, saved.t);
        }
        EXPECT_TRUE(got[0][0] == got[1][0]) << "the outputs differ";
        EXPECT_TRUE(got[0][1] == got[1][1]) << "the saved log-sum-exps differ";
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionRows, ::testing::Values(DType::BF16, DType::F16),
                         dtype_param_name);

// A block's last residual add runs fused with the next norm (NormFusion), while --recompute runs that norm
// alone on the stored sum, and so does a model that ends with it: add_norm_fwd must give residual_fwd's sum
// and then layernorm_fwd's or rmsnorm_fwd's output and statistics to the bit. Widths on each path of the
// kernel: registers with the last packs on some lanes only (32, 1600 in 16-bit types), whole (768, 2048), the
// general path (33, 2048 in f32); rows on several blocks.
class CudaAddNorm : public ::testing::TestWithParam<DType> {};

TEST_P(CudaAddNorm, EqualsTheAddThenTheNormBitForBit) {
    const DType dt = GetParam();
    auto be = make_backend({Device::CUDA, 0, 0});
    std::mt19937_64 gen(test_seed());
    for (const int C : {32, 33, 768, 1600, 2048}) {
        for (const bool layer : {true, false}) {
            SCOPED_TRACE(fmt::format("C={} {}", C, layer ? "LayerNorm" : "RMSNorm"));
            const int N = 19;
            const float eps = layer ? 1e-5f : 1e-6f;
            DevTensor a = put(*be, randn(gen, size_t(N) * C, 2.0f), {N, C}, dt),
                      b = put(*be, randn(gen, size_t(N) * C), {N, C}, dt),
                      w = put(*be, randn(gen, C), {C}, dt), bias = put(*be, randn(gen, C), {C}, dt);
            std::vector<uint8_t> got[2][4];  // [fused, apart][sum, out, mean, rstd]
            for (int i = 0; i < 2; i++) {
                DevTensor sum = poisoned(*be, {N, C}, dt), out = poisoned(*be, {N, C}, dt),
                          mean = poisoned(*be, {N}, DType::F32), rstd = poisoned(*be, {N}, DType::F32);
                const Tensor m = layer ? mean.t : Tensor{}, bi = layer ? bias.t : Tensor{};
                if (i == 0) {
                    be->add_norm_fwd(sum.t, out.t, m, rstd.t, a.t, b.t, w.t, bi, eps);
                } else {
                    be->residual_fwd(sum.t, a.t, b.t);
                    if (layer)
                        be->layernorm_fwd(out.t, mean.t, rstd.t, sum.t, w.t, bias.t);
                    else
                        be->rmsnorm_fwd(out.t, rstd.t, sum.t, w.t, eps);
                }
                got[i][0] = bytes(*be, sum.t);
                got[i][1] = bytes(*be, out.t);
                got[i][2] = layer ? bytes(*be, mean.t) : std::vector<uint8_t>{};
                got[i][3] = bytes(*be, rstd.t);
            }
            EXPECT_TRUE(got[0][0] == got[1][0]) << "the sums differ";
            EXPECT_TRUE(got[0][1] == got[1][1]) << "the norms' outputs differ";
            EXPECT_TRUE(got[0][2] == got[1][2]) << "the means differ";
            EXPECT_TRUE(got[0][3] == got[1][3]) << "the reciprocal deviations differ";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAddNorm, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_param_name);

// --gemm-tune's timing runs leave every product as it would be without them: a product that overwrites
// its output runs the chosen algorithm last, one that accumulates (the weight gradients) is timed on a
// scratch matrix. The products' cases and attention's batched products (gemm). Under cuemu, CUEMU_LT_ALGOS
// makes its cuBLASLt offer three algorithms to time; on a card, cuBLASLt's own are timed.
TEST(CudaGemmTune, TunedProductsMatchTheCpu) {
    ::setenv("CUEMU_LT_ALGOS", "3", 1);
    auto cpu = make_backend({Device::CPU, 0, 0});
    BackendOptions o{Device::CUDA, 0, 0, AttentionImpl::Gemm};
    o.gemm_tune = true;
    auto gpu = make_backend(o);
    int checked = 0;
    const std::vector<OpCase> cases = op_cases();
    for (size_t i = 0; i < cases.size(); i++) {
        const OpCase& c = cases[i];
        if (!c.name.starts_with("matmul") && !c.name.starts_with("attention B=")) continue;
        for (DType dt : {DType::F32, DType::BF16}) {
            SCOPED_TRACE(fmt::format("{} {}", c.name, dtype_name(dt)));
            const std::string err = compare_backends(c, *cpu, *gpu, dt, test_seed() + i);
            EXPECT_TRUE(err.empty()) << err << "seed " << test_seed();
            checked++;
        }
    }
    ::unsetenv("CUEMU_LT_ALGOS");
    EXPECT_GT(checked, 10);
}

class CudaOptimizer : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { gen.seed(test_seed() ^ uint64_t(GetParam())); }
    DType dt() const { return GetParam(); }
    std::vector<float> rnd(size_t n, float scale = 1.0f) { return rounded(randn(gen, n, scale), dt()); }
    Backend& cpu() { return *be.cpu; }
    Backend& gpu() { return *be.gpu; }
    Backends be;
    std::mt19937_64 gen;
};

// The optimizer in low precision: f32 master weights updated like the CPU's f32 weights, parameters the
// master rounded once, and a non-finite norm that changes not one byte.
TEST_P(CudaOptimizer, MasterWeightsAndSkippedStep) {
    // the last is large enough for many blocks of the norm's pass, its packs in runs of four and the rest;
    // then 120 small ones (more than one launch takes, the kernels' lists), every third of them one element
    // into its buffer (not 16-byte aligned) among aligned ones
    std::vector<Shape> shapes = {{64, 48}, {48}, {1000}, {7, 9}, {257, 1031}};
    for (int i = 0; i < 120; i++) shapes.push_back(i % 2 ? Shape{1 + i % 5, 3 + i} : Shape{8 * (i % 9) + 1});
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
            const bool shifted = i >= 5 && i % 3 == 0;
            const auto place = [&](const std::vector<float>& x, DType t) {
                if (!shifted) {
                    keep.push_back(put(be, x, shapes[i], t));
                    return Tensor(keep.back());
                }
                std::vector<float> y(x.size() + 1, 0.0f);
                std::copy(x.begin(), x.end(), y.begin() + 1);
                keep.push_back(put(be, y, {int64_t(y.size())}, t));
                return Tensor(keep.back()).range(1, x.size()).view(shapes[i]);
            };
            ParamSlot s;
            s.param = place(p[i], pdt);
            s.grad = place(g[i], pdt);
            s.m = place(m[i], DType::F32);
            s.v = place(v[i], DType::F32);
            if (pdt != DType::F32) s.master = place(p[i], DType::F32);
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
        // the parameters are the master weights rounded once (the GPU's own master: rounding the CPU's
        // value instead can land one unit apart where the two straddle a rounding midpoint)
        if (master)
            EXPECT_EQ(get(gpu(), sg[i].param), rounded(get(gpu(), sg[i].master), dt())) << "adamw params";
        else
            EXPECT_TRUE(close(get(gpu(), sg[i].param), want, tol_for(DType::F32), "adamw params"));
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

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOptimizer, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_param_name);

// FP8's amax pass (one launch: each block's maximum, then the scale in the block that finishes last) sees the
// largest element whichever block, run of unrolled loads or tail holds it. x is 2^-12 everywhere but one
// element of 256: a scale from a pass that missed the 256 makes it overflow E4M3 (NaN), one that saw it
// rounds the 2^-12 to 0, leaving that row 256 w and every other row 0, as on the CPU. The same for the
// backward's output gradient in E5M2 (2^-20 and one 2^14, overflowing to infinity). 80 x 1040: 83,200
// elements, 11 blocks in bf16 (21 in f32), runs of four loads and the rest; 5 x 13: a tail after the packs
// (and a product on the rounded values scaled back, not FP8's kernels).
class CudaFp8Scale : public ::testing::TestWithParam<DType> {};

TEST_P(CudaFp8Scale, SeesTheLargestElementWhereverItIs) {
    const DType dt = GetParam();
    Backends be;
    std::mt19937_64 gen(test_seed());
    for (const auto& [N, C] : {std::pair{80, 1040}, std::pair{5, 13}}) {
        const int OC = 16;
        const size_t n = size_t(N) * C, nd = size_t(N) * OC;
        const std::vector<float> w = rounded(randn(gen, size_t(C) * OC, 0.5f), dt);
        for (const size_t at : {size_t(0), n / 2 + 3, n - 9, n - 1}) {
            SCOPED_TRACE(fmt::format("{}x{} {}, the large element at {}", N, C, dtype_name(dt), at));
            std::vector<float> x(n, 1.0f / 4096), dout(nd, 1.0f / (1 << 20));
            x[at] = 256.0f;
            dout[at % nd] = 16384.0f;
            DevTensor xc = put(*be.cpu, x, {N, C}, DType::F32), wc = put(*be.cpu, w, {C, OC}, DType::F32);
            DevTensor dc = put(*be.cpu, dout, {N, OC}, DType::F32);
            DevTensor oc(*be.cpu, {N, OC}), dxc(*be.cpu, {N, C});
            DevTensor xg = put(*be.gpu, x, {N, C}, dt), wg = put(*be.gpu, w, {C, OC}, dt);
            DevTensor dg = put(*be.gpu, dout, {N, OC}, dt);
            DevTensor og = poisoned(*be.gpu, {N, OC}, dt), dxg = poisoned(*be.gpu, {N, C}, dt);
            be.cpu->matmul_fp8_fwd(oc, xc, wc, WLayout::InOut, {}, {}, {}, {});
            be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, {}, {});
            be.cpu->matmul_fp8_bwd(dxc, {}, {}, dc, xc, wc, WLayout::InOut, {}, {}, {});
            be.gpu->matmul_fp8_bwd(dxg, {}, {}, dg, xg, wg, WLayout::InOut, {}, {}, {});
            const std::vector<float> want = download(*be.cpu, oc), dx_want = download(*be.cpu, dxc);
            EXPECT_TRUE(close(get(*be.gpu, og), want, tol_for(dt), "out"));
            EXPECT_TRUE(close(get(*be.gpu, dxg), dx_want, tol_for(dt), "dx"));
            // what makes the case telling: the small values rounded to 0 under the large one's scale
            const size_t row = at / size_t(C);
            for (size_t i = 0; i < want.size(); i++)
                ASSERT_EQ(want[i] == 0.0f, i / OC != row) << "the CPU's output " << i;
        }
    }
}

// What an FP8 forward keeps for its backward (x's transposed rounding, W's in the backward's orientation,
// their scales) gives the same bits as the backward rounding x and W again: output, input and weight
// gradients, both weight layouts; and a `kept` that is too small is refused, saying what it needs.
TEST_P(CudaFp8Scale, KeptRoundingGivesTheSameBits) {
    const DType dt = GetParam();
    Backends be;
    std::mt19937_64 gen(test_seed());
    const int N = 64, C = 128, OC = 64;  // both operands take the one-pass rounding both ways
    const int64_t need = int64_t(be.gpu->fp8_kept_elems(N, C, OC, dt));
    EXPECT_EQ(need == 0, dt == DType::F32) << "kept elements: " << need;
    for (const WLayout layout : {WLayout::InOut, WLayout::OutIn}) {
        SCOPED_TRACE(layout == WLayout::InOut ? "W(in,out)" : "W(out,in)");
        const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
        const std::vector<float> x = randn(gen, size_t(N) * C), w = randn(gen, size_t(C) * OC, 0.5f),
                                 dout = randn(gen, size_t(N) * OC), dw0 = randn(gen, size_t(C) * OC);
        std::vector<std::vector<uint8_t>> runs[2];
        for (const bool keep : {false, true}) {
            DevTensor xg = put(*be.gpu, x, {N, C}, dt), wg = put(*be.gpu, w, ws, dt);
            DevTensor dg = put(*be.gpu, dout, {N, OC}, dt), dwg = put(*be.gpu, dw0, ws, dt);
            DevTensor og = poisoned(*be.gpu, {N, OC}, dt), dxg = poisoned(*be.gpu, {N, C}, dt);
            DevTensor kept = poisoned(*be.gpu, {std::max<int64_t>(need, 1)}, dt);
            be.gpu->matmul_fp8_fwd(og, xg, wg, layout, {}, {}, keep ? kept.t : Tensor{}, {});
            be.gpu->matmul_fp8_bwd(dxg, dwg, {}, dg, xg, wg, layout, {}, keep ? kept.t : Tensor{}, {});
            runs[keep] = {bytes(*be.gpu, og), bytes(*be.gpu, dxg), bytes(*be.gpu, dwg)};
        }
        EXPECT_TRUE(runs[0][0] == runs[1][0]) << "the output differs with `kept`";
        EXPECT_TRUE(runs[0][1] == runs[1][1]) << "the input gradient differs with `kept`";
        EXPECT_TRUE(runs[0][2] == runs[1][2]) << "the weight gradient differs with `kept`";
    }
    if (need > 1) {
        DevTensor xg = put(*be.gpu, randn(gen, size_t(N) * C), {N, C}, dt);
        DevTensor wg = put(*be.gpu, randn(gen, size_t(C) * OC), {C, OC}, dt);
        DevTensor og(*be.gpu, {N, OC}, dt), small(*be.gpu, {need - 1}, dt);
        try {
            be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, small, {});
            ADD_FAILURE() << "a kept buffer one element short was taken";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("keeps " + std::to_string(need) + " elements"),
                      std::string::npos)
                << e.what();
        }
    }
}

// An operand with an infinity stays non-finite through FP8's rounding (its amax is Inf, so its scale is 1,
// and Inf rounds to NaN in E4M3 and to Inf in E5M2): the outputs and gradients the CPU makes non-finite are
// the ones the GPU makes non-finite, the rest agree. The GPU rounds with the saturating conversion, the
// hardware's instruction, and puts an Inf back by hand. 64 x 128: the one-pass rounding both ways; 5 x 13:
// element by element and the small transposing tiles.
TEST_P(CudaFp8Scale, NonFiniteOperandsStayNonFinite) {
    const DType dt = GetParam();
    Backends be;
    std::mt19937_64 gen(test_seed());
    for (const auto& [N, C] : {std::pair{64, 128}, std::pair{5, 13}}) {
        const int OC = 16;
        for (const int which : {0, 1, 2}) {  // the infinity in x, in W, in dout
            SCOPED_TRACE(fmt::format("{}x{}x{} {}, Inf in {}", N, C, OC, dtype_name(dt),
                                     which == 0   ? "x"
                                     : which == 1 ? "W"
                                                  : "dout"));
            std::vector<float> x = rounded(randn(gen, size_t(N) * C), dt);
            std::vector<float> w = rounded(randn(gen, size_t(C) * OC, 0.5f), dt);
            std::vector<float> dout = rounded(randn(gen, size_t(N) * OC), dt);
            std::vector<float>& v = which == 0 ? x : which == 1 ? w : dout;
            v[v.size() / 3] = INFINITY;
            v[v.size() - 2] = -INFINITY;
            DevTensor xc = put(*be.cpu, x, {N, C}, DType::F32), wc = put(*be.cpu, w, {C, OC}, DType::F32);
            DevTensor dc = put(*be.cpu, dout, {N, OC}, DType::F32);
            DevTensor oc(*be.cpu, {N, OC}), dxc(*be.cpu, {N, C}), dwc(*be.cpu, {C, OC});
            DevTensor xg = put(*be.gpu, x, {N, C}, dt), wg = put(*be.gpu, w, {C, OC}, dt);
            DevTensor dg = put(*be.gpu, dout, {N, OC}, dt);
            DevTensor og = poisoned(*be.gpu, {N, OC}, dt), dxg = poisoned(*be.gpu, {N, C}, dt);
            DevTensor dwg = put(*be.gpu, std::vector<float>(size_t(C) * OC, 0.0f), {C, OC}, dt);
            be.cpu->matmul_fp8_fwd(oc, xc, wc, WLayout::InOut, {}, {}, {}, {});
            be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, {}, {});
            be.cpu->matmul_fp8_bwd(dxc, dwc, {}, dc, xc, wc, WLayout::InOut, {}, {}, {});
            be.gpu->matmul_fp8_bwd(dxg, dwg, {}, dg, xg, wg, WLayout::InOut, {}, {}, {});
            const std::pair<DevTensor*, DevTensor*> outs[] = {{&oc, &og}, {&dxc, &dxg}, {&dwc, &dwg}};
            for (const auto& [c, g] : outs) {
                const std::vector<float> want = download(*be.cpu, *c), got = get(*be.gpu, *g);
                size_t nonfinite = 0;
                std::vector<float> a, b;  // the finite ones
                for (size_t i = 0; i < want.size(); i++) {
                    ASSERT_EQ(std::isfinite(want[i]), std::isfinite(got[i]))
                        << "element " << i << ": CPU " << want[i] << ", GPU " << got[i];
                    if (std::isfinite(want[i]))
                        a.push_back(want[i]), b.push_back(got[i]);
                    else
                        nonfinite++;
                }
                EXPECT_TRUE(close(b, a, tol_for(dt), "finite elements"));
                if (c == &oc) {
                    EXPECT_GT(nonfinite + size_t(which == 2), 0u) << "the case must reach the output";
                }
            }
        }
    }
}

// FP8 delayed scaling on the GPU as on the CPU (the spec): training uses of one product (a forward, then its
// backward) with a history of 2, the operands' magnitudes changing from use to use (growing 8-fold past what
// the history's scales hold, so values saturate, then shrinking), an evaluation forward that records nothing,
// and a forward run again (--recompute's) between a forward and its backward. After every call the histories
// hold the same bits on both backends and the outputs agree; the forward run again gives its first run's
// bits and leaves the histories as they were. With and without `kept`; 64 x 128 -> 64 (FP8's kernels, the
// one-pass roundings both ways) and 5 x 13 -> 16 (the rounded values scaled back, the small tiles).
TEST_P(CudaFp8Scale, DelayedScalingMatchesTheCpu) {
    const DType dt = GetParam();
    Backends be;
    std::mt19937_64 gen(test_seed());
    const int H = 2, F = Fp8History::floats(H);
    std::vector<float> fresh(size_t(3 * F));
    for (size_t i = 0; i < 3; i++) fp8_history_init(fresh.data() + i * size_t(F), H);
    for (const auto& [N, C, OC] : {std::tuple{64, 128, 64}, std::tuple{5, 13, 16}}) {
        const int64_t need = int64_t(be.gpu->fp8_kept_elems(N, C, OC, dt));
        for (const bool keep : {false, true}) {
            if (keep && need == 0) continue;
            SCOPED_TRACE(fmt::format("{}x{}x{} {}{}", N, C, OC, dtype_name(dt), keep ? ", kept" : ""));
            DevTensor hc = put(*be.cpu, fresh, {3, F}, DType::F32),
                      hg = put(*be.gpu, fresh, {3, F}, DType::F32);
            DevTensor kept = poisoned(*be.gpu, {std::max<int64_t>(need, 1)}, dt);
            const Tensor kg = keep ? kept.t : Tensor{};
            const std::vector<float> w0 = randn(gen, size_t(C) * OC, 0.5f);
            const auto same_histories = [&](const char* after) {
                EXPECT_TRUE(bytes(*be.cpu, hc) == bytes(*be.gpu, hg))
                    << "the histories differ after " << after;
            };
            const float mags[] = {1.0f, 1.0f, 8.0f, 0.25f, 1.0f};
            for (size_t u = 0; u < std::size(mags); u++) {
                SCOPED_TRACE(fmt::format("use {} (magnitude {})", u, mags[u]));
                const std::vector<float> x = rounded(randn(gen, size_t(N) * C, mags[u]), dt);
                std::vector<float> w = w0;
                for (float& v : w) v *= mags[u];
                w = rounded(w, dt);
                const std::vector<float> dout = rounded(randn(gen, size_t(N) * OC, mags[u]), dt);
                DevTensor xc = put(*be.cpu, x, {N, C}, DType::F32), wc = put(*be.cpu, w, {C, OC}, DType::F32);
                DevTensor dc = put(*be.cpu, dout, {N, OC}, DType::F32);
                DevTensor oc(*be.cpu, {N, OC}), dxc(*be.cpu, {N, C}), dwc(*be.cpu, {C, OC});
                DevTensor xg = put(*be.gpu, x, {N, C}, dt), wg = put(*be.gpu, w, {C, OC}, dt);
                DevTensor dg = put(*be.gpu, dout, {N, OC}, dt), dwg(*be.gpu, {C, OC}, dt);
                DevTensor og = poisoned(*be.gpu, {N, OC}, dt), dxg = poisoned(*be.gpu, {N, C}, dt);
                if (u == 1) {  // an evaluation's forward: scaled by the history, nothing recorded
                    be.cpu->matmul_fp8_fwd(oc, xc, wc, WLayout::InOut, {}, {}, {}, {hc.t, false, false});
                    be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, kg, {hg.t, false, false});
                    EXPECT_TRUE(
                        close(get(*be.gpu, og), download(*be.cpu, oc), tol_for(dt), "evaluation out"));
                    same_histories("an evaluation");
                }
                be.cpu->matmul_fp8_fwd(oc, xc, wc, WLayout::InOut, {}, {}, {}, {hc.t, true, false});
                be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, kg, {hg.t, true, false});
                EXPECT_TRUE(close(get(*be.gpu, og), download(*be.cpu, oc), tol_for(dt), "out"));
                same_histories("a forward");
                if (u == 2) {  // what makes the case telling: x outgrew its history's scale
                    float amax = 0.0f;
                    for (float v : x) amax = std::max(amax, std::fabs(v));
                    EXPECT_GT(amax * download(*be.cpu, hc)[Fp8History::kScale], fp8_max(DType::F8E4M3));
                }
                if (u == 3) {  // run again: the same bits, the histories untouched
                    const std::vector<uint8_t> first = bytes(*be.gpu, og), held = bytes(*be.gpu, hg);
                    poison(*be.gpu, og);
                    be.gpu->matmul_fp8_fwd(og, xg, wg, WLayout::InOut, {}, {}, kg, {hg.t, true, true});
                    EXPECT_TRUE(bytes(*be.gpu, og) == first) << "the forward run again differs";
                    EXPECT_TRUE(bytes(*be.gpu, hg) == held) << "the forward run again moved the histories";
                }
                be.cpu->matmul_fp8_bwd(dxc, dwc, {}, dc, xc, wc, WLayout::InOut, {}, {}, {hc.t, true, false});
                be.gpu->matmul_fp8_bwd(dxg, dwg, {}, dg, xg, wg, WLayout::InOut, {}, kg, {hg.t, true, false});
                EXPECT_TRUE(close(get(*be.gpu, dxg), download(*be.cpu, dxc), tol_for(dt), "dx"));
                EXPECT_TRUE(close(get(*be.gpu, dwg), download(*be.cpu, dwc), tol_for(dt), "dw"));
                same_histories("a backward");
            }
            // and every ring slot was written
            const std::vector<float> h = download(*be.cpu, hc);
            for (size_t i = 0; i < 3; i++) {
                EXPECT_EQ(h[i * size_t(F) + Fp8History::kFilled], 1.0f);
                EXPECT_GT(h[i * size_t(F) + Fp8History::kRing + 1], 0.0f);
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFp8Scale, ::testing::Values(DType::F32, DType::BF16, DType::F16),
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

// Backend::record: recording runs nothing; each replay runs the work on what its memory holds then (a
// product and a conversion, cuBLASLt's and a kernel); work that waits for the device is not recorded (null,
// nothing of it ran) and a throw inside the work ends the recording and propagates; the CPU records nothing.
TEST(CudaBackend, RecordsWorkAndReplaysItOnTodaysValues) {
    Backends be;
    const int n = 16;
    std::mt19937_64 gen(test_seed());
    std::vector<float> a = randn(gen, n * n, 1.0f), x = randn(gen, n, 1.0f);
    DevTensor A = put(*be.gpu, a, {n, n}, DType::F32), X = put(*be.gpu, x, {1, n}, DType::F32);
    DevTensor Y = poisoned(*be.gpu, {1, n}, DType::F32), Z = poisoned(*be.gpu, {1, n}, DType::BF16);
    const auto work = [&] {
        be.gpu->matmul_fwd(Y, X, A, WLayout::InOut, {}, {});
        be.gpu->convert(Z, Y);
    };
    const auto want = [&] {  // on the CPU backend, from the GPU's inputs of the moment
        DevTensor a_c = put(*be.cpu, get(*be.gpu, A), {n, n}, DType::F32);
        DevTensor x_c = put(*be.cpu, get(*be.gpu, X), {1, n}, DType::F32), y_c(*be.cpu, {1, n});
        be.cpu->matmul_fwd(y_c, x_c, a_c, WLayout::InOut, {}, {});
        return rounded(get(*be.cpu, y_c), DType::BF16);
    };
    auto rec = be.gpu->record(work);
    ASSERT_NE(rec, nullptr);
    for (float z : get(*be.gpu, Z)) ASSERT_TRUE(std::isnan(z)) << "recording ran the work";
    for (int r = 0; r < 3; r++) {
        x = randn(gen, n, 1.0f);
        be.gpu->upload(X, x.data());  // new values in the same memory
        ASSERT_TRUE(rec->replay());
        EXPECT_TRUE(all_close(get(*be.gpu, Z), want(), 1e-2, 1e-2, "replay " + std::to_string(r)));
    }
    poison(*be.gpu, Z);
    EXPECT_EQ(be.gpu->record([&] {
        work();
        be.gpu->synchronize();  // a wait for the device: no graph holds it
    }),
              nullptr);
    for (float z : get(*be.gpu, Z)) EXPECT_TRUE(std::isnan(z)) << "a refused recording ran its work";
    EXPECT_THROW(be.gpu->record([&] {
        work();
        be.gpu->matmul_fwd(Y, A, A, WLayout::InOut, {}, {});  // shapes that do not fit: the op's error
    }),
                 Error);
    ASSERT_NE(be.gpu->record(work), nullptr) << "a recording after a failed one";
    EXPECT_EQ(be.cpu->record(work), nullptr);
}

}  // namespace
}  // namespace anvil::test
