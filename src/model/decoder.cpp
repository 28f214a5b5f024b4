#include "model/decoder.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/op_checks.h"
#include "model/kv_cache.h"

namespace anvil {

namespace {

// Sequences [b0, b0 + n) of a (B, T, ...) tensor.
Tensor seqs(Tensor t, int b0, int n) {
    const size_t per = size_t(t.numel() / t.shape[0]);
    Shape s = t.shape;
    s.dims[0] = n;
    return t.range(size_t(b0) * per, size_t(n) * per).view(s);
}

}  // namespace

int DecoderModel::logits_chunk(const ActPlan& plan) const {
    if (plan.mode() == ActMode::Decode || options_.logits_chunk_bytes == 0) return plan.max_B();
    const size_t per_seq = size_t(plan.max_T()) * size_t(config_.vocab_size) * dtype_size(options_.dtype);
    return int(std::clamp<size_t>(options_.logits_chunk_bytes / per_seq, 1, size_t(plan.max_B())));
}

void DecoderModel::plan(ActPlan& plan) const {
    const int64_t C = config_.n_embd, V = config_.vocab_size;
    const DType a = options_.dtype;
    plan.add(encoded_, {C}, a, Keep::Saved);
    for (const auto& b : blocks_) {
        plan.begin_block();
        b->plan(plan);
        plan.end_block();
    }
    norm_.plan(plan);
    lm_head_.plan(plan);
    if (const int chunk = logits_chunk(plan); chunk < plan.max_B())
        plan.add_chunked(act::logits, chunk, {V}, a, Keep::Saved);
    else
        plan.add(act::logits, {V}, a, Keep::Saved);
    plan.add(dres_, {C}, a, Keep::Backward);
    plan.add(dln_, {C}, a, Keep::Backward);
}

void DecoderModel::embed(const Pass& p, const ForwardPass& f, Tensor encoded) const {
    emb_.forward(p, encoded, f.tokens);
    if (p.neftune > 0.0f) {  // NEFTune: noise on the embeddings, the identity in the backward; lengths (B, T)
        be_.neftune_noise(encoded, f.lengths, p.neftune, dropout_site_seed(f.seed, Pass::kNeftuneSite));
    }
    p.drop(encoded, encoded, 0);  // site 0: the embeddings
}

const Tape& DecoderModel::forward(Activations& acts, const ForwardPass& f) {
    ANVIL_CHECK(f.tokens.dtype == DType::I32 && f.tokens.shape.ndim == 2,
                "forward: the batch's tokens are (B, T) int32, got {} {}", f.tokens.shape.str(),
                dtype_name(f.tokens.dtype));
    const int B = f.B(), T = f.T();
    const bool targets = !f.targets.empty();
    ANVIL_CHECK(!targets || (f.targets.dtype == DType::I32 && f.targets.shape == f.tokens.shape),
                "forward: the targets are {} {}, the tokens {}: give int32 targets of the tokens' shape",
                f.targets.shape.str(), dtype_name(f.targets.dtype), f.tokens.shape.str());
    ANVIL_CHECK(f.pos0 + T <= config_.n_ctx, "sequence length {} is longer than the model's context {}",
                f.pos0 + T, config_.n_ctx);
    ANVIL_CHECK(f.dloss == 0.0f || (acts.training() && targets),
                "forward: gradients need targets and training activations");
    if (f.row_slot) {
        ANVIL_CHECK(f.cache && f.row_pos && T == 1 && !targets && !f.last_logits,
                    "forward: per-row cache slots take one token per row into a cache");
        for (int b = 0; b < B; b++)
            ANVIL_CHECK(f.row_pos[b] >= 0 && f.row_pos[b] < config_.n_ctx && f.row_slot[b] >= 0 &&
                            f.row_slot[b] < f.cache->slots(),
                        "forward: row {} at position {} in slot {} (context {}, {} slots)", b, f.row_pos[b],
                        f.row_slot[b], config_.n_ctx, f.cache->slots());
    }
    const bool train = f.dloss != 0.0f;  // a pass that takes gradients drops (ModelOptions::dropout)
    Pass p{.be = be_,
           .acts = acts,
           .B = B,
           .T = T,
           .pos0 = f.pos0,
           .cache = f.cache,
           .slot = f.slot,
           .row_slot = f.row_slot,
           .row_pos = f.row_pos,
           .own_slots = f.row_slot && !repeated(f.row_slot, B),  // a decode step (a prefill's rows share one)
           .seed = f.seed,
           .train = train,
           .dropout = train ? options_.dropout : 0.0f,
           .attn_dropout = train ? options_.attn_dropout : 0.0f,
           .neftune = train ? options_.neftune_alpha : 0.0f,
           .tp = options_.tp.reducer.get()};
    Tape& tape = acts.tape();
    tape = Tape{.tokens = f.tokens, .pos0 = f.pos0, .seed = f.seed, .grad_logits = f.dloss != 0.0f};
    if (!f.row_slot) {
        tape.head_done = run(p, f);
        return tape;
    }
    // one-token rows: their slots and positions to the backend (act::rows), where the ops read them, so that
    // the step's device work is the same for every step of this shape and replays as one recording
    ANVIL_CHECK(acts.has(act::rows),
                "forward: per-row cache slots need decoding activations (ActMode::Decode)");
    const Tensor rows = acts.get(act::rows, B, 1);  // (B, 1, 2): the slots, then the positions
    std::vector<int32_t> host(size_t(2 * B));
    std::copy(f.row_slot, f.row_slot + B, host.begin());
    std::copy(f.row_pos, f.row_pos + B, host.begin() + B);
    be_.upload(rows, host.data());
    p.row_slots = rows.range(0, size_t(B)).view(Shape{B});
    p.row_positions = rows.range(size_t(B), size_t(B)).view(Shape{B});
    // recorded where nothing else varies: every logit row in place (gather_rows moves none), no collectives
    bool in_place = f.n_logit_rows < 0;
    if (f.n_logit_rows >= 0) {
        in_place = true;
        for (int i = 0; i < f.n_logit_rows && f.logit_rows; i++) in_place = in_place && f.logit_rows[i] == i;
    }
    if (!in_place || p.tp) {
        tape.head_done = run(p, f);
        return tape;
    }
    const KvCache& c = *f.cache;
    const std::vector<int64_t> key{B,
                                   p.own_slots,
                                   f.n_logit_rows,
                                   int64_t(reinterpret_cast<uintptr_t>(c.k(0).data)),
                                   int64_t(reinterpret_cast<uintptr_t>(c.pages().data)),
                                   c.k(0).dim(0),
                                   c.k(0).dim(1),
                                   c.pages().dim(0),
                                   c.pages().dim(1),
                                   int64_t(reinterpret_cast<uintptr_t>(f.tokens.data))};
    acts.run_recorded(be_, key, [&] { tape.head_done = run(p, f); });
    return tape;
}

bool DecoderModel::run(const Pass& p, const ForwardPass& f) {
    const bool targets = !f.targets.empty();
    const int B = p.B, T = p.T;
    const Tensor encoded = p.act(encoded_);
    embed(p, f, encoded);
    // every block ends in the norm after it (NormFusion): the next block's first, and the last block the
    // final norm where that norms every row (not the last position alone, nor the logit rows)
    const bool every_row = !f.last_logits && f.n_logit_rows < 0;
    const bool final_fused = every_row && !blocks_.empty();
    Tensor x = encoded;
    bool normed = false;
    for (size_t i = 0; i < blocks_.size(); i++) {
        const Norm* next = i + 1 < blocks_.size() ? blocks_[i + 1]->in_norm()
                           : final_fused          ? &norm_
                                                  : nullptr;
        blocks_[i]->forward(p, x, {.in_normed = normed, .out_norm = next});
        x = blocks_[i]->out(p);
        normed = next != nullptr;
    }
    if (const int chunk = p.acts.capacity(act::logits); B > chunk && every_row) {
        ANVIL_CHECK(
            targets,
            "forward: the logits of {} sequences are made {} at a time (--logits-chunk); give targets "
            "for the loss, or a batch of {} or fewer",
            B, chunk, chunk);
        if (!final_fused) norm_.forward(p, x);
        return chunked_loss(p, f, chunk);
    }
    // the final norm, the logits and the loss: over every position, or (last_logits) over the last one, or
    // over the logit rows
    Pass q = p;
    if (f.last_logits) {
        ANVIL_CHECK(B == 1 && !targets, "last_logits: one sequence, no targets");
        x = x.slice0(0).slice0(T - 1).view(Shape{1, 1, config_.n_embd});
        q.T = 1;
    } else if (f.n_logit_rows >= 0) {
        x = gather_rows(x, f);
        q.B = f.n_logit_rows;
    }
    if (q.B > 0) {  // (no logit rows: no row wants logits)
        if (!final_fused) norm_.forward(q, x);
        lm_head_.forward(q, q.act(act::logits), norm_.out(q));
    }
    if (targets)
        be_.classifier(q.act(act::losses), q.act(act::logits), f.targets, f.dloss, config_.vocab_size);
    return false;
}

bool DecoderModel::chunked_loss(const Pass& p, const ForwardPass& f, int chunk) const {
    const Tensor xn = norm_.out(p), losses = p.act(act::losses), targets = f.targets;
    const Tensor dln = f.dloss != 0.0f ? p.act(dln_) : Tensor{};
    for (int b0 = 0; b0 < p.B; b0 += chunk) {
        Pass q = p;
        q.B = std::min(chunk, p.B - b0);
        const Tensor logits = q.act(act::logits), in = seqs(xn, b0, q.B);
        lm_head_.forward(q, logits, in);
        be_.classifier(seqs(losses, b0, q.B), logits, seqs(targets, b0, q.B), f.dloss, config_.vocab_size);
        if (!dln.empty()) lm_head_.backward(q, seqs(dln, b0, q.B), logits, in);  // logits: d(loss)/d(logits)
    }
    return !dln.empty();
}

// The logit rows of x (B, 1, C) moved, in order, to its first rows (in place: the rows ascend, so a row is
// read before it is overwritten), as (n, 1, C).
Tensor DecoderModel::gather_rows(Tensor x, const ForwardPass& f) const {
    const int n = f.n_logit_rows, B = f.B();
    const size_t C = size_t(config_.n_embd);
    ANVIL_CHECK(f.row_slot && n <= B && (n == 0 || f.logit_rows),
                "forward: {} logit rows of {} need per-row slots", n, B);
    for (int i = 0; i < n; i++) {
        const int r = f.logit_rows[i];
        ANVIL_CHECK(r >= i && r < B && (i == 0 || r > f.logit_rows[i - 1]),
                    "forward: logit rows must ascend within the {} rows, got {} at {}", B, r, i);
        if (r != i) be_.convert(x.range(size_t(i) * C, C), x.range(size_t(r) * C, C));
    }
    return x.range(0, size_t(n) * C).view(Shape{n, 1, int64_t(C)});
}

void DecoderModel::backward(Activations& acts, BackwardHooks* hooks) {
    Tape& tape = acts.tape();
    ANVIL_CHECK(tape.grad_logits, "backward: call forward with a nonzero dloss first");
    const Pass p{.be = be_,
                 .acts = acts,
                 .B = int(tape.tokens.shape[0]),
                 .T = int(tape.tokens.shape[1]),
                 .pos0 = tape.pos0,
                 .seed = tape.seed,
                 .train = true,
                 .dropout = options_.dropout,
                 .attn_dropout = options_.attn_dropout,
                 .tp = options_.tp.reducer.get()};
    const Tensor dres = p.act(dres_), dln = p.act(dln_);
    // the logits hold d(loss)/d(logits); a chunked loss did this in the forward
    if (!tape.head_done) lm_head_.backward(p, dln, p.act(act::logits), norm_.out(p));
    be_.zero(dres);
    norm_.backward(p, dres, dln, blocks_.back()->out(p));
    for (int l = config_.n_layer - 1; l >= 0; l--) {
        const Tensor in = l == 0 ? p.act(encoded_) : blocks_[size_t(l - 1)]->out(p);
        // --recompute full: the blocks share one set of buffers, which the forward left holding the last
        // block's; every other block runs its forward again (the same bits) to fill them
        if (acts.recompute_blocks() && l != config_.n_layer - 1) {
            Pass again = p;
            again.again = true;
            blocks_[size_t(l)]->forward(again, in, {});  // its own first norm; its output's norm has run
        }
        blocks_[size_t(l)]->backward(p, dres, dln, in);
        if (hooks) hooks->on_layer_grads_ready(l);
    }
    p.drop(dres, dres, 0);
    emb_.backward(p, dres, tape.tokens);
    if (hooks) hooks->on_layer_grads_ready(kOutsideLayers);
    tape.grad_logits = false;
}

std::vector<Linear*> DecoderModel::linears() {
    std::vector<Linear*> out;
    for (auto& b : blocks_)
        for (Linear* l : b->linears()) out.push_back(l);
    return out;
}

}  // namespace anvil
