// Model-level checks on a tiny GPT-2 (and a tiny Llama) through the model seam (model.h): the whole backward
// against finite differences, the parameter store (order, shapes, init, frozen entries), the per-layer
// backward hooks, a linear adapter joining forward and backward, determinism, recomputation, and KV-cached
// generation against uncached forward passes (through the cache rebuild).
#include <cmath>

#include "backend/dropout_mask.h"
#include "core/rng.h"
#include "harness.h"
#include "model/generate.h"
#include "model/gpt2.h"
#include "model_harness.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace anvil::test {
namespace {

TEST(Model, GradientMatchesFiniteDifferences) {
    TinyRun run(test_seed());
    run.shake(test_seed() + 1, 0.3f);
    run.check_gradients(test_seed() + 2);
}

TEST(Model, ParamStoreMatchesConfig) {
    const ModelConfig c = tiny();
    auto be = make_backend({Device::CPU, 1, 0});
    auto m = make_model(*be, c);
    const ParamStore& s = m->params();
    EXPECT_EQ(s.numel(), c.num_params());
    EXPECT_EQ(s.size(), size_t(2 + 12 * c.n_layer + 2));
    EXPECT_EQ(s.spec(2 + 2).name, "transformer.h.0.attn.c_attn.weight");  // Hugging Face's order
    EXPECT_EQ(s.spec(2 + 2).shape, (Shape{8, 24}));                       // Conv1D (in, out)
    EXPECT_EQ(s.spec(2 + 2).layer, 0);
    EXPECT_EQ(s.spec(0).layer, kOutsideLayers);
    EXPECT_EQ(s.spec(s.size() - 1).name, "transformer.ln_f.bias");
    for (size_t i = 0; i < s.size(); i++)
        EXPECT_EQ(s.spec(i).decay, s.spec(i).shape.ndim >= 2) << s.spec(i).name;  // nanoGPT's grouping
}

TEST(Model, InitFollowsGpt2) {
    ModelConfig c;
    c.n_layer = 4;
    c.n_embd = 64;
    c.n_head = 4;
    c.n_ctx = 32;
    c.vocab_size = 300;
    auto be = make_backend({Device::CPU, 1, 0});
    auto m = make_model(*be, c);
    m->params().init(7);
    const auto host = all_params(m->params());
    auto stdev = [](const std::vector<float>& v) {
        double s = 0, s2 = 0;
        for (float x : v) s += x, s2 += double(x) * x;
        const double mean = s / v.size();
        return std::sqrt(s2 / v.size() - mean * mean);
    };
    const ParamStore& s = m->params();
    auto at = [&](const std::string& n) { return host[s.find(n)]; };
    EXPECT_NEAR(stdev(at("transformer.wte.weight")), 0.02, 0.002);
    EXPECT_NEAR(stdev(at("transformer.h.0.attn.c_attn.weight")), 0.02, 0.002);
    EXPECT_NEAR(stdev(at("transformer.h.0.mlp.c_proj.weight")), 0.02 / std::sqrt(8.0), 0.001);  // residual
    EXPECT_NEAR(stdev(at("transformer.h.0.attn.c_proj.weight")), 0.02 / std::sqrt(8.0), 0.001);
    for (float x : at("transformer.h.0.ln_1.weight")) EXPECT_EQ(x, 1.0f);
    for (float x : at("transformer.h.0.attn.c_attn.bias")) EXPECT_EQ(x, 0.0f);
    auto m2 = make_model(*be, c);
    m2->params().init(7);
    EXPECT_EQ(all_params(m2->params()), host) << "same seed, same weights";
}

TEST(Model, ForwardIsDeterministic) {
    TinyRun a(5), b(5);
    EXPECT_EQ(a.loss(true), b.loss(true));
    for (size_t i = 0; i < a.model->params().size(); i++)
        EXPECT_EQ(download(*a.be, a.model->params().grad(i)), download(*b.be, b.model->params().grad(i)));
}

// Frozen entries have no gradient, no optimizer state and no memory for either; the trainable ones get
// exactly the gradients of the unfrozen model, and a step leaves the frozen weights untouched.
TEST(Model, FrozenEntriesHaveNoGradientOrOptimizerState) {
    ModelOptions mo;
    mo.frozen = {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.ln_1.bias",
                 "transformer.h.1.mlp.c_fc.weight"};
    TinyRun frozen(9, mo), full(9);
    ParamStore& fs = frozen.model->params();
    size_t trainable_bytes = 0;
    for (size_t i = 0; i < fs.size(); i++) {
        const bool is_frozen =
            std::find(mo.frozen.begin(), mo.frozen.end(), fs.spec(i).name) != mo.frozen.end();
        EXPECT_EQ(fs.grad(i).empty(), is_frozen) << fs.spec(i).name;
        if (!is_frozen) trainable_bytes += (fs.param(i).nbytes() + kAlign - 1) / kAlign * kAlign;
    }
    EXPECT_EQ(fs.trainable().size(), fs.size() - mo.frozen.size());
    EXPECT_LE(fs.grad_bytes(), trainable_bytes + kAlign);
    EXPECT_LT(fs.grad_bytes(), full.model->params().grad_bytes());
    const size_t before = frozen.be->memory_in_use();
    AdamW opt(fs, 0.1f);
    EXPECT_LE(frozen.be->memory_in_use() - before, 2 * (trainable_bytes + kAlign))
        << "m and v: trainable only";
    EXPECT_THROW(opt.offset(fs.find("transformer.wte.weight")), Error) << "no moments for a frozen entry";

    frozen.loss(true);
    full.loss(true);
    for (size_t i : fs.trainable())
        EXPECT_EQ(download(*frozen.be, fs.grad(i)), download(*full.be, full.model->params().grad(i)))
            << fs.spec(i).name;
    const auto w0 = all_params(fs);
    Trainer trainer(*frozen.model, opt);
    StepBatch batch{frozen.tok.data(), frozen.tgt.data(), frozen.valid()};
    AdamWArgs args;
    args.lr = 1e-2f;
    trainer.step(batch, 1, frozen.B, frozen.T, args);
    const auto w1 = all_params(fs);
    for (size_t i = 0; i < fs.size(); i++)
        EXPECT_EQ(w0[i] == w1[i], fs.grad(i).empty()) << fs.spec(i).name << ": frozen iff unchanged";
}

// ZeRO-1's optimizer: two ranks' shards, each updating its range of the layout, together update every weight
// exactly as the whole optimizer does, with half the moment memory each.
TEST(Model, ShardedAdamWUpdatesTheWholeInPieces) {
    TinyRun whole(12), r0(12), r1(12);
    const auto before = all_params(whole.model->params());
    AdamWArgs args;
    args.lr = 1e-2f;
    args.max_grad_norm = 0.5f;
    std::vector<std::vector<std::vector<float>>> after;
    std::vector<std::unique_ptr<AdamW>> opts;
    int part = 0;
    for (TinyRun* run : {&whole, &r0, &r1}) {
        const OptShard shard = run == &whole ? OptShard{} : OptShard{part++, 2};
        opts.push_back(std::make_unique<AdamW>(run->model->params(), 0.1f, shard));
        run->loss(true);
        DevTensor nsq(*run->be, {1});
        run->be->global_norm_sq(nsq, run->model->params().grad_tensors());
        for (int step = 1; step <= 2; step++) {
            args.step = step;
            opts.back()->step(args, nsq);
        }
        after.push_back(all_params(run->model->params()));
    }
    const AdamW &w = *opts[0], &s0 = *opts[1], &s1 = *opts[2];
    EXPECT_EQ(s0.begin(0), 0u);
    EXPECT_EQ(s0.begin(1) % (kAlign / sizeof(float)), 0u) << "a range starts where an arena entry could";
    EXPECT_EQ(s0.begin(2), w.layout_floats());
    EXPECT_LE(size_t(s0.m_range().numel()), w.layout_floats() / 2 + kAlign);
    EXPECT_EQ(size_t(s0.m_range().numel() + s1.m_range().numel()), w.layout_floats());
    const ParamStore& store = whole.model->params();
    for (size_t i : store.trainable()) {
        const size_t o = w.offset(i);
        for (size_t k = 0; k < after[0][i].size(); k++) {
            const size_t owner = o + k < s0.begin(1) ? 1 : 2;
            ASSERT_EQ(after[owner][i][k], after[0][i][k]) << store.spec(i).name << "[" << k << "]";
            ASSERT_EQ(after[3 - owner][i][k], before[i][k]) << store.spec(i).name << ": not the other rank's";
        }
    }
}

// ZeRO-1 on a GPU reduces bf16/f16 gradients in place, so each rank's range of the f32 layout must map onto
// one run of the gradient arena: the runs tile the arena, every rank's AdamW pieces lie in its own, and each
// trainable element is owned once. Odd sizes, a frozen entry between trainable ones, three ranks.
TEST(Model, ZeroBoundsTileTheGradientArenaInAnyDtype) {
    auto be = make_backend({Device::CPU, 1, 0});
    for (DType dt : {DType::F32, DType::BF16}) {
        std::vector<ParamSpec> specs;
        for (int k = 0; k < 9; k++) {
            ParamSpec s;
            s.name = "p" + std::to_string(k);
            s.shape = k % 3 == 0 ? Shape{37 * (k + 1), 5} : Shape{int64_t(129 + 61 * k)};
            s.dtype = dt;
            s.trainable = k != 4;
            specs.push_back(s);
        }
        ParamStore store(*be, specs);
        const Tensor arena = store.grad_tensors()[0];
        const size_t es = dtype_size(dt);
        const auto element = [&](Tensor t) {
            return size_t(static_cast<const char*>(t.data) - static_cast<const char*>(arena.data)) / es;
        };
        const int W = 3;
        std::vector<int> owners(size_t(arena.numel()), 0);
        std::vector<size_t> first;
        for (int r = 0; r < W; r++) {
            const AdamW opt(store, 0.1f, OptShard{r, W});
            const std::vector<size_t> b = zero_bounds(store, opt);
            ASSERT_EQ(b.size(), size_t(W + 1));
            if (r == 0) first = b;
            EXPECT_EQ(b, first) << "every rank computes the same runs";
            EXPECT_EQ(b.front(), 0u);
            EXPECT_EQ(b.back(), size_t(arena.numel()));
            for (int k = 0; k < W; k++) {
                EXPECT_LE(b[size_t(k)], b[size_t(k) + 1]);
                if (dt == DType::F32) {
                    EXPECT_EQ(b[size_t(k)], opt.begin(k)) << "f32: the layout is the arena";
                }
            }
            for (const AdamW::Piece& p : opt.pieces()) {
                const size_t a = element(p.grad), z = a + size_t(p.grad.numel());
                EXPECT_GE(a, b[size_t(r)]) << store.spec(p.entry).name;
                EXPECT_LE(z, b[size_t(r) + 1]) << store.spec(p.entry).name;
                for (size_t e = a; e < z; e++) owners[e]++;
            }
        }
        for (size_t i : store.trainable()) {
            const size_t a = element(store.grad(i)), n = size_t(store.spec(i).shape.numel());
            for (size_t e = a; e < a + n; e++)
                ASSERT_EQ(owners[e], 1) << store.spec(i).name << "[" << e - a << "]";
        }
    }
}

struct Recorder : BackwardHooks {
    Model* model = nullptr;
    std::vector<int> order;
    std::vector<std::vector<std::vector<float>>> at_hook;  // each layer's gradients when its hook fired
    void on_layer_grads_ready(int layer) override {
        order.push_back(layer);
        std::vector<std::vector<float>> g;
        const ParamStore& s = model->params();
        for (size_t i = 0; i < s.size(); i++)
            if (s.spec(i).layer == layer) g.push_back(download(model->backend(), s.grad(i)));
        at_hook.push_back(g);
    }
};

// The hook fires once per layer in backward order, then once for everything outside the blocks, and each
// time the layer's gradients are already final.
TEST(Model, LayerHooksFireOncePerLayerInBackwardOrder) {
    ModelConfig c = tiny();
    c.n_layer = 4;
    TinyRun run(3, {}, c);
    Recorder rec;
    rec.model = run.model.get();
    run.loss(true, &rec);
    EXPECT_EQ(rec.order, (std::vector<int>{3, 2, 1, 0, kOutsideLayers}));
    const ParamStore& s = run.model->params();
    for (size_t k = 0; k < rec.order.size(); k++) {
        size_t j = 0;
        for (size_t i = 0; i < s.size(); i++) {
            if (s.spec(i).layer != rec.order[k]) continue;
            EXPECT_EQ(rec.at_hook[k][j++], download(*run.be, s.grad(i)))
                << s.spec(i).name << " changed later";
        }
        EXPECT_GT(j, 0u);
    }
}

// A low-rank adapter on a linear layer, as LoRA will be: out += (in A^T) B^T with fixed A (r, in), B (out,
// r); the backward adds its share to the input gradient. The model's gradients stay exact.
class LowRankAdapter final : public LinearAdapter {
public:
    // on the linear layer `layer` of a model whose buffer names are `names`
    LowRankAdapter(Backend& be, ActNames& names, const Linear& layer, int r, uint64_t seed)
        : a_(upload(be, randn_seeded(seed, size_t(r) * layer.in_features()), {r, layer.in_features()})),
          b_(upload(be, randn_seeded(seed + 1, size_t(layer.out_features()) * r), {layer.out_features(), r})),
          in_(layer.in_features()),
          out_(layer.out_features()),
          r_(r),
          h_(names.id(layer.name() + ".lora_h")),
          tmp_(names.id(layer.name() + ".lora_tmp")),
          dh_(names.id(layer.name() + ".lora_dh")) {}
    void plan(ActPlan& plan) const override {
        plan.add(h_, {r_}, DType::F32, Keep::Saved);
        plan.add(tmp_, {std::max(in_, out_)}, DType::F32, Keep::Scratch);
        plan.add(dh_, {r_}, DType::F32, Keep::Backward);
    }
    void forward(const Pass& p, Tensor out, Tensor in) const override {
        const Tensor h = p.act(h_), tmp = first(p.act(tmp_), out.shape);
        p.be.matmul_fwd(h, in, a_, WLayout::OutIn, {}, {});
        p.be.matmul_fwd(tmp, h, b_, WLayout::OutIn, {}, {});
        p.be.residual_fwd(out, out, tmp);
    }
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const override {
        const Tensor h = p.act(h_), dh = p.act(dh_);
        const Tensor tmp = first(p.act(tmp_), din.shape);
        p.be.matmul_bwd(dh, {}, {}, dout, h, b_, WLayout::OutIn, {});  // dh (N, r) = dout B
        p.be.matmul_bwd(tmp, {}, {}, dh, in, a_, WLayout::OutIn, {});  // (N, in) = dh A
        p.be.residual_fwd(din, din, tmp);
    }

private:
    static std::vector<float> randn_seeded(uint64_t seed, size_t n) {
        std::mt19937_64 g(seed);
        return randn(g, n, 0.5f);
    }
    // The first elements of a buffer seen with a smaller shape.
    static Tensor first(Tensor buf, Shape s) {
        EXPECT_LE(s.numel(), buf.numel());
        buf.shape = s;
        return buf;
    }
    DevTensor a_, b_;
    int in_, out_, r_;
    ActId h_, tmp_, dh_;
};

TEST(Model, LinearAdapterJoinsForwardAndBackward) {
    TinyRun run(test_seed());
    auto* gpt2 = dynamic_cast<Gpt2Model*>(run.model.get());
    ASSERT_TRUE(gpt2);
    const double before = run.loss(false);
    // on the MLP's down projection (in 32, out 8): its input gradient is taken through the GELU too
    Linear& down = gpt2->block(1).ffn.down();
    ASSERT_EQ(down.in_features(), 32);
    ASSERT_EQ(down.out_features(), 8);
    down.set_adapter(std::make_shared<LowRankAdapter>(*run.be, run.model->act_names(), down, 3, test_seed()));
    Linear& qkv = gpt2->block(0).mixer.qkv();
    qkv.set_adapter(
        std::make_shared<LowRankAdapter>(*run.be, run.model->act_names(), qkv, 2, test_seed() + 5));
    run.model->release();
    run.model->reserve(run.B, run.T, true);  // plan again: the adapters add buffers
    EXPECT_NE(run.loss(false), before) << "the adapters change the output";
    run.shake(test_seed() + 1, 0.3f);
    run.check_gradients(test_seed() + 2);
}

// Greedy generation with the KV cache equals argmax over full forward passes of the window the generator
// conditions on, including after the context fills and the cache is rebuilt from its last half.
void cached_generation_matches_full_forward(ModelConfig c) {
    c.n_ctx = 16;
    auto [be, m] = cpu_model(c);
    auto params = all_params(m->params());
    std::mt19937_64 g(test_seed());
    for (auto& p : params)
        for (auto& x : p) x += 0.5f * std::normal_distribution<float>(0.0f, 1.0f)(g);
    set_all_params(m->params(), params);
    m->reserve(1, c.n_ctx, false);
    const std::vector<int32_t> prompt = {3, 1, 4};
    SampleOptions opt;
    opt.temperature = 0.0f;
    opt.max_new_tokens = 30;  // 13 tokens fill the context; the cache is rebuilt, then 17 more
    Generator gen(*m);
    const std::vector<int32_t> out = gen.generate(prompt, opt);
    ASSERT_EQ(out.size(), 30u);
    std::vector<int32_t> history = prompt, window = prompt;
    int rebuilt = 0;
    for (int32_t next : out) {
        const int T = int(window.size());
        const ForwardPass f{.tokens = m->tokens(1, T)};
        be->upload(f.tokens, window.data());
        m->forward(f);
        const std::vector<float> logits = download(*be, m->logits(1, T));
        const float* last = logits.data() + size_t(T - 1) * c.vocab_size;
        EXPECT_EQ(next, int32_t(std::max_element(last, last + c.vocab_size) - last))
            << "after " << history.size() << " tokens (" << rebuilt << " rebuilds)";
        history.push_back(next);
        if (T == c.n_ctx) {  // the generator keeps the most recent half
            window.assign(history.end() - c.n_ctx / 2, history.end());
            rebuilt++;
        } else {
            window.push_back(next);
        }
    }
    EXPECT_GE(rebuilt, 1) << "the test must reach the cache rebuild";
}

// Greedy decode steps pick their token on the device (token_logprobs' top 1, Generator::greedy_step) unless
// log-probabilities are asked for; both choose the first largest logit among the tokenizer's ids.
TEST(Model, GreedyOnTheDeviceChoosesAsTheHost) {
    ModelConfig c = tiny();
    auto [be, m] = cpu_model(c);
    SampleOptions opt;
    opt.temperature = 0.0f;
    opt.max_new_tokens = 20;
    opt.vocab_real = c.vocab_size - 9;
    Generator gen(*m);
    std::vector<float> lps;
    const std::vector<int32_t> device = gen.generate({3, 1, 4}, opt),
                               host = gen.generate({3, 1, 4}, opt, {}, &lps);
    EXPECT_EQ(device, host);
    for (int32_t t : device) EXPECT_LT(t, opt.vocab_real);
}

TEST(Model, CachedGenerationMatchesFullForward) {
    cached_generation_matches_full_forward(tiny());
}

// Llama: rotary positions continue from the cache's position; the cache holds the 2 key/value heads.
TEST(Llama, CachedGenerationMatchesFullForward) {
    cached_generation_matches_full_forward(tiny_llama(false));
}

// Shaken less than GPT-2: SwiGLU and RMSNorm over large weights curve the loss enough that finite differences
// at some seeds (about 1 in 130 at 0.3, before Richardson extrapolation) read the curvature as an error.
TEST(Llama, GradientMatchesFiniteDifferences) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied head" : "untied head");
        TinyRun run(test_seed(), {}, tiny_llama(tied));
        run.shake(test_seed() + 1, 0.2f);
        run.check_gradients(test_seed() + 2);
    }
    // with biases on every projection (Llama's attention_bias and mlp_bias; Qwen2 has those of q, k and v)
    ModelConfig biased = tiny_llama(false);
    biased.qkv_bias = biased.o_bias = biased.mlp_bias = true;
    TinyRun run(test_seed(), {}, biased);
    run.shake(test_seed() + 1, 0.2f);
    run.check_gradients(test_seed() + 2);
}

