// The decoder-only skeleton every family shares: token embedding, a stack of pre-norm residual blocks, a
// final norm, an output layer and the fused loss; and the backward through them, calling the per-layer hooks.
// A family (gpt2.cpp, llama.cpp) builds the parts: what its blocks are, its norm, whether the head is tied.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"

namespace anvil {

// How a block's forward meets the norms beside it: the residual add that ends a block runs fused with the
// norm that reads its output (Norm::forward_add: the sum normed while it is read once), so that norm, the
// next block's first or the model's final one, has run before the next forward starts. The same bits as the
// add and the norm apart.
struct NormFusion {
    bool in_normed = false;          // in_norm() has already run on this block's input
    const Norm* out_norm = nullptr;  // the norm of this block's output, to run fused with its last add
};

// One transformer block: x -> x + dropout(f(norm(x))) -> ... Its output is its own buffer (Keep::Output); the
// backward takes d(out) in dres and leaves d(in) there (dln is scratch). Its forward depends only on its
// input, its parameters and the pass's seed, so --recompute full can run it again, to the same bits, before
// its backward.
class Block {
public:
    virtual ~Block() = default;
    virtual void plan(ActPlan& plan) const = 0;
    virtual void forward(const Pass& p, Tensor in, NormFusion fuse) const = 0;
    virtual const Norm* in_norm() const = 0;  // the norm that reads the block's input, first thing
    virtual Tensor out(const Pass& p) const = 0;
    virtual void backward(const Pass& p, Tensor dres, Tensor dln, Tensor in) const = 0;
    virtual std::vector<Linear*> linears() = 0;
};

// The pre-norm residual block both families use: x + mixer(norm1(x)), then + ffn(norm2(.)). A family gives
// its parts (GPT-2: LayerNorm, fused-qkv attention, GELU MLP; Llama: RMSNorm, rotary GQA attention, SwiGLU);
// they are built in that order, which is the order their parameters are registered (Hugging Face's order).
// Tensor parallel, the mixer and the ffn each hold a slice of the heads or columns: their outputs and their
// input gradients are partial sums, summed over the ranks here (Megatron's f and g), so norms, residuals and
// everything outside the blocks stay whole and identical on every rank.
template <class Mixer, class Ffn>
class PreNormBlock final : public Block {
public:
    template <class N1, class M, class N2, class F>
    PreNormBlock(ParamRegistry& reg, const std::string& prefix, int layer, int dim, N1 make_norm1,
                 M make_mixer, N2 make_norm2, F make_ffn)
        : norm1(make_norm1()),
          mixer(make_mixer()),
          norm2(make_norm2()),
          ffn(make_ffn()),
          dim_(dim),
          dtype_(reg.dtype),
          site_(1 + 2 * uint64_t(layer)),
          res2_(reg.acts.id(prefix + ".res2")),
          res3_(reg.acts.id(prefix + ".res3")),
          proj_(reg.acts.id("block.proj")),
          what_{"the tensor-parallel all-reduce of " + prefix + "'s attention output",
                "the tensor-parallel all-reduce of " + prefix + "'s MLP output",
                "the tensor-parallel all-reduce of " + prefix + "'s MLP input gradient",
                "the tensor-parallel all-reduce of " + prefix + "'s attention input gradient"} {}

