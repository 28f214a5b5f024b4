#include "model/gpt2.h"

#include <cmath>

#include "core/rng.h"

namespace anvil {

std::vector<ParamInfo> param_table(const GPTConfig& c) {
    const int64_t C = c.n_embd;
    std::vector<ParamInfo> t;
    t.push_back({"transformer.wte.weight", {c.vocab_size, C}, true, false});
    t.push_back({"transformer.wpe.weight", {c.n_ctx, C}, true, false});
    for (int l = 0; l < c.n_layer; l++) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        // order must match LayerParam
        t.push_back({h + "ln_1.weight", {C}, false, false});
        t.push_back({h + "ln_1.bias", {C}, false, false});
        t.push_back({h + "attn.c_attn.weight", {C, 3 * C}, true, false});
        t.push_back({h + "attn.c_attn.bias", {3 * C}, false, false});
        t.push_back({h + "attn.c_proj.weight", {C, C}, true, true});
        t.push_back({h + "attn.c_proj.bias", {C}, false, false});
        t.push_back({h + "ln_2.weight", {C}, false, false});
        t.push_back({h + "ln_2.bias", {C}, false, false});
        t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, true, false});
        t.push_back({h + "mlp.c_fc.bias", {4 * C}, false, false});
        t.push_back({h + "mlp.c_proj.weight", {4 * C, C}, true, true});
        t.push_back({h + "mlp.c_proj.bias", {C}, false, false});
    }
    t.push_back({"transformer.ln_f.weight", {C}, false, false});
    t.push_back({"transformer.ln_f.bias", {C}, false, false});
    return t;
}

namespace {
TensorTable table_of(const std::vector<ParamInfo>& info, DType dtype) {
    TensorTable t;
    for (const auto& p : info) t.add(p.name, p.shape, dtype);
    return t;
}
// The first B*T*... elements of a max-sized activation, seen as (B, T, rest).
Tensor bt(Tensor full, int B, int T) {
    Tensor t = full;
    t.shape.dims[0] = B;
    if (full.shape.ndim >= 2) t.shape.dims[1] = T;
    return t;
}
}  // namespace

GPT2::GPT2(Backend& backend, const GPTConfig& config, DType param_dtype, bool recompute)
    : backend_(backend),
      config_(config),
      dtype_(param_dtype),
      recompute_(recompute),
      info_(param_table(config)) {
    config_.validate("model config");
    const TensorTable table = table_of(info_, dtype_);
    params_ = Arena(backend_, table);
    grads_ = Arena(backend_, table);
}

std::vector<std::vector<float>> GPT2::init_host(uint64_t seed) const {
    Rng rng(seed);
    const double std_resid = 0.02 / std::sqrt(2.0 * config_.n_layer);
    std::vector<std::vector<float>> host;
    for (const auto& p : info_) {
        std::vector<float> v(size_t(p.shape.numel()));
        const bool is_ln_weight = p.name.find(".ln_") != std::string::npos && p.name.ends_with(".weight");
        if (is_ln_weight) {
            for (auto& x : v) x = 1.0f;
        } else if (p.shape.ndim >= 2) {
            const double std = p.residual_proj ? std_resid : 0.02;
            for (auto& x : v) x = float(rng.normal() * std);
        }  // biases stay zero
        host.push_back(std::move(v));
    }
    return host;
}

std::vector<std::vector<float>> GPT2::params_to_host() const {
    std::vector<std::vector<float>> host;
    std::vector<uint8_t> raw;
    for (size_t i = 0; i < info_.size(); i++) {
        const Tensor t = params_[i];
        std::vector<float> v(size_t(t.numel()));
        raw.resize(t.nbytes());
        backend_.download(raw.data(), t);
        convert_to_f32(v.data(), raw.data(), t.dtype, v.size());
        host.push_back(std::move(v));
    }
    return host;
}

void GPT2::params_from_host(const std::vector<std::vector<float>>& host) {
    ANVIL_ASSERT(host.size() == info_.size());
    std::vector<uint8_t> raw;
    for (size_t i = 0; i < info_.size(); i++) {
        const Tensor t = params_[i];
        ANVIL_ASSERT(int64_t(host[i].size()) == t.numel());
        raw.resize(t.nbytes());
        convert_from_f32(raw.data(), t.dtype, host[i].data(), host[i].size());
        backend_.upload(t, raw.data());
    }
}

