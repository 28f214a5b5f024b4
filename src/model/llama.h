// Llama (and the models that share its layout: Mistral, Qwen2, TinyLlama, SmolLM): token embeddings,
// pre-RMSNorm blocks (rotary grouped-query attention, then a SwiGLU MLP), a final RMSNorm and an output
// layer, tied to the embedding only with tie_word_embeddings. Hugging Face's LlamaForCausalLM names and
// layouts (nn.Linear weights are (out, in)). The second family on the model seam (model.h): the trainer,
// evaluation, generation, LoRA and checkpoints are the ones GPT-2 uses.
#pragma once

#include <vector>

#include "model/decoder.h"

namespace anvil {

extern const ModelFamily kLlamaFamily;    // model_type "llama"
extern const ModelFamily kMistralFamily;  // "mistral": the same layout (a sliding window becomes the context)
extern const ModelFamily kQwen2Family;    // "qwen2": the same layout with biases on q, k and v

// x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)).
using LlamaBlock = PreNormBlock<RotaryAttention, GatedMlp>;

class LlamaModel final : public DecoderModel {
public:
    LlamaModel(Backend& be, const ModelConfig& c, const ModelOptions& o);
    WLayout linear_layout() const override { return WLayout::OutIn; }  // nn.Linear
    bool ignorable_tensor(const std::string& file_name) const override;

private:
    Arena rope_;  // the rotary frequencies, (head_size / 2) f32
};

}  // namespace anvil
