// OpenAI's HTTP API as anvil serves it: request bodies of /v1/completions and /v1/chat/completions checked
// and turned into a prompt and sampling options, the responses and server-sent-event chunks in OpenAI's
// schema, and errors as {"error": {"message", "type", "param", "code"}}. Text only; no HTTP here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "model/generate.h"

namespace anvil::serve {

// A request the server refuses: its HTTP status and OpenAI's error fields.
struct ApiError : std::runtime_error {
    ApiError(int status, std::string message, std::string param = "",
             std::string type = "invalid_request_error", std::string code = "")
        : std::runtime_error(message),
          status(status),
          type(std::move(type)),
          param(std::move(param)),
          code(std::move(code)) {}
    int status;
    std::string type, param, code;
};
nlohmann::json error_body(const ApiError& e);

enum class Endpoint : uint8_t { Completions, Chat };

// What the server knows about the model it serves.
struct ServedModel {
    std::string name;  // the id /v1/models lists and requests name
    int n_ctx = 0;
    const Tokenizer* tok = nullptr;
    PromptTemplate prompt = PromptTemplate::Alpaca;  // chat rendering
    std::vector<int32_t> stop_tokens;                // end of text and end of turn
    int64_t created = 0;                             // unix time, for /v1/models
    int max_prompts = 64;  // completions' prompts in one request (the scheduler's sequences and queue)
};

struct GenerationRequest {
    Endpoint endpoint = Endpoint::Completions;
    // A choice each: completions' prompts, or chat's one, each `n` times (OpenAI's n), prompt-major: choice
    // i * n + k is prompt i's k-th (choices[j].index = j)
    std::vector<std::vector<int32_t>> prompts;
    int n = 1;
    SampleOptions sample;
    // Choice j's sampling: the request's with seed + j, so the choices are independent draws and each repeats
    // with the seed (choice 0 is `anvil generate --seed S`'s, choice j --num-samples' sample j).
    SampleOptions choice_sample(size_t j) const {
        SampleOptions s = sample;
        s.seed += j;
        return s;
    }
    // The request's prompt tokens as OpenAI counts them: each prompt once, whatever n.
    int prompt_tokens() const {
        int t = 0;
        for (size_t j = 0; j < prompts.size(); j += size_t(n)) t += int(prompts[j].size());
        return t;
    }
    std::vector<std::string> stop;  // stop strings: the text ends before the first one
    bool stream = false, include_usage = false;
    LogprobRequest logprobs;  // completions' logprobs (and, with echo, the prompt's); chat's top_logprobs
    bool echo = false;        // completions: the prompt's text (and tokens) before the completion's
    bool token_ids = false;   // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
};

// Checks a body and renders its prompt; throws ApiError (400 for what the client got wrong, 404 for an
// unknown model). Without a seed, `random_seed` seeds the sampling.
GenerationRequest parse_request(Endpoint endpoint, const std::string& body, const ServedModel& m,
                                uint64_t random_seed);

// The finished response, a streamed chunk (delta text; finish_reason when it is the last), the usage chunk.
struct ResponseHead {
    Endpoint endpoint;
    std::string id, model;
    int64_t created;
};
struct Choice {
    std::string text;
    const char* finish = nullptr;
    nlohmann::json logprobs;  // null when not asked for
};
// choices[i] becomes choices[i] with index i; the token counts are the request's, over every prompt
nlohmann::json completion_response(const ResponseHead& h, const std::vector<Choice>& choices,
                                   int prompt_tokens, int completion_tokens);
nlohmann::json stream_chunk(const ResponseHead& h, const std::string& delta, const char* finish, bool first,
                            const nlohmann::json& logprobs = nullptr, int index = 0);

// Characters in UTF-8 text: the bytes that do not continue a character (a token holding part of a character
// counts it with its lead byte).
size_t utf8_length(const std::string& s);

// A token and its log-probabilities; lp null for the prompt's first token (nothing predicts it).
struct LogprobItem {
    int32_t id;
    const TokenLogprob* lp;
};
// Completions' logprobs object: {"tokens", "token_logprobs", "top_logprobs" (the `top` likeliest and the
// token itself, by text), "text_offset"}; offsets count characters from `offset`, which is moved past the
// items' text. With `ids`, tokens are named "token_id:N" (their text still counts for the offsets).
nlohmann::json completion_logprobs(const Tokenizer& tok, const std::vector<LogprobItem>& items,
                                   size_t& offset, bool ids = false);
// Chat's: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
nlohmann::json chat_logprobs(const Tokenizer& tok, const std::vector<LogprobItem>& items, bool ids = false);
nlohmann::json usage_chunk(const ResponseHead& h, int prompt_tokens, int completion_tokens);
nlohmann::json models_list(const ServedModel& m);

}  // namespace anvil::serve
