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

}  // namespace anvil::serve
