#include "model/layers.h"

#include <cmath>

#include "backend/op_checks.h"
#include "core/text.h"

namespace anvil {

size_t ParamRegistry::add(ParamSpec s) {
    if (!s.keep_dtype) s.dtype = dtype;
    specs.push_back(std::move(s));
    return specs.size() - 1;
}

size_t ParamRegistry::add_int8(const std::string& weight_name, Shape shape, int out_dim, int layer,
                               size_t* scale) {
    ParamSpec w{weight_name, shape, DType::I8, false, {Init::Zeros, 0.0}, false, layer, false};
    w.keep_dtype = true;
    w.scale_dim = out_dim;
    ParamSpec sc{
        weight_name + "_scale", {shape[out_dim]}, DType::F32, false, {Init::Ones, 0.0}, false, layer, false};
    sc.keep_dtype = true;
    const size_t i = add(std::move(w));
    *scale = add(std::move(sc));
    return i;
}

namespace {

// Attention of the pass's new queries over the cache, appending their keys and values: the one sequence, or
// each row in its own slot. qkv (B, T, q + 2 kv columns) -> y (B, T, q columns).
void cached_attention(const Pass& p, Tensor y, Tensor qkv, int layer, int heads) {
    const KvCache& c = *p.cache;
    if (!p.row_slot) {
        ANVIL_CHECK(p.B == 1, "decoding with a KV cache runs one sequence per slot, got a batch of {}", p.B);
        p.be.attention_cached(y.slice0(0), qkv.slice0(0), c.k(layer, p.slot), c.v(layer, p.slot), p.pos0,
                              heads);
        return;
    }
    // one token a row (T = 1): every row in one call
    const auto rows = [&](Tensor t) { return t.view(Shape{p.B, t.shape[t.shape.ndim - 1]}); };
    p.be.attention_cached_rows(rows(y), rows(qkv), c.k(layer), c.v(layer), c.pages(), p.row_slots,
                               p.row_positions, heads, p.own_slots);
}

// Attention of a block's packed qkv into y: over the cache when the pass decodes, else causal within the pass
// (into `saved`, what the backward reads; a decoding pass plans none). heads: this rank's query heads.
void attend(const Pass& p, Tensor y, ActId saved, Tensor qkv, int layer, int heads, int tp_rank) {
    if (p.cache)
        cached_attention(p, y, qkv, layer, heads);
    else
        p.be.attention_fwd(y, p.act(saved), qkv, heads, p.attn_drop(layer, tp_rank * heads));
}

}  // namespace

// ---- Linear -------------------------------------------------------------------------------------------

Linear::Linear(ParamRegistry& reg, const std::string& name, int in, int out, WLayout layout, bool bias,
               InitRule init, int layer, Parallel par, int blocks)
    : reg_(&reg),
      name_(name),
      fp8_(reg.fp8 && layer >= 0),
      fp8_kept_(reg.acts.id(name + ".fp8_kept")),
      in_(in),
      out_(out),
      layer_(layer),
      layout_(layout) {
    const TensorParallel& tp = reg.tp;
    Shard ws_shard, b_shard;
    if (tp.on() && par != Parallel::None) {
        parallel_ = par;
        const int split = par == Parallel::Column ? out : in;
        ANVIL_ASSERT(split % (blocks * tp.size) == 0);  // the model checked its heads and MLP width
        // the weight's dimension of the split features, in its layout
        const int out_dim = layout == WLayout::InOut ? 1 : 0;
        if (par == Parallel::Column) {
            out_ = out / tp.size;
            ws_shard = {out_dim, blocks, tp.size, tp.rank};
            b_shard = {0, blocks, tp.size, tp.rank};
        } else {
            in_ = in / tp.size;
            ws_shard = {1 - out_dim, 1, tp.size, tp.rank};
        }
    }
    if (fp8_ && reg.fp8_history > 0) fp8_slot_ = reg.fp8_layers++;
    const Shape ws = layout == WLayout::InOut ? Shape{in_, out_} : Shape{out_, in_};
    if (reg.int8)  // the model refuses tensor parallelism with int8 weights
        w_ = reg.add_int8(name + ".weight", ws, layout == WLayout::InOut ? 1 : 0, layer, &scale_);
    else
        w_ = reg.add({name + ".weight", ws, DType::F32, true, init, true, layer, false, ws_shard});
    if (bias)
        b_ = reg.add(
            {name + ".bias", {out_}, DType::F32, true, {Init::Zeros, 0.0}, false, layer, false, b_shard});
}

Linear Linear::tied(ParamRegistry& reg, size_t weight, WLayout layout, size_t scale) {
    Linear l;
    l.reg_ = &reg;
    l.name_ = reg.specs[weight].name;
    l.w_ = weight;
    l.scale_ = scale;
    l.layout_ = layout;
    const Shape& ws = reg.specs[weight].shape;
    l.in_ = int(layout == WLayout::InOut ? ws[0] : ws[1]);
    l.out_ = int(layout == WLayout::InOut ? ws[1] : ws[0]);
    l.layer_ = reg.specs[weight].layer;
    return l;
}

void Linear::plan(ActPlan& plan) const {
    if (adapter_) adapter_->plan(plan);
    // what the FP8 backward reads instead of rounding `in` and the weight again (Backend::fp8_kept_elems)
    if (fp8_ && plan.training()) {
        const int64_t n = int64_t(
            reg_->store->backend().fp8_kept_elems(plan.max_B() * plan.max_T(), in_, out_, reg_->dtype));
        if (n > 0) plan.add_flat(fp8_kept_, n, reg_->dtype, Keep::Saved, "linear.fp8_kept");
    }
}

Tensor Linear::fp8_kept(const Pass& p) const {
    return p.acts.has(fp8_kept_) ? p.act(fp8_kept_) : Tensor{};
}

Fp8Scaling Linear::fp8_scaling(const Pass& p) const {
    if (fp8_slot_ < 0) return {};
    return {reg_->fp8_state.slice0(fp8_slot_), p.train, p.again};
}

void Linear::forward(const Pass& p, Tensor out, Tensor in, Tensor pre_gelu) const {
    const ParamStore& s = *reg_->store;
    // row-parallel: the outputs are partial sums, summed over the ranks afterwards; one rank adds the bias
    const bool add_bias = b_ != ParamStore::npos && !(parallel_ == Parallel::Row && reg_->tp.rank != 0);
    const Tensor bias = add_bias ? s.param(b_) : Tensor{};
    const auto product = [&](Tensor o, Tensor pg) {
        if (fp8_)
            return p.be.matmul_fp8_fwd(o, in, s.param(w_), layout_, bias, pg, fp8_kept(p), fp8_scaling(p));
        if (scale_ == ParamStore::npos) return p.be.matmul_fwd(o, in, s.param(w_), layout_, bias, pg);
        p.be.matmul_q8_fwd(o, in, s.param(w_), s.param(scale_), layout_, bias, pg);
    };
    if (!adapter_) return product(out, pre_gelu);
    // the adapter adds to the product before the activation
    const Tensor y = pre_gelu.empty() ? out : pre_gelu;
    product(y, {});
    adapter_->forward(p, y, in);
    if (!pre_gelu.empty()) p.be.gelu_fwd(out, pre_gelu);
}

void Linear::recompute_gelu(const Pass& p, Tensor out, Tensor in, Tensor pre_gelu) const {
    // (an int8 weight's product runs again too: on CUDA its many-row form is matmul_fwd's on the dequantized
    // weight, the epilogue included)
    if (!adapter_ && !fp8_ && pre_gelu.dtype != DType::F32) return forward(p, out, in, pre_gelu);
    p.be.gelu_fwd(out, pre_gelu);
}

bool Linear::backward_reads_input() const {
    return adapter_ || fp8_ || !reg_->store->grad(w_).empty();
}

void Linear::backward(const Pass& p, Tensor din, Tensor dout, Tensor in, Tensor in_pre_gelu) const {
    const ParamStore& s = *reg_->store;
    const Tensor dbias = b_ == ParamStore::npos ? Tensor{} : s.grad(b_);
    const auto product = [&](Tensor pg) {
        if (fp8_)
            return p.be.matmul_fp8_bwd(din, s.grad(w_), dbias, dout, in, s.param(w_), layout_, pg,
                                       fp8_kept(p), fp8_scaling(p));
        if (scale_ == ParamStore::npos)
            return p.be.matmul_bwd(din, s.grad(w_), dbias, dout, in, s.param(w_), layout_, pg);
        ANVIL_CHECK(dbias.empty(), "{}: an int8 layer is a frozen base; its bias takes no gradient", name_);
        if (!din.empty()) p.be.matmul_q8_bwd(din, dout, s.param(w_), s.param(scale_), layout_, pg);
    };
    if (!adapter_) return product(in_pre_gelu);
    product({});
    adapter_->backward(p, din, dout, in);
    if (!in_pre_gelu.empty() && !din.empty()) p.be.gelu_bwd(din, din, in_pre_gelu);
}

// ---- LinearGroup --------------------------------------------------------------------------------------

LinearGroup::LinearGroup(std::initializer_list<const Linear*> parts) {
    ANVIL_ASSERT(parts.size() >= 1 && parts.size() <= size_t(kMaxParts));
    for (const Linear* l : parts) parts_[n_++] = l;
    fused_ = joinable() && env_not_off("ANVIL_FUSE_PROJECTIONS");
}

void LinearGroup::join(ParamRegistry& reg, std::initializer_list<Linear*> parts) {
    // Each part registered its weight and then its bias (Qwen2's q, k and v): [w0 b0 w1 b1 ...] becomes
    // [w0 w1 ... b0 b1 ...]. Nothing else lies in that range, and names, not positions, find entries in
    // checkpoints; a bias is zeros and draws nothing, so the weights' initial values stay the same.
    const Linear* first = *parts.begin();
    bool interleaved = first->b_ != ParamStore::npos && first->scale_ == ParamStore::npos;
    size_t k = 0;
    for (const Linear* l : parts) {
        interleaved = interleaved && l->w_ == first->w_ + 2 * k && l->b_ == l->w_ + 1;
        k++;
    }
    if (interleaved && parts.size() > 1) {
        const size_t base = first->w_, n = parts.size();
        std::vector<ParamSpec> moved(reg.specs.begin() + ptrdiff_t(base),
                                     reg.specs.begin() + ptrdiff_t(base + 2 * n));
        k = 0;
        for (Linear* l : parts) {
            reg.specs[base + k] = std::move(moved[2 * k]);
            reg.specs[base + n + k] = std::move(moved[2 * k + 1]);
            l->w_ = base + k;
            l->b_ = base + n + k;
            k++;
        }
    }
    const Linear* prev = nullptr;
    for (const Linear* l : parts) {
        if (prev && l->w_ == prev->w_ + 1) reg.specs[l->w_].joined = true;
        if (prev && l->b_ != ParamStore::npos && l->b_ == prev->b_ + 1) reg.specs[l->b_].joined = true;
        prev = l;
    }
}

bool LinearGroup::joinable() const {
    if (n_ < 2) return false;
    const ParamStore& s = *parts_[0]->reg_->store;
    const Linear& a = *parts_[0];
    const bool bias = a.b_ != ParamStore::npos;
    // entry i's tensor right after entry j's (or both absent: a frozen entry has no gradient)
    const auto follows = [](const Tensor& prev, const Tensor& t) {
        if (prev.empty() || t.empty()) return prev.empty() && t.empty();
        return t.dtype == prev.dtype && static_cast<const char*>(prev.data) + prev.nbytes() == t.data;
    };
    for (int i = 0; i < n_; i++) {
        const Linear& l = *parts_[i];
        if (l.adapter_ || l.fp8_ || l.scale_ != ParamStore::npos || l.layout_ != WLayout::OutIn ||
            l.parallel_ == Parallel::Row || l.in_ != a.in_ || (l.b_ != ParamStore::npos) != bias)
            return false;
        if (i == 0) continue;
        const Linear& prev = *parts_[i - 1];
        if (!follows(s.param(prev.w_), s.param(l.w_)) || !follows(s.grad(prev.w_), s.grad(l.w_)))
            return false;
        if (bias && (!follows(s.param(prev.b_), s.param(l.b_)) || !follows(s.grad(prev.b_), s.grad(l.b_))))
            return false;
    }
    return true;
}

LinearGroup::Stacked LinearGroup::stacked(int64_t total) const {
    const ParamStore& s = *parts_[0]->reg_->store;
    const Linear& a = *parts_[0];
    const bool bias = a.b_ != ParamStore::npos;
    // the first part's storage seen whole (a frozen entry's gradient stays empty)
    const auto whole = [](Tensor t, Shape shape) { return t.empty() ? t : (t.shape = shape, t); };
    return {whole(s.param(a.w_), Shape{total, a.in_}), whole(s.grad(a.w_), Shape{total, a.in_}),
            bias ? whole(s.param(a.b_), Shape{total}) : Tensor{},
            bias ? whole(s.grad(a.b_), Shape{total}) : Tensor{}};
}

void LinearGroup::forward(const Pass& p, Tensor out, Tensor in) const {
    if (!fused_) {
        int64_t c0 = 0;
        for (int i = 0; i < n_; i++) {
            parts_[i]->forward(p, out.cols(c0, parts_[i]->out_), in);
            c0 += parts_[i]->out_;
        }
        return;
    }
    const Stacked st = stacked(cols(out));
    p.be.matmul_fwd(out, in, st.w, WLayout::OutIn, st.b, {});
}

Tensor LinearGroup::grad_part(Tensor dout, int i) const {
    int64_t c0 = 0;
    for (int j = 0; j < i; j++) c0 += parts_[j]->out_;
    const int64_t w = parts_[i]->out_;
    if (fused_) return dout.cols(c0, w);
    Shape shape = dout.shape;
    shape.dims[size_t(shape.ndim - 1)] = w;
    return dout.range(size_t(rows(dout) * c0), size_t(rows(dout) * w)).view(shape);
}

void LinearGroup::backward(const Pass& p, Tensor din, Tensor dout, Tensor in, Tensor dx) const {
    if (!fused_) {
        for (int i = 0; i < n_; i++) {
            parts_[i]->backward(p, i == 0 || din.empty() ? din : dx, grad_part(dout, i), in);
            if (i > 0 && !din.empty()) p.be.residual_fwd(din, din, dx);
        }
        return;
    }
    const Stacked st = stacked(cols(dout));
    p.be.matmul_bwd(din, st.dw, st.db, dout, in, st.w, WLayout::OutIn, {});
}

// ---- Norm ---------------------------------------------------------------------------------------------

Norm::Norm(ParamRegistry& reg, const std::string& name, int dim, int layer, bool recomputable, NormKind kind,
           float eps)
    : reg_(&reg),
      name_(name),
      out_(reg.acts.id(name + ".out")),
      mean_(reg.acts.id(name + ".mean")),
      rstd_(reg.acts.id(name + ".rstd")),
      recomputable_(recomputable),
      kind_(kind),
      eps_(eps) {
    w_ = reg.add({name + ".weight", {dim}, DType::F32, true, {Init::Ones, 0.0}, false, layer, false});
    if (kind == NormKind::Layer)
        b_ = reg.add({name + ".bias", {dim}, DType::F32, true, {Init::Zeros, 0.0}, false, layer, false});
}

void Norm::plan(ActPlan& plan) const {
    const int64_t C = reg_->specs[w_].shape[0];
    // block norms share one output buffer when it is recomputed
    plan.add(out_, {C}, reg_->dtype, recomputable_ ? Keep::Recomputable : Keep::Saved, "norm.out");
    if (kind_ == NormKind::Layer) plan.add(mean_, {}, DType::F32, Keep::Saved, "norm.mean");
    plan.add(rstd_, {}, DType::F32, Keep::Saved, "norm.rstd");
}

void Norm::forward(const Pass& p, Tensor in) const {
    const ParamStore& s = *reg_->store;
    if (kind_ == NormKind::Rms) return p.be.rmsnorm_fwd(out(p), p.act(rstd_), in, s.param(w_), eps_);
    p.be.layernorm_fwd(out(p), p.act(mean_), p.act(rstd_), in, s.param(w_), s.param(b_));
}

void Norm::forward_add(const Pass& p, Tensor sum, Tensor a, Tensor b) const {
    const ParamStore& s = *reg_->store;
    const bool layer = kind_ == NormKind::Layer;
    p.be.add_norm_fwd(sum, out(p), layer ? p.act(mean_) : Tensor{}, p.act(rstd_), a, b, s.param(w_),
                      layer ? s.param(b_) : Tensor{}, eps_);
}

void Norm::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const ParamStore& s = *reg_->store;
    if (kind_ == NormKind::Rms) return p.be.rmsnorm_bwd(din, s.grad(w_), dout, in, s.param(w_), p.act(rstd_));
    p.be.layernorm_bwd(din, s.grad(w_), s.grad(b_), dout, in, s.param(w_), p.act(mean_), p.act(rstd_));
}

