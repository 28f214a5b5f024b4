// Multiple-choice evaluation (HellaSwag): the item files, the scored rows and the batched scorer against each
// row scored alone from the model's logits.
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>

#include "data/choices.h"
#include "model_harness.h"
#include "runtime/evaluate.h"

namespace anvil::test {
namespace {

std::string write_items(const std::string& name, const std::string& content) {
    const std::string p = fresh_dir("choices") + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
}

TEST(Choices, ReadsHellaSwagsFieldsAndTheGenericOnes) {
    const std::string p = write_items(
        "items.jsonl",
        R"({"ind": 24, "activity_label": "Roof shingle removal", "ctx": "A man is sitting on a roof. he", )"
        R"("endings": ["is using wrap.", "is ripping level tiles off.", "is holding a rubik's cube.", )"
        R"("starts pulling up roofing."], "label": 3, "split": "val"})"
        "\n\r\n"
        R"({"ctx": "x", "endings": ["a", "b"], "label": "1"})"
        "\r\n"
        R"({"context": "2 + 2 =", "choices": ["4", "5", "22"], "answer": 0})"
        "\n");
    const std::vector<ChoiceItem> items = read_choice_items(p);
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].context, "A man is sitting on a roof. he");
    EXPECT_EQ(items[0].endings.size(), 4u);
    EXPECT_EQ(items[0].endings[3], "starts pulling up roofing.");
    EXPECT_EQ(items[0].label, 3);
    EXPECT_EQ(items[1].label, 1);  // Hugging Face's copy writes the label as a string
    EXPECT_EQ(items[2].context, "2 + 2 =");
    EXPECT_EQ(items[2].endings[2], "22");
    EXPECT_EQ(items[2].label, 0);
}

TEST(Choices, BadItemsNameTheLineAndTheKey) {
    const std::string good = R"("ctx": "c", "endings": ["a", "b"])";
    const auto bad = [&](const std::string& line, const std::string& needle) {
        const std::string p = write_items("bad.jsonl", "{" + good + R"(, "label": 0})" + "\n" + line + "\n");
        expect_error([&] { read_choice_items(p); }, needle, p + ":2");
    };
    bad("{not json", "not valid JSON");
    bad("[1, 2]", "must be a JSON object");
    bad(R"({"endings": ["a", "b"], "label": 0})", "no \"ctx\"");
    bad(R"({"ctx": 3, "endings": ["a", "b"], "label": 0})", "\"ctx\" must be a string");
    bad(R"({"ctx": "c", "label": 0})", "no \"endings\"");
    bad(R"({"ctx": "c", "endings": ["a"], "label": 0})", "two or more strings");
    bad(R"({"ctx": "c", "endings": ["a", 7], "label": 0})", "\"endings\"[1] must be a string");
    bad(R"({"ctx": "c", "endings": ["a", ""], "label": 0})", "\"endings\"[1] is empty");
    bad("{" + good + "}", "no \"label\"");
    bad("{" + good + R"(, "label": 2})", "\"label\" is 2, but there are 2 endings");
    bad("{" + good + R"(, "label": -1})", "\"label\" is -1");
    bad("{" + good + R"(, "label": ""})", "test split is unlabelled");
    bad("{" + good + R"(, "label": "B"})", "give the index of the right ending");
    bad("{" + good + R"(, "label": 1.5})", "an integer or a string of digits");
    expect_error([&] { read_choice_items(write_items("empty.jsonl", "\n \n")); }, "no multiple-choice items");
    expect_error([&] { read_choice_items("/nonexistent/items.jsonl"); }, "no such file", "/nonexistent");
}

TEST(Choices, TheEndingFollowsTheContextAfterOneSpace) {
    ByteTokenizer tok;
    const auto row = [&](const std::string& ctx, const std::string& end) {
        const ChoiceRow r = choice_row(ChoiceItem{ctx, {end, "other"}, 0}, 0, tok);
        std::string text;
        for (size_t i = 0; i < r.tokens.size(); i++)
            text += r.tokens[i] == tok.eot_id() ? std::string("<eot>") : std::string(1, char(r.tokens[i]));
        return std::to_string(r.n_context) + "|" + text;
    };
    EXPECT_EQ(row("The cat", "sat."), "7|The cat sat.");  // llm.c's " " + ending
    EXPECT_EQ(row("Answer: ", "yes"), "8|Answer: yes");   // the context ends with whitespace
    EXPECT_EQ(row("Answer:\n", "yes"), "8|Answer:\nyes");
    EXPECT_EQ(row("Q", " yes"), "1|Q yes");   // the ending starts with it
    EXPECT_EQ(row("", "yes"), "1|<eot>yes");  // nothing to predict the first token from but EOT
}

// A model with the byte tokenizer's vocabulary and a short context, its weights shaken off the init so the
// endings' scores differ.
std::unique_ptr<Model> byte_model(Backend& be) {
    ModelConfig c = tiny();
    c.vocab_size = 257;
    c.n_ctx = 16;
    auto m = make_model(be, c);
    m->params().init(test_seed());
    auto params = all_params(m->params());
    std::mt19937_64 g(test_seed() + 1);
    for (auto& p : params)
        for (auto& x : p) x += 0.3f * std::normal_distribution<float>(0.0f, 1.0f)(g);
    set_all_params(m->params(), params);
    return m;
}

