// Multiple-choice items (HellaSwag, and tasks written the same way): a context, two or more endings, the
// index of the right one. A model answers with the ending it finds likeliest after the context
// (train/evaluate.h: multiple_choice).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace anvil {

struct ChoiceItem {
    std::string context;
    std::vector<std::string> endings;
    int label = 0;  // index into endings
};

// One item per JSONL line (blank lines skipped): HellaSwag's own fields, {"ctx", "endings", "label"} (the
// rowanz/hellaswag files llm.c evaluates on, and Hugging Face's copy, whose label is a string), or
// {"context", "choices", "label" or "answer"}. The label is an integer or a string of digits. A line that
// breaks this is an error naming file:line and the key; an empty file is an error too.
std::vector<ChoiceItem> read_choice_items(const std::string& path);

// The tokens of one ending after its context, as scored: the context encoded as a prompt (BOS first when
// the tokenizer adds one; the end-of-text token alone for an empty context, so the ending's first token is
// predicted from something), then the ending encoded as the text's continuation, with a space between them
// unless the context ends or the ending starts with whitespace (as llm.c encodes " " + ending for
// HellaSwag, and lm-evaluation-harness's target delimiter).
struct ChoiceRow {
    std::vector<int32_t> tokens;  // context then ending
    int n_context = 0;            // tokens[n_context..] are the ending's: the scored targets
};
ChoiceRow choice_row(const ChoiceItem& item, size_t ending, const Tokenizer& tok);

}  // namespace anvil
