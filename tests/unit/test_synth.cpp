// data synth's filter (data/synth.h): ROUGE-L as rouge_score computes it, Self-Instruct's draw of example
// tasks, and the order in which a question is dropped.
#include <gtest/gtest.h>

#include <set>

#include "data/synth.h"

namespace anvil {
namespace {

TEST(Synth, RougeLIsTheFMeasureOfTheLongestCommonSubsequence) {
    EXPECT_EQ(rouge_words("Write a POEM, about cats!"),
              (std::vector<std::string>{"write", "a", "poem", "about", "cats"}));
    const auto a = rouge_words("the cat sat on the mat"), b = rouge_words("the cat on the mat");
    EXPECT_DOUBLE_EQ(rouge_l(a, b), 2.0 * 5 / 11);  // LCS "the cat on the mat"
    EXPECT_DOUBLE_EQ(rouge_l(a, a), 1.0);
    EXPECT_DOUBLE_EQ(rouge_l(rouge_words("a b c d"), rouge_words("d c b a")), 2.0 * 1 / 8);  // order counts
    EXPECT_DOUBLE_EQ(rouge_l(a, {}), 0.0);
    EXPECT_EQ(rouge_words("naïve café").size(), 2u) << "bytes past ASCII are letters";
}

TEST(Synth, SelfInstructPromptNumbersTheTasks) {
    EXPECT_EQ(self_instruct_prompt({"Add two numbers.", "Name a\ncolour."}),
              "Come up with a series of tasks:\n\nTask 1: Add two numbers.\nTask 2: Name a colour.\nTask 3:");
}

TEST(Synth, DrawTakesDistinctTasksAtMostSoManyGenerated) {
    const std::vector<std::string> seeds{"s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"},
        gen{"g1", "g2", "g3"};
    Rng rng(7);
    std::set<std::vector<std::string>> orders;
    for (int k = 0; k < 50; k++) {
        const std::vector<std::string> t = draw_tasks(seeds, gen, 5, 2, rng);
        ASSERT_EQ(t.size(), 5u);
        EXPECT_EQ(std::set<std::string>(t.begin(), t.end()).size(), 5u);
        EXPECT_EQ(std::count_if(t.begin(), t.end(), [](const std::string& s) { return s[0] == 'g'; }), 2);
        orders.insert(t);
    }
    EXPECT_GT(orders.size(), 40u);
    EXPECT_EQ(draw_tasks(seeds, {}, 5, 2, rng).size(), 5u) << "no generated tasks yet: all seeds";
    EXPECT_EQ(draw_tasks({"s1"}, {}, 5, 2, rng).size(), 1u) << "fewer seeds than asked: all of them";
}

TEST(Synth, FilterDropsForTheFirstReasonInOrder) {
    SynthFilterOptions o;
    o.min_words = 3;
    o.max_words = 12;
    SynthFilter f(o);
    f.add_seed("Write a short poem about the sea.", 4);
    f.add_held_out("Translate this sentence into French please.", "test.jsonl:9");
    EXPECT_EQ(f.check("Hi there").reason, SynthReason::Length);
    EXPECT_EQ(f.check("one two three four five six seven eight nine ten eleven twelve thirteen").reason,
              SynthReason::Length);
    EXPECT_EQ(f.check("Bad \x01 control char here").reason, SynthReason::Malformed);
    EXPECT_EQ(f.check("Bad \xff byte in here").reason, SynthReason::Malformed);
    SynthVerdict v = f.check("translate this sentence into French, please!");
    EXPECT_EQ(v.reason, SynthReason::Leak);
    EXPECT_EQ(v.match, "test.jsonl:9");
    v = f.check("Translate this sentence into French now please.");  // ROUGE-L 12/13 with the held-out one
    EXPECT_EQ(v.reason, SynthReason::Leak);
    EXPECT_NEAR(v.score, 12.0 / 13, 1e-12);
    v = f.check("WRITE a short poem about the sea");
    EXPECT_EQ(v.reason, SynthReason::Duplicate);
    EXPECT_EQ(v.match, "seed 4");
    v = f.check("Write a short poem about the deep blue sea.");  // LCS 7 of 7 and 9 words: 14/16
    EXPECT_EQ(v.reason, SynthReason::Similar);
    EXPECT_NEAR(v.score, 14.0 / 16, 1e-12);
    EXPECT_EQ(f.check("List three prime numbers below twenty.").reason, SynthReason::Kept);
    f.keep("List three prime numbers below twenty.", "attempt 3");
    v = f.check("List three prime numbers below twenty now.");
    EXPECT_EQ(v.reason, SynthReason::Similar);
    EXPECT_EQ(v.match, "attempt 3");
    // below the ROUGE-L bound, above the Jaccard one: a near duplicate
    SynthFilterOptions loose = o;
    loose.max_rouge = 1.0;
    SynthFilter g(loose);
    g.keep("name the largest planet in the solar system and its moons", "attempt 0");
    v = g.check("name the largest planet in the solar system and its moons today");  // Jaccard 8/9
    EXPECT_EQ(v.reason, SynthReason::NearDuplicate);
    EXPECT_EQ(v.match, "attempt 0");
}

}  // namespace
}  // namespace anvil
