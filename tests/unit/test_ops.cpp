// The op table's first mode on the CPU backend (the spec): every op's backward against central finite
// differences of its forward, and its outputs against a host reference in double (tests/ops/op_cases.h).
// Inputs are fresh random draws each run; the seed is printed at the start and ANVIL_TEST_SEED replays it.
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "../ops/op_cases.h"
#include "backend/cpu/vec_math.h"
#include "backend/profiling_backend.h"
#include "harness.h"

namespace anvil::test {
namespace {

class OpGradients : public ::testing::TestWithParam<size_t> {};

TEST_P(OpGradients, MatchFiniteDifferencesAndReference) {
    const OpCase c = op_cases()[GetParam()];
    SCOPED_TRACE(c.name);
    auto cpu = make_backend({Device::CPU, 2, 0});
    const std::string err = check_gradients(c, *cpu, test_seed() + GetParam());
    EXPECT_TRUE(err.empty()) << err << "seed " << test_seed();
}

INSTANTIATE_TEST_SUITE_P(Table, OpGradients, ::testing::Range(size_t(0), op_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) {
                             std::string n = op_cases()[p.param].name;
                             for (char& ch : n)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return std::to_string(p.param) + "_" + n;
                         });

// The op list (backend/ops.def) and the op table agree: every listed op is called by some case's forward or
// backward (counted by the profiling backend, which forwards every op under its listed name).
TEST(OpTable, CoversEveryListedOp) {
    auto cpu = make_backend({Device::CPU, 2, 0});
    ProfilingBackend prof(*cpu);
    for (const OpCase& c : op_cases()) time_case(c, prof, DType::F32, 1);
    for (const char* op : kBackendOps)
        EXPECT_GT(prof.op_calls().count(op), 0u)
            << op << " is in backend/ops.def but no case in tests/ops calls it";
}

// A strided view (Tensor::cols) reaches only the arguments ops.def marks [strided]; anywhere else it is an
// error naming the op, never a silent misread of its rows.
TEST(StridedViews, RefusedWhereAnOpReadsContiguousRows) {
    auto cpu = make_backend({Device::CPU, 2, 0});
    const int N = 6, C = 8;
    DevTensor wide(*cpu, {N, 3 * C}), x(*cpu, {N, C}), w(*cpu, {C, C}), dx(*cpu, {N, C}), dw(*cpu, {C, C});
    const Tensor view = wide.t.cols(C, C);
    EXPECT_FALSE(view.contiguous());
    EXPECT_EQ(view.ld(), 3 * C);
    EXPECT_NO_THROW(cpu->matmul_fwd(view, x.t, w.t, WLayout::InOut, {}, {}));       // [strided: out]
    EXPECT_THROW(cpu->matmul_fwd(x.t, view, w.t, WLayout::InOut, {}, {}), Error);   // the input
    EXPECT_THROW(cpu->matmul_fwd(view, x.t, w.t, WLayout::InOut, {}, x.t), Error);  // out with the GELU
    EXPECT_THROW(cpu->matmul_bwd(dx.t, dw.t, {}, view, x.t, w.t, WLayout::InOut, {}), Error);
    EXPECT_THROW(cpu->gelu_fwd(view, x.t), Error);
    EXPECT_THROW(cpu->convert(view, x.t), Error);
    EXPECT_THROW((void)view.view(Shape{N * C}), Error);
    // a single row, or every column, is contiguous
    EXPECT_TRUE(wide.t.cols(0, 3 * C).contiguous());
    EXPECT_TRUE(wide.t.slice0(0).view(Shape{1, 3 * C}).cols(C, C).contiguous());
}

// attention_cached_rows' own_slots is a promise about the rows (each in a slot of its own: a decode step),
// on which a backend may write the keys and values as it attends; a packed prefill's rows share a slot, and
// such a call with the promise is refused where the host can read the slots, naming the slot.
TEST(AttentionCachedRows, OwnSlotsRefusedWhereTwoRowsShareOne) {
    auto cpu = make_backend({Device::CPU, 2, 0});
    const int B = 3, NH = 2, HS = 4, C = NH * HS, page = 4, S = 3, PPS = 2;
    DevTensor qkv(*cpu, {B, 3 * C}), out(*cpu, {B, C}), k(*cpu, {S * PPS, page, C}),
        v(*cpu, {S * PPS, page, C});
    DevTensor pages(*cpu, {S, PPS}, DType::I32), slot(*cpu, {B}, DType::I32), pos(*cpu, {B}, DType::I32);
    for (int i = 0; i < S * PPS; i++) pages.t.ptr<int32_t>()[i] = i;
    for (Tensor t : {qkv.t, k.t, v.t}) std::fill_n(t.f32(), t.numel(), 0.5f);
    const auto call = [&](std::vector<int32_t> slots, std::vector<int32_t> positions, bool own) {
        std::copy(slots.begin(), slots.end(), slot.t.ptr<int32_t>());
        std::copy(positions.begin(), positions.end(), pos.t.ptr<int32_t>());
        cpu->attention_cached_rows(out, qkv, k, v, pages, slot, pos, NH, own);
    };
    EXPECT_NO_THROW(call({2, 0, 1}, {3, 0, 5}, true));   // a decode step
    EXPECT_NO_THROW(call({1, 1, 0}, {2, 3, 0}, false));  // a packed prefill beside a decode row
    try {
        call({1, 1, 0}, {2, 3, 0}, true);
        ADD_FAILURE() << "two rows of slot 1 taken as a decode step";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("two rows are in slot 1"), std::string::npos) << e.what();
    }
}

TEST(CpuMath, ExpApprox) {
    for (float x = -87.0f; x < 88.0f; x += 0.37f) {
        const double want = std::exp(double(x));
        EXPECT_NEAR(cpu::vexp(x) / want, 1.0, 3e-7) << "x=" << x;
    }
}

// The attention backward's scratch holds one block per thread of *its* backend: another backend with more
// threads (OpenMP's thread count is process-wide) must not make it write past the scratch.
TEST(CpuBackend, AttentionScratchFollowsItsOwnThreadCount) {
    auto one = make_backend({Device::CPU, 1, 0});
    auto four = make_backend({Device::CPU, 4, 0});  // created last: sets the process-wide default to 4
    const int B = 2, T = 16, C = 8, NH = 2;
    const AttnDims d{B, T, NH, C / NH};
    std::mt19937_64 g(test_seed());
    const size_t n = one->attention_scratch_elems(d), guard = 3 * size_t(T) * T;
    EXPECT_EQ(n, size_t(T) * T) << "one thread, one (T, T) block";
    DevTensor qkv = upload(*one, randn(g, size_t(B) * T * 3 * C), {B, T, 3 * C});
    DevTensor out(*one, {B, T, C}), saved(*one, {int64_t(one->attention_saved_elems(d))});
    DevTensor dqkv(*one, {B, T, 3 * C});
    std::vector<float> scratch_host(n + guard, 1234.5f);
    DevTensor scratch = upload(*one, scratch_host, {int64_t(n + guard)});
    Tensor exact = scratch.t;
    exact.shape = Shape{int64_t(n)};
    const AttnDropout drop{0.25f, 3, 0};  // the dropout's copy of the probabilities is the scratch too
    one->attention_fwd(out, saved, qkv, NH, drop);
    one->attention_bwd(dqkv, exact, upload(*one, randn(g, size_t(B) * T * C), {B, T, C}), qkv, out, saved, NH,
                       drop);
    const std::vector<float> after = download(*one, scratch);
    for (size_t i = n; i < n + guard; i++)
        ASSERT_EQ(after[i], 1234.5f) << "written past the scratch at " << i;
}

// set_autocast(BF16): matmul_fwd/_bwd multiply f32 tensors with both operands rounded to bf16 (round to
// nearest even) and accumulate in f32, as PyTorch's CPU autocast does: against the same products of the
// rounded operands in double (both weight layouts, bias, the GELU epilogue, din, dw accumulated, dbias), and
// measurably unlike the f32 products. Skipped where anvil was built without oneDNN.
TEST(CpuBackend, Bf16ProductsRoundTheOperands) {
    auto be = make_backend({Device::CPU, 2, 0});
    if (!be->set_autocast(DType::BF16)) GTEST_SKIP() << "built without oneDNN: no bf16 products";
    auto f32 = make_backend({Device::CPU, 2, 0});
    const auto bf16 = [](float x) {  // round to nearest even, by bits
        uint32_t u;
        std::memcpy(&u, &x, 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        float y;
        std::memcpy(&y, &u, 4);
        return y;
    };
    std::mt19937_64 g(test_seed());
    for (const auto& [N, C, OC] : {std::tuple{37, 50, 29}, std::tuple{64, 128, 96}})
        for (WLayout layout : {WLayout::InOut, WLayout::OutIn}) {
            SCOPED_TRACE(fmt::format("{}x{}x{} {}", N, C, OC, layout == WLayout::InOut ? "InOut" : "OutIn"));
            const std::vector<float> x = randn(g, size_t(N) * C), w = randn(g, size_t(C) * OC),
                                     b = randn(g, size_t(OC)), dy = randn(g, size_t(N) * OC),
                                     dw0 = randn(g, size_t(C) * OC);
            // W's element (i, o) of the (C, OC) product wherever the layout stores it
            const auto W = [&](const std::vector<float>& v, int i, int o) {
                return layout == WLayout::InOut ? v[size_t(i) * OC + o] : v[size_t(o) * C + i];
            };
            const Shape ws = layout == WLayout::InOut ? Shape{C, OC} : Shape{OC, C};
            std::vector<double> y(size_t(N) * OC), din(size_t(N) * C), dw(size_t(C) * OC),
                db(static_cast<size_t>(OC));
            for (int n = 0; n < N; n++)
                for (int o = 0; o < OC; o++) {
                    double acc = b[size_t(o)];
                    for (int i = 0; i < C; i++) acc += double(bf16(x[size_t(n) * C + i])) * bf16(W(w, i, o));
                    y[size_t(n) * OC + o] = acc;
                }
            for (int n = 0; n < N; n++)
                for (int i = 0; i < C; i++) {
                    double acc = 0;
                    for (int o = 0; o < OC; o++)
                        acc += double(bf16(dy[size_t(n) * OC + o])) * bf16(W(w, i, o));
                    din[size_t(n) * C + i] = acc;
                }
            for (int i = 0; i < C; i++)
                for (int o = 0; o < OC; o++) {
                    double acc = W(dw0, i, o);
                    for (int n = 0; n < N; n++)
                        acc += double(bf16(x[size_t(n) * C + i])) * bf16(dy[size_t(n) * OC + o]);
                    dw[layout == WLayout::InOut ? size_t(i) * OC + o : size_t(o) * C + i] = acc;
                }
            for (int o = 0; o < OC; o++)
                for (int n = 0; n < N; n++) db[size_t(o)] += dy[size_t(n) * OC + o];
            const auto close = [](const std::vector<float>& got, const std::vector<double>& want,
                                  const char* what) {
                double mx = 0;
                for (double v : want) mx = std::max(mx, std::fabs(v));
                for (size_t k = 0; k < want.size(); k++)
                    ASSERT_NEAR(got[k], want[k], 2e-6 * (std::fabs(want[k]) + mx)) << what << "[" << k << "]";
            };
            Backend* bes[2] = {be.get(), f32.get()};
            std::vector<float> out[2], pre[2], gin[2], gw[2], gb[2];
            for (int k = 0; k < 2; k++) {
                Backend& e = *bes[k];
                DevTensor dx = upload(e, x, {N, C}), dwt = upload(e, w, ws), dbias = upload(e, b, {OC});
                DevTensor o(e, {N, OC}), p(e, {N, OC}), gi(e, {N, C}), gwt = upload(e, dw0, ws), gbt(e, {OC});
                DevTensor dyt = upload(e, dy, {N, OC});
                e.zero(gbt);
                e.matmul_fwd(o, dx, dwt, layout, dbias, {});
                out[k] = download(e, o);
                e.matmul_fwd(o, dx, dwt, layout, dbias, p);  // the GELU epilogue: p the product, o its GELU
                pre[k] = download(e, p);
                e.matmul_bwd(gi, gwt, gbt, dyt, dx, dwt, layout, {});
                gin[k] = download(e, gi), gw[k] = download(e, gwt), gb[k] = download(e, gbt);
            }
            close(out[0], y, "out");
            close(pre[0], y, "pre_gelu");
            close(gin[0], din, "din");
            close(gw[0], dw, "dw");
            close(gb[0], db, "dbias");
            double diff = 0;
            for (size_t k = 0; k < out[0].size(); k++)
                diff = std::max(diff, double(std::fabs(out[0][k] - out[1][k])));
            EXPECT_GT(diff, 1e-3) << "the bf16 products must differ from the f32 ones";
        }
    EXPECT_TRUE(be->set_autocast(DType::F32));
}

}  // namespace
}  // namespace anvil::test
