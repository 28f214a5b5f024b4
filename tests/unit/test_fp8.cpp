// FP8 (--precision fp8): the formats' rounding and the per-tensor scale against an independent model of them
// (tests/ops: every value decoded from its bits, the nearest found by search), and a model trained with FP8
// products (simulated on the CPU) against the same model in fp32.
#include <algorithm>
#include <cmath>
#include <deque>

#include "../ops/op_cases.h"
#include "core/fp8.h"
#include "harness.h"
#include "model_harness.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace anvil::test {
namespace {

class Fp8Format : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8Format, RoundsToTheNearestValueTiesToEven) {
    const DType t = GetParam();
    const Fp8Grid grid(t);
    EXPECT_EQ(fp8_max(t), float(grid.max));
    std::vector<double> finite;  // the non-negative values, ascending
    for (int b = 0; b < 256; b++) {
        const double v = grid.values[size_t(b)];
        if (std::isnan(v)) {
            EXPECT_TRUE(std::isnan(fp8_value(uint8_t(b), t)) || std::isinf(fp8_value(uint8_t(b), t))) << b;
            continue;
        }
        EXPECT_EQ(fp8_value(uint8_t(b), t), float(v)) << "pattern " << b;
        EXPECT_EQ(fp8_round(float(v), t), float(v));
        EXPECT_EQ(fp8_bits(float(v), t), b) << "value " << v;
        if (b < 0x80) finite.push_back(v);
    }
    std::sort(finite.begin(), finite.end());
    // every midpoint between neighbours: a tie, which goes to the even pattern, either sign
    for (size_t i = 0; i + 1 < finite.size(); i++) {
        const float mid = float((finite[i] + finite[i + 1]) / 2);
        ASSERT_EQ(double(mid), (finite[i] + finite[i + 1]) / 2) << "the midpoint is exact in f32";
        EXPECT_EQ(fp8_bits(mid, t), grid.nearest_bits(mid)) << "tie at " << mid;
        EXPECT_EQ(fp8_bits(-mid, t), grid.nearest_bits(-mid)) << "tie at " << -mid;
    }
    // random magnitudes over the whole range and below the smallest subnormal
    std::mt19937_64 g(test_seed());
    std::uniform_real_distribution<double> lg(-22.0, std::log2(grid.max));
    for (int i = 0; i < 20000; i++) {
        const float x = float(std::exp2(lg(g))) * (g() % 2 ? 1.0f : -1.0f);
        ASSERT_EQ(fp8_bits(x, t), grid.nearest_bits(x)) << "x = " << x << " seed " << test_seed();
    }
    // no saturation: NaN stays NaN, past the largest value E4M3 gives NaN and E5M2 Inf
    EXPECT_TRUE(std::isnan(fp8_round(std::nanf(""), t)));
    const float past = float(grid.max) * 1.25f;
    if (t == DType::F8E4M3) {
        EXPECT_TRUE(std::isnan(fp8_round(past, t)));
        EXPECT_TRUE(std::isnan(fp8_round(INFINITY, t)));
    } else {
        EXPECT_EQ(fp8_round(past, t), INFINITY);
        EXPECT_EQ(fp8_round(-INFINITY, t), -INFINITY);
        EXPECT_EQ(fp8_bits(INFINITY, t), 0x7c);
    }
    // the bulk conversions are the same rounding
    const std::vector<float> src = {0.3f, -17.0f, 1e-6f, float(grid.max)};
    std::vector<uint8_t> bits(src.size());
    std::vector<float> back(src.size());
    convert_from_f32(bits.data(), t, src.data(), src.size());
    convert_to_f32(back.data(), bits.data(), t, src.size());
    for (size_t i = 0; i < src.size(); i++) EXPECT_EQ(back[i], fp8_round(src[i], t));
}