void GPT2::reserve(int max_B, int max_T, bool training) {
    ANVIL_CHECK(max_B > 0 && max_T > 0, "batch size and sequence length must be positive, got {} and {}",
                max_B, max_T);
    ANVIL_CHECK(max_T <= config_.n_ctx,
                "sequence length {} is longer than the model's context {}; use --seq {} "
                "or less",
                max_T, config_.n_ctx, config_.n_ctx);
    ANVIL_ASSERT(acts_.size() == 0);
    max_B_ = max_B;
    max_T_ = max_T;
    training_ = training;
    const int64_t B = max_B, T = max_T, C = config_.n_embd, V = config_.vocab_size, L = config_.n_layer;
    const AttnDims ad{max_B, max_T, config_.n_head, config_.head_size()};
    const DType a = dtype_;
    TensorTable t;
    t.add("tokens", {B, T}, DType::I32);
    t.add("targets", {B, T}, DType::I32);
    t.add("encoded", {B, T, C}, a);
    for (int64_t l = 0; l < L; l++) {
        const int64_t kept = recompute_ ? 0 : B;  // with recompute, ln1/ln2/fch_gelu live in shared buffers
        t.add("ln1", {kept, T, C}, a);
        t.add("ln1_mean", {B, T}, DType::F32);
        t.add("ln1_rstd", {B, T}, DType::F32);
        t.add("qkv", {B, T, 3 * C}, a);
        t.add("atty", {B, T, C}, a);
        t.add("att", {int64_t(backend_.attention_saved_elems(ad))}, a);
        t.add("res2", {B, T, C}, a);
        t.add("ln2", {kept, T, C}, a);
        t.add("ln2_mean", {B, T}, DType::F32);
        t.add("ln2_rstd", {B, T}, DType::F32);
        t.add("fch", {B, T, 4 * C}, a);
        t.add("fch_gelu", {kept, T, 4 * C}, a);
        t.add("res3", {B, T, C}, a);
    }
    t.add("lnf", {B, T, C}, a);
    t.add("lnf_mean", {B, T}, DType::F32);
    t.add("lnf_rstd", {B, T}, DType::F32);
    t.add("logits", {B, T, V}, a);
    t.add("losses", {B, T}, DType::F32);
    t.add("proj", {B, T, C}, a);
    t.add("ln_shared", {recompute_ ? B : 0, T, C}, a);
    t.add("fch_gelu_shared", {recompute_ ? B : 0, T, 4 * C}, a);
    if (training) {
        t.add("dres", {B, T, C}, a);
        t.add("dln", {B, T, C}, a);
        t.add("dqkv", {B, T, 3 * C}, a);
        t.add("datty", {B, T, C}, a);
        t.add("dfch", {B, T, 4 * C}, a);
        t.add("att_scratch", {int64_t(backend_.attention_scratch_elems(ad))}, a);
    }
    acts_ = Arena(backend_, t);
}

void GPT2::release() {
    acts_ = Arena();
    max_B_ = max_T_ = 0;
}

GPT2::Acts GPT2::views(int B, int T) const {
    ANVIL_ASSERT(acts_.size() > 0);
    ANVIL_CHECK(B <= max_B_ && T <= max_T_, "batch ({}, {}) is larger than the reserved ({}, {})", B, T,
                max_B_, max_T_);
    size_t i = 0;
    auto next = [&](bool is_bt = true) { return is_bt ? bt(acts_[i++], B, T) : acts_[i++]; };
    Acts a;
    a.tokens = next();
    a.targets = next();
    a.encoded = next();
    for (int l = 0; l < config_.n_layer; l++) {
        LayerActs la;
        la.ln1 = next();
        la.ln1_mean = next();
        la.ln1_rstd = next();
        la.qkv = next();
        la.atty = next();
        la.att = next(false);
        la.res2 = next();
        la.ln2 = next();
        la.ln2_mean = next();
        la.ln2_rstd = next();
        la.fch = next();
        la.fch_gelu = next();
        la.res3 = next();
        a.layers.push_back(la);
    }
    a.lnf = next();
    a.lnf_mean = next();
    a.lnf_rstd = next();
    a.logits = next();
    a.losses = next();
    a.proj = next();
    const Tensor ln_shared = next(), fchg_shared = next();
    if (recompute_)
        for (LayerActs& la : a.layers) {
            la.ln1 = la.ln2 = ln_shared;
            la.fch_gelu = fchg_shared;
        }
    if (training_) {
        a.dres = next();
        a.dln = next();
        a.dqkv = next();
        a.datty = next();
        a.dfch = next();
        a.att_scratch = next(false);
    }
    ANVIL_ASSERT(i == acts_.size());
    return a;
}

Tensor GPT2::tokens(int B, int T) const {
    return bt(acts_[0], B, T);
}
Tensor GPT2::targets(int B, int T) const {
    return bt(acts_[1], B, T);
}
Tensor GPT2::losses(int B, int T) const {
    return views(B, T).losses;
}
Tensor GPT2::logits(int B, int T) const {
    return views(B, T).logits;
}

void GPT2::zero_grads() {
    backend_.zero(grads_.flat(dtype_));
}

