// Evaluation shared by `anvil train` (periodic and final) and `anvil eval`.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "dist/comm.h"
#include "model/model.h"

namespace anvil {

struct LossResult {
    double loss = 0.0;  // mean over scored targets
    double ppl = 0.0;   // exp(loss)
    int64_t targets = 0;
};

// Mean loss over the stream's sequential windows (see fill_eval_batch); max_batches 0 = all. The model must
// have activations reserved for (B, T). With `comm` (data parallel), rank r scores batches r, r+W, ... and
// every rank returns the total.
LossResult evaluate_loss(Model& model, const TokenView& s, int B, int T, int64_t max_batches,
                         Comm* comm = nullptr);

struct AnswerSample {
    Example example;
    std::string got;
    bool correct = false;
};

struct ExactMatchResult {
    int total = 0, correct = 0;
    double accuracy() const { return total ? double(correct) / total : 0.0; }
    std::vector<AnswerSample> samples;  // the first few, for the report
};

// Greedy answers to each example's prompt (data/chat.h), compared character for character with its answer
// (the output, or a chat's final assistant turn). With `comm`, rank r answers examples r, r+W, ...; the
// counts are the totals, the samples rank 0's.
ExactMatchResult exact_match(Model& model, const Tokenizer& tok, PromptTemplate tmpl,
                             const std::vector<Example>& examples, int max_examples, int keep_samples = 3,
                             Comm* comm = nullptr);

}  // namespace anvil
