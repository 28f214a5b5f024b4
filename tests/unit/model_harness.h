// A tiny GPT-2 for model-level tests: a fixed batch with some ignored targets, its loss and gradients through
// the model seam, and finite-difference checks of every trainable entry.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "harness.h"
#include "model/model.h"
#include "train/trainer.h"

namespace anvil::test {

inline ModelConfig tiny() {
    ModelConfig c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.n_ctx = 8;
    c.vocab_size = 11;
    return c;
}

// A tiny Llama: grouped-query attention (4 heads, 2 key/value heads), SwiGLU, rotary positions.
inline ModelConfig tiny_llama(bool tied = false) {
    ModelConfig c = tiny();
    c.model_type = "llama";
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_dim = 12;
    c.norm_eps = 1e-6;
    c.rope_theta = 100.0;  // short wavelengths, so 8 positions turn the pairs well round
    c.tie_embeddings = tied;
    return c;
}

// A model of config c on a 2-thread CPU backend, its parameters drawn from test_seed().
struct CpuModel {
    std::unique_ptr<Backend> be;
    std::unique_ptr<Model> m;
};
inline CpuModel cpu_model(const ModelConfig& c) {
    CpuModel r{make_backend({Device::CPU, 2, 0}), nullptr};
    r.m = make_model(*r.be, c);
    r.m->params().init(test_seed());
    return r;
}

inline std::vector<std::vector<float>> all_params(const ParamStore& s) {
    std::vector<std::vector<float>> v;
    for (size_t i = 0; i < s.size(); i++) v.push_back(s.read_f32(i));
    return v;
}
inline void set_all_params(ParamStore& s, const std::vector<std::vector<float>>& v) {
    for (size_t i = 0; i < s.size(); i++) s.write_f32(i, v[i].data());
}

// Continuous batching on the model seam: the prompts prefilled into their slots of one cache (B =
// slots.size() slots), each alone or (packed) all in one forward of a row per position with the prompts' last
// rows as logit rows, then `steps` passes of all B rows together, one token each (row_slot/row_pos), row b
// fed feed(b, s) at step s. Every step's logits (B rows of the vocabulary), in step order. paged (with
// packed): the cache a pool of pages, the slots' pages a shuffle of them (some in no slot).
template <typename Feed>
std::vector<std::vector<float>> decode_rows(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int>& slots, int steps, Feed feed,
                                            bool packed = false, bool paged = false) {
    Backend& be = m.backend();
    const int B = int(prompts.size()), PPS = KvCache::pages_for(m.config().n_ctx);
    auto pool = m.make_cache(0, int(slots.size()), paged ? B * PPS + 3 : 0);
    if (paged) {
        std::vector<int32_t> order(static_cast<size_t>(pool->n_pages()));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(7));
        for (int b = 0; b < B; b++)
            pool->set_pages(b, std::span<const int32_t>(order).subspan(size_t(b) * PPS, size_t(PPS)));
        pool->sync();
    }
    auto rows = m.make_activations(B, 1, ActMode::Decode);
    std::vector<int> pos(static_cast<size_t>(B));
    if (packed) {
        std::vector<int> slot, at, ends;
        std::vector<int32_t> tok;
        for (int b = 0; b < B; b++) {
            for (size_t j = 0; j < prompts[size_t(b)].size(); j++)
                slot.push_back(slots[size_t(b)]), at.push_back(int(j)), tok.push_back(prompts[size_t(b)][j]);
            ends.push_back(int(tok.size()) - 1);
            pos[size_t(b)] = int(prompts[size_t(b)].size());
        }
        auto acts = m.make_activations(int(tok.size()), 1, ActMode::Decode);
        const Tensor tokens = acts->get(act::tokens, int(tok.size()), 1);
        be.upload(tokens, tok.data());
        m.forward(*acts, rows_pass(tokens, pool.get(), slot.data(), at.data(), ends.data(), B));
    }
    auto prefill = m.make_activations(1, m.config().n_ctx, ActMode::Decode);
    ANVIL_ASSERT(packed || !paged);  // one sequence's prefill reads its slot's positions in a row
    for (int b = 0; b < B && !packed; b++) {
        const auto& ids = prompts[size_t(b)];
        ForwardPass f{.tokens = prefill->get(act::tokens, 1, int(ids.size()))};
        be.upload(f.tokens, ids.data());
        f.cache = pool.get();
        f.slot = slots[size_t(b)];
        f.last_logits = true;
        m.forward(*prefill, f);
        pos[size_t(b)] = int(ids.size());
    }
    std::vector<std::vector<float>> out;
    for (int s = 0; s < steps; s++) {
        std::vector<int32_t> tok(static_cast<size_t>(B));
        for (int b = 0; b < B; b++) tok[size_t(b)] = feed(b, s);
        const Tensor tokens = rows->get(act::tokens, B, 1);
        be.upload(tokens, tok.data());
        m.forward(*rows, rows_pass(tokens, pool.get(), slots.data(), pos.data()));
        const Tensor l = rows->get(act::logits, B, 1);  // in the model's dtype
        std::vector<uint8_t> raw(l.nbytes());
        be.download(raw.data(), l);
        out.emplace_back(size_t(l.numel()));
        convert_to_f32(out.back().data(), raw.data(), l.dtype, out.back().size());
        for (int& p : pos) p++;
    }
    return out;
}

