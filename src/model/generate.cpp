#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace anvil {

int32_t sample_token(std::vector<float>& logits, const SampleOptions& opt, Rng& rng) {
    const int V = int(logits.size());
    if (opt.temperature <= 0.0f)
        return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    int keep = V;
    if (opt.top_k > 0 && opt.top_k < V) {
        keep = opt.top_k;
        std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                          [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    } else {
        std::sort(idx.begin(), idx.end(),
                  [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    }
    const float mx = logits[size_t(idx[0])];
    std::vector<double> p(static_cast<size_t>(keep));
    double sum = 0.0;
    for (int i = 0; i < keep; i++) {
        p[size_t(i)] = std::exp(double(logits[size_t(idx[size_t(i)])] - mx) / opt.temperature);
        sum += p[size_t(i)];
    }
    if (opt.top_p < 1.0f) {  // smallest prefix (by probability) whose mass reaches top_p
        double acc = 0.0;
        int n = 0;
        while (n < keep) {
            acc += p[size_t(n)] / sum;
            n++;
            if (acc >= opt.top_p) break;
        }
        keep = n;
        sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
    }
    double u = rng.uniform() * sum;
    for (int i = 0; i < keep; i++) {
        u -= p[size_t(i)];
        if (u <= 0.0) return idx[size_t(i)];
    }
    return idx[size_t(keep - 1)];
}

Generator::Generator(GPT2& model) : model_(model) {
    const GPTConfig& c = model.config();
    const int64_t T = c.n_ctx, C = c.n_embd, V = c.vocab_size;
    const DType a = model.params()[0].dtype;
    TensorTable t;
    for (int l = 0; l < c.n_layer; l++) {
        t.add("k", {T, C}, a);
        t.add("v", {T, C}, a);
    }
    for (auto [name, shape, dt] :
         std::initializer_list<std::tuple<const char*, Shape, DType>>{{"tok", {1, T}, DType::I32},
                                                                      {"x", {T, C}, a},
                                                                      {"ln", {T, C}, a},
                                                                      {"mean", {T}, DType::F32},
                                                                      {"rstd", {T}, DType::F32},
                                                                      {"qkv", {T, 3 * C}, a},
                                                                      {"atty", {T, C}, a},
                                                                      {"proj", {T, C}, a},
                                                                      {"x2", {T, C}, a},
                                                                      {"fch", {T, 4 * C}, a},
                                                                      {"fchg", {T, 4 * C}, a},
                                                                      {"logits", {1, V}, a}})
        t.add(name, shape, dt);
    cache_ = Arena(model.backend(), t);
    size_t i = 0;
    for (int l = 0; l < c.n_layer; l++) {
        k_.push_back(cache_[i++]);
        v_.push_back(cache_[i++]);
    }
    for (Tensor* p : {&tok_, &x_, &ln_, &mean_, &rstd_, &qkv_, &atty_, &proj_, &x2_, &fch_, &fchg_, &logits_})
        *p = cache_[i++];
}

namespace {
Tensor rows(Tensor t, int n) {
    t.shape.dims[0] = n;
    return t;
}
}  // namespace

void Generator::step(const int32_t* ids, int n, int pos0, std::vector<float>& logits) {
    Backend& be = model_.backend();
    const GPTConfig& c = model_.config();
    // Positions pos0..pos0+n-1: embed with the position table shifted by pos0.
    Tensor tok = tok_;
    tok.shape = Shape{1, n};
    be.upload(tok, ids);
    Tensor wpe = model_.wpe();
    wpe.data = static_cast<char*>(wpe.data) + size_t(pos0) * size_t(c.n_embd) * dtype_size(wpe.dtype);
    wpe.shape.dims[0] = c.n_ctx - pos0;
    Tensor x = rows(x_, n).view(Shape{1, n, c.n_embd});
    be.embedding_fwd(x, tok, model_.wte(), wpe);
    x = x.view(Shape{n, c.n_embd});
    Tensor x2 = rows(x2_, n);
    for (int l = 0; l < c.n_layer; l++) {
        auto P = [&](LayerParam p) { return model_.layer_param(l, p); };
        Tensor ln = rows(ln_, n), mean = rows(mean_, n), rstd = rows(rstd_, n), qkv = rows(qkv_, n);
        Tensor atty = rows(atty_, n), proj = rows(proj_, n), fch = rows(fch_, n), fchg = rows(fchg_, n);
        be.layernorm_fwd(ln, mean, rstd, x, P(kLn1W), P(kLn1B));
        be.matmul_fwd(qkv, ln, P(kQkvW), WLayout::InOut, P(kQkvB), {});
        be.attention_cached(atty, qkv, k_[size_t(l)], v_[size_t(l)], pos0, c.n_head);
        be.matmul_fwd(proj, atty, P(kAttProjW), WLayout::InOut, P(kAttProjB), {});
        be.residual_fwd(x2, x, proj);
        be.layernorm_fwd(ln, mean, rstd, x2, P(kLn2W), P(kLn2B));
        be.matmul_fwd(fchg, ln, P(kFcW), WLayout::InOut, P(kFcB), fch);
        be.matmul_fwd(proj, fchg, P(kFcProjW), WLayout::InOut, P(kFcProjB), {});
        be.residual_fwd(x, x2, proj);
    }
    // Only the last position's logits are needed.
    Tensor last = x.slice0(n - 1).view(Shape{1, c.n_embd});
    Tensor ln = rows(ln_, 1), mean = rows(mean_, 1), rstd = rows(rstd_, 1);
    be.layernorm_fwd(ln, mean, rstd, last, model_.lnf_w(), model_.lnf_b());
    be.matmul_fwd(logits_, ln, model_.wte(), WLayout::OutIn, {}, {});
    std::vector<uint8_t> raw(logits_.nbytes());
    be.download(raw.data(), logits_);
    logits.resize(size_t(c.vocab_size));
    convert_to_f32(logits.data(), raw.data(), logits_.dtype, logits.size());
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SampleOptions& opt,
                                         const std::function<void(int32_t)>& on_token) {
    const int n_ctx = model_.config().n_ctx;
    ANVIL_CHECK(!prompt.empty(), "generate: the prompt is empty; give at least one token");
    for (int32_t id : prompt)
        ANVIL_CHECK(id >= 0 && id < model_.config().vocab_size,
                    "generate: prompt token {} is outside the model's "
                    "vocabulary of {}",
                    id, model_.config().vocab_size);
    Rng rng(opt.seed);
    std::vector<int32_t> ctx = prompt;
    if (int(ctx.size()) > n_ctx) ctx.erase(ctx.begin(), ctx.end() - n_ctx);  // keep the most recent context
    std::vector<float> logits;
    std::vector<int32_t> out;
    step(ctx.data(), int(ctx.size()), 0, logits);
    int pos = int(ctx.size());
    for (int i = 0; i < opt.max_new_tokens; i++) {
        if (opt.vocab_real > 0 && size_t(opt.vocab_real) < logits.size())
            logits.resize(size_t(opt.vocab_real));
        const int32_t next = sample_token(logits, opt, rng);
        out.push_back(next);
        if (on_token) on_token(next);
        if (next == opt.stop_token || i + 1 == opt.max_new_tokens) break;
        ctx.push_back(next);
        if (pos == n_ctx) {  // full: rebuild the cache from the most recent half of the context
            const int keep = n_ctx / 2;
            std::vector<int32_t> tail(ctx.end() - keep, ctx.end());
            step(tail.data(), keep, 0, logits);
            pos = keep;
        } else {
            step(&next, 1, pos, logits);
            pos++;
        }
    }
    return out;
}

}  // namespace anvil
