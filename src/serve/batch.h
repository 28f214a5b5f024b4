// Many prompts sampled to their end on the continuous-batching scheduler, for the data tools that generate in
// bulk: `data pseudo-label` answers records, `data synth` writes questions and then their answers. Requests
// go in as the scheduler's queue takes them and are collected in order, so the output does not depend on how
// they were batched: request i's tokens are what `anvil generate --seed` gives for its prompt and options.
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
    Finish finish = Finish::None;  // Stop (a stop token), Length (max_new_tokens) or Cancelled (`enough`)
};

// Samples every request, `slots` sequences at a time. `enough(i, ids)` (may be empty) sees request i's
// tokens as they come and, returning true, ends it there (a stop string met); `progress(done)` is called
// as each request is collected. A sampling error throws.
std::vector<BatchResult> sample_batch(
    Model& model, int slots, const std::vector<BatchRequest>& reqs,
    const std::function<bool(size_t, const std::vector<int32_t>&)>& enough = {},
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