// Each row alone, from the logits of one forward over its last n_ctx + 1 tokens: the log-softmax of every
// ending token that is a target in that window.
double row_logprob_alone(Model& m, const ChoiceRow& r) {
    Backend& be = m.backend();
    const int V = m.config().vocab_size, Tm = m.config().n_ctx;
    const int first = std::max(0, int(r.tokens.size()) - 1 - Tm);
    const std::vector<int32_t> w(r.tokens.begin() + first, r.tokens.end());
    const int T = int(w.size()) - 1;
    const ForwardPass f{.tokens = m.tokens(1, T)};
    be.upload(f.tokens, w.data());
    m.forward(f);
    const std::vector<float> logits = download(be, m.logits(1, T));
    double sum = 0.0;
    for (int p = 0; p < T; p++) {
        if (first + p + 1 < r.n_context) continue;  // a context token: not scored
        const float* l = logits.data() + size_t(p) * V;
        double mx = l[0], z = 0.0;
        for (int v = 1; v < V; v++) mx = std::max(mx, double(l[v]));
        for (int v = 0; v < V; v++) z += std::exp(double(l[v]) - mx);
        sum += double(l[w[size_t(p) + 1]]) - mx - std::log(z);
    }
    return sum;
}

TEST(Choices, BatchedScoresEqualEachRowScoredAlone) {
    SCOPED_TRACE("ANVIL_TEST_SEED=" + std::to_string(test_seed()));
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = byte_model(*be);
    std::mt19937_64 g(test_seed() + 2);
    const auto word = [&](int lo, int hi) {
        std::string s(size_t(std::uniform_int_distribution<int>(lo, hi)(g)), 'a');
        for (char& ch : s) ch = char('a' + std::uniform_int_distribution<int>(0, 5)(g));
        return s;
    };
    std::vector<ChoiceItem> items;
    for (int i = 0; i < 9; i++) {  // contexts from empty to past the context of 16 (the start dropped)
        ChoiceItem it{i == 0 ? "" : word(1, 24), {}, 0};
        const int n = 2 + i % 3;
        for (int k = 0; k < n; k++) it.endings.push_back(word(1, 6));
        it.label = i % n;
        items.push_back(it);
    }
    ByteTokenizer tok;
    m->reserve(3, m->config().n_ctx, false);  // 3 rows a batch: items split over batches
    const ChoiceResult r = multiple_choice(*m, tok, items, 8);
    ASSERT_EQ(r.scores.size(), 8u);  // max_items
    EXPECT_EQ(r.total, 8);
    int correct = 0, correct_norm = 0;
    m->release();
    m->reserve(1, m->config().n_ctx, false);
    for (size_t i = 0; i < r.scores.size(); i++) {
        const ChoiceScore& s = r.scores[i];
        ASSERT_EQ(s.index, int(i));
        ASSERT_EQ(s.logprob.size(), items[i].endings.size());
        int best = 0, best_norm = 0;
        for (size_t k = 0; k < s.logprob.size(); k++) {
            const ChoiceRow row = choice_row(items[i], k, tok);
            const double alone = row_logprob_alone(*m, row);
            EXPECT_NEAR(s.logprob[k], alone, 1e-4 * std::max(1.0, std::abs(alone)))
                << "item " << i << " ending " << k;
            EXPECT_EQ(s.tokens[k], int(items[i].endings[k].size()) + (items[i].context.empty() ? 0 : 1));
            if (s.logprob[k] > s.logprob[size_t(best)]) best = int(k);
            if (s.logprob[k] / s.tokens[k] > s.logprob[size_t(best_norm)] / s.tokens[size_t(best_norm)])
                best_norm = int(k);
        }
        EXPECT_EQ(s.pred, best);
        EXPECT_EQ(s.pred_norm, best_norm);
        correct += best == s.label;
        correct_norm += best_norm == s.label;
    }
    EXPECT_EQ(r.correct, correct);
    EXPECT_EQ(r.correct_norm, correct_norm);
}

// --sample-every's sampler: the prompt's text then the sample, the same for the same seed, ending at a stop
// token.
TEST(Sample, SeededFromThePromptAndEndsAtAStopToken) {
    auto be = make_backend({Device::CPU, 1, 0});
    auto m = byte_model(*be);
    ByteTokenizer tok;
    const std::vector<int32_t> prompt = tok.encode("abc");
    const std::string a = sample_text(*m, tok, prompt, 40, 7), b = sample_text(*m, tok, prompt, 40, 7);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a.substr(0, 3), "abc");
    EXPECT_NE(a, sample_text(*m, tok, prompt, 40, 8)) << "another seed, another sample";
    // every id a stop token: the sample ends after its first token, which is the 1-token sample's
    std::vector<int32_t> every(257);
    std::iota(every.begin(), every.end(), 0);
    EXPECT_EQ(sample_text(*m, tok, prompt, 40, 7, every), sample_text(*m, tok, prompt, 1, 7));
    EXPECT_LT(sample_text(*m, tok, prompt, 1, 7).size(), a.size());
}

}  // namespace
}  // namespace anvil::test
