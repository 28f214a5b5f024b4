#include "serve/batch.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "core/error.h"

namespace anvil::serve {

std::vector<BatchResult> sample_batch(Model& model, int slots, const std::vector<BatchRequest>& reqs,
                                      const std::function<void(size_t)>& progress) {
    SchedulerOptions so;
    so.slots = slots;
    so.max_queue = std::max<int>(1, int(reqs.size()));
    Scheduler sched(model, so);
    // every request queued before the scheduler starts: what each pass carries follows from the requests
    // alone, not from when the waiter got to them, so the same requests give the same tokens
    std::vector<std::shared_ptr<Sequence>> seqs;
    for (const BatchRequest& r : reqs) {
        seqs.push_back(sched.submit(r.prompt, r.opt, LogprobRequest{0, false}));
        ANVIL_ASSERT(seqs.back());
    }
    std::thread worker([&] { sched.run(); });
    std::vector<BatchResult> out(reqs.size());
    try {
        for (size_t i = 0; i < seqs.size(); i++) {
            BatchResult& r = out[i];
            for (;;) {
                Sequence::Update u = seqs[i]->wait(r.ids.size(), std::chrono::milliseconds(200));
                r.ids.insert(r.ids.end(), u.tokens.begin(), u.tokens.end());
                for (const TokenLogprob& t : u.logprobs) r.logprob += t.logprob;
                if (u.finish == Finish::Error) fail("sampling failed: {}", u.error);
                if (u.finish != Finish::None) {
                    r.finish = u.finish;
                    break;
                }
            }
            if (progress) progress(i + 1);
        }
    } catch (...) {
        sched.stop();
        worker.join();
        throw;
    }
    sched.stop();
    worker.join();
    return out;
}

std::vector<Answer> answer_examples(Model& model, const Tokenizer& tok, PromptTemplate t,
                                    const std::vector<Example>& ex, SampleOptions opt,
                                    const std::vector<uint64_t>& seeds, int slots) {
    ANVIL_ASSERT(seeds.size() == ex.size());
    opt.stop_tokens = stop_tokens(t, tok);
    opt.vocab_real = tok.vocab_size();
    std::vector<BatchRequest> reqs;
    std::vector<size_t> asked;
    for (size_t i = 0; i < ex.size(); i++) {
        if (!template_problem(ex[i], t, tok).empty()) continue;
        BatchRequest r{prompt_tokens(ex[i], t, tok), opt};
        if (int(r.prompt.size()) + 1 >= model.config().n_ctx) continue;
        r.opt.seed = seeds[i];
        reqs.push_back(std::move(r));
        asked.push_back(i);
    }
    const std::vector<BatchResult> res = sample_batch(model, slots, reqs);
    std::vector<Answer> out(ex.size());
    for (size_t k = 0; k < res.size(); k++) {
        Answer& a = out[asked[k]];
        a.text = tok.decode(res[k].ids);
        a.finished = res[k].finish == Finish::Stop;
        a.logprob = res[k].ids.empty() ? 0.0 : res[k].logprob / double(res[k].ids.size());
    }
    return out;
}

}  // namespace anvil::serve
