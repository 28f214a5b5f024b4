// Text generation with a KV cache: the prompt is run through the model once (prefill), then each new token
// costs one position. When the context fills, the cache is rebuilt from the last half of it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/arena.h"
#include "core/rng.h"
#include "model/gpt2.h"

namespace anvil {

struct SampleOptions {
    int max_new_tokens = 64;
    float temperature = 1.0f;  // 0 = greedy
    int top_k = 0;             // 0 = off
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 1337;
    int stop_token = -1;  // stop after emitting this id (end-of-text); -1 = never
    int vocab_real =
        0;  // sample only ids below this (the tokenizer's, when the model's vocabulary is padded)
};

// Picks the next token from logits (V) on the host.
int32_t sample_token(std::vector<float>& logits, const SampleOptions& opt, Rng& rng);

class Generator {
public:
    explicit Generator(GPT2& model);
    // Returns the new tokens (not the prompt). on_token, if set, sees each one as it is produced.
    std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& opt,
                                  const std::function<void(int32_t)>& on_token = {});

private:
    // Runs positions pos0.. for `ids` through the model, appending to the cache; returns the last logits.
    void step(const int32_t* ids, int n, int pos0, std::vector<float>& logits);

    GPT2& model_;
    Arena cache_;  // per layer k, v (n_ctx, C); then work buffers for up to n_ctx rows
    std::vector<Tensor> k_, v_;
    Tensor tok_, x_, ln_, mean_, rstd_, qkv_, atty_, proj_, x2_, fch_, fchg_, logits_;
};

}  // namespace anvil
