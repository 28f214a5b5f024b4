// A row of logits as log-probabilities, the same on every backend: the spec of Backend::token_logprobs and
// what generation reports for a sampled token. The log-softmax is taken in double over the row's V values;
// the top k are ordered by value, most likely first, ties to the lower id.
#pragma once

#include <cstdint>
#include <span>

namespace anvil {

// lp = logits[target] - logsumexp(logits); ids, top_lp (k each, k <= logits.size()): the k likeliest tokens.
void logprob_row(std::span<const float> logits, int32_t target, int k, float* lp, int32_t* ids,
                 float* top_lp);

}  // namespace anvil
