#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "data/batcher.h"
#include "model/generate.h"

namespace anvil {

LossResult evaluate_loss(Model& model, const TokenView& s, int B, int T, int64_t max_batches, Comm* comm) {
    const int rank = comm ? comm->rank() : 0, W = comm ? comm->size() : 1;
    Backend& be = model.backend();
    const std::vector<uint64_t> starts = window_starts(s, T, true);
    int64_t n = eval_batches(starts, B);
    if (max_batches > 0 && n > max_batches) n = max_batches;
    std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
    std::vector<float> losses(size_t(B) * T);
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t i = rank; i < n; i += W) {
        fill_eval_batch(s, starts, B, T, i, tokens.data(), targets.data());
        be.upload(model.tokens(B, T), tokens.data());
        be.upload(model.targets(B, T), targets.data());
        ForwardPass f;
        f.B = B;
        f.T = T;
        f.targets = true;
        model.forward(f);
        be.download(losses.data(), model.losses(B, T));
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
                             Comm* comm) {
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
    }
    if (W > 1) {
        double totals[2] = {double(r.total), double(r.correct)};
        comm->allreduce_sum(totals, 2, "the exact-match counts");
        r.total = int(totals[0]);
        r.correct = int(totals[1]);
    }
    return r;
}

}  // namespace anvil
