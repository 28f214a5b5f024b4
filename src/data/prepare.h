// anvil data prepare: raw files -> token shards with a train/validation/test split, exact de-duplication,
// a leakage check and a report of every record that was not kept.
//
// Split: each JSONL/CSV record goes to validation if u < val_fraction, to test if u < val_fraction +
// test_fraction, else to training, u being a 64-bit hash of the record's content and --seed scaled to [0, 1):
// stable when files are reordered or appended to. A text file is one document split by position: its first
// 1 - val - test of bytes train, then validation, then test (cut where tokenization is unaffected).
// De-duplication: a record whose content equals an earlier one is dropped (the report names both); with
// near_dedup, so is one near an earlier kept record (MinHash, verified by exact Jaccard; data/minhash.h).
// Leakage: validation/test records that equal a training record or share a span of --leak-ngram tokens
// with the training split (within a text, or within an instruction record's input or output) are reported.
#pragma once

#include <string>
#include <vector>

namespace anvil {

struct PrepareOptions {
    std::vector<std::string> inputs;
    std::string out;
    std::string tokenizer = "byte";
    std::string format = "auto";
    std::string text_field = "text", csv_column = "text";
    std::string prompt_template = "auto";  // data/chat.h
    double val_fraction = 0.05, test_fraction = 0.0;
    uint64_t seed = 1337;
    bool dedup = true;
    // near-duplicates too (data/minhash.h): a record whose word-5-gram Jaccard similarity with a kept record
    // reaches near_threshold is dropped, whatever split either would go to
    bool near_dedup = false;
    double near_threshold = 0.8;
    int leak_ngram = -1;  // -1: 13 with a BPE tokenizer, 50 with bytes; 0 = off
    bool strict = false;
    bool overwrite = false;
    uint64_t shard_tokens = 100'000'000;
    int threads = 0;
};

// Returns the exit status: 0, or 1 when --strict and records were rejected (the report says which).
int run_prepare(const PrepareOptions& opts);

}  // namespace anvil