// ---- Embedding ----------------------------------------------------------------------------------------

Embedding::Embedding(ParamRegistry& reg, const std::string& tokens, const std::string& positions, int vocab,
                     int n_ctx, int dim, double std)
    : reg_(&reg) {
    if (reg.int8)  // a row of the table is an output channel of the tied head
        wte_ = reg.add_int8(tokens, {vocab, dim}, 0, -1, &wte_scale_);
    else
        wte_ = reg.add({tokens, {vocab, dim}, DType::F32, true, {Init::Normal, std}, true, -1, false});
    if (!positions.empty())
        wpe_ = reg.add({positions, {n_ctx, dim}, DType::F32, true, {Init::Normal, std}, true, -1, false});
}

void Embedding::forward(const Pass& p, Tensor out, Tensor tokens) const {
    const ParamStore& s = *reg_->store;
    const auto lookup = [&](Tensor o, Tensor ids, Tensor wpe) {
        if (wte_scale_ == ParamStore::npos) return p.be.embedding_fwd(o, ids, s.param(wte_), wpe);
        p.be.embedding_q8_fwd(o, ids, s.param(wte_), s.param(wte_scale_), wpe);
    };
    if (wpe_ == ParamStore::npos) return lookup(out, tokens, {});
    // positions pos0.. : the table from row pos0 on
    auto from = [&](int pos0, int T) {
        Tensor wpe = s.param(wpe_);
        ANVIL_CHECK(pos0 + T <= wpe.dim(0), "position {} is past the model's context {}", pos0 + T - 1,
                    wpe.dim(0));
        wpe.data = static_cast<char*>(wpe.data) + size_t(pos0) * size_t(wpe.dim(1)) * dtype_size(wpe.dtype);
        wpe.shape.dims[0] -= pos0;
        return wpe;
    };
    if (!p.row_pos) return lookup(out, tokens, from(p.pos0, p.T));
    // a decode step, one token a row, each at its own position: the tokens in one lookup, then the positions
    ANVIL_ASSERT(p.T == 1);
    lookup(out, tokens, {});
    p.be.embedding_rows_add(out.view(Shape{p.B, out.shape[out.shape.ndim - 1]}), s.param(wpe_),
                            p.row_positions);
}

