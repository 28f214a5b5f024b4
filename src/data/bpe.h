// Byte-level BPE as GPT-2 defines it: pre-tokenize with GPT-2's regex, then apply merges lowest rank first
// (leftmost on ties) to each piece's bytes. Vocabulary forms read: encoder.json + vocab.bpe (OpenAI),
// vocab.json + merges.txt (Hugging Face), tokenizer.json (Hugging Face tokenizers, ByteLevel BPE). Text that
// is not valid UTF-8 is first repaired (U+FFFD per maximal invalid subpart, as Python and JavaScript
// decoders do), so invalid input tokenizes as GPT-2 tokenizes the decoded text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace anvil {

class BpeTokenizer final : public Tokenizer {
public:
    // A directory holding one of the forms above, or a tokenizer.json file.
    static BpeTokenizer load(const std::string& path);
    // From raw parts: token bytes by id, merges as (left id, right id) in rank order, special tokens.
    BpeTokenizer(std::vector<std::string> tokens, const std::vector<std::pair<int32_t, int32_t>>& merges,
                 std::vector<std::pair<std::string, int32_t>> specials, std::string source);

    using Tokenizer::decode;
    std::vector<int32_t> encode(std::string_view text) const override;
    // As encode, but special-token strings (<|endoftext|>) in the text become their ids.
    std::vector<int32_t> encode_with_specials(std::string_view text) const;
    std::string decode(const int32_t* ids, size_t n) const override;
    int vocab_size() const override { return int(tokens_.size()); }
    int eot_id() const override { return eot_; }
    std::string kind() const override { return "bpe"; }
    // Writes tokenizer.json, vocab.json and merges.txt (what Hugging Face's GPT-2 tokenizers read).
    void save(const std::string& dir) const override;

    const std::string& source() const { return source_; }
    size_t num_merges() const { return merges_.size(); }
    const std::string& token_bytes(int32_t id) const { return tokens_[size_t(id)]; }

private:
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
    struct Merge {
        int32_t rank, id;
    };
    // (left, right) -> merge, open addressing on a power-of-two table
    struct PairTable {
        std::vector<uint64_t> keys;
        std::vector<Merge> vals;
        uint64_t mask = 0;
        void build(const std::vector<std::pair<uint64_t, Merge>>& items);
        const Merge* find(int32_t a, int32_t b) const;
    };

    std::vector<std::string> tokens_;                  // id -> bytes
    std::unordered_map<std::string, int32_t> index_;   // bytes -> id (ordinary tokens)
    std::vector<std::pair<int32_t, int32_t>> merges_;  // rank -> (left, right)
    PairTable pairs_;
    int32_t byte_ids_[256];
    std::vector<std::pair<std::string, int32_t>> specials_;
    int32_t eot_ = -1;
    std::string source_;
};

// GPT-2's reversible byte <-> printable-character map used in vocabulary files.
std::string bytes_to_vocab_string(std::string_view bytes);
// Inverse; false if the string holds a character outside the map.
bool vocab_string_to_bytes(std::string_view s, std::string* bytes);

// Trains a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + <|endoftext|>) on the texts,
// pre-tokenized with GPT-2's regex. Pairs are merged most frequent first (ties: the smaller pair of ids).
BpeTokenizer train_bpe(const std::vector<std::string>& texts, int vocab_size, bool show_progress);

}  // namespace anvil
