// Byte-level BPE as GPT-2 defines it: pre-tokenize with GPT-2's regex (or a tokenizer.json's Split pattern:
// Llama 3, Qwen), then apply merges lowest rank first (leftmost on ties) to each piece's bytes. Vocabulary
// forms read: encoder.json + vocab.bpe (OpenAI), vocab.json + merges.txt (Hugging Face), tokenizer.json
// (Hugging Face tokenizers, ByteLevel BPE). Text that is not valid UTF-8 is first repaired (U+FFFD per
// maximal invalid subpart, as Python and JavaScript decoders do), so invalid input tokenizes as GPT-2
// tokenizes the decoded text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe_merge.h"
#include "data/regex_split.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

namespace anvil {

// Finds special-token strings in text: at each position whose byte can start one, the longest that matches.
class SpecialMatcher {
public:
    SpecialMatcher() = default;
    explicit SpecialMatcher(const std::vector<std::pair<std::string, int32_t>>& specials);
    // The first special at or after `pos`: its offset (npos if none), length and id.
    size_t find(std::string_view text, size_t pos, size_t* len, int32_t* id) const;
    int32_t id_of(std::string_view text) const;

private:
    std::vector<std::vector<std::pair<std::string, int32_t>>> by_first_;  // first byte -> longest first
};

class BpeTokenizer final : public Tokenizer {
public:
    // A directory holding one of the forms above, or a tokenizer.json file.
    static BpeTokenizer load(const std::string& path);
    // From raw parts: token bytes by id, merges as (left id, right id) in rank order, special tokens.
    BpeTokenizer(std::vector<std::string> tokens, const std::vector<std::pair<int32_t, int32_t>>& merges,
                 std::vector<std::pair<std::string, int32_t>> specials, std::string source);

    // A tokenizer.json's own pre-tokenizer pattern (else GPT-2's), ignore_merges (a piece that is a whole
    // token is that token), its BOS and EOS (tokenizer_config.json), and the files to copy into checkpoints.
    void set_split(std::shared_ptr<const RegexSplit> split) { split_ = std::move(split); }
    void set_ignore_merges(bool v) { ignore_merges_ = v; }
    // A Unicode normalizer applied to ordinary text before the split (Qwen's NFC); special tokens match the
    // raw text.
    void set_normalizer(utf8::Form f) { norm_ = f; }
    void set_bos_eos(int32_t bos, int32_t eos) {
        bos_ = bos;
        if (eos >= 0) eot_ = eos;
    }
    void set_hf_files(std::vector<std::pair<std::string, std::string>> files) {
        hf_files_ = std::move(files);
    }

    using Tokenizer::decode;
    std::vector<int32_t> encode(std::string_view text) const override;
    std::vector<int32_t> encode_with_specials(std::string_view text) const override;
    std::string decode(const int32_t* ids, size_t n) const override;
    int vocab_size() const override { return int(tokens_.size()); }
    int eot_id() const override { return eot_; }
    int bos_id() const override { return bos_; }
    int special_id(std::string_view text) const override;
    std::string kind() const override { return "bpe"; }
    // Writes tokenizer.json, vocab.json and merges.txt (what Hugging Face's GPT-2 tokenizers read); a
    // tokenizer read from a tokenizer.json copies that file and its tokenizer_config.json instead.
    void save(const std::string& dir) const override;

    const std::string& source() const { return source_; }
    size_t num_merges() const { return merges_.size(); }
    const std::string& token_bytes(int32_t id) const { return tokens_[size_t(id)]; }

private:
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

    std::vector<std::string> tokens_;                  // id -> bytes
    std::unordered_map<std::string, int32_t> index_;   // bytes -> id (ordinary tokens)
    std::vector<std::pair<int32_t, int32_t>> merges_;  // rank -> (left, right)
    PairTable pairs_;
    int32_t byte_ids_[256];
    std::vector<std::pair<std::string, int32_t>> specials_;
    SpecialMatcher matcher_;
    int32_t eot_ = -1, bos_ = -1;
    bool ignore_merges_ = false;
    utf8::Form norm_ = utf8::Form::None;
    std::shared_ptr<const RegexSplit> split_;
    std::vector<std::pair<std::string, std::string>> hf_files_;  // (name, contents) copied by save()
    std::string source_;
};

// A Hugging Face tokenizer.json (a file, or a directory holding it and tokenizer_config.json): byte-level BPE
// (ByteLevel, or a Split pattern then ByteLevel) as a BpeTokenizer, SentencePiece-style BPE (Prepend/Replace
// normalizer or Metaspace, byte fallback) as an SpBpeTokenizer. BOS and EOS follow tokenizer_config.json. An
// unsupported model, normalizer or pre-tokenizer type is an error naming it.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);

// GPT-2's reversible byte <-> printable-character map used in vocabulary files.
std::string bytes_to_vocab_string(std::string_view bytes);
// Inverse; false if the string holds a character outside the map.
bool vocab_string_to_bytes(std::string_view s, std::string* bytes);

// Trains a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + <|endoftext|>) on the texts,
// pre-tokenized with GPT-2's regex. Pairs are merged most frequent first (ties: the smaller pair of ids).
BpeTokenizer train_bpe(const std::vector<std::string>& texts, int vocab_size, bool show_progress);

}  // namespace anvil
