// anvil compare's statistics (runtime/compare.h): the paired bootstrap against what it must give on cases
// whose answer is known, against the normal approximation on a large sample, and its interval's coverage over
// many simulated evaluations; the per-example file's round trip and the record check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/rng.h"
#include "io/fs.h"
#include "runtime/compare.h"

namespace anvil {
namespace {

TEST(PairedBootstrap, SameValuesGiveZeroAndNoDifference) {
    const std::vector<double> a = {1, 0, 1, 1, 0, 0, 1};
    const PairedComparison r = paired_bootstrap(a, a, 1000, 7);
    EXPECT_EQ(r.n, 7);
    EXPECT_EQ(r.diff, 0.0);
    EXPECT_EQ(r.lo, 0.0);
    EXPECT_EQ(r.hi, 0.0);
    EXPECT_EQ(r.p_value, 1.0);
    EXPECT_EQ(r.a_higher + r.b_higher, 0);
}

TEST(PairedBootstrap, ConstantShiftIsExact) {
    const std::vector<double> a = {0.1, 2.0, -1.0, 3.5}, b = {0.6, 2.5, -0.5, 4.0};
    const PairedComparison r = paired_bootstrap(a, b, 1000, 1);
    EXPECT_NEAR(r.diff, 0.5, 1e-12);
    EXPECT_NEAR(r.lo, 0.5, 1e-12);
    EXPECT_NEAR(r.hi, 0.5, 1e-12);
    EXPECT_EQ(r.b_higher, 4);
    EXPECT_EQ(r.p_value, 0.0);
}

TEST(PairedBootstrap, DeterministicFromItsSeed) {
    Rng g(3);
    std::vector<double> a(50), b(50);
    for (size_t i = 0; i < a.size(); i++) a[i] = double(g.uniform() < 0.5), b[i] = double(g.uniform() < 0.6);
    const PairedComparison x = paired_bootstrap(a, b, 2000, 11), y = paired_bootstrap(a, b, 2000, 11);
    const PairedComparison z = paired_bootstrap(a, b, 2000, 12);
    EXPECT_EQ(x.lo, y.lo);
    EXPECT_EQ(x.hi, y.hi);
    EXPECT_EQ(x.p_value, y.p_value);
    EXPECT_EQ(x.diff, z.diff);
    EXPECT_TRUE(x.lo != z.lo || x.hi != z.hi);
}

// 400 paired 0/1 results: the bootstrap's interval is the normal one, diff +- 1.96 sd / sqrt(n) (sd of the
// differences, the plug-in estimate the bootstrap resamples), within its Monte Carlo error.
TEST(PairedBootstrap, AgreesWithTheNormalApproximationOnALargeSample) {
    Rng g(5);
    std::vector<double> a(400), b(400);
    for (size_t i = 0; i < a.size(); i++) {
        a[i] = double(g.uniform() < 0.55);
        b[i] = g.uniform() < 0.7 ? a[i] : double(g.uniform() < 0.75);  // correlated, as two models are
    }
    const PairedComparison r = paired_bootstrap(a, b, 20000, 9);
    double m = 0.0, v = 0.0;
    for (size_t i = 0; i < a.size(); i++) m += b[i] - a[i];
    m /= double(a.size());
    for (size_t i = 0; i < a.size(); i++) v += (b[i] - a[i] - m) * (b[i] - a[i] - m);
    const double se = std::sqrt(v / double(a.size())) / std::sqrt(double(a.size()));
    EXPECT_NEAR(r.diff, m, 1e-12);
    EXPECT_NEAR(r.lo, m - 1.959964 * se, 0.01);
    EXPECT_NEAR(r.hi, m + 1.959964 * se, 0.01);
    EXPECT_GT(r.hi - r.lo, 3.5 * se);
}

// 300 simulated evaluations of 80 records whose true mean difference is 0.1: the 95% interval holds it in
// about 95% of them (the percentile bootstrap runs a little short at small n; a binomial standard deviation
// over 300 is 1.3 points).
TEST(PairedBootstrap, IntervalCoversTheTrueDifference) {
    Rng g(21);
    int covered = 0;
    const int kRuns = 300;
    for (int run = 0; run < kRuns; run++) {
        std::vector<double> a(80), b(80);
        for (size_t i = 0; i < a.size(); i++) {
            // b - a is -1 with 0.15, +1 with 0.25, else 0: mean 0.1
            const double u = g.uniform();
            a[i] = u < 0.15 ? 1.0 : 0.0;
            b[i] = u >= 0.15 && u < 0.40 ? 1.0 : 0.0;
        }
        const PairedComparison r = paired_bootstrap(a, b, 1000, uint64_t(run));
        covered += r.lo <= 0.1 && 0.1 <= r.hi;
    }
    const double coverage = double(covered) / kRuns;
    EXPECT_GT(coverage, 0.89) << covered << " of " << kRuns;
    EXPECT_LT(coverage, 0.99) << covered << " of " << kRuns;
}

TEST(PerExampleFile, RoundTripsAndPairsOnlyTheSameRecords) {
    const std::string dir = std::filesystem::temp_directory_path() / "anvil_compare_test";
    make_dirs(dir);
    std::vector<ExampleResult> rs = {{0, "Q: one\n", "1", "1", true, -0.25, 2},
                                     {1, "Q: \"two\" \u00e9\n", "2", "3", false, -1.5, 3}};
    write_per_example(dir + "/a.jsonl", rs);
    const PerExample a = read_per_example(dir + "/a.jsonl");
    ASSERT_EQ(a.records.size(), 2u);
    EXPECT_EQ(a.records[1].prompt, rs[1].prompt);
    EXPECT_EQ(a.records[1].exact, false);
    EXPECT_EQ(a.records[1].logprob, -1.5);
    EXPECT_EQ(metric_values(a, CompareMetric::ExactMatch), (std::vector<double>{1.0, 0.0}));
    EXPECT_EQ(metric_values(a, CompareMetric::Loss), (std::vector<double>{0.25, 1.5}));
    // a run directory: its eval_examples.jsonl
    write_per_example(dir + "/" + kRunExamplesFile, rs);
    EXPECT_EQ(read_per_example(dir).records.size(), 2u);
    check_same_records(a, read_per_example(dir));
    rs[1].expected = "two";
    write_per_example(dir + "/b.jsonl", rs);
    try {
        check_same_records(a, read_per_example(dir + "/b.jsonl"));
        FAIL() << "records with another expected answer were paired";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("record 2 differs"), std::string::npos) << e.what();
    }
    rs.pop_back();
    write_per_example(dir + "/c.jsonl", rs);
    EXPECT_THROW(check_same_records(a, read_per_example(dir + "/c.jsonl")), Error);
    write_file_atomic(dir + "/bad.jsonl", "{\"index\": 0}\n");
    try {
        read_per_example(dir + "/bad.jsonl");
        FAIL() << "a record without its fields was read";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("bad.jsonl line 1"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace anvil
