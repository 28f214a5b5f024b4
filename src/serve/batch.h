// Many prompts sampled to their end on the continuous-batching scheduler, for the data tools that generate in
// bulk: `data pseudo-label` answers records, `data synth` writes questions and then their answers, `data
// augment` paraphrases. Each request draws with its own seed, as `anvil generate --seed` does, and the same
// requests give the same tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/chat.h"
#include "model/generate.h"
#include "model/model.h"
#include "serve/scheduler.h"

namespace anvil::serve {

struct BatchRequest {
    std::vector<int32_t> prompt;  // fits the context with room for a token (the caller checks)
    SampleOptions opt;
};
struct BatchResult {
    std::vector<int32_t> ids;      // the tokens sampled
    double logprob = 0;            // the sum of their log-probabilities (natural log)
    Finish finish = Finish::None;  // Stop (a stop token) or Length (max_new_tokens, or the context)
};

// Samples every request, `slots` sequences at a time; `progress(done)` is called as each request is
// collected. Every request is queued before decoding starts, so the passes (which rows go together, and so
// the products' rounding) depend on the requests alone: the same requests give the same tokens, however busy
// the machine. A sampling error throws.
std::vector<BatchResult> sample_batch(Model& model, int slots, const std::vector<BatchRequest>& reqs,
                                      const std::function<void(size_t)>& progress = {});

// An answer to a record in a prompt template: the text (the end-of-turn token left out), whether it ended
// with the template's stop token within opt.max_new_tokens, and its tokens' mean log-probability.
struct Answer {
    std::string text;
    bool finished = false;
    double logprob = 0;
};
// Each example's answer (request i sampled with seeds[i]); an example whose prompt the template cannot render
// or the context cannot hold gets none (finished false).
std::vector<Answer> answer_examples(Model& model, const Tokenizer& tok, PromptTemplate t,
                                    const std::vector<Example>& ex, SampleOptions opt,
                                    const std::vector<uint64_t>& seeds, int slots);

}  // namespace anvil::serve
