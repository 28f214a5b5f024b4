#include "serve/batch.h"

#include <deque>
#include <memory>
#include <thread>

#include "core/error.h"

namespace anvil::serve {

std::vector<BatchResult> sample_batch(Model& model, int slots, const std::vector<BatchRequest>& reqs,
                                      const std::function<bool(size_t, const std::vector<int32_t>&)>& enough,
                                      const std::function<void(size_t)>& progress) {
    SchedulerOptions so;
    so.slots = slots;
    so.max_queue = 4 * slots;
    Scheduler sched(model, so);
    std::thread worker([&] { sched.run(); });
    std::vector<BatchResult> out(reqs.size());
    std::deque<std::pair<size_t, std::shared_ptr<Sequence>>> pending;
    size_t done = 0;
    const auto collect = [&] {  // waits for the oldest request
        auto [i, seq] = std::move(pending.front());
        pending.pop_front();
        BatchResult& r = out[i];
        for (;;) {
            Sequence::Update u = seq->wait(r.ids.size(), std::chrono::milliseconds(200));
            r.ids.insert(r.ids.end(), u.tokens.begin(), u.tokens.end());
            for (const TokenLogprob& t : u.logprobs) r.logprob += t.logprob;
            if (u.finish == Finish::Error) fail("sampling failed: {}", u.error);
            if (u.finish != Finish::None) {
                r.finish = u.finish;
                break;
            }
            if (enough && !u.tokens.empty() && enough(i, r.ids)) seq->cancel();
        }
        if (progress) progress(++done);
    };
    try {
        for (size_t i = 0; i < reqs.size(); i++) {
            std::shared_ptr<Sequence> seq;
            while (!(seq = sched.submit(reqs[i].prompt, reqs[i].opt, LogprobRequest{0, false}))) {
                ANVIL_ASSERT(!pending.empty());  // a queue that refuses holds at least one request
                collect();
            }
            pending.emplace_back(i, std::move(seq));
        }
        while (!pending.empty()) collect();
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
