#include "model/decoder.h"

namespace anvil {

void DecoderModel::plan(ActPlan& plan) const {
    const int64_t C = config_.n_embd, V = config_.vocab_size;
    const DType a = options_.dtype;
    plan.add("encoded", {C}, a, Keep::Saved);
    for (const auto& b : blocks_) b->plan(plan);
    norm_.plan(plan);
    lm_head_.plan(plan);
    plan.add("logits", {V}, a, Keep::Saved);
    plan.add("d.res", {C}, a, Keep::Backward);
    plan.add("d.ln", {C}, a, Keep::Backward);
}

void DecoderModel::forward(Activations& acts, const ForwardPass& f) {
    ANVIL_CHECK(f.pos0 + f.T <= config_.n_ctx, "sequence length {} is longer than the model's context {}",
                f.pos0 + f.T, config_.n_ctx);
    ANVIL_CHECK(f.dloss == 0.0f || (acts.training() && f.targets),
                "forward: gradients need targets and training activations");
    if (f.row_slot) {
        ANVIL_CHECK(f.cache && f.row_pos && f.T == 1 && !f.targets && !f.last_logits,
                    "forward: per-row cache slots decode one token per row into a cache");
        for (int b = 0; b < f.B; b++)
            ANVIL_CHECK(f.row_pos[b] >= 0 && f.row_pos[b] < config_.n_ctx && f.row_slot[b] >= 0 &&
                            f.row_slot[b] < f.cache->slots(),
                        "forward: row {} at position {} in slot {} (context {}, {} slots)", b, f.row_pos[b],
                        f.row_slot[b], config_.n_ctx, f.cache->slots());
    }
    const Pass p{.be = be_,
                 .acts = acts,
                 .B = f.B,
                 .T = f.T,
                 .pos0 = f.pos0,
                 .cache = f.cache,
                 .slot = f.slot,
                 .row_slot = f.row_slot,
                 .row_pos = f.row_pos,
                 .seed = f.seed,
                 .tp = options_.tp.reducer.get()};
    const Tensor encoded = p.act("encoded");
    emb_.forward(p, encoded, p.act("tokens"));
    Tensor x = encoded;
    for (const auto& b : blocks_) {
        b->forward(p, x);
        x = b->out(p);
    }
    // the final norm, the logits and the loss: over every position, or (last_logits) over the last one
    Pass q = p;
    if (f.last_logits) {
        ANVIL_CHECK(f.B == 1 && !f.targets, "last_logits: one sequence, no targets");
        x = x.slice0(0).slice0(f.T - 1).view(Shape{1, 1, config_.n_embd});
        q.T = 1;
    }
    norm_.forward(q, x);
    const Tensor logits = q.act("logits");
    lm_head_.forward(q, logits, norm_.out(q));
    if (f.targets) be_.classifier(q.act("losses"), logits, q.act("targets"), f.dloss, config_.vocab_size);
    last_B_ = f.B;
    last_T_ = f.T;
    last_seed_ = f.seed;
    have_grad_logits_ = f.dloss != 0.0f;
}

void DecoderModel::backward(Activations& acts, BackwardHooks* hooks) {
    ANVIL_CHECK(have_grad_logits_, "backward: call forward with a nonzero dloss first");
    const Pass p{.be = be_,
                 .acts = acts,
                 .B = last_B_,
                 .T = last_T_,
                 .seed = last_seed_,
                 .tp = options_.tp.reducer.get()};
    const Tensor dres = p.act("d.res"), dln = p.act("d.ln");
    lm_head_.backward(p, dln, p.act("logits"), norm_.out(p));  // the logits hold d(loss)/d(logits)
    be_.zero(dres);
    norm_.backward(p, dres, dln, blocks_.back()->out(p));
    for (int l = config_.n_layer - 1; l >= 0; l--) {
        const Tensor in = l == 0 ? p.act("encoded") : blocks_[size_t(l - 1)]->out(p);
        blocks_[size_t(l)]->backward(p, dres, dln, in);
        if (hooks) hooks->on_layer_grads_ready(l);
    }
    emb_.backward(p, dres, p.act("tokens"));
    if (hooks) hooks->on_layer_grads_ready(kOutsideLayers);
    have_grad_logits_ = false;
}

std::vector<Linear*> DecoderModel::linears() {
    std::vector<Linear*> out;
    for (auto& b : blocks_)
        for (Linear* l : b->linears()) out.push_back(l);
    return out;
}

}  // namespace anvil
