// Training data as token streams, with the loss mask that instruction tuning needs.
//
// Inputs: a plain text file (the whole file is one document), or JSONL with one record per line:
// {"text": ...} (field chosen by --text-field), the instruction schema {"instruction", "input", "output"} or
// chat records {"messages": [{"role", "content"}, ...]}, rendered through a template (data/chat.h) with only
// the answers in the loss. Records end with the end-of-text token. The validation split is the last --val-fraction of the
// records (JSONL) or of the tokens (text).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/token_view.h"
#include "data/tokenizer.h"

namespace anvil {

// FNV-1a over ids and flags: identifies a training split (a resumed run checks it).
uint64_t fingerprint(const TokenView& v);

struct DataOptions {
    double val_fraction = 0.1;
    std::string text_field = "text";
    PromptTemplate prompt = PromptTemplate::Alpaca;
    bool keep_examples = false;  // fill Dataset::train_examples (--augment re-renders them)
};

struct Dataset {
    std::string path;
    TokenView train, val;
    std::vector<Example> val_examples;  // instruction records of the validation split
    // with DataOptions::keep_examples: the training split's records in order (a text record: an empty one)
    std::vector<Example> train_examples;
    size_t records = 0, val_records = 0;
    bool jsonl = false;
    std::string format;             // how the files are laid out, where not anvil's own: "llm.c GPT-2 shards"
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

// A directory of token shards, anvil data prepare's or llm.c's (data/llmc.h), as opposed to a text or JSONL
// file; open_data_dir opens either kind.
bool is_data_dir(const std::string& path);
Dataset open_data_dir(const std::string& dir, const Tokenizer& tok);

// Reads the instruction and chat records of a JSONL file (for exact match); errors name file and line.
std::vector<Example> read_examples_jsonl(const std::string& path);
void write_examples_jsonl(const std::string& path, const std::vector<Example>& examples);
nlohmann::ordered_json example_json(const Example& e);  // the record as it is written

}  // namespace anvil
