// The pseudo-label vote (data/pseudo_label.h): which answer wins, and why a record is dropped.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/pseudo_label.h"

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

}  // namespace
}  // namespace anvil