TEST_P(Fp8Format, ScaleIsTheLargestPowerOfTwoThatFits) {
    const DType t = GetParam();
    const Fp8Grid grid(t);
    std::mt19937_64 g(test_seed());
    std::uniform_real_distribution<double> lg(-140.0, 127.0);
    std::vector<float> amax = {1.0f, float(grid.max), std::nextafter(float(grid.max), INFINITY), 3e38f,
                               1e-40f};
    for (int j = -20; j <= 20; j++) amax.push_back(std::ldexp(float(grid.max), j));
    for (int i = 0; i < 5000; i++) amax.push_back(float(std::exp2(lg(g))));
    for (float a : amax) EXPECT_EQ(fp8_scale_exp(a, t), grid.scale_exp(a)) << "amax " << a;
    EXPECT_EQ(fp8_scale_exp(0.0f, t), 0);
    EXPECT_EQ(fp8_scale_exp(INFINITY, t), 0);
    EXPECT_EQ(fp8_scale_exp(std::nanf(""), t), 0);
    // the whole fake quantization: amax, scale, rounding, back
    std::vector<float> x = randn(g, 999, 3.0f), q(x.size());
    fp8_fake_quantize(q.data(), x.data(), x.size(), t);
    EXPECT_EQ(q, grid.quantize(x));
}

// Delayed scaling's rounding under a scale the operand outgrows: a finite value past the format's max
// saturates to it (also where x times the scale overflows f32), Inf and NaN stay non-finite as fp8_round
// makes them; inside the range it is fp8_fake_quantize's rounding. The amax comes back, NaN skipped.
TEST_P(Fp8Format, ScaledRoundingSaturatesWhatOutgrowsTheScale) {
    const DType t = GetParam();
    const Fp8Grid grid(t);
    std::mt19937_64 g(test_seed());
    std::vector<float> x = randn(g, 500, 3.0f);
    x.insert(x.end(), {1e30f, -1e30f, 3e38f, INFINITY, -INFINITY, std::nanf(""), 0.0f, -0.0f});
    for (const int k : {0, 4, 40, 126}) {
        SCOPED_TRACE("scale 2^" + std::to_string(k));
        std::vector<float> q(x.size());
        const float amax = fp8_fake_quantize_scaled(q.data(), x.data(), x.size(), t, std::ldexp(1.0f, k),
                                                    std::ldexp(1.0f, -k));
        EXPECT_EQ(amax, INFINITY);
        for (size_t i = 0; i < x.size(); i++) {
            if (std::isnan(x[i])) {
                EXPECT_TRUE(std::isnan(q[i]));
            } else if (std::isinf(x[i])) {  // NaN in E4M3 (no infinities), Inf in E5M2
                EXPECT_TRUE(t == DType::F8E4M3 ? std::isnan(q[i]) : q[i] == x[i]) << q[i];
            } else {
                const double v = std::clamp(double(x[i]) * std::ldexp(1.0, k), -grid.max, grid.max);
                EXPECT_EQ(double(q[i]), grid.nearest(v) * std::ldexp(1.0, -k)) << "x " << x[i];
            }
        }
    }
}