struct TinyRun {
    std::unique_ptr<Backend> be = make_backend({Device::CPU, 2, 0});
    std::unique_ptr<Model> model;
    int B = 2, T = 6;
    std::vector<int32_t> tok, tgt;
    explicit TinyRun(uint64_t seed, ModelOptions mo = {}, ModelConfig c = tiny()) {
        model = make_model(*be, c, mo);
        model->params().init(seed);
        model->reserve(B, T, true);
        std::mt19937_64 g(seed);
        for (int i = 0; i < B * T; i++) {
            tok.push_back(int32_t(g() % uint64_t(c.vocab_size)));
            tgt.push_back(i % 5 == 3 ? -1 : int32_t(g() % uint64_t(c.vocab_size)));  // some ignored targets
        }
    }
    int valid() const {
        int v = 0;
        for (int32_t t : tgt) v += t >= 0;
        return v;
    }
    // Mean loss over valid targets; with grad=true also leaves gradients in the store. train (default: grad)
    // runs the forward as a training pass, dropout on, with the pass seed `seed`; without grad it takes no
    // backward (the loss a finite difference needs, masks and all).
    double loss(bool grad, BackwardHooks* hooks = nullptr, std::optional<bool> train = {},
                uint64_t seed = 0) {
        ForwardPass f{.tokens = model->tokens(B, T), .targets = model->targets(B, T)};
        be->upload(f.tokens, tok.data());
        be->upload(f.targets, tgt.data());
        if (grad) model->zero_grads();
        f.dloss = train.value_or(grad) ? 1.0f / float(valid()) : 0.0f;
        f.seed = seed;
        model->forward(f);
        if (grad) model->backward(hooks);
        const std::vector<float> l = download(*be, model->losses(B, T));
        double s = 0.0;
        for (float x : l) s += x;
        return s / valid();
    }
    // `steps` AdamW steps (learning rate lr, weight decay wd) on this batch through Trainer::step: the
    // losses.
    std::vector<double> train(int steps, float lr, float wd) {
        AdamW opt(model->params(), wd);
        Trainer trainer(*model, opt);
        AdamWArgs args;
        args.lr = lr;
        std::vector<double> losses;
        for (int s = 0; s < steps; s++) {
            args.step = s + 1;
            losses.push_back(trainer.step({tok.data(), tgt.data(), valid()}, 1, B, T, args).loss);
        }
        return losses;
    }
    // Perturbs every parameter so each path carries signal (GPT-2's init makes some paths tiny).
    void shake(uint64_t seed, float scale) {
        auto p = all_params(model->params());
        std::mt19937_64 g(seed);
        for (auto& t : p)
            for (auto& x : t) x += scale * std::normal_distribution<float>(0.0f, 1.0f)(g);
        set_all_params(model->params(), p);
    }
    // Finite differences of the loss against every trainable entry's analytic gradient (a sample of each).
    // The loss is a training pass's, dropout masks and all (the same pass seed, so the same masks).
    void check_gradients(uint64_t seed) {
        loss(true);
        ParamStore& s = model->params();
        auto params = all_params(s);
        std::vector<std::vector<float>> grads;  // all of them first: a training forward may write some
        for (size_t i : s.trainable()) grads.push_back(download(*be, s.grad(i)));
        std::mt19937_64 g(seed);
        for (size_t n = 0; n < grads.size(); n++) {
            const size_t i = s.trainable()[n];
            const std::vector<float>& grad = grads[n];
            std::vector<size_t> idx;  // a sample of coordinates per tensor keeps the test fast
            for (size_t k = 0; k < 12; k++) idx.push_back(size_t(g() % params[i].size()));
            auto f = [&] {
                set_all_params(s, params);
                return loss(false, nullptr, true);
            };
            EXPECT_TRUE(check_grad(params[i], grad, f, s.spec(i).name, 2e-3, 3e-2, 3e-4, idx));
        }
        set_all_params(s, params);
    }
};

}  // namespace anvil::test
