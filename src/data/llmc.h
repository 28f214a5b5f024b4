// llm.c's token shards (its dev/data scripts: tinyshakespeare.py, fineweb.py, ...), read in place so a user
// of llm.c trains on the files they already have.
//
// Layout (little-endian): a 1024-byte header of 256 int32, [0] the magic, [1] the version, [2] the token
// count; then the ids. Magic 20240520 version 1: GPT-2 ids as uint16; magic 20240801 version 7: Llama 3 ids
// as uint32. Every document starts with a delimiter (GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>).
// A directory's files named *_train*.bin are the training split, *_val*.bin the validation split.
#pragma once

#include <string>

#include "data/dataset.h"

namespace anvil {

constexpr int32_t kLlmcMagicGpt2 = 20240520;
constexpr int32_t kLlmcMagicLlama3 = 20240801;
constexpr size_t kLlmcHeaderBytes = 1024;

// A directory holding llm.c shards (*_train*.bin files) and no meta.json; open_llmc checks their headers.
bool is_llmc_dir(const std::string& path);

// Which tokenizer the shards need, for messages: "GPT-2" or "Llama 3" (from the first training shard).
std::string llmc_tokenizer_name(const std::string& dir);

// Memory-maps the shards, each checked: the magic and version, the size against the header's count, every
// id below the tokenizer's vocabulary. Every token is in the loss; a record ends at each delimiter (the
// tokenizer's end-of-text id for GPT-2 shards, its BOS for Llama 3's). The fingerprint covers each file's
// name, count and first and last 4096 ids, not every id.
Dataset open_llmc(const std::string& dir, const Tokenizer& tok);

}  // namespace anvil