void Embedding::backward(const Pass& p, Tensor dout, Tensor tokens) const {
    ANVIL_ASSERT(p.pos0 == 0);
    const ParamStore& s = *reg_->store;
    p.be.embedding_bwd(s.grad(wte_), wpe_ == ParamStore::npos ? Tensor{} : s.grad(wpe_), dout, tokens);
}

// ---- Attention ----------------------------------------------------------------------------------------

Attention::Attention(ParamRegistry& reg, const std::string& prefix, int dim, int heads, int layer, double std,
                     double proj_std)
    : reg_(&reg),
      qkv_buf_(reg.acts.id(prefix + ".qkv")),
      y_buf_(reg.acts.id(prefix + ".y")),
      saved_buf_(reg.acts.id(prefix + ".saved")),
      dy_(reg.acts.id("attn.dy")),
      dqkv_(reg.acts.id("attn.dqkv")),
      scratch_(reg.acts.id("attn.scratch")),
      dim_(dim / reg.tp.size),  // this rank's heads
      heads_(heads / reg.tp.size),
      layer_(layer),
      qkv_(reg, prefix + ".c_attn", dim, 3 * dim, WLayout::InOut, true, {Init::Normal, std}, layer,
           Parallel::Column, 3),
      proj_(reg, prefix + ".c_proj", dim, dim, WLayout::InOut, true, {Init::Normal, proj_std}, layer,
            Parallel::Row) {}

