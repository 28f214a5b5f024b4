// GPT-2: token and learned position embeddings, pre-LayerNorm blocks (attention, then a GELU MLP), a final
// LayerNorm and an output layer tied to the token embedding. Hugging Face's names and layouts (Conv1D
// weights are (in, out)). The first family on the model seam (model.h).
#pragma once

#include <vector>

#include "model/decoder.h"

namespace anvil {

extern const ModelFamily kGpt2Family;

// One transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)) (Hugging Face's ln_1, attn, ln_2, mlp).
using Gpt2Block = PreNormBlock<Attention, Mlp>;

// The head is tied to the token embedding, (V, C) read as (out, in).
class Gpt2Model final : public DecoderModel {
public:
    Gpt2Model(Backend& be, const ModelConfig& c, const ModelOptions& o);
    std::string canonical_name(const std::string& file_name) const override;
    WLayout linear_layout() const override { return WLayout::InOut; }  // Conv1D
    bool ignorable_tensor(const std::string& file_name) const override;
    Gpt2Block& block(int l) { return static_cast<Gpt2Block&>(*blocks_[size_t(l)]); }
};

}  // namespace anvil
