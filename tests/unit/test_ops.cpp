// The op table's first mode on the CPU backend (the spec): every op's backward against central finite
// differences of its forward, and its outputs against a host reference in double (tests/ops/op_cases.h).
// Inputs are fresh random draws each run; the seed is printed at the start and ANVIL_TEST_SEED replays it.
#include <cmath>

#include "../ops/op_cases.h"
#include "backend/cpu/vec_math.h"
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
    for (size_t i = n; i < n + guard; i++) ASSERT_EQ(after[i], 1234.5f) << "written past the scratch at " << i;
}

}  // namespace
}  // namespace anvil::test