void Attention::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    const int64_t C = dim_;
    const Backend& be = reg_->store->backend();
    const AttnDims d{plan.max_B(), plan.max_T(), heads_, dim_ / heads_, a};
    plan.add(qkv_buf_, {3 * C}, a, Keep::Saved, "attn.qkv");
    plan.add(y_buf_, {C}, a, Keep::Saved, "attn.y");  // attention output, before the projection
    if (plan.mode() != ActMode::Decode)
        plan.add_flat(saved_buf_, int64_t(be.attention_saved_elems(d)), a, Keep::Saved, "attn.saved");
    plan.add(dy_, {C}, a, Keep::Backward);
    plan.add(dqkv_, {3 * C}, a, Keep::Backward);
    plan.add_flat(scratch_, int64_t(be.attention_scratch_elems(d)), a, Keep::Backward);
    qkv_.plan(plan);
    proj_.plan(plan);
}

void Attention::forward(const Pass& p, Tensor out, Tensor in) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_);
    qkv_.forward(p, qkv, in);
    attend(p, y, saved_buf_, qkv, layer_, heads_, reg_->tp.rank);
    proj_.forward(p, out, y);
}

void Attention::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_);
    const Tensor dy = p.act(dy_), dqkv = p.act(dqkv_);
    proj_.backward(p, dy, dout, y);
    p.be.attention_bwd(dqkv, p.act(scratch_), dy, qkv, y, p.act(saved_buf_), heads_,
                       p.attn_drop(layer_, reg_->tp.rank * heads_));
    qkv_.backward(p, din, dqkv, in);
}

