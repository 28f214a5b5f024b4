#include "model/layers.h"

namespace anvil {

size_t ParamRegistry::add(ParamSpec s) {
    s.dtype = dtype;
    specs.push_back(std::move(s));
    return specs.size() - 1;
}

KvCache::KvCache(Allocator& alloc, int layers, int max_T, int kv_dim, DType dtype) : max_T_(max_T) {
    TensorTable t;
    for (int l = 0; l < layers; l++) {
        t.add("k", {max_T, kv_dim}, dtype);
        t.add("v", {max_T, kv_dim}, dtype);
    }
    arena_ = Arena(alloc, t);
}

// ---- Linear -------------------------------------------------------------------------------------------

Linear::Linear(ParamRegistry& reg, const std::string& name, int in, int out, WLayout layout, bool bias,
               InitRule init, int layer)
    : reg_(&reg), name_(name), in_(in), out_(out), layer_(layer), layout_(layout) {
    const Shape ws = layout == WLayout::InOut ? Shape{in, out} : Shape{out, in};
    w_ = reg.add({name + ".weight", ws, DType::F32, true, init, true, layer, false});
    if (bias) b_ = reg.add({name + ".bias", {out}, DType::F32, true, {Init::Zeros, 0.0}, false, layer, false});
}

Linear Linear::tied(ParamRegistry& reg, size_t weight, WLayout layout) {
    Linear l;
    l.reg_ = &reg;
    l.name_ = reg.specs[weight].name;
    l.w_ = weight;
    l.layout_ = layout;
    const Shape& ws = reg.specs[weight].shape;
    l.in_ = int(layout == WLayout::InOut ? ws[0] : ws[1]);
    l.out_ = int(layout == WLayout::InOut ? ws[1] : ws[0]);
    l.layer_ = reg.specs[weight].layer;
    return l;
}

void Linear::plan(ActPlan& plan) const {
    if (adapter_) adapter_->plan(plan, name_, out_);
}

void Linear::forward(const Pass& p, Tensor out, Tensor in, Tensor pre_gelu) const {
    const ParamStore& s = *reg_->store;
    const Tensor bias = b_ == ParamStore::npos ? Tensor{} : s.param(b_);
    if (!adapter_) return p.be.matmul_fwd(out, in, s.param(w_), layout_, bias, pre_gelu);
    // the adapter adds to the product before the activation
    const Tensor y = pre_gelu.empty() ? out : pre_gelu;
    p.be.matmul_fwd(y, in, s.param(w_), layout_, bias, {});
    adapter_->forward(p, name_, y, in);
    if (!pre_gelu.empty()) p.be.gelu_fwd(out, pre_gelu);
}

void Linear::backward(const Pass& p, Tensor din, Tensor dout, Tensor in, Tensor in_pre_gelu) const {
    const ParamStore& s = *reg_->store;
    const Tensor dbias = b_ == ParamStore::npos ? Tensor{} : s.grad(b_);
    if (!adapter_) return p.be.matmul_bwd(din, s.grad(w_), dbias, dout, in, s.param(w_), layout_, in_pre_gelu);
    p.be.matmul_bwd(din, s.grad(w_), dbias, dout, in, s.param(w_), layout_, {});
    adapter_->backward(p, name_, din, dout, in);
    if (!in_pre_gelu.empty() && !din.empty()) p.be.gelu_bwd(din, din, in_pre_gelu);
}

// ---- Norm ---------------------------------------------------------------------------------------------

Norm::Norm(ParamRegistry& reg, const std::string& name, int dim, int layer, bool recomputable)
    : reg_(&reg),
      name_(name),
      out_(name + ".out"),
      mean_(name + ".mean"),
      rstd_(name + ".rstd"),
      recomputable_(recomputable) {
    w_ = reg.add({name + ".weight", {dim}, DType::F32, true, {Init::Ones, 0.0}, false, layer, false});
    b_ = reg.add({name + ".bias", {dim}, DType::F32, true, {Init::Zeros, 0.0}, false, layer, false});
}

void Norm::plan(ActPlan& plan) const {
    const int64_t C = reg_->specs[w_].shape[0];
    // block norms share one output buffer when it is recomputed
    plan.add(out_, {C}, reg_->dtype, recomputable_ ? Keep::Recomputable : Keep::Saved, "norm.out");
    plan.add(mean_, {}, DType::F32, Keep::Saved, "norm.mean");
    plan.add(rstd_, {}, DType::F32, Keep::Saved, "norm.rstd");
}

void Norm::forward(const Pass& p, Tensor in) const {
    const ParamStore& s = *reg_->store;
    p.be.layernorm_fwd(out(p), p.act(mean_), p.act(rstd_), in, s.param(w_), s.param(b_));
}

void Norm::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const ParamStore& s = *reg_->store;
    p.be.layernorm_bwd(din, s.grad(w_), s.grad(b_), dout, in, s.param(w_), p.act(mean_), p.act(rstd_));
}

// ---- Embedding ----------------------------------------------------------------------------------------

Embedding::Embedding(ParamRegistry& reg, const std::string& tokens, const std::string& positions, int vocab,
                     int n_ctx, int dim, double std)
    : reg_(&reg) {
    wte_ = reg.add({tokens, {vocab, dim}, DType::F32, true, {Init::Normal, std}, true, -1, false});
    wpe_ = reg.add({positions, {n_ctx, dim}, DType::F32, true, {Init::Normal, std}, true, -1, false});
}

