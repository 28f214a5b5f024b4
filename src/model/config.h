// A model's shape, for every family (Hugging Face's config.json names the family in `model_type`), and its
// config.json form. The trainer, the evaluation and the CLI see only this; each family reads and writes its
// own keys (gpt2.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace anvil {

// Llama 3.1's rotary frequency scaling (rope_scaling with rope_type "llama3"), or plain "linear" scaling.
struct RopeScaling {
    std::string type;  // "" (none), "llama3", "linear"
    double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
    int original_max_position_embeddings = 8192;
    bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
    std::string model_type = "gpt2";
    int n_layer = 4;
    int n_head = 4;
    int n_kv_head = 0;  // key/value heads (grouped-query attention); 0 = n_head
    int n_embd = 128;
    int n_ctx = 128;       // maximum sequence length (HF: n_positions / max_position_embeddings)
    int vocab_size = 257;  // rows of the token embedding; the tokenizer's ids must be below it
    // Rotary families (Llama); GPT-2 has a 4x GELU MLP, learned positions, LayerNorm eps 1e-5 and a tied head.
    int ffn_dim = 0;   // the MLP's hidden width (HF intermediate_size); 0 = 4 * n_embd
    int head_dim = 0;  // 0 = n_embd / n_head
    double rope_theta = 10000.0;
    double norm_eps = 1e-5;
    bool tie_embeddings = true;
    RopeScaling rope_scaling;
    // Biases of the rotary families: on q, k and v (Qwen2; Llama's attention_bias), on o_proj (Llama's
    // attention_bias), on the MLP's three projections (Llama's mlp_bias).
    bool qkv_bias = false, o_bias = false, mlp_bias = false;
    // Mistral's sliding_window when it is shorter than max_position_embeddings: anvil attends to every
    // earlier position, which is the same within the window, so the model runs with n_ctx = the window, and
    // this (max_position_embeddings) is written back.
    int hf_max_positions = 0;
    // Weight-only int8 (anvil quantize; config.json's "quantization_config"): every linear layer's weight and the
    // token embedding are I8 with an f32 scale per output channel, a frozen base for inference and LoRA.
    bool int8_weights = false;

    int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
    int ffn() const { return ffn_dim > 0 ? ffn_dim : 4 * n_embd; }
    int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    // Every parameter, a tied matrix once.
    int64_t num_params() const;
    // Training FLOPs per token at sequence length T (nanoGPT's estimate: 6 N + 12 L C T, N without the
    // position table), the MFU numerator.
    double flops_per_token(int T) const;
    // Throws a clear error naming `where` (a flag list or a file) if a size is not usable.
    void validate(const std::string& where) const;
    bool same_shape(const ModelConfig& o) const {
        return model_type == o.model_type && n_layer == o.n_layer && n_head == o.n_head &&
               kv_heads() == o.kv_heads() && n_embd == o.n_embd && n_ctx == o.n_ctx &&
               vocab_size == o.vocab_size && ffn() == o.ffn() && head_size() == o.head_size() &&
               rope_theta == o.rope_theta && norm_eps == o.norm_eps && tie_embeddings == o.tie_embeddings &&
               rope_scaling == o.rope_scaling && qkv_bias == o.qkv_bias && o_bias == o.o_bias &&
               mlp_bias == o.mlp_bias && int8_weights == o.int8_weights;
    }
    std::string str() const;
};

// config.json's quantization_config.quant_method for anvil's int8 weights.
constexpr const char* kInt8Method = "anvil-int8";

// Hugging Face config.json of the family; `extra` adds anvil's own keys (tokenizer, template) beside them.
nlohmann::json config_to_hf_json(const ModelConfig& c, const nlohmann::json& extra);
// Reads a config.json of any family anvil implements (by `model_type`; GPT-2 when absent); rejects variants
// it does not implement with the key and what to do. `path` is for messages.
ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& path);

}  // namespace anvil
