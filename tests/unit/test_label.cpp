// The pseudo-label vote (data/pseudo_label.h): which answer wins, and why a record is dropped.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/pseudo_label.h"
#include "data/quality.h"

namespace anvil {
namespace {

Candidate cand(const std::string& text, double lp, bool finished = true, bool accepted = true) {
    return {text, lp, finished, accepted};
}

TEST(PseudoLabel, MajorityWinsTiesGoToTheLikelierThenTheFirst) {
    Vote v = vote({cand("a", -1), cand("b", -0.5), cand("a", -2), cand("c", -0.1)}, {});
    EXPECT_EQ(v.answer, "a");
    EXPECT_EQ(v.votes, 2);
    EXPECT_EQ(v.samples, 4);
    EXPECT_DOUBLE_EQ(v.agreement, 0.5);
    EXPECT_DOUBLE_EQ(v.logprob, -1.5);
    EXPECT_EQ(v.reason, LabelReason::Kept);
    EXPECT_EQ(vote({cand("a", -1), cand("b", -0.5)}, {}).answer, "b");  // one vote each: the likelier
    EXPECT_EQ(vote({cand("a", -1), cand("b", -1)}, {}).answer, "a");    // ... and then the first drawn
}

TEST(PseudoLabel, InvalidSamplesCountInTheShareButNeverWin) {
    // cut off, refused by the checker, empty: none of them votes, all of them are samples
    Vote v = vote({cand("x", -0.1, false), cand("y", -0.1, true, false), cand("", -0.1), cand("z", -3)},
                  {0.3, -10});
    EXPECT_EQ(v.answer, "z");
    EXPECT_EQ(v.valid, 1);
    EXPECT_DOUBLE_EQ(v.agreement, 0.25);
    EXPECT_EQ(v.reason, LabelReason::LowAgreement);
}

TEST(PseudoLabel, ReasonsInOrder) {
    EXPECT_EQ(vote({cand("a", -1, false), cand("a", -1, false)}, {}).reason, LabelReason::Unfinished);
    EXPECT_EQ(vote({cand("a", -1, true, false), cand("b", -1, false)}, {}).reason, LabelReason::Rejected);
    EXPECT_EQ(vote({cand("a", -1), cand("b", -1)}, {0.75, -10}).reason, LabelReason::LowAgreement);
    EXPECT_EQ(vote({cand("a", -1), cand("a", -3)}, {0.75, -1.5}).reason, LabelReason::LowLogprob);
    EXPECT_EQ(vote({cand("a", -1), cand("a", -1.5)}, {1.0, -1.5}).reason, LabelReason::Kept);
    EXPECT_STREQ(reason_name(LabelReason::LowLogprob), "low_logprob");
}

TEST(PseudoLabel, RegexCheckerAcceptsAnAnswerWithAMatch) {
    AnswerChecker check("regex:^[0-9]+$");
    std::vector<UnlabeledRecord> recs(1);
    recs[0].json = {{"instruction", "Add."}};
    recs[0].ex.instruction = "Add.";
    std::vector<std::vector<Candidate>> c = {{cand("42", -1), cand("4 2", -1), cand("42", -2)}};
    check.check(recs, c, 2);
    EXPECT_TRUE(c[0][0].accepted);
    EXPECT_FALSE(c[0][1].accepted);
    EXPECT_TRUE(c[0][2].accepted);
    EXPECT_THROW((void)AnswerChecker("regex:("), Error);
    EXPECT_THROW((void)AnswerChecker("python:x"), Error);
}

// The Gopher rules (data/quality.h), each broken alone by a text made for it.
TEST(GopherRules, EachRuleOnATextThatBreaksIt) {
    std::string prose;
    for (int i = 0; i < 12; i++) prose += "the model reads the data and keeps it with care. ";
    EXPECT_TRUE(gopher_failures(prose).empty());
    const auto only = [](const std::string& text, const char* rule, GopherOptions o = {}) {
        const std::vector<std::string> f = gopher_failures(text, o);
        return f.size() == 1 && f[0] == rule;
    };
    EXPECT_TRUE(only("the data and the model", "too_few_words"));
    GopherOptions few;
    few.max_words = 20;
    EXPECT_TRUE(only(prose, "too_many_words", few));
    std::string hashtags = prose;
    for (int i = 0; i < 20; i++) hashtags += "#data ";
    EXPECT_TRUE(only(hashtags, "symbols"));
    std::string lines;
    for (int i = 0; i < 12; i++) lines += "the model reads the data and keeps it with care...\n";
    EXPECT_TRUE(only(lines, "ellipsis"));
    std::string bullets;
    for (int i = 0; i < 12; i++) bullets += "- the model reads the data and keeps it with care\n";
    EXPECT_TRUE(only(bullets, "bullets"));
    std::string numbers = prose;
    for (int i = 0; i < 100; i++) numbers += "12345 ";
    EXPECT_TRUE(only(numbers, "non_alpha"));
    std::string salad;
    for (int i = 0; i < 60; i++) salad += "model data token ";
    EXPECT_TRUE(only(salad, "no_stop_words"));
    std::string longw = "the and ";
    for (int i = 0; i < 60; i++) longw += "internationalization ";
    EXPECT_TRUE(only(longw, "long_words"));
}

}  // namespace
}  // namespace anvil