// ---- Mlp ----------------------------------------------------------------------------------------------

Mlp::Mlp(ParamRegistry& reg, const std::string& prefix, int dim, int hidden, int layer, double std,
         double proj_std)
    : reg_(&reg),
      pre_buf_(reg.acts.id(prefix + ".pre")),
      act_buf_(reg.acts.id(prefix + ".act")),
      dpre_(reg.acts.id("mlp.dpre")),
      hidden_(hidden / reg.tp.size),  // this rank's columns
      fc_(reg, prefix + ".c_fc", dim, hidden, WLayout::InOut, true, {Init::Normal, std}, layer,
          Parallel::Column),
      proj_(reg, prefix + ".c_proj", hidden, dim, WLayout::InOut, true, {Init::Normal, proj_std}, layer,
            Parallel::Row) {}

void Mlp::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    plan.add(pre_buf_, {hidden_}, a, Keep::Saved, "mlp.pre");         // before the GELU
    plan.add(act_buf_, {hidden_}, a, Keep::Recomputable, "mlp.act");  // after it
    plan.add(dpre_, {hidden_}, a, Keep::Backward);
    fc_.plan(plan);
    proj_.plan(plan);
}

void Mlp::forward(const Pass& p, Tensor out, Tensor in) const {
    const Tensor act = p.act(act_buf_);
    fc_.forward(p, act, in, p.act(pre_buf_));
    proj_.forward(p, out, act);
}

