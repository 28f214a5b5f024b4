// AdamW, global norm, clipping, the NaN guard and the learning-rate schedule.
#include <cmath>

#include "harness.h"
#include "train/schedule.h"

namespace anvil::test {
namespace {

// PyTorch's AdamW in double, the reference.
void adamw_ref(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
               std::vector<double>& v, double lr, double b1, double b2, double eps, double wd, int step) {
    for (size_t i = 0; i < p.size(); i++) {
        p[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
}

struct OptFixture : ::testing::Test {
    std::unique_ptr<Backend> be = make_backend({Device::CPU, 2, 0});
    std::mt19937_64 gen{test_seed()};
};

TEST_F(OptFixture, AdamWMatchesReferenceWithClipping) {
    const int n = 257;
    std::vector<float> p0 = randn(gen, n), g0 = randn(gen, n, 3.0f);
    DevTensor p = upload(*be, p0, {n}), g = upload(*be, g0, {n}), m(*be, {n}), v(*be, {n}), nsq(*be, {1});
    std::vector<double> pr(p0.begin(), p0.end()), mr(n, 0), vr(n, 0);
    AdamWArgs a;
    a.lr = 1e-2f;
    a.max_grad_norm = 1.0f;
    for (int step = 1; step <= 5; step++) {
        a.step = step;
        be->global_norm_sq(nsq, {g.t});
        const double norm = std::sqrt(double(download(*be, nsq)[0]));
        double ss = 0;
        for (float x : g0) ss += double(x) * x;
        EXPECT_NEAR(norm, std::sqrt(ss), 1e-4 * std::sqrt(ss));
        be->adamw({ParamSlot{p, g, m, v, {}, 0.1f}}, a, nsq);
        std::vector<double> gr(g0.begin(), g0.end());
        const double scale = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
        for (auto& x : gr) x *= scale;
        adamw_ref(pr, gr, mr, vr, a.lr, a.beta1, a.beta2, a.eps, 0.1, step);
    }
    EXPECT_TRUE(all_close(download(*be, p), std::vector<float>(pr.begin(), pr.end()), 1e-5, 1e-6, "adamw"));
}

TEST_F(OptFixture, NonFiniteNormSkipsTheUpdate) {
    const int n = 16;
    std::vector<float> p0 = randn(gen, n), g0 = randn(gen, n);
    g0[5] = NAN;
    DevTensor p = upload(*be, p0, {n}), g = upload(*be, g0, {n}), m(*be, {n}), v(*be, {n}), nsq(*be, {1});
    be->global_norm_sq(nsq, {g.t});
    EXPECT_TRUE(std::isnan(download(*be, nsq)[0]));
    AdamWArgs a;
    a.lr = 0.1f;
    be->adamw({ParamSlot{p, g, m, v, {}, 0.1f}}, a, nsq);
    EXPECT_EQ(download(*be, p), p0) << "weights untouched";
    EXPECT_EQ(download(*be, m), std::vector<float>(n, 0.0f)) << "moments untouched";
}

TEST_F(OptFixture, NormIsIndependentOfThreadCount) {
    const int n = 100003;
    const std::vector<float> g0 = randn(gen, n);
    float r[2];
    for (int threads : {1, 2}) {
        auto b = make_backend({Device::CPU, threads, 0});
        DevTensor g = upload(*b, g0, {n}), nsq(*b, {1});
        b->global_norm_sq(nsq, {g.t});
        r[threads - 1] = download(*b, nsq)[0];
    }
    EXPECT_EQ(r[0], r[1]);
}

TEST(Schedule, WarmupThenCosine) {
    LrSchedule s{1.0f, 0.1f, 10, 110, LrShape::Cosine};
    EXPECT_FLOAT_EQ(s.at(0), 0.1f);
    EXPECT_FLOAT_EQ(s.at(9), 1.0f);
    EXPECT_FLOAT_EQ(s.at(10), 1.0f);
    EXPECT_NEAR(s.at(10 + 99 / 2), 0.55f + 0.45f * std::cos(3.14159265f * 49 / 99), 1e-6);
    EXPECT_FLOAT_EQ(s.at(109), 0.1f);
    LrSchedule c{0.5f, 0.1f, 0, 10, LrShape::Constant};
    EXPECT_EQ(c.at(0), 0.5f);
    EXPECT_EQ(c.at(9), 0.5f);
}

// llm.c's linear and warmup-stable-decay shapes, ending at the floor on the last step.
TEST(Schedule, LinearAndWarmupStableDecay) {
    LrSchedule l{1.0f, 0.1f, 10, 110, LrShape::Linear};
    EXPECT_FLOAT_EQ(l.at(9), 1.0f);
    EXPECT_FLOAT_EQ(l.at(10), 1.0f);
    EXPECT_NEAR(l.at(10 + 33), 1.0f - 0.9f * 33 / 99, 1e-6);
    EXPECT_FLOAT_EQ(l.at(109), 0.1f);
    // 100 steps, 5 of warmup, the last 20 decaying: 5..79 stable, 80..99 along 1 - sqrt(r) to 0
    LrSchedule w{2.0f, 0.0f, 5, 100, LrShape::Wsd, 0.2f};
    EXPECT_FLOAT_EQ(w.at(0), 0.4f);
    EXPECT_FLOAT_EQ(w.at(4), 2.0f);
    EXPECT_FLOAT_EQ(w.at(50), 2.0f);
    EXPECT_FLOAT_EQ(w.at(79), 2.0f);
    EXPECT_FLOAT_EQ(w.at(80), 2.0f);  // r = 0
    EXPECT_NEAR(w.at(80 + 4), 2.0f * (1.0f - std::sqrt(4.0f / 19)), 1e-6);
    EXPECT_FLOAT_EQ(w.at(99), 0.0f);
    for (int s = 81; s < 100; s++) EXPECT_LT(w.at(s), w.at(s - 1)) << s;
    // a decay longer than the run after warmup starts where warmup ends
    LrSchedule all{1.0f, 0.5f, 4, 10, LrShape::Wsd, 1.0f};
    EXPECT_FLOAT_EQ(all.at(3), 1.0f);
    EXPECT_FLOAT_EQ(all.at(4), 1.0f);
    EXPECT_NEAR(all.at(6), 0.5f + 0.5f * (1.0f - std::sqrt(2.0f / 5)), 1e-6);
    EXPECT_FLOAT_EQ(all.at(9), 0.5f);
    expect_error([] { parse_lr_shape("step"); }, "--lr-schedule step: use cosine, linear, constant or wsd");
}

}  // namespace
}  // namespace anvil::test