    void plan(ActPlan& plan) const override {
        norm1.plan(plan);
        mixer.plan(plan);
        norm2.plan(plan);
        ffn.plan(plan);
        plan.add(res2_, {dim_}, dtype_, Keep::Saved, "block.res2");
        plan.add(res3_, {dim_}, dtype_, Keep::Output, "block.res3");
        plan.add(proj_, {dim_}, dtype_, Keep::Scratch);
    }
    void forward(const Pass& p, Tensor in, NormFusion fuse) const override {
        const Tensor proj = p.act(proj_), res2 = p.act(res2_);
        if (!fuse.in_normed) norm1.forward(p, in);
        mixer.forward(p, proj, norm1.out(p));
        p.tp_sum(proj, what_[0].c_str());
        p.drop(proj, proj, site_);
        norm2.forward_add(p, res2, in, proj);  // res2 = in + proj, then norm2(res2)
        ffn.forward(p, proj, norm2.out(p));
        p.tp_sum(proj, what_[1].c_str());
        p.drop(proj, proj, site_ + 1);
        if (fuse.out_norm)
            fuse.out_norm->forward_add(p, out(p), res2, proj);  // out = res2 + proj, then the next norm of it
        else
            p.be.residual_fwd(out(p), res2, proj);
    }
    const Norm* in_norm() const override { return &norm1; }
    Tensor out(const Pass& p) const override { return p.act(res3_); }
    void backward(const Pass& p, Tensor dres, Tensor dln, Tensor in) const override {
        const Tensor res2 = p.act(res2_);
        // the branches' output gradients through their dropout (the forward's masks, from the same seeds), in
        // the forward's scratch, which the backward does not otherwise use
        const Tensor dbranch = p.dropout > 0.0f ? p.act(proj_) : dres;
        // the MLP half: dres holds d(out) = d(res2) through the residual
        if (p.acts.recompute()) norm2.forward(p, res2);
        p.drop(dbranch, dres, site_ + 1);
        ffn.backward(p, dln, dbranch, norm2.out(p));
        p.tp_sum(dln, what_[2].c_str());
        norm2.backward(p, dres, dln, res2);
        // the attention half: dres holds d(res2) = d(in) through the residual
        if (p.acts.recompute()) norm1.forward(p, in);
        p.drop(dbranch, dres, site_);
        mixer.backward(p, dln, dbranch, norm1.out(p));
        p.tp_sum(dln, what_[3].c_str());
        norm1.backward(p, dres, dln, in);
    }
    std::vector<Linear*> linears() override {
        std::vector<Linear*> out = mixer.linears();
        for (Linear* l : ffn.linears()) out.push_back(l);
        return out;
    }

    Norm norm1;
    Mixer mixer;
    Norm norm2;
    Ffn ffn;

private:
    int64_t dim_;
    DType dtype_;
    uint64_t site_;             // the attention branch's dropout site; the MLP's is the next
    ActId res2_, res3_, proj_;  // the residual after attention, the block's output, the branches' output
    std::string what_[4];
};

class DecoderModel : public Model {
public:
    using Model::backward;
    using Model::forward;
    const Tape& forward(Activations& acts, const ForwardPass& f) override;
    void backward(Activations& acts, BackwardHooks* hooks) override;
    std::vector<Linear*> linears() override;

protected:
    DecoderModel(Backend& be, const ModelConfig& c, const ModelOptions& o)
        : Model(be, c, o),
          encoded_(reg_.acts.id("encoded")),
          dres_(reg_.acts.id("d.res")),
          dln_(reg_.acts.id("d.ln")) {}
    void plan(ActPlan& plan) const override;
    // The embeddings' output into `encoded`, with NEFTune's noise and dropout where the pass has them.
    void embed(const Pass& p, const ForwardPass& f, Tensor encoded) const;
    // The pass's device work: the embeddings, the blocks, the head and the loss; true when the loss was
    // taken in chunks (Tape::head_done)
    bool run(const Pass& p, const ForwardPass& f);
    Tensor gather_rows(Tensor x, const ForwardPass& f) const;
    // Sequences whose logits a plan keeps at once (ModelOptions::logits_chunk_bytes).
    int logits_chunk(const ActPlan& plan) const;
    // Per chunk of `chunk` sequences of the final norm's output: the logits, the loss and (dloss != 0) the
    // head's backward, which leaves d(final norm's output) in d.ln for backward().
    // returns whether the head's backward ran (dloss != 0)
    bool chunked_loss(const Pass& p, const ForwardPass& f, int chunk) const;

    ActId encoded_;     // the embeddings' output, the first block's input
    ActId dres_, dln_;  // the backward's residual-stream gradient and a sub-block's input gradient
    Embedding emb_;
    std::vector<std::unique_ptr<Block>> blocks_;
    Norm norm_;
    Linear lm_head_;
};

}  // namespace anvil