// The families in Llama's layout: Qwen2 (q, k, v biases) and Mistral (a sliding window shorter than the
// positions becomes the context) read and write their config.json, and their parameters follow transformers.
TEST(Llama, RelativesFollowTransformers) {
    auto be = make_backend({Device::CPU, 1, 0});
    ModelConfig qwen = tiny_llama(true);
    qwen.model_type = "qwen2";
    qwen.qkv_bias = true;
    nlohmann::json j = config_to_hf_json(qwen, {});
    EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
    EXPECT_EQ(j["use_sliding_window"], false);
    j.erase("attention_bias");  // Qwen2's biases come with the model type, not a key
    const ModelConfig qback = config_from_hf_json(j, "config.json");
    EXPECT_TRUE(qback.same_shape(qwen)) << qback.str();
    auto qm = make_model(*be, qback);
    const ParamStore& qs = qm->params();
    EXPECT_EQ(qs.numel(), qback.num_params());
    EXPECT_NE(qs.find("model.layers.1.self_attn.v_proj.bias"), ParamStore::npos);
    EXPECT_EQ(qs.spec(qs.find("model.layers.1.self_attn.v_proj.bias")).shape, (Shape{4}));
    EXPECT_EQ(qs.find("model.layers.1.self_attn.o_proj.bias"), ParamStore::npos);
    EXPECT_FALSE(qs.spec(qs.find("model.layers.0.self_attn.q_proj.bias")).decay)
        << "biases take no weight decay";
    j["use_sliding_window"] = true;
    expect_error([&] { config_from_hf_json(j, "config.json"); }, "use_sliding_window");

    ModelConfig llama = tiny_llama(false);
    nlohmann::json lj = config_to_hf_json(llama, {});
    lj["attention_bias"] = lj["mlp_bias"] = true;
    const ModelConfig biased = config_from_hf_json(lj, "config.json");
    EXPECT_TRUE(biased.qkv_bias && biased.o_bias && biased.mlp_bias);
    auto bm = make_model(*be, biased);
    EXPECT_EQ(bm->params().numel(), biased.num_params());
    EXPECT_NE(bm->params().find("model.layers.0.mlp.down_proj.bias"), ParamStore::npos);
    EXPECT_TRUE(config_from_hf_json(config_to_hf_json(biased, {}), "config.json").same_shape(biased));

    ModelConfig mistral = tiny_llama(false);
    mistral.model_type = "mistral";
    nlohmann::json mj = config_to_hf_json(mistral, {});
    EXPECT_EQ(mj["architectures"][0], "MistralForCausalLM");
    EXPECT_TRUE(mj["sliding_window"].is_null());
    mj["max_position_embeddings"] = 64;
    for (const auto& [window, ctx] :
         std::vector<std::pair<nlohmann::json, int>>{{nullptr, 64}, {64, 64}, {4096, 64}, {16, 16}}) {
        mj["sliding_window"] = window;
        const ModelConfig m = config_from_hf_json(mj, "config.json");
        EXPECT_EQ(m.n_ctx, ctx) << "sliding_window " << window.dump();
        const nlohmann::json out = config_to_hf_json(m, {});
        EXPECT_EQ(out["max_position_embeddings"], 64) << "sliding_window " << window.dump();
        if (ctx == 16) {
            EXPECT_EQ(out["sliding_window"], 16);
        }
    }
}