// Delayed scaling's history against a model of it written here: each use's scale from the largest amax of
// the H uses before it (the first use from its own), the ring overwriting its oldest, a non-finite amax kept
// as 0, a use that does not record leaving no amax behind, the roundings' amax raising a use's own.
TEST_P(Fp8Format, HistoryScalesEachUseFromTheUsesBefore) {
    const DType t = GetParam();
    const Fp8Grid grid(t);
    const int H = 3;
    std::vector<float> st(size_t(Fp8History::floats(H)), -1.0f);
    fp8_history_init(st.data(), H);
    EXPECT_EQ(st[Fp8History::kLength], float(H));
    std::deque<double> ring;  // the model: the last H recorded amaxes
    const std::vector<float> amaxes = {2.0f, 0.5f, 300.0f, 1e-3f, INFINITY, 7.0f, 0.25f, 40.0f, 1e4f};
    for (size_t u = 0; u < amaxes.size(); u++) {
        const bool record = u != 5;  // one use (an evaluation) records nothing
        SCOPED_TRACE(fmt::format("use {}, amax {}, {}", u, amaxes[u], record ? "recorded" : "not recorded"));
        std::vector<float> x = {0.1f, -amaxes[u], 0.0f, amaxes[u] / 3};
        const double want_amax =
            ring.empty() ? double(amaxes[u]) : *std::max_element(ring.begin(), ring.end());
        const int k = fp8_history_begin(st.data(), x.data(), x.size(), t, record);
        EXPECT_EQ(k, grid.scale_exp(std::isfinite(want_amax) ? want_amax : 0.0));
        EXPECT_EQ(st[Fp8History::kScale], std::ldexp(1.0f, k));
        EXPECT_EQ(st[Fp8History::kDequant], std::ldexp(1.0f, -k));
        if (record) {
            fp8_history_note(st.data(), amaxes[u]);  // the roundings' amax
            ring.push_back(std::isfinite(amaxes[u]) ? amaxes[u] : 0.0);
            if (int(ring.size()) > H) ring.pop_front();
        }
    }
    // the last use's amax joins the ring at the next use
    std::vector<float> x = {1.0f};
    fp8_history_begin(st.data(), x.data(), x.size(), t, false);
    std::vector<double> got(st.begin() + Fp8History::kRing, st.begin() + Fp8History::kRing + H);
    std::sort(got.begin(), got.end());
    std::vector<double> want(ring.begin(), ring.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Format, ::testing::Values(DType::F8E4M3, DType::F8E5M2),
                         [](const auto& p) {
                             return std::string(p.param == DType::F8E4M3 ? "E4M3" : "E5M2");
                         });

// A tiny GPT-2 and Llama trained 30 AdamW steps on one batch with FP8 products (the blocks' linear layers;
// on the CPU the rounding is simulated in f32; GPT-2 also with delayed scaling) and in fp32 from the same
// weights: the FP8 gradients point
// where fp32's do, and the FP8 loss curve follows fp32's while differing from it (the rounding is there).
class Fp8Training : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8Training, TracksFp32) {
    const ModelConfig cfg = std::string(GetParam()) == "llama" ? tiny_llama(false) : tiny();
    std::vector<double> curve[2];
    std::vector<std::vector<float>> grads[2];
    for (int r = 0; r < 2; r++) {
        ModelOptions mo;
        mo.fp8 = r == 1;
        if (mo.fp8 && std::string(GetParam()) == "gpt2_delayed") mo.fp8_history = 16;
        TinyRun run(5, mo, cfg);
        run.loss(true);
        for (size_t i : run.model->params().trainable())
            grads[r].push_back(download(*run.be, run.model->params().grad(i)));
        curve[r] = run.train(30, 1e-2f, 0.0f);
    }
    for (size_t k = 0; k < grads[0].size(); k++) {
        double dot = 0, n0 = 0, n1 = 0;
        for (size_t e = 0; e < grads[0][k].size(); e++) {
            dot += double(grads[0][k][e]) * grads[1][k][e];
            n0 += double(grads[0][k][e]) * grads[0][k][e];
            n1 += double(grads[1][k][e]) * grads[1][k][e];
        }
        EXPECT_GT(dot / std::sqrt(n0 * n1 + 1e-30), 0.98) << "cosine of FP8 and fp32 gradients, tensor " << k;
    }
    double worst = 0;
    bool differs = false;
    for (size_t s = 0; s < curve[0].size(); s++) {
        worst = std::max(worst, std::abs(curve[1][s] - curve[0][s]) / curve[0][s]);
        differs = differs || curve[1][s] != curve[0][s];
    }
    EXPECT_TRUE(differs) << "the FP8 run must round something";
    EXPECT_LT(curve[1].back(), 0.5 * curve[1].front()) << "did not learn";
    EXPECT_LT(worst, 0.05) << "largest relative gap to the fp32 loss curve";
    std::printf("%s fp8 vs fp32: largest relative loss gap %.4f over 30 steps (final %.4f vs %.4f)\n",
                GetParam(), worst, curve[1].back(), curve[0].back());
}

INSTANTIATE_TEST_SUITE_P(Family, Fp8Training, ::testing::Values("gpt2", "llama", "gpt2_delayed"));

}  // namespace
}  // namespace anvil::test
