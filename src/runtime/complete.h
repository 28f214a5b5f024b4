// One completion of a prompt, as `anvil generate` and the Python layer make it: the generator's tokens as
// showable text (whole characters, nothing from a stop string on), how it ended and how long it took.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/generate.h"

namespace anvil {

struct TextCompletion {
    std::string text;             // up to, not including, a stop string
    std::vector<int32_t> tokens;  // as generated (the end token included where one ended it)
    std::vector<float> logprobs;  // each token's, where asked
    std::string finish_reason;    // "stop": an end token or a stop string; "length": anything else
    double ttft_ms = 0.0;         // to the first token (the prompt's prefill in it)
    double total_ms = 0.0;
    double tokens_per_s = 0.0;  // the decode rate after the first token
};

// Called after every token with the text it made showable (often empty): false ends the generation there
// (a reader gone, Ctrl-C).
using OnPiece = std::function<bool(const std::string& piece)>;

// Generates after `prompt` with `s` (its stop_tokens end it, reported as "stop"); `stop` strings end it too.
// on_piece (may be empty) sees the text as it becomes showable, the held-back rest at the end.
TextCompletion complete_text(Generator& gen, const Tokenizer& tok, const SampleOptions& s,
                             const std::vector<int32_t>& prompt, const std::vector<std::string>& stop = {},
                             const OnPiece& on_piece = {}, bool logprobs = false);

}  // namespace anvil
