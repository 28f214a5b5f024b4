// A Hugging Face tokenizer.json read in two parts: model.vocab and model.merges, the file's bulk (Llama 3's:
// 128k tokens and 280k merges in 9 MB), straight into vectors by a SAX pass, and everything else as a JSON
// document without them. Building those two as a document cost three times the rest of the load.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

struct TokenizerJson {
    nlohmann::json doc;  // the file without model.vocab and model.merges

    bool has_vocab = false;     // model.vocab is there (and is an object: vocab_object)
    bool vocab_object = false;  //
    std::vector<std::pair<std::string, int64_t>> vocab;  // {token: id} in file order
    std::string vocab_bad;  // the first token whose id is not an integer ("" if none)

    bool has_merges = false;                                  // model.merges is there and is an array
    std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings or ["a", "b"] pairs, in order
    std::string merges_bad;  // the first malformed merge, "merge N: what is wrong" ("" if none)
};

// Parses `text` (the contents of `path`, named in errors); not valid JSON is an error naming the file.
TokenizerJson parse_tokenizer_json(const std::string& text, const std::string& path);

}  // namespace anvil
