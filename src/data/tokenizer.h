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
    // As encode, but special-token strings in the text (<|endoftext|>, <|eot_id|>, </s>) become their ids, as
    // transformers does: for templates that spell their markers.
    virtual std::vector<int32_t> encode_with_specials(std::string_view text) const { return encode(text); }
    virtual std::string decode(const int32_t* ids, size_t n) const = 0;
    std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
    virtual int vocab_size() const = 0;
    virtual int eot_id() const = 0;  // ends every document and record (GPT-2's <|endoftext|>, Llama's EOS)
    // The beginning-of-sequence token put before every document and record when the tokenizer's config asks
    // for one (Llama: add_bos_token), or -1.
    virtual int bos_id() const { return -1; }
    // A prompt as a model sees it: BOS (when the tokenizer adds one), then the text.
    std::vector<int32_t> encode_prompt(std::string_view text) const {
        std::vector<int32_t> ids = encode(text);
        if (bos_id() >= 0) ids.insert(ids.begin(), bos_id());
        return ids;
    }
    // The id of a special token's text, or -1.
    virtual int special_id(std::string_view /*text*/) const { return -1; }
    // How a checkpoint's config.json names this tokenizer (anvil_tokenizer key).
    virtual std::string kind() const = 0;
    // Writes whatever files the tokenizer needs into a checkpoint directory.
    virtual void save(const std::string& dir) const = 0;
    // The system message the tokenizer's own ChatML chat template (tokenizer_config.json) opens a
    // conversation with when it has none: Qwen2's "You are a helpful assistant.", Qwen2.5's "You are Qwen,
    // created by Alibaba Cloud. You are a helpful assistant."; or "". The chatml template does the same.
    const std::string& default_system() const { return default_system_; }
    void set_default_system(std::string s) { default_system_ = std::move(s); }
    // tokenizer_config.json's chat_template (its "default" one where it names several), or "": what `auto`
    // reads a template from where the special tokens do not tell (Llama 2 Chat's [INST] has none).
    const std::string& chat_template() const { return chat_template_; }
    void set_chat_template(std::string s) { chat_template_ = std::move(s); }
    // A piece of a longer text whose earlier part is encoded already, ending in a special token
    // (after_special) or in text. Byte-level tokenizers encode it as encode() does; SentencePiece-style ones
    // put their "▁" before it only where Hugging Face's would, so that a record encoded piece by piece gets
    // the ids of the whole text: after a special token when every stretch gets one (the Prepend normalizer),
    // never in the middle of a stretch.
    virtual std::vector<int32_t> encode_continuation(std::string_view text, bool /*after_special*/) const {
        return encode(text);
    }

private:
    std::string default_system_, chat_template_;
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

// "byte", or a path to BPE vocabulary files: a directory with encoder.json + vocab.bpe or vocab.json +
// merges.txt (GPT-2), or a Hugging Face tokenizer.json file or its directory (with tokenizer_config.json):
// byte-level BPE (GPT-2, Llama 3, Qwen) or SentencePiece-style BPE with byte fallback (Llama 2, Mistral).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);
// The tokenizer a checkpoint directory was trained with (its config.json anvil_tokenizer key, else
// tokenizer files found in the directory); an error naming --tokenizer when it says nothing of one.
std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& dir, const nlohmann::json& config);
// Whether it says which (a model saved without tokenizer files, as save_pretrained of a model alone, does
// not).
bool checkpoint_names_tokenizer(const std::string& dir, const nlohmann::json& config);
// The tokenizer files of a Hugging Face or GPT-2 directory, those of them in `dir`.
std::vector<std::string> tokenizer_files_in(const std::string& dir);

}  // namespace anvil
