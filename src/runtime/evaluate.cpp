#include "runtime/evaluate.h"

#include <algorithm>
#include <cmath>

#include "data/batcher.h"
#include "model/generate.h"
#include "runtime/compare.h"

namespace anvil {

namespace {

// One forward of (B, T) tokens against targets (-1: none): each position's loss, into losses (B * T).
void token_losses(Model& model, int B, int T, const int32_t* tokens, const int32_t* targets, float* losses) {
    Backend& be = model.backend();
    const ForwardPass f{.tokens = model.tokens(B, T), .targets = model.targets(B, T)};
    be.upload(f.tokens, tokens);
    be.upload(f.targets, targets);
    model.forward(f);
    be.download(losses, model.losses(B, T));
}

int argmax_first(const std::vector<double>& v) {
    return int(std::max_element(v.begin(), v.end()) - v.begin());  // the first of equal maxima
}

// One ending of one item, as a row to score.
struct ScoredRow {
    size_t score;  // its item's ChoiceScore
    int ending;
    ChoiceRow t;
};

// Rows [first, first + B) in one forward of (B, T), T their longest (at most the model's max_T, each row's
// last positions kept): each row's log-likelihood and target count added into its item's score.
void score_rows(Model& model, int pad, const std::vector<ScoredRow>& rows, size_t first, int B,
                std::vector<ChoiceScore>& scores) {
    const int Tm = model.max_T();
    int T = 1;
    for (int b = 0; b < B; b++) T = std::max(T, std::min(int(rows[first + b].t.tokens.size()) - 1, Tm));
    std::vector<int32_t> tokens(size_t(B) * T, pad), targets(size_t(B) * T, -1);
    for (int b = 0; b < B; b++) {
        const ChoiceRow& t = rows[first + b].t;
        const int len = int(t.tokens.size()) - 1;  // inputs and targets, before the window
        const int d = std::max(0, len - Tm);       // the context's start, dropped from a long row
        for (int p = 0; p < len - d; p++) {
            tokens[size_t(b) * T + p] = t.tokens[size_t(d + p)];
            if (d + p + 1 >= t.n_context) targets[size_t(b) * T + p] = t.tokens[size_t(d + p + 1)];
        }
    }
    std::vector<float> losses(size_t(B) * T);
    token_losses(model, B, T, tokens.data(), targets.data(), losses.data());
    for (int b = 0; b < B; b++) {
        const ScoredRow& row = rows[first + b];
        ChoiceScore& sc = scores[row.score];
        for (int p = 0; p < T; p++)
            if (targets[size_t(b) * T + p] >= 0) {
                sc.logprob[size_t(row.ending)] -= losses[size_t(b) * T + p];
                sc.tokens[size_t(row.ending)]++;
            }
    }
}

// Every row scored, longest first so that a batch's rows are of about one length and little of it is padding,
// in batches of the model's reserved rows; `progress` (may be empty) gets the rows done.
void score_all(Model& model, int pad, std::vector<ScoredRow>& rows, std::vector<ChoiceScore>& scores,
               const std::function<void(int)>& progress) {
    const int Bm = model.max_B();
    ANVIL_ASSERT(Bm > 0 && model.max_T() > 0);
    std::stable_sort(rows.begin(), rows.end(), [](const ScoredRow& a, const ScoredRow& b) {
        return a.t.tokens.size() > b.t.tokens.size();
    });
    for (size_t first = 0; first < rows.size(); first += size_t(Bm)) {
        const int B = int(std::min(rows.size() - first, size_t(Bm)));
        score_rows(model, pad, rows, first, B, scores);
        if (progress) progress(int(first) + B);
    }
}

// A record as training scores its answer: the prompt, then the final answer's tokens up to its last target
// (the end-of-turn token), those the scored ending.
ChoiceRow answer_row(const Example& ex, PromptTemplate tmpl, const Tokenizer& tok, int index) {
    const std::vector<int32_t> prompt = prompt_tokens(ex, tmpl, tok);
    const TokenStream rec = record_tokens(ex, tmpl, tok);
    size_t end = rec.size();
    while (end > 0 && !(rec.flags[end - 1] & kInLoss)) end--;
    ANVIL_CHECK(end > prompt.size() && std::equal(prompt.begin(), prompt.end(), rec.ids.begin()),
                "record {}: its answer encodes to no tokens after its prompt", index);
    return {std::vector<int32_t>(rec.ids.begin(), rec.ids.begin() + std::ptrdiff_t(end)), int(prompt.size())};
}

// Every rank's results, in record order, on every rank.
std::vector<ExampleResult> gather_examples(Comm& comm, const std::vector<ExampleResult>& mine) {
    std::string lines;
    for (const ExampleResult& e : mine) lines += example_line(e) + "\n";
    std::vector<ExampleResult> all;
    for (const std::string& text : allgather_text(comm, lines, "the per-example results"))
        for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
            all.push_back(parse_example_line(text.substr(at, end - at)));
    std::sort(all.begin(), all.end(),
              [](const ExampleResult& a, const ExampleResult& b) { return a.index < b.index; });
    return all;
}

}  // namespace

LossResult evaluate_loss(Model& model, const TokenView& s, int B, int T, int64_t max_batches, Comm* comm) {
    const int rank = comm ? comm->rank() : 0, W = comm ? comm->size() : 1;
    const std::vector<uint64_t> starts = window_starts(s, T, true);
    int64_t n = eval_batches(starts, B);
    if (max_batches > 0 && n > max_batches) n = max_batches;
    std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
    std::vector<float> losses(size_t(B) * T);
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t i = rank; i < n; i += W) {
        fill_eval_batch(s, starts, B, T, i, tokens.data(), targets.data());
        token_losses(model, B, T, tokens.data(), targets.data(), losses.data());
        for (size_t j = 0; j < losses.size(); j++)
            if (targets[j] >= 0) {
                sum += losses[j];
                count++;
            }
    }
    if (W > 1) {
        double totals[2] = {sum, double(count)};
        comm->allreduce_sum(totals, 2, "the validation loss's totals");
        sum = totals[0];
        count = int64_t(totals[1]);
    }
    LossResult r;
    r.targets = count;
    r.loss = count ? sum / double(count) : NAN;
    r.ppl = std::exp(r.loss);
    return r;
}