TEST(Llama, ParamStoreFollowsTransformers) {
    const ModelConfig c = tiny_llama(false);
    auto be = make_backend({Device::CPU, 1, 0});
    auto m = make_model(*be, c);
    const ParamStore& s = m->params();
    EXPECT_EQ(s.numel(), c.num_params());
    ASSERT_EQ(s.size(), size_t(1 + 9 * c.n_layer + 2));
    EXPECT_EQ(s.spec(0).name, "model.embed_tokens.weight");
    EXPECT_EQ(s.spec(1).name, "model.layers.0.input_layernorm.weight");
    EXPECT_EQ(s.spec(2).name, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(s.spec(2).shape, (Shape{8, 8}));  // nn.Linear (out, in)
    EXPECT_EQ(s.spec(3).name, "model.layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(s.spec(3).shape, (Shape{4, 8}));  // 2 key/value heads of 2
    EXPECT_EQ(s.spec(7).name, "model.layers.0.mlp.gate_proj.weight");
    EXPECT_EQ(s.spec(s.size() - 2).name, "model.norm.weight");
    EXPECT_EQ(s.spec(s.size() - 1).name, "lm_head.weight");
    for (size_t i = 0; i < s.size(); i++)
        EXPECT_EQ(s.spec(i).decay, s.spec(i).shape.ndim >= 2) << s.spec(i).name;
    auto tied = make_model(*be, tiny_llama(true));
    EXPECT_EQ(tied->params().size(), s.size() - 1) << "a tied head has no weight of its own";
    EXPECT_EQ(tied->params().numel(), tiny_llama(true).num_params());
    // config.json written and read back
    ModelConfig scaled = c;
    scaled.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    scaled.rope_theta = 500000.0;
    const ModelConfig back = config_from_hf_json(config_to_hf_json(scaled, {}), "config.json");
    EXPECT_TRUE(back.same_shape(scaled)) << back.str();
    // transformers 5 writes rope_theta and the scaling into one rope_parameters object
    nlohmann::json v5 = config_to_hf_json(scaled, {});
    v5.erase("rope_theta");
    v5.erase("rope_scaling");
    v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                             {"factor", 8.0},           {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    const ModelConfig back5 = config_from_hf_json(v5, "config.json");
    EXPECT_TRUE(back5.same_shape(scaled)) << back5.str();
    EXPECT_EQ(back5.rope_theta, 500000.0);
    EXPECT_EQ(back5.rope_scaling.type, "llama3");
    v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    EXPECT_EQ(config_from_hf_json(v5, "config.json").rope_scaling.type, "");
}

// Llama 3.1's frequency scaling: long wavelengths divided by the factor, short ones kept, the band between
// interpolated (transformers' _compute_llama3_parameters).
TEST(Llama, RopeScalingFollowsLlama31) {
    const RopeScaling sc{"llama3", 8.0, 1.0, 4.0, 8192};
    const std::vector<float> plain = rope_inv_freq(128, 500000.0, {}),
                             scaled = rope_inv_freq(128, 500000.0, sc);
    ASSERT_EQ(plain.size(), 64u);
    EXPECT_FLOAT_EQ(plain[0], 1.0f);
    EXPECT_FLOAT_EQ(scaled[0], plain[0]);           // wavelength 2 pi: high frequency, kept
    EXPECT_FLOAT_EQ(scaled[63], plain[63] / 8.0f);  // the longest wavelengths: divided by the factor
    int between = 0;
    for (size_t i = 0; i < plain.size(); i++) {
        EXPECT_LE(scaled[i], plain[i]);
        EXPECT_GE(scaled[i], plain[i] / 8.0f * (1 - 1e-6f));
        between += scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0f * (1 + 1e-6f);
    }
    EXPECT_GT(between, 0) << "some frequencies lie in the interpolated band";
}

// fp16's loss scale multiplies the gradients by a power of two and divides it out again: the step, and the
// gradient norm it reports, are those of the unscaled gradients (scale 1024 against none, on the CPU).
TEST(Trainer, LossScaleLeavesTheStepAndItsNormUnchanged) {
    StepStats st[2];
    std::vector<std::vector<float>> w[2];
    for (int r = 0; r < 2; r++) {
        TinyRun run(21);
        AdamW opt(run.model->params(), 0.1f);
        Trainer trainer(*run.model, opt);
        if (r == 1) trainer.scaler().enabled = true, trainer.scaler().scale = 1024.0f;
        AdamWArgs args;
        args.lr = 1e-2f;
        args.max_grad_norm = 1.0f;
        st[r] = trainer.step({run.tok.data(), run.tgt.data(), run.valid()}, 1, run.B, run.T, args);
        w[r] = all_params(run.model->params());
    }
    EXPECT_EQ(st[1].loss_scale, 1024.0f);
    EXPECT_EQ(st[0].loss, st[1].loss);
    EXPECT_EQ(st[0].grad_norm, st[1].grad_norm) << "the logged norm must not carry the loss scale";
    EXPECT_GT(st[0].grad_norm, 0.0);
    EXPECT_EQ(w[0], w[1]);
}

// llm.c's outlier detector: no z-score until the window is full, then the newest value's against the window
// it has joined (population standard deviation); a constant window gives 0.
TEST(Trainer, ZScoreWindowIsLlmcs) {
    ZScoreWindow w(4);
    for (double x : {1.0, 2.0, 3.0, 4.0}) EXPECT_TRUE(std::isnan(w.push(x)));
    const double mean = (2.0 + 3.0 + 4.0 + 10.0) / 4, var = (std::pow(2 - mean, 2) + std::pow(3 - mean, 2) +
                                                             std::pow(4 - mean, 2) + std::pow(10 - mean, 2)) /
                                                            4;
    EXPECT_NEAR(w.push(10.0), (10.0 - mean) / std::sqrt(var), 1e-12);
    EXPECT_EQ(std::vector<double>(w.values().begin(), w.values().end()), (std::vector<double>{2, 3, 4, 10}));
    ZScoreWindow c(3);
    c.set_values({9, 5, 5, 5});  // the newest 3 kept
    EXPECT_EQ(c.push(5.0), 0.0);
}

// --skip-loss-z / --skip-grad-z: after a window of identical steps (lr 0), a step whose loss and gradient
// norm jump (the weights shaken) is not applied: the weights and the moments stay as they were, bit for bit,
// and its z-score is the largest a window of 16 allows, sqrt(15); the next step, judged against a window that
// now holds the jump, is applied.
TEST(Trainer, SkipsTheUpdateOfAnOutlierStep) {
    for (const bool by_loss : {true, false}) {
        SCOPED_TRACE(by_loss ? "loss" : "grad");
        TinyRun run(21);
        AdamW opt(run.model->params(), 0.1f);
        Trainer trainer(*run.model, opt);
        trainer.set_outlier_skip({by_loss ? 3.0f : 0.0f, by_loss ? 0.0f : 3.0f, 16});
        const StepBatch batch{run.tok.data(), run.tgt.data(), run.valid()};
        AdamWArgs args;
        args.lr = 0.0f;
        StepStats st;
        for (int s = 0; s < 16; s++) {
            args.step = s + 1;
            st = trainer.step(batch, 1, run.B, run.T, args);
            ASSERT_EQ(st.outlier, nullptr);
            ASSERT_TRUE(std::isnan(st.loss_z)) << "no z-score while the window fills";
        }
        const double calm_loss = st.loss, calm_norm = st.grad_norm;
        run.shake(5, 0.5f);
        const auto before = all_params(run.model->params());
        const auto moments = [&] {
            std::vector<std::vector<float>> mv;
            for (size_t i : run.model->params().trainable()) {
                const size_t n = size_t(run.model->params().spec(i).shape.numel());
                std::vector<float> m(n), v(n);
                opt.moments(i, m.data(), v.data());
                mv.push_back(m), mv.push_back(v);
            }
            return mv;
        };
        const auto m_before = moments();
        args.lr = 1e-2f;
        args.step = 17;
        st = trainer.step(batch, 1, run.B, run.T, args);
        ASSERT_GT(st.loss, calm_loss);
        ASSERT_GT(st.grad_norm, calm_norm);
        ASSERT_NE(st.outlier, nullptr);
        EXPECT_STREQ(st.outlier, by_loss ? "loss" : "grad");
        EXPECT_NEAR(by_loss ? st.loss_z : st.grad_z, std::sqrt(15.0), 1e-9);
        EXPECT_TRUE(st.finite);
        EXPECT_EQ(all_params(run.model->params()), before) << "an outlier step must not move the weights";
        EXPECT_EQ(moments(), m_before) << "nor the moments";
        args.step = 18;
        st = trainer.step(batch, 1, run.B, run.T, args);
        EXPECT_EQ(st.outlier, nullptr);
        EXPECT_NE(all_params(run.model->params()), before) << "the next step is applied";
    }
}

// --precision bf16 on the CPU: f32 tensors, bf16 products (Backend::set_autocast). 30 AdamW steps of a tiny
// GPT-2 and Llama stay within 2% of the fp32 run's loss at every step, and are not the fp32 run.
TEST(Trainer, Bf16ProductsTrackFp32OnTheCpu) {
    for (const ModelConfig& c : {tiny(), tiny_llama(false)}) {
        SCOPED_TRACE(c.model_type);
        std::vector<double> losses[2];
        for (int bf = 0; bf < 2; bf++) {
            TinyRun run(33, {}, c);
            if (bf && !run.be->set_autocast(DType::BF16))
                GTEST_SKIP() << "built without oneDNN: no bf16 products";
            losses[bf] = run.train(30, 1e-2f, 0.1f);
        }
        for (size_t s = 0; s < losses[0].size(); s++)
            EXPECT_NEAR(losses[1][s], losses[0][s], 0.02 * losses[0][s]) << "step " << s + 1;
        EXPECT_NE(losses[1], losses[0]);
        EXPECT_LT(losses[1].back(), 0.7 * losses[1].front()) << "it trains";
    }
}

TEST(Sampling, TopKAndTopP) {
    std::vector<float> logits = {0.0f, 5.0f, 4.0f, -3.0f};
    Rng rng(1);
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    EXPECT_EQ(sample_token(logits, greedy, rng), 1);
    SampleOptions k1;
    k1.top_k = 1;
    for (int i = 0; i < 20; i++) EXPECT_EQ(sample_token(logits, k1, rng), 1);
    SampleOptions k2;
    k2.top_k = 2;
    for (int i = 0; i < 50; i++) {
        const int32_t t = sample_token(logits, k2, rng);
        EXPECT_TRUE(t == 1 || t == 2);
    }
    SampleOptions p;
    p.top_p = 0.5f;  // token 1 alone has ~73% of the mass
    for (int i = 0; i < 20; i++) EXPECT_EQ(sample_token(logits, p, rng), 1);
}

// OpenAI's logit_bias, presence_penalty and frequency_penalty on the logits, before the pick.
TEST(Sampling, PenaltiesAndLogitBiasAsOpenAiDefinesThem) {
    const std::vector<float> l = {1.0f, 3.0f, 2.5f, 0.0f};
    // logits after the answer so far generated 1 twice and 2 once
    const auto after_122 = [&](const SampleOptions& o) {
        TokenCounts c({}, o);
        for (int32_t id : {1, 1, 2}) c.add(id);
        std::vector<float> x = l;
        c.adjust(x);
        return x;
    };
    SampleOptions o;
    o.temperature = 0.0f;
    o.logit_bias = {{3, 10.0f}, {0, -1.5f}};
    std::vector<float> x = l;
    TokenCounts({}, o).adjust(x);
    EXPECT_EQ(x, (std::vector<float>{-0.5f, 3.0f, 2.5f, 10.0f})) << "nothing generated yet: the bias alone";
    EXPECT_EQ(after_122(o), x) << "no penalty: what was generated does not count";
    o.logit_bias.clear();
    o.presence_penalty = 0.25f;
    o.frequency_penalty = 0.5f;
    EXPECT_EQ(after_122(o), (std::vector<float>{1.0f, 1.75f, 1.75f, 0.0f}))
        << "1 twice: 3 - 0.25 - 2 x 0.5; 2 once";
    o.frequency_penalty = 1.5f;  // 1: 3 - 0.25 - 3, 2: 2.5 - 0.25 - 1.5, below 0's 1
    Rng rng(1);
    x = after_122(o);
    EXPECT_EQ(sample_token(x, o, rng), 0) << "the penalties decide the greedy pick";
    o.presence_penalty = o.frequency_penalty = -1.0f;  // negative: repeats encouraged
    x = after_122(o);
    EXPECT_EQ(sample_token(x, o, rng), 1);
    TokenCounts c({}, o);  // sample: adjusts, picks and counts
    x = l;
    EXPECT_EQ(c.sample(x, rng), 1);
    x = {1.0f, 2.5f, 2.4f, 0.0f};
    EXPECT_EQ(c.sample(x, rng), 1) << "1 counted once: 2.5 + 1 + 1 above 2.4";
}

// Hugging Face's repetition_penalty: every token of the prompt or the answer, once however often it occurs,
// its logit divided when positive and multiplied when negative; min_p keeps what is at least min_p as likely
// as the likeliest, in the whole-distribution pass and in the sorted one (top-k) alike.
TEST(Sampling, RepetitionPenaltyAndMinP) {
    SampleOptions o;
    o.repetition_penalty = 2.0f;
    TokenCounts c({0, 3}, o);
    c.add(1);
    c.add(1);
    c.add(3);
    std::vector<float> x = {1.0f, 3.0f, 2.5f, -4.0f};
    c.adjust(x);
    EXPECT_EQ(x, (std::vector<float>{0.5f, 1.5f, 2.5f, -8.0f}));
    Rng rng(3);
    SampleOptions m;
    m.min_p = 0.2f;         // e^-1 = 0.37 of the likeliest stays, e^-2 = 0.14 goes
    for (int k : {0, 3}) {  // the whole distribution, then the sorted path
        m.top_k = k;
        std::set<int32_t> seen;
        for (int i = 0; i < 400; i++) {
            std::vector<float> l = {0.0f, -1.0f, -2.0f, -5.0f};
            seen.insert(sample_token(l, m, rng));
        }
        EXPECT_EQ(seen, (std::set<int32_t>{0, 1})) << "top_k " << k;
    }
}

// Through the generator: two tokens lifted far above the rest by logit_bias, 7 by one more than 8 (more than
// a tiny model's logits ever differ), take turns once a frequency penalty of 2 counts each one's uses;
// without it 7 repeats.
TEST(Sampling, GeneratorCountsTheAnswersTokens) {
    ModelConfig c = tiny();
    auto [be, m] = cpu_model(c);
    SampleOptions o;
    o.temperature = 0.0f;
    o.max_new_tokens = 12;
    o.logit_bias = {{7, 100.0f}, {8, 99.0f}};
    Generator gen(*m);
    const std::vector<int32_t> plain = gen.generate({3, 1, 4}, o);
    EXPECT_EQ(plain, std::vector<int32_t>(12, 7));
    o.frequency_penalty = 2.0f;
    const std::vector<int32_t> out = gen.generate({3, 1, 4}, o);
    int n7 = 0, n8 = 0;
    for (int32_t t : out) {
        ASSERT_TRUE(t == 7 || t == 8) << t;
        (t == 7 ? n7 : n8)++;
        EXPECT_LE(std::abs(n7 - n8), 1) << "each use costs 2, more than the two logits differ";
    }
    EXPECT_EQ(n7 + n8, 12);
}

// The whole distribution (no top-k, no top-p) is sampled in one pass without sorting: p(1) = 3/4 here.
TEST(Sampling, WholeDistributionFollowsTheSoftmax) {
    Rng rng(7);
    SampleOptions o;
    o.temperature = 1.0f;
    int ones = 0;
    const int n = 8000;
    for (int i = 0; i < n; i++) {
        std::vector<float> logits = {0.0f, std::log(3.0f), -30.0f};
        ones += sample_token(logits, o, rng) == 1;
    }
    EXPECT_NEAR(double(ones) / n, 0.75, 0.02);
}

// Every --recompute mode gives the loss and the gradients of keeping everything, bit for bit, with less
// activation memory: selective (norms and GELU/SwiGLU recomputed) less than off, full (each block run again
// from its input) least. GPT-2 and Llama with grouped-query attention, alone, with LoRA adapters on every
// projection (with dropout, whose mask the second forward must draw again), with fp8 products (also under
// delayed scaling, whose scales the second forward must take from the first) and with --dropout.
TEST(Model, RecomputeGivesIdenticalGradients) {
    ModelOptions with_lora;
    with_lora.lora.rank = 2;
    with_lora.lora.alpha = 3.0f;
    with_lora.lora.dropout = 0.25f;
    ModelOptions fp8;
    fp8.fp8 = true;
    ModelOptions delayed = fp8;  // FP8 delayed scaling: the second forward takes the first's scales
    delayed.fp8_history = 2;
    ModelOptions drop;
    drop.dropout = drop.attn_dropout = 0.25f;
    struct Case {
        const char* what;
        ModelConfig c;
        ModelOptions mo;
        std::vector<std::string> targets;
    };
    const std::vector<Case> cases = {
        {"gpt2", tiny(), {}, {}},
        {"llama", tiny_llama(false), {}, {}},
        {"gpt2 lora", tiny(), with_lora, {"c_attn", "c_proj", "c_fc"}},
        // the MLP's weights frozen without adapters: the GELU's output is not recomputed (nothing reads it)
        {"gpt2 lora c_attn", tiny(), with_lora, {"c_attn"}},
        {"llama lora",
         tiny_llama(true),
         with_lora,
         {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
        {"gpt2 fp8", tiny(), fp8, {}},
        {"gpt2 fp8 delayed", tiny(), delayed, {}},
        {"gpt2 dropout", tiny(), drop, {}},
        {"llama dropout", tiny_llama(false), drop, {}},
    };
    const uint64_t seed = test_seed();
    for (const Case& k : cases) {
        std::vector<std::vector<float>> grads[3];
        double loss[3];
        size_t act_bytes[3];
        for (int r = 0; r < 3; r++) {
            ModelOptions mo = k.mo;
            mo.lora.targets = k.targets;
            mo.recompute = Recompute(r);
            ModelConfig c = k.c;
            c.n_layer = 3;
            TinyRun run(seed, mo, c);
            // delayed scaling: a pass before the weights move, so the measured pass scales by that pass's
            // amaxes (smaller than its own), and a second forward that began a use of its own would scale
            // otherwise
            if (mo.fp8_history > 0) run.loss(true);
            run.shake(seed + 1, 0.1f);  // LoRA's B starts at zero: give every path a gradient
            act_bytes[r] = run.model->activations().bytes();
            loss[r] = run.loss(true);
            const ParamStore& s = run.model->params();
            for (size_t i : s.trainable()) grads[r].push_back(download(*run.be, s.grad(i)));
        }
        for (int r = 1; r < 3; r++) {
            EXPECT_EQ(loss[r], loss[0]) << k.what << ", --recompute " << recompute_name(Recompute(r));
            EXPECT_EQ(grads[r], grads[0]) << k.what << ", --recompute " << recompute_name(Recompute(r));
        }
        EXPECT_LT(act_bytes[1], act_bytes[0]) << k.what;
        EXPECT_LT(act_bytes[2], act_bytes[1]) << k.what;
    }
}

// --dropout (nanoGPT's: the attention probabilities too), and dropout on the attention probabilities alone:
// the gradient of a training pass, masks and all, against finite differences in both families; evaluation
// passes drop nothing (the loss of the model trained without dropout, bit for bit, LoRA's dropout off too);
// another pass seed draws other masks, the same seed the same; the masks' keep rate.
TEST(Model, DropoutGradientsAndEvaluation) {
    ModelOptions drop;
    drop.dropout = drop.attn_dropout = 0.2f;  // nanoGPT's
    ModelOptions attn_only;
    attn_only.attn_dropout = 0.3f;
    ModelOptions drop_lora = drop;
    drop_lora.lora.rank = 2;
    drop_lora.lora.dropout = 0.3f;
    drop_lora.lora.targets = {"c_attn", "c_fc"};
    ModelOptions plain_lora = drop_lora;
    plain_lora.dropout = plain_lora.lora.dropout = 0.0f;
    const uint64_t seed = test_seed();
    for (const auto& [what, c, mo, plain] :
         std::vector<std::tuple<const char*, ModelConfig, ModelOptions, ModelOptions>>{
             {"gpt2", tiny(), drop, {}},
             {"llama", tiny_llama(false), drop, {}},
             {"gpt2 attention probabilities", tiny(), attn_only, {}},
             {"llama attention probabilities", tiny_llama(false), attn_only, {}},
             {"gpt2 lora", tiny(), drop_lora, plain_lora}}) {
        SCOPED_TRACE(what);
        TinyRun run(seed, mo, c), ref(seed, plain, c);
        run.shake(seed + 1, 0.2f);
        set_all_params(ref.model->params(), all_params(run.model->params()));
        run.check_gradients(seed + 2);
        // evaluation: no dropout anywhere
        EXPECT_EQ(run.loss(false, nullptr, false, 5), ref.loss(false, nullptr, false, 5));
        EXPECT_EQ(run.loss(false, nullptr, false, 5), run.loss(false, nullptr, false, 6));
        // training passes: the seed draws the masks
        const double a = run.loss(false, nullptr, true, 5);
        EXPECT_EQ(run.loss(false, nullptr, true, 5), a);
        EXPECT_NE(run.loss(false, nullptr, true, 6), a);
        EXPECT_NE(ref.loss(false, nullptr, true, 5), a);
    }
    // the sites' masks: each keeps about 1 - p of its elements, and two sites' masks are unrelated
    const uint32_t th = dropout_threshold(0.2f);
    const uint64_t pass = 0x1234;
    int kept[2] = {0, 0}, both = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        const bool k0 = dropout_keep(dropout_site_seed(pass, 1), uint64_t(i), th);
        const bool k1 = dropout_keep(dropout_site_seed(pass, 2), uint64_t(i), th);
        kept[0] += k0, kept[1] += k1, both += k0 && k1;
    }
    for (int k : kept) EXPECT_NEAR(double(k) / n, 0.8, 0.005);
    EXPECT_NEAR(double(both) / n, 0.64, 0.005)
        << "independent masks keep an element in both 0.8^2 of the time";
}

// Taking the loss a chunk of sequences at a time (ModelOptions::logits_chunk_bytes) gives the whole batch's
// losses and gradients (the head's weight gradient summed chunk by chunk), with logits for one chunk only;
// evaluation through the chunked activations gives the same losses, and the whole batch's logits are refused.
TEST(Model, ChunkedLossMatchesTheWhole) {
    for (const auto& [c, lora] : std::vector<std::pair<ModelConfig, bool>>{
             {tiny(), false}, {tiny_llama(false), false}, {tiny_llama(true), true}, {tiny(), true}}) {
        ModelOptions with_lora;
        with_lora.lora.rank = 2;
        with_lora.lora.targets = c.model_type == "gpt2" ? std::vector<std::string>{"c_attn", "c_fc"}
                                                        : std::vector<std::string>{"q_proj", "gate_proj"};
        SCOPED_TRACE(c.model_type + (c.tie_embeddings ? " tied" : "") + (lora ? " lora" : ""));
        const uint64_t seed = test_seed();
        std::vector<std::vector<float>> grads[2];
        std::vector<float> losses[2], eval_losses[2];
        size_t bytes[2];
        for (int chunked = 0; chunked < 2; chunked++) {
            ModelOptions mo = lora ? with_lora : ModelOptions{};
            mo.logits_chunk_bytes = chunked ? size_t(6 * c.vocab_size) * sizeof(float) : 0;  // one sequence
            TinyRun run(seed, mo, c);
            run.shake(seed + 1, 0.1f);
            bytes[chunked] = run.model->activations().bytes();
            EXPECT_EQ(run.model->activations().capacity(act::logits), chunked ? 1 : run.B);
            run.loss(true);
            losses[chunked] = download(*run.be, run.model->losses(run.B, run.T));
            const ParamStore& s = run.model->params();
            for (size_t i : s.trainable()) grads[chunked].push_back(download(*run.be, s.grad(i)));
            run.loss(false);
            eval_losses[chunked] = download(*run.be, run.model->losses(run.B, run.T));
            if (chunked) {
                expect_error([&] { run.model->logits(run.B, run.T); }, "chunks");
                const ForwardPass f{.tokens = run.model->tokens(run.B, run.T)};
                expect_error([&] { run.model->forward(f); }, "--logits-chunk");
            }
        }
        EXPECT_LT(bytes[1], bytes[0]);
        for (size_t k = 0; k < losses[0].size(); k++) {
            EXPECT_NEAR(losses[1][k], losses[0][k], 1e-6f * std::fabs(losses[0][k])) << k;
            EXPECT_EQ(eval_losses[1][k], losses[1][k]) << k;
        }
        ASSERT_EQ(grads[1].size(), grads[0].size());
        for (size_t i = 0; i < grads[0].size(); i++)
            for (size_t k = 0; k < grads[0][i].size(); k++)
                ASSERT_NEAR(grads[1][i][k], grads[0][i][k], 1e-5f * (1.0f + std::fabs(grads[0][i][k])))
                    << "tensor " << i << "[" << k << "]";
    }
}

// Under --recompute full a block keeps only its output: one more layer costs one (B, T, C) buffer, where
// keeping everything costs its every saved activation.
TEST(Model, FullRecomputeKeepsOneOutputPerBlock) {
    for (const ModelConfig& base : {tiny(), tiny_llama(false)}) {
        auto be = make_backend({Device::CPU, 1, 0});
        size_t bytes[2][2];  // [full][layers 3, 4]
        for (int full = 0; full < 2; full++)
            for (int extra = 0; extra < 2; extra++) {
                ModelConfig c = base;
                c.n_layer = 3 + extra;
                ModelOptions mo;
                mo.recompute = full ? Recompute::Full : Recompute::Off;
                auto m = make_model(*be, c, mo);
                bytes[full][extra] = m->make_activations(4, 8, ActMode::Train)->bytes();
            }
        const size_t output = 4 * 8 * size_t(base.n_embd) * sizeof(float);
        const size_t full_step = bytes[1][1] - bytes[1][0], kept_step = bytes[0][1] - bytes[0][0];
        EXPECT_GE(full_step, output) << base.model_type;
        EXPECT_LT(full_step, output + 256) << base.model_type;  // an arena rounds each buffer up
        EXPECT_GT(kept_step, 5 * output) << base.model_type;
    }
}

// Evaluation shares every layer's buffers: far less memory than training activations of the same size.
TEST(Model, EvalActivationsAreShared) {
    ModelConfig c = tiny();
    c.n_layer = 6;
    auto be = make_backend({Device::CPU, 1, 0});
    auto m = make_model(*be, c);
    const auto train = m->make_activations(4, 8, ActMode::Train),
               eval = m->make_activations(4, 8, ActMode::Eval);
    EXPECT_LT(eval->bytes() * 3, train->bytes());
}

}  // namespace
}  // namespace anvil::test
