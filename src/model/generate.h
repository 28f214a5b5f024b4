// Text generation with a KV cache: the prompt is run through the model once (prefill), then each new token
// costs one position. When the context fills, the cache is rebuilt from the last half of it. The model's own
// forward runs every position (model.h: a pass with a cache); nothing here knows the family.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/rng.h"
#include "model/model.h"

namespace anvil {

struct SampleOptions {
    int max_new_tokens = 64;
    float temperature = 1.0f;  // 0 = greedy
    int top_k = 0;             // 0 = off
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 1337;
    std::vector<int32_t> stop_tokens;  // stop after emitting one of these (end-of-text, end of turn)
    int vocab_real =
        0;  // sample only ids below this (the tokenizer's, when the model's vocabulary is padded)
    // OpenAI's penalties: a token already generated in this answer loses presence_penalty once and
    // frequency_penalty for every time it was generated; logit_bias adds to chosen tokens' logits. All of it
    // before temperature, top-k and top-p; the prompt's tokens do not count.
    float presence_penalty = 0.0f, frequency_penalty = 0.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;
    // Hugging Face's repetition_penalty (1 = off): the logit of every token in the prompt or the answer so
    // far is divided by it when positive, multiplied when negative (as transformers, vLLM and llama.cpp do).
    float repetition_penalty = 1.0f;
    // min_p (0 = off): after temperature, only tokens at least min_p times as likely as the likeliest stay.
    float min_p = 0.0f;
};

// A sequence's sampling: the tokens of its prompt (for repetition_penalty) and of its answer so far, counted
// (for every penalty), kept only where opt asks for them.
class TokenCounts {
public:
    TokenCounts(const std::vector<int32_t>& prompt, const SampleOptions& opt);
    // The next token from logits (V, overwritten): opt's logit_bias and penalties, then sample_token;
    // counted.
    int32_t sample(std::vector<float>& logits, Rng& rng);
    // Applies opt's logit_bias, repetition penalty and presence and frequency penalties to logits (V) in
    // place.
    void adjust(std::vector<float>& logits) const;
    void add(int32_t id);

private:
    const SampleOptions* opt_;
    bool count_ = false;
    std::unordered_map<int32_t, int> counts_;
    std::unordered_set<int32_t> prompt_;
};

// Picks the next token from logits (V) on the host (they may be overwritten); TokenCounts::sample applies the
// penalties first.
int32_t sample_token(std::vector<float>& logits, const SampleOptions& opt, Rng& rng);
// True when opt's choice is the first largest raw logit (greedy, nothing adjusting the logits), which the
// device can make without sending the logits back.
bool greedy_on_device(const SampleOptions& opt);

// A token's log-probability under the model, and the `top` likeliest tokens' (most likely first; ties by id):
// the log-softmax of the raw logits (V), before temperature, penalties and logit_bias (what OpenAI's logprobs
// and vLLM's default report). Computed in double.
struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);
// The log-probabilities a request asks for (OpenAI's logprobs and top_logprobs, and echo's of the prompt).
struct LogprobRequest {
    static constexpr int kMaxTop = 20;  // OpenAI's most
    int top = -1;  // each sampled token's, with the `top` likeliest beside it (up to kMaxTop); -1: none
    bool prompt = false;  // every prompt token's after the first (the server then computes its positions
                          // instead of taking them from the prefix cache)
};

// Runs ids[0..n) of the sequence in cache slot `slot`, at positions pos0.., through the model, appending to
// the cache; returns the last position's logits (V) in f32. `acts`: decoding activations for at least n
// positions.
std::vector<float> forward_cached(Model& model, Activations& acts, KvCache& cache, int slot,
                                  const int32_t* ids, int n, int pos0);

// Prompts run through the model in pieces of this many positions, each starting at a multiple of it: the
// activations are planned for one piece, and a server (serve/scheduler) can decode other sequences between a
// long prompt's pieces. The generator and the server cut a prompt alike, so they compute the same logits.
constexpr int kPrefillChunk = 256;
// The positions of one piece for a requested chunk (0: the whole context at once).
inline int prefill_chunk_size(int requested, int n_ctx) {
    return requested > 0 && requested < n_ctx ? requested : n_ctx;
}
// The length of the piece that starts at position `pos` of a prompt ending at `end`: up to the next multiple
// of `chunk`.
inline int prefill_piece(int pos, int end, int chunk) {
    return std::min(end - pos, chunk - pos % chunk);
}

class Generator {
public:
    // prefill_chunk: positions per forward of a prompt (0: the whole context at once)
    explicit Generator(Model& model, int prefill_chunk = kPrefillChunk);
    // Returns the new tokens (not the prompt). on_token, if set, sees each one as it is produced and may end
    // the generation after it by returning false (a stop string, a reader gone). With `logprobs`, each new
    // token's log-probability under the raw logits (token_logprob) is appended there.
    std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& opt,
                                  const std::function<bool(int32_t)>& on_token = {},
                                  std::vector<float>* logprobs = nullptr);
    // Decode steps replayed from a recording so far (Activations::run_recorded; 0 where the backend records
    // nothing): what the benchmarks and tests read to know the CUDA graphs ran.
    size_t replays() const;

private:
    // Runs positions pos0.. for `ids` through the model, appending to the cache; returns the last logits.
    void step(const int32_t* ids, int n, int pos0, std::vector<float>& logits);
    // A decode step whose next token the device picks: the first largest of the logits' first V columns
    // (token_logprobs' top 1), so 4 bytes come back instead of the logits.
    int32_t greedy_step(int32_t id, int pos, int V);

    Model& model_;
    int chunk_;                          // positions per forward
    std::unique_ptr<Activations> acts_;  // decoding activations for one chunk
    std::unique_ptr<KvCache> cache_;
};

}  // namespace anvil