ExactMatchResult exact_match(Model& model, const Tokenizer& tok, PromptTemplate tmpl,
                             const std::vector<Example>& examples, int max_examples, int keep_samples,
                             Comm* comm, bool per_example, const std::function<void(int)>& progress) {
    const int rank = comm ? comm->rank() : 0, W = comm ? comm->size() : 1;
    Generator gen(model);
    ExactMatchResult r;
    SampleOptions opt;
    opt.temperature = 0.0f;
    opt.stop_tokens = stop_tokens(tmpl, tok);
    opt.vocab_real = tok.vocab_size();
    const int n =
        max_examples > 0 && max_examples < int(examples.size()) ? max_examples : int(examples.size());
    for (int i = rank; i < n; i += W) {
        const Example& ex = examples[size_t(i)];
        const std::vector<int32_t> prompt = prompt_tokens(ex, tmpl, tok);
        const int expected = int(tok.encode(ex.answer()).size());
        opt.max_new_tokens = expected + 16;
        std::vector<int32_t> out = gen.generate(prompt, opt);
        if (!out.empty() && std::count(opt.stop_tokens.begin(), opt.stop_tokens.end(), out.back()))
            out.pop_back();
        const std::string got = tok.decode(out);
        const bool ok = got == ex.answer();
        r.total++;
        r.correct += ok;
        // the report shows one example per instruction first, and the first misses
        const bool new_kind = std::none_of(r.samples.begin(), r.samples.end(), [&](const AnswerSample& s) {
            return s.example.question() == ex.question();
        });
        const bool first_miss = !ok && std::none_of(r.samples.begin(), r.samples.end(),
                                                    [](const AnswerSample& s) { return !s.correct; });
        if (int(r.samples.size()) < keep_samples && (new_kind || first_miss))
            r.samples.push_back({ex, got, ok});
        if (per_example) r.examples.push_back({i, render_text(ex, tmpl, tok, true), ex.answer(), got, ok});
        if (progress) progress(r.total);
    }
    if (per_example) {  // the expected answers' log-probabilities, batched
        std::vector<ScoredRow> rows;
        std::vector<ChoiceScore> scores(r.examples.size());
        for (size_t k = 0; k < r.examples.size(); k++) {
            const int i = r.examples[k].index;
            rows.push_back({k, 0, answer_row(examples[size_t(i)], tmpl, tok, i)});
            scores[k].logprob.assign(1, 0.0);
            scores[k].tokens.assign(1, 0);
        }
        score_all(model, tok.eot_id(), rows, scores, {});
        for (size_t k = 0; k < r.examples.size(); k++) {
            r.examples[k].answer_tokens = scores[k].tokens[0];
            r.examples[k].logprob = scores[k].logprob[0] / std::max(1, scores[k].tokens[0]);
        }
        if (W > 1) r.examples = gather_examples(*comm, r.examples);
    }
    if (W > 1) {
        double totals[2] = {double(r.total), double(r.correct)};
        comm->allreduce_sum(totals, 2, "the exact-match counts");
        r.total = int(totals[0]);
        r.correct = int(totals[1]);
    }
    return r;
}