void Mlp::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor pre = p.act(pre_buf_), act = p.act(act_buf_), dpre = p.act(dpre_);
    // the GELU's output is read again only by c_proj's weight gradient or adapter (QLoRA on c_attn: neither)
    if (p.acts.recompute() && proj_.backward_reads_input()) fc_.recompute_gelu(p, act, in, pre);
    proj_.backward(p, dpre, dout, act, pre);
    fc_.backward(p, din, dpre, in);
}

}  // namespace anvil

namespace anvil {

// ---- rotary frequencies -------------------------------------------------------------------------------

std::vector<float> rope_inv_freq(int head_size, double theta, const RopeScaling& sc) {
    const int half = head_size / 2;
    std::vector<float> f(static_cast<size_t>(half));
    constexpr double kPi = 3.14159265358979323846;
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / std::pow(theta, double(2 * i) / double(head_size));
        if (sc.type == "linear") {
            inv /= sc.factor;
        } else if (sc.type == "llama3") {  // transformers' _compute_llama3_parameters
            const double old = sc.original_max_position_embeddings;
            const double low_wavelen = old / sc.low_freq_factor, high_wavelen = old / sc.high_freq_factor;
            const double wavelen = 2.0 * kPi / inv;
            if (wavelen > low_wavelen) {
                inv /= sc.factor;
            } else if (wavelen >= high_wavelen) {  // between the two: interpolate
                const double smooth =
                    (old / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
                inv = (1.0 - smooth) * inv / sc.factor + smooth * inv;
            }
        }
        f[size_t(i)] = float(inv);
    }
    return f;
}

// ---- RotaryAttention ----------------------------------------------------------------------------------

RotaryAttention::RotaryAttention(ParamRegistry& reg, const std::string& prefix, int dim, int heads,
                                 int kv_heads, int head_size, int layer, double std, bool qkv_bias,
                                 bool o_bias)
    : reg_(&reg),
      qkv_buf_(reg.acts.id(prefix + ".qkv")),
      y_buf_(reg.acts.id(prefix + ".y")),
      saved_buf_(reg.acts.id(prefix + ".saved")),
      dy_(reg.acts.id("rattn.dy")),
      dqkv_(reg.acts.id("rattn.dqkv")),
      drot_(reg.acts.id("rattn.drot")),
      dx_(reg.acts.id("rattn.dx")),
      scratch_(reg.acts.id("rattn.scratch")),
      heads_(heads / reg.tp.size),  // this rank's query and key/value heads
      kv_heads_(kv_heads / reg.tp.size),
      hs_(head_size),
      layer_(layer),
      q_(reg, prefix + ".q_proj", dim, heads * head_size, WLayout::OutIn, qkv_bias, {Init::Normal, std},
         layer, Parallel::Column),
      k_(reg, prefix + ".k_proj", dim, kv_heads * head_size, WLayout::OutIn, qkv_bias, {Init::Normal, std},
         layer, Parallel::Column),
      v_(reg, prefix + ".v_proj", dim, kv_heads * head_size, WLayout::OutIn, qkv_bias, {Init::Normal, std},
         layer, Parallel::Column),
      o_(reg, prefix + ".o_proj", heads * head_size, dim, WLayout::OutIn, o_bias, {Init::Normal, std}, layer,
         Parallel::Row) {
    LinearGroup::join(reg, {&q_, &k_, &v_});
}

void RotaryAttention::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    const int64_t QC = int64_t(heads_) * hs_, KC = int64_t(kv_heads_) * hs_, C = q_.in_features();
    const Backend& be = reg_->store->backend();
    const AttnDims d{plan.max_B(), plan.max_T(), heads_, hs_, a};
    // [q | k | v], the key/value heads once each; the three projections write their columns (strided views)
    plan.add(qkv_buf_, {QC + 2 * KC}, a, Keep::Saved, "rattn.qkv");
    plan.add(y_buf_, {QC}, a, Keep::Saved, "rattn.y");
    if (plan.mode() != ActMode::Decode)
        plan.add_flat(saved_buf_, int64_t(be.attention_saved_elems(d)), a, Keep::Saved, "rattn.saved");
    plan.add(dy_, {QC}, a, Keep::Backward);
    plan.add(dqkv_, {3 * QC}, a, Keep::Backward);
    plan.add(drot_, {QC + 2 * KC}, a, Keep::Backward);  // dq, dk, dv: LinearGroup::grad_part
    plan.add(dx_, {C}, a, Keep::Backward);
    plan.add_flat(scratch_, int64_t(be.attention_scratch_elems(d)), a, Keep::Backward);
    for (const Linear* l : {&q_, &k_, &v_, &o_}) l->plan(plan);
}

