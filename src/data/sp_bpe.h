// SentencePiece-style BPE as Hugging Face's tokenizer.json describes it (Llama 2, Mistral, TinyLlama): spaces
// become "▁" (the normalizer's Replace, with a "▁" prepended to each stretch of text, or the Metaspace
// pre-tokenizer), characters are the initial symbols, merges apply lowest rank first, and a character the
// vocabulary lacks falls back to its UTF-8 bytes as <0xNN> tokens. Added tokens are matched before all of
// that. Decoding turns "▁" back into spaces, joins byte tokens and drops the one leading space.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "data/bpe.h"

namespace anvil {

class SpBpeTokenizer final : public Tokenizer {
public:
    struct Spec {
        std::vector<std::string> pieces;                           // id -> piece (UTF-8, "▁" for spaces)
        std::vector<std::pair<std::string, std::string>> merges;   // rank order
        std::vector<std::pair<std::string, int32_t>> added;        // added tokens, matched before splitting
        std::vector<bool> added_special;                           // parallel to `added`
        std::string prepend = "\u2581";                            // before a stretch of text ("" = none)
        bool prepend_every_stretch = true;  // Prepend normalizer: after added tokens too; Metaspace "first": not
        bool byte_fallback = true;
        int32_t unk = -1, bos = -1, eos = -1;
        std::string source;
    };
    explicit SpBpeTokenizer(Spec s);
    void set_hf_files(std::vector<std::pair<std::string, std::string>> files) { hf_files_ = std::move(files); }
    void set_bos_eos(int32_t bos, int32_t eos) {
        spec_.bos = bos;
        spec_.eos = eos;
    }

    using Tokenizer::decode;
    std::vector<int32_t> encode(std::string_view text) const override;
    std::vector<int32_t> encode_with_specials(std::string_view text) const override;
    std::vector<int32_t> encode_continuation(std::string_view text, bool after_special) const override;
    std::string decode(const int32_t* ids, size_t n) const override;
    int vocab_size() const override { return int(spec_.pieces.size()); }
    int eot_id() const override { return spec_.eos; }
    int bos_id() const override { return spec_.bos; }
    int special_id(std::string_view text) const override { return all_.id_of(text); }
    std::string kind() const override { return "bpe"; }
    void save(const std::string& dir) const override;

private:
    // `prepend_first`: whether the text's first stretch gets the "▁" (it does where the text starts a record)
    std::vector<int32_t> encode_added(std::string_view text, const SpecialMatcher& m,
                                      bool prepend_first) const;
    // one stretch between added tokens, after a "▁" when `prepend`
    void encode_text(std::string_view text, bool prepend, std::vector<int32_t>& out) const;
    void encode_word(std::string_view word, std::vector<int32_t>& out) const;
    void merge_word(std::string_view word, std::vector<int32_t>& out) const;

    Spec spec_;
    std::unordered_map<std::string, int32_t> index_;
    PairTable pairs_;
    int32_t byte_ids_[256];
    SpecialMatcher all_, ordinary_;  // every added token; the non-special ones
    bool split_words_ = false;  // no token holds "▁" after another character: words can merge apart
    std::vector<std::pair<std::string, std::string>> hf_files_;
};

}  // namespace anvil
