// Evaluation shared by `anvil train` (periodic and final) and `anvil eval`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "data/choices.h"
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

// One instruction record as evaluated: a line of `anvil eval --per-example` and of a run's
// eval_examples.jsonl (runtime/compare.h reads them).
struct ExampleResult {
    int index = 0;         // in the records given
    std::string prompt;    // as the model saw it (render_text of the prompt)
    std::string expected;  // the record's answer: its output, or a chat's final assistant turn
    std::string output;    // the greedy answer
    bool exact = false;    // output == expected, character for character
    // Mean log-probability of the expected answer's tokens and the end-of-turn token after it, given the
    // prompt, as training scores them (natural log); answer_tokens of them.
    double logprob = 0.0;
    int answer_tokens = 0;
};

struct ExactMatchResult {
    int total = 0, correct = 0;
    double accuracy() const { return total ? double(correct) / total : 0.0; }
    std::vector<AnswerSample> samples;    // the first few, for the report
    std::vector<ExampleResult> examples;  // with per_example: every record, in order (every rank's)
};

// Greedy answers to each example's prompt (data/chat.h), compared character for character with its answer
// (the output, or a chat's final assistant turn). With `comm`, rank r answers examples r, r+W, ...; the
// counts are the totals, the samples rank 0's. With `per_example`, every record's result too, its answer's
// log-probability scored in batches of the model's reserved activations (as multiple_choice scores endings).
// `progress` (may be empty) gets the number of this rank's records answered.
ExactMatchResult exact_match(Model& model, const Tokenizer& tok, PromptTemplate tmpl,
                             const std::vector<Example>& examples, int max_examples, int keep_samples = 3,
                             Comm* comm = nullptr, bool per_example = false,
                             const std::function<void(int)>& progress = {});

// Each text's log-likelihood under the model: its tokens after the end-of-text token that opens it (the
// sum over them, natural log, and their count; a text longer than the model's reserved max_T scored on its
// last max_T tokens), in batches of the reserved rows (Model::reserve). `progress` (may be empty) gets the
// texts done.
struct TextScore {
    double logprob = 0.0;
    int tokens = 0;
    double perplexity() const;  // exp(-logprob / tokens)
};
std::vector<TextScore> score_texts(Model& model, const Tokenizer& tok, const std::vector<std::string>& texts,
                                   const std::function<void(int)>& progress = {});
// A text as score_texts scores it: the end-of-text token, then its tokens.
std::vector<int32_t> text_row(const Tokenizer& tok, const std::string& text);
// Each of ids[1..]'s log-probability after the ids before it (natural log), in one row of the model's
// reserved activations: the last max_T of them when there are more.
std::vector<float> token_logprobs(Model& model, const std::vector<int32_t>& ids);

// Up to `tokens` tokens sampled after `prompt` at temperature 1 from the tokenizer's ids, seeded, ending
// after one of `stop` (where given): the prompt and the sample as text.
std::string sample_text(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, int tokens,
                        uint64_t seed, std::vector<int32_t> stop = {});

// One multiple-choice item as scored: each ending's log-likelihood after the context (the sum over its
// tokens) and its token count.
struct ChoiceScore {
    int index = 0;  // in the item list
    int label = 0;
    std::vector<double> logprob;
    std::vector<int> tokens;
    int pred = 0;       // the ending with the highest log-likelihood
    int pred_norm = 0;  // ... per token
};

struct ChoiceResult {
    int total = 0;
    int correct = 0;       // acc: the likeliest ending is the label (lm-evaluation-harness's acc)
    int correct_norm = 0;  // acc_norm: the likeliest per token (llm.c's HellaSwag figure)
    double acc() const { return total ? double(correct) / total : 0.0; }
    double acc_norm() const { return total ? double(correct_norm) / total : 0.0; }
    std::vector<ChoiceScore> scores;  // this rank's items, in order
};

// Scores every ending of the first max_items items (0 = all) with the model's reserved activations: rows of
// context + ending (data/choices.h), longest first, in batches of up to max_B rows, each row's last max_T
// positions when it is longer (the context's start dropped), the ending's tokens the only targets. Ties go to
// the first ending. With `comm`, rank r scores items r, r+W, ... and the counts are the totals. `progress`
// (may be empty) gets the number of this rank's endings scored.
ChoiceResult multiple_choice(Model& model, const Tokenizer& tok, const std::vector<ChoiceItem>& items,
                             int max_items, Comm* comm = nullptr,
                             const std::function<void(int)>& progress = {});
// How many items multiple_choice scores: the first max_items (0 = all).
int choice_items(const std::vector<ChoiceItem>& items, int max_items);

}  // namespace anvil