void RotaryAttention::forward(const Pass& p, Tensor out, Tensor in) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_);
    // [q (QC) | k (KC) | v (KC)] in each row of qkv, written in place (no packing copy); q and k side by side
    // take one rotation over their heads
    const int64_t QC = int64_t(heads_) * hs_, KC = int64_t(kv_heads_) * hs_;
    LinearGroup{&q_, &k_, &v_}.forward(p, qkv, in);
    const Tensor qk = qkv.cols(0, QC + KC);
    if (p.row_pos)  // each row at its own position
        p.be.rope_rows(qk, inv_freq_, heads_ + kv_heads_, p.row_positions, false);
    else
        p.be.rope(qk, inv_freq_, heads_ + kv_heads_, p.pos0, false);
    attend(p, y, saved_buf_, qkv, layer_, heads_, reg_->tp.rank);
    o_.forward(p, out, y);
}

void RotaryAttention::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor qkv = p.act(qkv_buf_), y = p.act(y_buf_), dy = p.act(dy_), dqkv = p.act(dqkv_);
    const LinearGroup qkv_proj{&q_, &k_, &v_};
    const bool fused = qkv_proj.fused();
    o_.backward(p, dy, dout, y);
    p.be.attention_bwd(dqkv, p.act(scratch_), dy, qkv, y, p.act(saved_buf_), heads_,
                       p.attn_drop(layer_, reg_->tp.rank * heads_));
    // [dq | dk | dv]: with a key/value head per query head and the projections as one product, dqkv is it
    const bool in_place = fused && kv_heads_ == heads_;
    const Tensor drot = in_place ? dqkv : p.act(drot_);
    const Tensor dq = qkv_proj.grad_part(drot, 0), dk = qkv_proj.grad_part(drot, 1);
    if (!in_place) p.be.qkv_unpack(dq, dk, qkv_proj.grad_part(drot, 2), dqkv, heads_);
    if (fused) {  // dq and dk side by side: one rotation back
        p.be.rope(drot.cols(0, dq.cols() + dk.cols()), inv_freq_, heads_ + kv_heads_, p.pos0, true);
    } else {
        p.be.rope(dq, inv_freq_, heads_, p.pos0, true);
        p.be.rope(dk, inv_freq_, kv_heads_, p.pos0, true);
    }
    qkv_proj.backward(p, din, drot, in, p.act(dx_));
}

