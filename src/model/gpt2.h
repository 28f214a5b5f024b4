// GPT-2: token and learned position embeddings, pre-LayerNorm blocks (attention, then a GELU MLP), a final
// LayerNorm and an output layer tied to the token embedding. Hugging Face's names and layouts (Conv1D
// weights are (in, out)). The first family on the model seam (model.h).
#pragma once

#include <vector>

#include "model/model.h"

namespace anvil {

extern const ModelFamily kGpt2Family;

// One transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)). The one definition the training forward,
// the backward and cached decoding all run.
class Gpt2Block {
public:
    Gpt2Block(ParamRegistry& reg, const ModelConfig& c, int layer);
    void plan(ActPlan& plan) const;
    void forward(const Pass& p, Tensor in) const;
    Tensor out(const Pass& p) const { return p.act(res3_); }
    // dres holds d(out) and becomes d(in); dln is scratch.
    void backward(const Pass& p, Tensor dres, Tensor dln, Tensor in) const;

    // in this order: the parameters are registered as they are built (Hugging Face's order)
    Norm ln_1;
    Attention attn;
    Norm ln_2;
    Mlp mlp;

private:
    int layer_, dim_;
    DType dtype_;
    std::string res2_, res3_;
};

class Gpt2Model final : public Model {
public:
    Gpt2Model(Backend& be, const ModelConfig& c, const ModelOptions& o);
    using Model::backward;
    using Model::forward;
    void forward(Activations& acts, const ForwardPass& f) override;
    void backward(Activations& acts, BackwardHooks* hooks) override;
    std::string canonical_name(const std::string& file_name) const override;
    std::vector<Linear*> linears() override;
    WLayout linear_layout() const override { return WLayout::InOut; }  // Conv1D
    bool ignorable_tensor(const std::string& file_name) const override;
    Gpt2Block& block(int l) { return blocks_[size_t(l)]; }

private:
    void plan(ActPlan& plan) const override;
    void head(const Pass& p, Tensor x, const ForwardPass& f);

    Embedding emb_;
    std::vector<Gpt2Block> blocks_;
    Norm ln_f_;
    Linear lm_head_;  // tied to the token embedding, (V, C) read as (out, in)
};

}  // namespace anvil
