#include "harness.h"

#include <cstdio>
#include <cstdlib>

namespace anvil::test {

uint64_t test_seed() {
    static const uint64_t seed = [] {
        if (const char* s = std::getenv("ANVIL_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
        return uint64_t(std::random_device{}()) << 16 ^ uint64_t(std::random_device{}());
    }();
    return seed;
}

namespace {
// Prints the run's seed before the first test: a failure seen once can be replayed.
class SeedReport : public ::testing::Environment {
public:
    void SetUp() override {
        std::printf("random inputs from seed %llu (ANVIL_TEST_SEED=%llu replays them)\n",
                    (unsigned long long)test_seed(), (unsigned long long)test_seed());
    }
};
[[maybe_unused]] ::testing::Environment* const kSeedReport = ::testing::AddGlobalTestEnvironment(new SeedReport);
}  // namespace

::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                                     double atol, const std::string& what) {
    if (a.size() != b.size())
        return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
    double worst = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
            return ::testing::AssertionFailure() << what << ": non-finite at " << i << " (" << a[i] << " vs "
                                                 << b[i] << "), seed " << test_seed();
        const double excess = std::abs(double(a[i]) - double(b[i])) / (atol + rtol * std::abs(double(b[i])));
        if (excess > worst) {
            worst = excess;
            wi = i;
        }
    }
    if (worst > 1.0)
        return ::testing::AssertionFailure()
               << what << ": element " << wi << " got " << a[wi] << " expected " << b[wi] << " (rtol " << rtol
               << ", atol " << atol << "), seed " << test_seed();
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult check_grad(std::vector<float>& x, const std::vector<float>& grad,
                                      const std::function<double()>& loss, const std::string& what,
                                      double eps, double rtol, double atol, std::vector<size_t> indices) {
    if (indices.empty())
        for (size_t i = 0; i < x.size(); i++) indices.push_back(i);
    std::vector<float> fd, an;
    // Central difference over a step h, using the perturbation actually applied (float rounding of x +- h).
    auto central = [&](float& xi, double h) {
        const float keep = xi;
        xi = keep + float(h);
        const double lp = loss();
        xi = keep - float(h);
        const double lm = loss();
        xi = keep;
        return (lp - lm) / (double(keep + float(h)) - double(keep - float(h)));
    };
    for (size_t i : indices) {
        // Richardson extrapolation over steps eps and 2 eps cancels the h^2 term of the central difference:
        // a strongly curved point (a large-weight tiny model has them) no longer reads as a wrong gradient.
        fd.push_back(float((4.0 * central(x[i], eps) - central(x[i], 2.0 * eps)) / 3.0));
        an.push_back(grad[i]);
    }
    return all_close(an, fd, rtol, atol, what + " gradient vs finite differences");
}

}  // namespace anvil::test