// ---- GatedMlp -----------------------------------------------------------------------------------------

GatedMlp::GatedMlp(ParamRegistry& reg, const std::string& prefix, int dim, int hidden, int layer, double std,
                   bool bias)
    : reg_(&reg),
      gu_buf_(reg.acts.id(prefix + ".gate_up")),
      act_buf_(reg.acts.id(prefix + ".act")),
      dact_(reg.acts.id("gmlp.dact")),
      dgu_(reg.acts.id("gmlp.dgate_up")),
      dx_(reg.acts.id("gmlp.dx")),
      dim_(dim),
      hidden_(hidden / reg.tp.size),  // this rank's columns
      gate_(reg, prefix + ".gate_proj", dim, hidden, WLayout::OutIn, bias, {Init::Normal, std}, layer,
            Parallel::Column),
      up_(reg, prefix + ".up_proj", dim, hidden, WLayout::OutIn, bias, {Init::Normal, std}, layer,
          Parallel::Column),
      down_(reg, prefix + ".down_proj", hidden, dim, WLayout::OutIn, bias, {Init::Normal, std}, layer,
            Parallel::Row) {
    LinearGroup::join(reg, {&gate_, &up_});
}

void GatedMlp::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    plan.add(gu_buf_, {2 * int64_t(hidden_)}, a, Keep::Saved, "gmlp.gate_up");  // [gate | up] in each row
    plan.add(act_buf_, {hidden_}, a, Keep::Recomputable, "gmlp.act");
    plan.add(dact_, {hidden_}, a, Keep::Backward);
    plan.add(dgu_, {2 * int64_t(hidden_)}, a, Keep::Backward);  // dgate, dup: LinearGroup::grad_part
    plan.add(dx_, {dim_}, a, Keep::Backward);
    for (const Linear* l : {&gate_, &up_, &down_}) l->plan(plan);
}

void GatedMlp::forward(const Pass& p, Tensor out, Tensor in) const {
    const Tensor gu = p.act(gu_buf_), act = p.act(act_buf_);
    LinearGroup{&gate_, &up_}.forward(p, gu, in);
    p.be.swiglu_fwd(act, gu.cols(0, hidden_), gu.cols(hidden_, hidden_));
    down_.forward(p, out, act);
}

void GatedMlp::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const Tensor gu = p.act(gu_buf_), act = p.act(act_buf_), dact = p.act(dact_), dgu = p.act(dgu_);
    const Tensor g = gu.cols(0, hidden_), u = gu.cols(hidden_, hidden_);
    const LinearGroup gate_up{&gate_, &up_};
    if (p.acts.recompute()) p.be.swiglu_fwd(act, g, u);
    down_.backward(p, dact, dout, act);
    p.be.swiglu_bwd(gate_up.grad_part(dgu, 0), gate_up.grad_part(dgu, 1), dact, g, u);
    gate_up.backward(p, din, dgu, in, p.act(dx_));
}

}  // namespace anvil
