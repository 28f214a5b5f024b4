// MinHash near-duplicates (data/minhash.h): pairs made at known Jaccard similarity become candidates at the
// rate theory gives for the bands and rows, 1 - (1 - s^rows)^bands, within the binomial interval;
// verification reports no pair below the threshold; shingles ignore case and spacing.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "data/minhash.h"

namespace anvil {
namespace {

// Two sets of `both` shared and `only` own elements each: Jaccard both / (both + 2 only).
std::pair<std::vector<uint64_t>, std::vector<uint64_t>> pair_at(Rng& g, int both, int only) {
    std::vector<uint64_t> a, b;
    for (int i = 0; i < both; i++) {
        const uint64_t x = g.next_u64();
        a.push_back(x);
        b.push_back(x);
    }
    for (int i = 0; i < only; i++) a.push_back(g.next_u64()), b.push_back(g.next_u64());
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    return {a, b};
}

TEST(MinHash, CandidatesAtTheRateTheoryGives) {
    const MinHashOptions o;  // 20 bands x 5 rows
    Rng g(17);
    const int kPairs = 1000;
    // (shared, own): Jaccard 0.3, 0.5, 0.6, 0.7
    for (const auto& [both, only] : {std::pair{30, 35}, {50, 25}, {60, 20}, {70, 15}}) {
        const double s = double(both) / (both + 2 * only);
        int hits = 0;
        for (int k = 0; k < kPairs; k++) {
            const auto [a, b] = pair_at(g, both, only);
            ASSERT_NEAR(jaccard(a, b), s, 1e-12);
            hits += lsh_candidates(minhash_signature(a, o), minhash_signature(b, o), o);
        }
        const double p = candidate_probability(s, o.bands, o.rows), rate = double(hits) / kPairs;
        // 4 standard deviations of a binomial proportion
        EXPECT_NEAR(rate, p, 4.0 * std::sqrt(p * (1.0 - p) / kPairs) + 1e-9)
            << "Jaccard " << s << ": " << hits << " of " << kPairs << " candidates, theory " << p;
    }
}

TEST(MinHash, VerifiedByExactJaccardSoNoFalsePositives) {
    MinHashOptions o;
    o.threshold = 0.8;
    Rng g(4);
    std::vector<std::vector<uint64_t>> sets;
    // pairs at 0.75 (candidates often, never reported) then pairs at 0.9 (reported whenever candidates)
    for (int k = 0; k < 200; k++) {
        const auto [a, b] = k < 100 ? pair_at(g, 60, 10) : pair_at(g, 90, 5);
        sets.push_back(a);
        sets.push_back(b);
    }
    const std::vector<NearMatch> found = near_duplicates(sets, o);
    int high = 0;
    for (const NearMatch& m : found) {
        EXPECT_GE(m.jaccard, 0.8);
        EXPECT_EQ(m.record % 2, 1u);
        EXPECT_EQ(m.match, m.record - 1);
        high++;
    }
    // every 0.9 pair but for the candidate misses theory allows (1 - 0.99995 of them)
    EXPECT_EQ(high, 100);
    // the same through a reference set: the second of each pair near the first
    std::vector<std::vector<uint64_t>> firsts, seconds;
    for (size_t i = 0; i < sets.size(); i += 2) firsts.push_back(sets[i]), seconds.push_back(sets[i + 1]);
    const std::vector<NearMatch> refs = near_references(seconds, firsts, o);
    ASSERT_EQ(refs.size(), 100u);
    for (const NearMatch& m : refs) EXPECT_EQ(m.record, m.match);
}

TEST(MinHash, ShinglesIgnoreCaseAndSpacing) {
    EXPECT_EQ(shingles("The cat sat on the mat", 2), shingles("the  CAT\tsat on\nthe mat  ", 2));
    EXPECT_EQ(shingles("one two three", 2).size(), 2u);
    EXPECT_EQ(shingles("one two", 5).size(), 1u) << "a short text: its words as one shingle";
    EXPECT_TRUE(shingles(" \n ", 3).empty());
    const auto a = shingles("a b c d e", 1), b = shingles("a b c x y", 1);
    EXPECT_NEAR(jaccard(a, b), 3.0 / 7.0, 1e-12);
    EXPECT_NEAR(candidate_probability(0.5, 20, 5), 1.0 - std::pow(1.0 - 1.0 / 32.0, 20), 1e-12);
}

}  // namespace
}  // namespace anvil
