// GPT-2 model configuration and its Hugging Face config.json form.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace anvil {

struct GPTConfig {
    int n_layer = 4;
    int n_head = 4;
    int n_embd = 128;
    int n_ctx = 128;       // maximum sequence length (HF: n_positions)
    int vocab_size = 257;  // rows of wte; the tokenizer's ids must be below it

    int head_size() const { return n_embd / n_head; }
    int64_t num_params() const;
    // Training FLOPs per token at sequence length T (nanoGPT's estimate: 6 N + 12 L C T, N without the
    // position table), the MFU numerator.
    double flops_per_token(int T) const;
    // Throws a clear error naming `where` (a flag list or a file) if a size is not usable.
    void validate(const std::string& where) const;
    bool same_shape(const GPTConfig& o) const {
        return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd && n_ctx == o.n_ctx &&
               vocab_size == o.vocab_size;
    }
    std::string str() const;
};

// HF GPT2Config keys. `extra` adds anvil's own keys (tokenizer name) beside them.
nlohmann::json config_to_hf_json(const GPTConfig& c, const nlohmann::json& extra);
// Reads n_layer, n_head, n_embd, n_positions (or n_ctx), vocab_size; rejects GPT-2 variants anvil does not
// implement (other activations, untied embeddings, other layer-norm eps). `path` is for messages.
GPTConfig config_from_hf_json(const nlohmann::json& j, const std::string& path);

}  // namespace anvil
