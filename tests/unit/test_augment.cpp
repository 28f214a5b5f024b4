// Label-safe augmentation (data/augment.h): what each operation may change, that only the chosen fields
// change, that a seed means the same copy, and --augment's rows in the Batcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "data/augment.h"
#include "data/batcher.h"

namespace anvil {
namespace {

std::vector<std::string> words(const std::string& s) {
    std::vector<std::string> out;
    std::string w;
    for (const char c : s + " ") {
        if (c == ' ' || c == '\n' || c == '\t') {
            if (!w.empty()) out.push_back(w);
            w.clear();
        } else {
            w += c;
        }
    }
    return out;
}

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

const std::string kText = "Reverse the letters of the word, please.";

TEST(Augment, EachOperationChangesOnlyWhatItMay) {
    Synonyms syn;
    syn.add_group({"reverse", "flip", "invert"});
    syn.add_group({"letters", "characters"});
    const std::vector<std::string> orig = words(kText);
    for (uint64_t seed = 0; seed < 40; seed++) {
        Rng r(seed);
        std::vector<std::string> w = words(augment_text(kText, AugmentOp::Swap, 0.3, &syn, r));
        std::vector<std::string> a = w, b = orig;
        std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b) << "swap: the same words";

        w = words(augment_text(kText, AugmentOp::Delete, 0.5, &syn, r));
        EXPECT_FALSE(w.empty());
        size_t at = 0;  // a subsequence of the original, in order
        for (const std::string& x : w)
            at = size_t(std::find(orig.begin() + long(at), orig.end(), x) - orig.begin()) + 1;
        EXPECT_LE(at, orig.size()) << "delete: the rest in order";
        EXPECT_EQ(w[0], "Reverse") << "delete: never a word the synonym list names";
        EXPECT_NE(std::find(w.begin(), w.end(), "letters"), w.end());

        w = words(augment_text(kText, AugmentOp::Insert, 0.3, &syn, r));
        EXPECT_EQ(w.size(), orig.size() + 2) << "insert: round(0.3 * 7) words";
        at = 0;
        for (const std::string& x : orig)
            at = size_t(std::find(w.begin() + long(at), w.end(), x) - w.begin()) + 1;
        EXPECT_LE(at, w.size()) << "insert: the original words in order";

        const std::string s = augment_text(kText, AugmentOp::Synonym, 0.3, &syn, r);
        EXPECT_NE(s, kText) << "two words have synonyms: one at least replaced";
        EXPECT_TRUE(s.starts_with("Flip ") || s.starts_with("Invert ") || s.starts_with("Reverse "))
            << "a synonym takes the word's capitals: " << s;
        EXPECT_TRUE(s.ends_with(" word, please.")) << s;

        EXPECT_EQ(lower(augment_text(kText, AugmentOp::Case, 0.3, &syn, r)), lower(kText))
            << "case: only case";
        const std::string sp = augment_text(kText, AugmentOp::Space, 0.3, &syn, r);
        EXPECT_EQ(words(sp), orig) << "space: only whitespace";
        EXPECT_GT(sp.size(), kText.size());
    }
    Rng r(1);
    EXPECT_EQ(augment_text("   ", AugmentOp::Delete, 0.5, nullptr, r), "   ") << "no words: unchanged";
    EXPECT_EQ(augment_text("one", AugmentOp::Delete, 1.0, nullptr, r), "one") << "never every word";
    EXPECT_EQ(augment_text("Reverse the letters", AugmentOp::Delete, 1.0, &syn, r), "Reverse letters")
        << "every word but the listed ones";
}

TEST(Augment, OnlyTheChosenFieldsChangeAndASeedIsOneCopy) {
    AugmentOptions o;
    o.ops = parse_augment_ops("swap, case,space", "--ops");
    o.p = 0.5;
    const Example e{"Reverse the letters of this word now.", "abcd efgh", "hgfe dcba", {}};
    for (uint64_t k = 0; k < 20; k++) {
        Example a = e, b = e;
        Rng r1(augmentation_seed(3, 1, k)), r2(augmentation_seed(3, 1, k));
        augment_example(a, o, r1);
        augment_example(b, o, r2);
        EXPECT_EQ(a.instruction, b.instruction);
        EXPECT_EQ(a.input, e.input) << "input is not a chosen field";
        EXPECT_EQ(a.output, e.output) << "the answer never changes";
    }
    Example chat;
    chat.messages = {{Role::System, "Be brief and exact."},
                     {Role::User, "Reverse abcd please now."},
                     {Role::Assistant, "dcba"}};
    o.fields = {"system"};
    Example c = chat;
    Rng r(5);
    augment_example(c, o, r);
    EXPECT_EQ(c.messages[1].content, chat.messages[1].content);
    EXPECT_EQ(c.messages[2].content, "dcba");
    EXPECT_NE(augmentation_seed(3, 1, 2), augmentation_seed(3, 2, 1));
}

TEST(Augment, BadSpecsNameTheFlag) {
    EXPECT_THROW((void)parse_augment_ops("swap,shuffle", "--augment"), Error);
    AugmentOptions o;
    o.ops = {AugmentOp::Synonym};
    EXPECT_THROW(check_augment_options(o, "--augment", "--augment-fields"), Error)
        << "synonym without a word list";
    o.ops = {AugmentOp::Swap};
    o.fields = {"output"};
    EXPECT_THROW(check_augment_options(o, "--augment", "--augment-fields"), Error)
        << "the answer is never augmented";
}

// --augment's rows: the unaugmented ones at chance 0, a fixed function of (seed, batch) otherwise.
TEST(Augment, BatcherRowsAreDrawnPerEpochAndRepeat) {
    ByteTokenizer tok;
    std::vector<Example> ex;
    TokenStream s;
    for (int i = 0; i < 12; i++) {
        ex.push_back({"Reverse the word number " + std::to_string(i) + " now.", "", "dcba", {}});
        const TokenStream r = record_tokens(ex.back(), PromptTemplate::Compact, tok);
        s.ids.insert(s.ids.end(), r.ids.begin(), r.ids.end());
        s.flags.insert(s.flags.end(), r.flags.begin(), r.flags.end());
    }
    const int B = 3, T = 24;
    const auto rows = [&](double prob, int64_t index) {
        Batcher b(s.view(), B, T, true, 9);
        if (prob >= 0) {
            auto a = std::make_shared<RecordAugmenter>();
            a->examples = ex;
            a->opts.ops = {AugmentOp::Case, AugmentOp::Swap};
            a->opts.p = 0.5;
            a->prob = prob;
            a->seed = 9;
            a->prompt = PromptTemplate::Compact;
            a->tok = &tok;
            b.set_augmenter(a);
        }
        std::vector<int32_t> tokens(size_t(B * T)), targets(size_t(B * T)), lengths(size_t(B * T));
        b.fill(index, tokens.data(), targets.data(), lengths.data());
        // each row is cut into whole records: a run of L positions each saying L (--neftune-alpha's L)
        for (int r = 0; r < B; r++) {
            int t = 0;
            while (t < T) {
                const int L = lengths[size_t(r * T + t)];
                EXPECT_TRUE(L >= 1 && t + L <= T) << "row " << r << " position " << t << " length " << L;
                if (L < 1 || t + L > T) break;
                for (int u = t; u < t + L; u++) EXPECT_EQ(lengths[size_t(r * T + u)], L);
                t += L;
            }
        }
        tokens.insert(tokens.end(), targets.begin(), targets.end());
        tokens.insert(tokens.end(), lengths.begin(), lengths.end());
        return tokens;
    };
    for (int64_t i = 0; i < 8; i++) {
        EXPECT_EQ(rows(0.0, i), rows(-1, i)) << "chance 0: the stream's rows";
        EXPECT_EQ(rows(1.0, i), rows(1.0, i)) << "the same seed and batch: the same rows";
    }
    int differ = 0;
    for (int64_t i = 0; i < 8; i++) differ += rows(1.0, i) != rows(-1, i);
    EXPECT_GE(differ, 6);
}

}  // namespace
}  // namespace anvil
