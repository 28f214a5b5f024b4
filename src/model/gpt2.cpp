#include "model/gpt2.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace anvil {

namespace {

std::string layer_prefix(int l) {
    return "transformer.h." + std::to_string(l);
}

// ---- config.json --------------------------------------------------------------------------------------

nlohmann::json to_hf(const ModelConfig& c) {
    return {
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"n_layer", c.n_layer},
        {"n_head", c.n_head},
        {"n_embd", c.n_embd},
        {"n_positions", c.n_ctx},
        {"n_ctx", c.n_ctx},
        {"n_inner", nullptr},
        {"vocab_size", c.vocab_size},
        {"activation_function", "gelu_new"},
        {"layer_norm_epsilon", 1e-5},
        {"initializer_range", 0.02},
        {"resid_pdrop", 0.0},
        {"embd_pdrop", 0.0},
        {"attn_pdrop", 0.0},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", true},
        {"use_cache", true},
        {"torch_dtype", "float32"},
    };
}

int get_int(const nlohmann::json& j, const char* key, const std::string& path) {
    ANVIL_CHECK(j.contains(key), "{}: config has no \"{}\"; it must be a Hugging Face GPT-2 config.json", path,
                key);
    ANVIL_CHECK(j[key].is_number_integer(), "{}: \"{}\" must be an integer, got {}", path, key, j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    ANVIL_CHECK(v > 0 && v < (int64_t(1) << 31), "{}: \"{}\" must be positive, got {}", path, key, v);
    return int(v);
}

// Rejects the GPT-2 variants anvil does not implement, naming the key.
void check_variant(const nlohmann::json& j, const ModelConfig& c, const std::string& path) {
    if (j.contains("activation_function") && j["activation_function"].is_string()) {
        const std::string act = j["activation_function"];
        ANVIL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                    "{}: activation_function \"{}\" is not supported; anvil implements GPT-2's tanh GELU "
                    "(gelu_new)",
                    path, act);
    }
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
        ANVIL_CHECK(j["tie_word_embeddings"].get<bool>(), "{}: untied output embeddings are not supported", path);
    if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number())
        ANVIL_CHECK(std::abs(j["layer_norm_epsilon"].get<double>() - 1e-5) < 1e-9,
                    "{}: layer_norm_epsilon {} is not supported; anvil uses GPT-2's 1e-5", path,
                    j["layer_norm_epsilon"].get<double>());
    if (j.contains("n_inner") && !j["n_inner"].is_null())
        ANVIL_CHECK(j["n_inner"] == 4 * c.n_embd, "{}: n_inner {} is not supported; anvil uses 4 * n_embd", path,
                    j["n_inner"].dump());
}

ModelConfig from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c;
    c.model_type = "gpt2";
    c.n_layer = get_int(j, "n_layer", path);
    c.n_head = get_int(j, "n_head", path);
    c.n_embd = get_int(j, "n_embd", path);
    c.n_ctx = get_int(j, j.contains("n_positions") ? "n_positions" : "n_ctx", path);
    c.vocab_size = get_int(j, "vocab_size", path);
    check_variant(j, c, path);
    return c;
}

int64_t num_params(const ModelConfig& c) {
    const int64_t C = c.n_embd, L = c.n_layer;
    const int64_t per_layer =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return int64_t(c.vocab_size) * C + int64_t(c.n_ctx) * C + L * per_layer + 2 * C;
}

int64_t position_params(const ModelConfig& c) {
    return int64_t(c.n_ctx) * c.n_embd;
}

std::unique_ptr<Model> make(Backend& be, const ModelConfig& c, const ModelOptions& o) {
    return std::make_unique<Gpt2Model>(be, c, o);
}

constexpr double kStd = 0.02;

}  // namespace

// PEFT's default target for GPT-2 is the fused q, k, v projection
const ModelFamily kGpt2Family = {"gpt2", from_hf, to_hf, num_params, position_params, make, "c_attn"};

// ---- the block ----------------------------------------------------------------------------------------

Gpt2Block::Gpt2Block(ParamRegistry& reg, const ModelConfig& c, int layer)
    : ln_1(reg, layer_prefix(layer) + ".ln_1", c.n_embd, layer, true),
      attn(reg, layer_prefix(layer) + ".attn", c.n_embd, c.n_head, layer, kStd, kStd / std::sqrt(2.0 * c.n_layer)),
      ln_2(reg, layer_prefix(layer) + ".ln_2", c.n_embd, layer, true),
      mlp(reg, layer_prefix(layer) + ".mlp", c.n_embd, 4 * c.n_embd, layer, kStd,
          kStd / std::sqrt(2.0 * c.n_layer)),
      layer_(layer),
      dim_(c.n_embd),
      dtype_(reg.dtype),
      res2_(layer_prefix(layer) + ".res2"),
      res3_(layer_prefix(layer) + ".res3") {}

void Gpt2Block::plan(ActPlan& plan) const {
    const int64_t C = dim_;
    const DType a = dtype_;
    ln_1.plan(plan);
    attn.plan(plan);
    ln_2.plan(plan);
    mlp.plan(plan);
    plan.add(res2_, {C}, a, Keep::Saved, "block.res2");
    plan.add(res3_, {C}, a, Keep::Saved, "block.res3");
    plan.add("block.proj", {C}, a, Keep::Scratch);
}

void Gpt2Block::forward(const Pass& p, Tensor in) const {
    const Tensor proj = p.act("block.proj"), res2 = p.act(res2_);
    ln_1.forward(p, in);
    attn.forward(p, proj, ln_1.out(p), layer_);
    p.be.residual_fwd(res2, in, proj);
    ln_2.forward(p, res2);
    mlp.forward(p, proj, ln_2.out(p));
    p.be.residual_fwd(out(p), res2, proj);
}

