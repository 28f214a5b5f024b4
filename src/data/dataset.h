// Training data as token streams, with the loss mask that instruction tuning needs.
//
// Inputs: a plain text file (the whole file is one document), or JSONL with one record per line:
// {"text": ...} (field chosen by --text-field) or the instruction schema {"instruction", "input", "output"}
// rendered through a prompt template (render_prompt) with only the output and the end-of-text token in
// the loss. Records end with the end-of-text token. The validation split is the last --val-fraction of the
// records (JSONL) or of the tokens (text).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "data/token_view.h"
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

struct TokenStream {
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;  // TokenFlag bits
    size_t size() const { return ids.size(); }
    void append(const std::vector<int32_t>& t, uint8_t flag);
    void append_one(int32_t id, uint8_t flag);
    TokenView view() const { return TokenView({TokenSegment{ids.data(), 4, flags.data(), -1, ids.size()}}); }
    operator TokenView() const { return view(); }
};

// FNV-1a over ids and flags: identifies a training split (a resumed run checks it).
uint64_t fingerprint(const TokenView& v);

struct DataOptions {
    double val_fraction = 0.1;
    std::string text_field = "text";
    PromptTemplate prompt = PromptTemplate::Alpaca;
};

struct Dataset {
    std::string path;
    TokenView train, val;
    std::vector<Example> val_examples;  // instruction records of the validation split
    size_t records = 0, val_records = 0;
    bool jsonl = false;
    uint64_t fingerprint = 0;       // of the training split
    std::shared_ptr<void> storage;  // owns the memory behind the views (token vectors or mapped shards)
};

// A text or JSONL file, tokenized in memory and split as described above.
Dataset load_dataset(const std::string& path, const Tokenizer& tok, const DataOptions& opts);

// A directory written by `anvil data prepare` (meta.json + shards), memory-mapped. The tokenizer must be
// the one saved there (tokenizer_for_checkpoint reads it).
bool is_prepared_dir(const std::string& path);
nlohmann::json read_prepared_meta(const std::string& dir);
std::unique_ptr<Tokenizer> tokenizer_for_prepared(const std::string& dir);  // the one it was prepared with
Dataset open_prepared(const std::string& dir, const Tokenizer& tok);

// Reads a JSONL file of instruction records (for eval); errors name file and line.
std::vector<Example> read_instruction_jsonl(const std::string& path);
void write_instruction_jsonl(const std::string& path, const std::vector<Example>& examples);

}  // namespace anvil