void GPT2::forward(int B, int T, bool with_targets, float dloss) {
    ANVIL_CHECK(T <= config_.n_ctx, "sequence length {} is longer than the model's context {}", T,
                config_.n_ctx);
    ANVIL_CHECK(dloss == 0.0f || (training_ && with_targets),
                "forward: gradients need targets and training buffers");
    Backend& be = backend_;
    const Acts a = views(B, T);
    const int NH = config_.n_head;
    be.embedding_fwd(a.encoded, a.tokens, wte(), wpe());
    Tensor res = a.encoded;
    for (int l = 0; l < config_.n_layer; l++) {
        const LayerActs& la = a.layers[size_t(l)];
        auto P = [&](LayerParam p) { return layer_param(l, p); };
        be.layernorm_fwd(la.ln1, la.ln1_mean, la.ln1_rstd, res, P(kLn1W), P(kLn1B));
        be.matmul_fwd(la.qkv, la.ln1, P(kQkvW), WLayout::InOut, P(kQkvB), {});
        be.attention_fwd(la.atty, la.att, la.qkv, NH);
        be.matmul_fwd(a.proj, la.atty, P(kAttProjW), WLayout::InOut, P(kAttProjB), {});
        be.residual_fwd(la.res2, res, a.proj);
        be.layernorm_fwd(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, P(kLn2W), P(kLn2B));
        be.matmul_fwd(la.fch_gelu, la.ln2, P(kFcW), WLayout::InOut, P(kFcB), la.fch);
        be.matmul_fwd(a.proj, la.fch_gelu, P(kFcProjW), WLayout::InOut, P(kFcProjB), {});
        be.residual_fwd(la.res3, la.res2, a.proj);
        res = la.res3;
    }
    be.layernorm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, res, lnf_w(), lnf_b());
    be.matmul_fwd(a.logits, a.lnf, wte(), WLayout::OutIn, {}, {});
    if (with_targets) be.classifier(a.losses, a.logits, a.targets, dloss, config_.vocab_size);
    last_B_ = B;
    last_T_ = T;
    have_grad_logits_ = dloss != 0.0f;
}

void GPT2::backward() {
    ANVIL_CHECK(have_grad_logits_, "backward: call forward with a nonzero dloss first");
    Backend& be = backend_;
    const int B = last_B_, T = last_T_, NH = config_.n_head, L = config_.n_layer;
    const Acts a = views(B, T);
    // logits now hold dlogits (B,T,V)
    be.matmul_bwd(a.dln, grads_[0], {}, a.logits, a.lnf, wte(), WLayout::OutIn, {});
    be.zero(a.dres);
    const Tensor last_res = a.layers[size_t(L - 1)].res3;
    be.layernorm_bwd(a.dres, grads_[grads_.size() - 2], grads_[grads_.size() - 1], a.dln, last_res, lnf_w(),
                     a.lnf_mean, a.lnf_rstd);
    for (int l = L - 1; l >= 0; l--) {
        const LayerActs& la = a.layers[size_t(l)];
        const Tensor res_in = l == 0 ? a.encoded : a.layers[size_t(l - 1)].res3;
        auto P = [&](LayerParam p) { return layer_param(l, p); };
        auto G = [&](LayerParam p) { return grads_[size_t(2 + l * kLayerParams + p)]; };
        // MLP: dres holds d(res3)
        if (recompute_) be.gelu_fwd(la.fch_gelu, la.fch);
        be.matmul_bwd(a.dfch, G(kFcProjW), G(kFcProjB), a.dres, la.fch_gelu, P(kFcProjW), WLayout::InOut,
                      la.fch);
        if (recompute_) be.layernorm_fwd(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, P(kLn2W), P(kLn2B));
        be.matmul_bwd(a.dln, G(kFcW), G(kFcB), a.dfch, la.ln2, P(kFcW), WLayout::InOut, {});
        be.layernorm_bwd(a.dres, G(kLn2W), G(kLn2B), a.dln, la.res2, P(kLn2W), la.ln2_mean, la.ln2_rstd);
        // attention: dres holds d(res2)
        be.matmul_bwd(a.datty, G(kAttProjW), G(kAttProjB), a.dres, la.atty, P(kAttProjW), WLayout::InOut, {});
        be.attention_bwd(a.dqkv, a.att_scratch, a.datty, la.qkv, la.atty, la.att, NH);
        if (recompute_) be.layernorm_fwd(la.ln1, la.ln1_mean, la.ln1_rstd, res_in, P(kLn1W), P(kLn1B));
        be.matmul_bwd(a.dln, G(kQkvW), G(kQkvB), a.dqkv, la.ln1, P(kQkvW), WLayout::InOut, {});
        be.layernorm_bwd(a.dres, G(kLn1W), G(kLn1B), a.dln, res_in, P(kLn1W), la.ln1_mean, la.ln1_rstd);
    }
    be.embedding_bwd(grads_[0], grads_[1], a.dres, a.tokens);
    have_grad_logits_ = false;
}

}  // namespace anvil