void Gpt2Block::backward(const Pass& p, Tensor dres, Tensor dln, Tensor in) const {
    const Tensor res2 = p.act(res2_);
    // MLP half: dres holds d(out) = d(res2) through the residual
    if (p.acts.recompute()) ln_2.forward(p, res2);
    mlp.backward(p, dln, dres, ln_2.out(p));
    ln_2.backward(p, dres, dln, res2);
    // attention half: dres holds d(res2) = d(in) through the residual
    if (p.acts.recompute()) ln_1.forward(p, in);
    attn.backward(p, dln, dres, ln_1.out(p));
    ln_1.backward(p, dres, dln, in);
}

// ---- the model ----------------------------------------------------------------------------------------

Gpt2Model::Gpt2Model(Backend& be, const ModelConfig& c, const ModelOptions& o) : Model(be, c, o) {
    emb_ = Embedding(reg_, "transformer.wte.weight", "transformer.wpe.weight", c.vocab_size, c.n_ctx, c.n_embd,
                     kStd);
    blocks_.reserve(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; l++) blocks_.emplace_back(reg_, c, l);
    ln_f_ = Norm(reg_, "transformer.ln_f", c.n_embd, -1, false);
    lm_head_ = Linear::tied(reg_, emb_.token_weight(), WLayout::OutIn);
    allocate_params();
}

void Gpt2Model::plan(ActPlan& plan) const {
    const int64_t C = config_.n_embd, V = config_.vocab_size;
    const DType a = options_.dtype;
    plan.add("encoded", {C}, a, Keep::Saved);
    for (const Gpt2Block& b : blocks_) b.plan(plan);
    ln_f_.plan(plan);
    lm_head_.plan(plan);
    plan.add("logits", {V}, a, Keep::Saved);
    plan.add("d.res", {C}, a, Keep::Backward);
    plan.add("d.ln", {C}, a, Keep::Backward);
}

void Gpt2Model::forward(Activations& acts, const ForwardPass& f) {
    ANVIL_CHECK(f.pos0 + f.T <= config_.n_ctx, "sequence length {} is longer than the model's context {}",
                f.pos0 + f.T, config_.n_ctx);
    ANVIL_CHECK(f.dloss == 0.0f || (acts.training() && f.targets),
                "forward: gradients need targets and training activations");
    const Pass p{be_, acts, f.B, f.T, f.pos0, f.cache, f.seed};
    const Tensor encoded = p.act("encoded");
    emb_.forward(p, encoded, p.act("tokens"));
    Tensor x = encoded;
    for (const Gpt2Block& b : blocks_) {
        b.forward(p, x);
        x = b.out(p);
    }
    head(p, x, f);
    last_B_ = f.B;
    last_T_ = f.T;
    last_seed_ = f.seed;
    have_grad_logits_ = f.dloss != 0.0f;
}

// Final norm, logits, and the loss: over every position, or (last_logits) over each row's last one.
void Gpt2Model::head(const Pass& p, Tensor x, const ForwardPass& f) {
    Pass q = p;
    if (f.last_logits) {
        ANVIL_CHECK(f.B == 1 && !f.targets, "last_logits: one sequence, no targets");
        x = x.slice0(0).slice0(f.T - 1).view(Shape{1, 1, config_.n_embd});
        q.T = 1;
    }
    ln_f_.forward(q, x);
    const Tensor logits = q.act("logits");
    lm_head_.forward(q, logits, ln_f_.out(q));
    if (f.targets)
        be_.classifier(q.act("losses"), logits, q.act("targets"), f.dloss, config_.vocab_size);
}

void Gpt2Model::backward(Activations& acts, BackwardHooks* hooks) {
    ANVIL_CHECK(have_grad_logits_, "backward: call forward with a nonzero dloss first");
    const Pass p{be_, acts, last_B_, last_T_, 0, nullptr, last_seed_};
    const Tensor dres = p.act("d.res"), dln = p.act("d.ln");
    lm_head_.backward(p, dln, p.act("logits"), ln_f_.out(p));  // the logits hold d(loss)/d(logits)
    be_.zero(dres);
    ln_f_.backward(p, dres, dln, blocks_.back().out(p));
    for (int l = config_.n_layer - 1; l >= 0; l--) {
        const Tensor in = l == 0 ? p.act("encoded") : blocks_[size_t(l - 1)].out(p);
        blocks_[size_t(l)].backward(p, dres, dln, in);
        if (hooks) hooks->on_layer_grads_ready(l);
    }
    emb_.backward(p, dres, p.act("tokens"));
    if (hooks) hooks->on_layer_grads_ready(kOutsideLayers);
    have_grad_logits_ = false;
}

std::vector<Linear*> Gpt2Model::linears() {
    std::vector<Linear*> out;
    for (Gpt2Block& b : blocks_)
        for (Linear* l : {&b.attn.qkv(), &b.attn.proj(), &b.mlp.up(), &b.mlp.down()}) out.push_back(l);
    return out;
}

std::string Gpt2Model::canonical_name(const std::string& file_name) const {
    if (store_.find(file_name) == ParamStore::npos && store_.find("transformer." + file_name) != ParamStore::npos)
        return "transformer." + file_name;
    return file_name;
}

bool Gpt2Model::ignorable_tensor(const std::string& n) const {
    return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n == "lm_head.weight";
}

}  // namespace anvil