std::string sample_text(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, int tokens,
                        uint64_t seed, std::vector<int32_t> stop) {
    SampleOptions opt;
    opt.stop_tokens = std::move(stop);
    opt.max_new_tokens = tokens;
    opt.temperature = 1.0f;
    opt.seed = seed;
    opt.vocab_real = tok.vocab_size();
    Generator gen(model);
    return tok.decode(prompt) + tok.decode(gen.generate(prompt, opt));
}

double TextScore::perplexity() const {
    return std::exp(-logprob / std::max(1, tokens));
}

std::vector<TextScore> score_texts(Model& model, const Tokenizer& tok, const std::vector<std::string>& texts,
                                   const std::function<void(int)>& progress) {
    std::vector<ScoredRow> rows;
    std::vector<ChoiceScore> scores(texts.size());
    for (size_t i = 0; i < texts.size(); i++) {
        rows.push_back({i, 0, ChoiceRow{text_row(tok, texts[i]), 1}});
        scores[i].logprob.assign(1, 0.0);
        scores[i].tokens.assign(1, 0);
    }
    score_all(model, tok.eot_id(), rows, scores, progress);
    std::vector<TextScore> out(texts.size());
    for (size_t i = 0; i < texts.size(); i++) out[i] = {scores[i].logprob[0], scores[i].tokens[0]};
    return out;
}

std::vector<int32_t> text_row(const Tokenizer& tok, const std::string& text) {
    std::vector<int32_t> ids = {tok.eot_id()};
    const std::vector<int32_t> t = tok.encode(text);
    ids.insert(ids.end(), t.begin(), t.end());
    return ids;
}

std::vector<float> token_logprobs(Model& model, const std::vector<int32_t>& ids) {
    const int T = std::min(int(ids.size()) - 1, model.max_T());
    if (T <= 0) return {};
    const int32_t* first = ids.data() + (ids.size() - size_t(T) - 1);
    std::vector<float> lp(static_cast<size_t>(T));
    token_losses(model, 1, T, first, first + 1, lp.data());
    for (float& x : lp) x = -x;
    return lp;
}

int choice_items(const std::vector<ChoiceItem>& items, int max_items) {
    return max_items > 0 && max_items < int(items.size()) ? max_items : int(items.size());
}

ChoiceResult multiple_choice(Model& model, const Tokenizer& tok, const std::vector<ChoiceItem>& items,
                             int max_items, Comm* comm, const std::function<void(int)>& progress) {
    const int rank = comm ? comm->rank() : 0, W = comm ? comm->size() : 1;
    const int n = choice_items(items, max_items);
    ChoiceResult r;
    std::vector<ScoredRow> rows;  // every ending of this rank's items
    for (int i = rank; i < n; i += W) {
        const ChoiceItem& item = items[size_t(i)];
        ChoiceScore sc;
        sc.index = i;
        sc.label = item.label;
        sc.logprob.assign(item.endings.size(), 0.0);
        sc.tokens.assign(item.endings.size(), 0);
        for (size_t k = 0; k < item.endings.size(); k++) {
            ScoredRow row{r.scores.size(), int(k), choice_row(item, k, tok)};
            ANVIL_CHECK(row.t.tokens.size() > size_t(row.t.n_context),
                        "multiple-choice item {}: ending {} encodes to no tokens", i, k);
            rows.push_back(std::move(row));
        }
        r.scores.push_back(std::move(sc));
    }
    score_all(model, tok.eot_id(), rows, r.scores, progress);
    for (ChoiceScore& sc : r.scores) {
        std::vector<double> norm(sc.logprob.size());
        for (size_t k = 0; k < norm.size(); k++) norm[k] = sc.logprob[k] / sc.tokens[k];
        sc.pred = argmax_first(sc.logprob);
        sc.pred_norm = argmax_first(norm);
        r.total++;
        r.correct += sc.pred == sc.label;
        r.correct_norm += sc.pred_norm == sc.label;
    }
    if (W > 1) {
        double totals[3] = {double(r.total), double(r.correct), double(r.correct_norm)};
        comm->allreduce_sum(totals, 3, "the multiple-choice counts");
        r.total = int(totals[0]);
        r.correct = int(totals[1]);
        r.correct_norm = int(totals[2]);
    }
    return r;
}

}  // namespace anvil