void Embedding::forward(const Pass& p, Tensor out, Tensor tokens) const {
    const ParamStore& s = *reg_->store;
    Tensor wpe = s.param(wpe_);  // positions pos0.. : the table from row pos0 on
    ANVIL_CHECK(p.pos0 + p.T <= wpe.dim(0), "position {} is past the model's context {}", p.pos0 + p.T - 1,
                wpe.dim(0));
    wpe.data = static_cast<char*>(wpe.data) + size_t(p.pos0) * size_t(wpe.dim(1)) * dtype_size(wpe.dtype);
    wpe.shape.dims[0] -= p.pos0;
    p.be.embedding_fwd(out, tokens, s.param(wte_), wpe);
}

void Embedding::backward(const Pass& p, Tensor dout, Tensor tokens) const {
    ANVIL_ASSERT(p.pos0 == 0);
    const ParamStore& s = *reg_->store;
    p.be.embedding_bwd(s.grad(wte_), s.grad(wpe_), dout, tokens);
}

// ---- Attention ----------------------------------------------------------------------------------------

Attention::Attention(ParamRegistry& reg, const std::string& prefix, int dim, int heads, int layer, double std,
                     double proj_std)
    : reg_(&reg),
      prefix_(prefix),
      qkv_buf_(prefix + ".qkv"),
      y_buf_(prefix + ".y"),
      saved_buf_(prefix + ".saved"),
      dim_(dim),
      heads_(heads),
      qkv_(reg, prefix + ".c_attn", dim, 3 * dim, WLayout::InOut, true, {Init::Normal, std}, layer),
      proj_(reg, prefix + ".c_proj", dim, dim, WLayout::InOut, true, {Init::Normal, proj_std}, layer) {}

void Attention::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    const int64_t C = dim_;
    const Backend& be = reg_->store->backend();
    const AttnDims d{plan.max_B(), plan.max_T(), heads_, dim_ / heads_};
    plan.add(qkv_buf_, {3 * C}, a, Keep::Saved, "attn.qkv");
    plan.add(y_buf_, {C}, a, Keep::Saved, "attn.y");  // attention output, before the projection
    if (plan.mode() != ActMode::Decode)
        plan.add_flat(saved_buf_, int64_t(be.attention_saved_elems(d)), a, Keep::Saved, "attn.saved");
    plan.add("attn.dy", {C}, a, Keep::Backward);
    plan.add("attn.dqkv", {3 * C}, a, Keep::Backward);
    plan.add_flat("attn.scratch", int64_t(be.attention_scratch_elems(d)), a, Keep::Backward);
    qkv_.plan(plan);
    proj_.plan(plan);
}

void Attention::forward(const Pass& p, Tensor out, Tensor in, int layer) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_);
    qkv_.forward(p, qkv, in);
    if (p.cache) {
        ANVIL_CHECK(p.B == 1, "decoding with a KV cache runs one sequence at a time, got a batch of {}", p.B);
        const Tensor q2 = qkv.view(Shape{p.T, 3 * int64_t(dim_)}), y2 = y.view(Shape{p.T, int64_t(dim_)});
        p.be.attention_cached(y2, q2, p.cache->k(layer), p.cache->v(layer), p.pos0, heads_);
    } else {
        p.be.attention_fwd(y, p.act(saved_buf_), qkv, heads_);
    }
    proj_.forward(p, out, y);
}

void Attention::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_);
    const Tensor dy = p.act("attn.dy"), dqkv = p.act("attn.dqkv");
    proj_.backward(p, dy, dout, y);
    p.be.attention_bwd(dqkv, p.act("attn.scratch"), dy, qkv, y, p.act(saved_buf_), heads_);
    qkv_.backward(p, din, dqkv, in);
}

// ---- Mlp ----------------------------------------------------------------------------------------------

Mlp::Mlp(ParamRegistry& reg, const std::string& prefix, int dim, int hidden, int layer, double std,
         double proj_std)
    : reg_(&reg),
      prefix_(prefix),
      pre_buf_(prefix + ".pre"),
      act_buf_(prefix + ".act"),
      hidden_(hidden),
      fc_(reg, prefix + ".c_fc", dim, hidden, WLayout::InOut, true, {Init::Normal, std}, layer),
      proj_(reg, prefix + ".c_proj", hidden, dim, WLayout::InOut, true, {Init::Normal, proj_std}, layer) {}

void Mlp::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    plan.add(pre_buf_, {hidden_}, a, Keep::Saved, "mlp.pre");         // before the GELU
    plan.add(act_buf_, {hidden_}, a, Keep::Recomputable, "mlp.act");  // after it
    plan.add("mlp.dpre", {hidden_}, a, Keep::Backward);
    fc_.plan(plan);
    proj_.plan(plan);
}

void Mlp::forward(const Pass& p, Tensor out, Tensor in) const {
    const Tensor act = p.act(act_buf_);
    fc_.forward(p, act, in, p.act(pre_buf_));
    proj_.forward(p, out, act);
}

void Mlp::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor pre = p.act(pre_buf_), act = p.act(act_buf_), dpre = p.act("mlp.dpre");
    if (p.acts.recompute()) p.be.gelu_fwd(act, pre);
    proj_.backward(p, dpre, dout, act, pre);
    fc_.backward(p, din, dpre, in);
}

}  // namespace anvil
