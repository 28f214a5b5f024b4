// Label-safe text augmentation (`anvil data augment`, `anvil train --augment`): the operations of EDA (Wei
// and Zou 2019: synonym replacement, random insertion, swap and deletion) and case and whitespace noise,
// applied only to the fields of a record that do not decide its answer (the instruction, by default). Every
// draw comes from a seed: augmentation_seed(seed, epoch, record) makes an augmented epoch reproducible, so a
// resumed run sees exactly what the uninterrupted one saw.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/rng.h"
#include "data/chat.h"
#include "data/token_view.h"

namespace anvil {

// swap: two words trade places; delete: words dropped (never one the synonym list names: those carry the
// meaning, and are replaced, not dropped); insert: a word of the text (or a synonym of one) put
// at a random gap; synonym: words replaced by a synonym from the word list; case: a word lowercased,
// uppercased or capitalized; space: a gap widened to two spaces, or a space added at either end.
enum class AugmentOp : uint8_t { Swap, Delete, Insert, Synonym, Case, Space };
const char* augment_op_name(AugmentOp op);
// "swap,delete,insert,synonym,case,space" (any of them, comma-separated); throws naming `flag`.
std::vector<AugmentOp> parse_augment_ops(const std::string& spec, const char* flag);

// A word list of synonyms: one group a line, its words separated by commas (blank lines and lines from "#"
// skipped), as WordNet's synsets list them; a word's synonyms are the other words of every group it is in.
// Words match lowercased.
class Synonyms {
public:
    static Synonyms read(const std::string& path);  // throws naming the file and line
    void add_group(const std::vector<std::string>& words);
    const std::vector<std::string>* of(std::string_view word) const;  // lowercased; nullptr when none
    bool empty() const { return table_.empty(); }

private:
    std::unordered_map<std::string, std::vector<std::string>> table_;
};

// Fields a record's augmentation may touch: "instruction", "input" (instruction records), "system", "user"
// (a chat's system message and user turns).
// "a, b,c" -> {"a", "b", "c"} (--ops, --fields)
std::vector<std::string> split_commas(const std::string& spec);

struct AugmentOptions {
    std::vector<AugmentOp> ops;
    double p = 0.1;  // the share of a field's words an op changes: max(1, round(p * words)) (EDA's alpha)
    std::vector<std::string> fields = {"instruction"};
    std::shared_ptr<const Synonyms> synonyms;  // needed by synonym (insert uses it where given)
};
// Fields known (an error names `fields_flag`), synonyms where an operation needs them (names `flag`).
void check_augment_options(const AugmentOptions& o, const char* flag, const char* fields_flag);

// `text` with one operation applied: words are its whitespace-separated pieces; a word's punctuation stays
// with it and a synonym takes its capitalization. A text without words comes back unchanged.
std::string augment_text(std::string_view text, AugmentOp op, double p, const Synonyms* synonyms, Rng& rng);
// The record with one operation, drawn from o.ops, applied to each of its chosen fields (a field of its
// own draws); returns the operation.
AugmentOp augment_example(Example& e, const AugmentOptions& o, Rng& rng);
// The same with the operation given.
void augment_fields(Example& e, AugmentOp op, const AugmentOptions& o, Rng& rng);
// The chosen fields of a record (the ones augment_fields changes), for what changes them elsewhere (a
// paraphrasing model).
std::vector<std::string*> chosen_fields(Example& e, const std::vector<std::string>& fields);

// The generator of record `record`'s augmentation in epoch `epoch` (or copy `epoch` of `data augment`).
uint64_t augmentation_seed(uint64_t seed, uint64_t epoch, uint64_t record);

// `anvil train --augment`: the training split's records, each re-rendered in an epoch from an augmented copy
// with chance `prob` (drawn, with the copy, from augmentation_seed(seed, epoch, record)).
struct RecordAugmenter {
    std::vector<Example> examples;  // the training split's records in order; a text record: an empty Example
    AugmentOptions opts;
    double prob = 0.5;
    uint64_t seed = 0;
    PromptTemplate prompt = PromptTemplate::Alpaca;
    const Tokenizer* tok = nullptr;  // outlives it
    // Record k's tokens in `epoch` (record_tokens of its augmented copy), or false when it stays as it is.
    bool augmented(size_t k, uint64_t epoch, TokenStream& out) const;
};

}  // namespace anvil
