// Tokenizers. The byte tokenizer maps each byte to its value (0..255) and puts the end-of-text token
// after them (id 256). GPT-2's byte-level BPE plugs in behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    // Ordinary text: special-token strings inside it are encoded as text, never as the special id.
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    virtual std::string decode(const int32_t* ids, size_t n) const = 0;
    std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
    virtual int vocab_size() const = 0;
    virtual int eot_id() const = 0;
    // How a checkpoint's config.json names this tokenizer (anvil_tokenizer key).
    virtual std::string kind() const = 0;
    // Writes whatever files the tokenizer needs into a checkpoint directory.
    virtual void save(const std::string& dir) const = 0;
};

class ByteTokenizer final : public Tokenizer {
public:
    using Tokenizer::decode;
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const int32_t* ids, size_t n) const override;
    int vocab_size() const override { return 257; }
    int eot_id() const override { return 256; }
    std::string kind() const override { return "byte"; }
    void save(const std::string&) const override {}
};

// "byte", or a path to GPT-2 BPE vocabulary files (a directory with encoder.json + vocab.bpe or
// vocab.json + merges.txt or tokenizer.json, or a tokenizer.json file).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);
// The tokenizer a checkpoint directory was trained with (its config.json anvil_tokenizer key, else
// tokenizer files found in the directory).
std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& dir, const nlohmann::json& config);

}  // namespace anvil
