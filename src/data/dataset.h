// Training data as token streams, with the loss mask that instruction tuning needs.
//
// Inputs: a plain text file (the whole file is one document), or JSONL with one record per line:
// {"text": ...} (field chosen by --text-field) or the instruction schema {"instruction", "input", "output"}
// rendered through a prompt template (render_prompt) with only the output and the end-of-text token in
// the loss. Records end with the end-of-text token. The validation split is the last --val-fraction of the
// records (JSONL) or of the tokens (text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace anvil {

struct Example {
    std::string instruction, input, output;
};

// Prompt templates: everything the model sees before the output; the output follows, then end-of-text.
//  alpaca   Stanford Alpaca's prompts:
//           "Below is an instruction that describes a task, paired with an input that provides further
//           context. Write a response that appropriately completes the request.\n\n### Instruction:\n
//           {instruction}\n\n### Input:\n{input}\n\n### Response:\n"; without input: "Below is an
//           instruction that describes a task. Write a response that appropriately completes the
//           request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
//  compact  "{instruction}\n{input}\n=> " (the input line left out when input is empty): for small
//           byte-level models, where every prompt byte costs a token
enum class PromptTemplate : uint8_t { Alpaca, Compact };
PromptTemplate parse_template(const std::string& name);  // throws naming the flag
const char* template_name(PromptTemplate t);
std::string render_prompt(const Example& e, PromptTemplate t);

// Per-token flags.
enum TokenFlag : uint8_t {
    kInLoss = 1,       // the token is a prediction target
    kNeedsPrompt = 2,  // ... but only when its record's start is inside the row (instruction outputs)
    kRecordStart = 4,  // first token of a record
};

struct TokenStream {
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;  // TokenFlag bits
    size_t size() const { return ids.size(); }
    void append(const std::vector<int32_t>& t, uint8_t flag);
    void append_one(int32_t id, uint8_t flag);
    uint64_t fingerprint() const;  // FNV-1a over ids and flags
};

struct DataOptions {
    double val_fraction = 0.1;
    std::string text_field = "text";
    PromptTemplate prompt = PromptTemplate::Alpaca;
};

struct Dataset {
    std::string path;
    TokenStream train, val;
    std::vector<Example> val_examples;  // instruction records of the validation split
    size_t records = 0, val_records = 0;
    bool jsonl = false;
};

Dataset load_dataset(const std::string& path, const Tokenizer& tok, const DataOptions& opts);

// Reads a JSONL file of instruction records (for eval); errors name file and line.
std::vector<Example> read_instruction_jsonl(const std::string& path);
void write_instruction_jsonl(const std::string& path, const std::vector<Example>& examples);

}  // namespace anvil
