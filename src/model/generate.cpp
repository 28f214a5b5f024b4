#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/logprobs.h"

namespace anvil {

TokenCounts::TokenCounts(const std::vector<int32_t>& prompt, const SampleOptions& opt)
    : opt_(&opt),
      count_(opt.repetition_penalty != 1.0f || opt.presence_penalty != 0.0f ||
             opt.frequency_penalty != 0.0f) {
    if (opt.repetition_penalty != 1.0f) prompt_.insert(prompt.begin(), prompt.end());
}

void TokenCounts::add(int32_t id) {
    if (count_) counts_[id]++;
}

void TokenCounts::adjust(std::vector<float>& logits) const {
    const SampleOptions& opt = *opt_;
    const auto at = [&](int32_t id) -> float* {
        return id >= 0 && size_t(id) < logits.size() ? &logits[size_t(id)] : nullptr;
    };
    for (const auto& [id, bias] : opt.logit_bias)
        if (float* l = at(id)) *l += bias;
    if (opt.repetition_penalty != 1.0f) {
        const auto penalise = [&](int32_t id) {
            if (float* l = at(id)) *l = *l > 0.0f ? *l / opt.repetition_penalty : *l * opt.repetition_penalty;
        };
        for (int32_t id : prompt_) penalise(id);
        for (const auto& [id, n] : counts_)
            if (!prompt_.count(id)) penalise(id);  // once per token, however often it occurs
    }
    if (opt.presence_penalty == 0.0f && opt.frequency_penalty == 0.0f) return;
    for (const auto& [id, n] : counts_)
        if (float* l = at(id)) *l -= opt.presence_penalty + opt.frequency_penalty * float(n);
}

int32_t TokenCounts::sample(std::vector<float>& logits, Rng& rng) {
    adjust(logits);
    const int32_t next = sample_token(logits, *opt_, rng);
    add(next);
    return next;
}

bool greedy_on_device(const SampleOptions& opt) {
    return opt.temperature <= 0.0f && opt.logit_bias.empty() && opt.repetition_penalty == 1.0f &&
           opt.presence_penalty == 0.0f && opt.frequency_penalty == 0.0f;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
    TokenLogprob r;
    r.token = token;
    const int k = int(std::min(size_t(std::max(top, 0)), logits.size()));
    std::vector<int32_t> ids(static_cast<size_t>(k));
    std::vector<float> lps(static_cast<size_t>(k));
    logprob_row(logits, token, k, &r.logprob, ids.data(), lps.data());
    for (int i = 0; i < k; i++) r.top.emplace_back(ids[size_t(i)], lps[size_t(i)]);
    return r;
}

int32_t sample_token(std::vector<float>& logits, const SampleOptions& opt, Rng& rng) {
    const int V = int(logits.size());
    if (opt.temperature <= 0.0f)
        return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if ((opt.top_k <= 0 || opt.top_k >= V) && opt.top_p >= 1.0f) {
        // the whole distribution: one pass in id order, no sort (a server samples every row of every step)
        const float mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (float& l : logits) {
            l = float(std::exp(double(l - mx) / opt.temperature));  // the likeliest is 1
            if (l < opt.min_p) l = 0.0f;
            sum += l;
        }
        double u = rng.uniform() * sum;
        for (int i = 0; i < V; i++) {
            u -= logits[size_t(i)];
            if (u <= 0.0) return i;
        }
        return V - 1;
    }
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
        if (p[size_t(i)] < opt.min_p) {  // sorted: the rest are less likely still
            keep = i;
            break;
        }
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

Generator::Generator(Model& model, int prefill_chunk)
    : model_(model),
      chunk_(prefill_chunk_size(prefill_chunk, model.config().n_ctx)),
      acts_(model.make_activations(1, chunk_, ActMode::Decode)),
      cache_(model.make_cache()) {
    // one sequence, slot 0; greedy_step's target
    model.backend().zero(acts_->get(act::targets, 1, 1));
}

size_t Generator::replays() const {
    return acts_->replays();
}

namespace {

// Runs ids[0..n) at positions pos0.. of cache slot `slot`: one token as a decode step's row (a pass the model
// records once and replays), more as a piece of a prompt with the last position's logits.
void run_cached(Model& model, Activations& acts, KvCache& cache, int slot, const int32_t* ids, int n,
                int pos0) {
    const Tensor tokens = acts.get(act::tokens, 1, n);
    model.backend().upload(tokens, ids);
    if (n == 1) return void(model.forward(acts, rows_pass(tokens, &cache, &slot, &pos0)));
    ForwardPass f{.tokens = tokens};
    f.pos0 = pos0;
    f.cache = &cache;
    f.slot = slot;
    f.last_logits = true;
    model.forward(acts, f);
}

}  // namespace

std::vector<float> forward_cached(Model& model, Activations& acts, KvCache& cache, int slot,
                                  const int32_t* ids, int n, int pos0) {
    run_cached(model, acts, cache, slot, ids, n, pos0);
    return model.backend().download_f32(acts.get(act::logits, 1, 1));
}

int32_t Generator::greedy_step(int32_t id, int pos, int V) {
    Backend& be = model_.backend();
    run_cached(model_, *acts_, *cache_, 0, &id, 1, pos);
    // the top 1 in the pass's own buffers: the target (0, set by the constructor) and the outputs, which the
    // next step writes again
    const Tensor logits = acts_->get(act::logits, 1, 1), ints = acts_->get(act::targets, 1, 2);
    const Tensor floats = acts_->get(act::losses, 1, 2);
    int32_t next = 0;
    be.argmax_rows(&next, logits.view(Shape{1, logits.shape[logits.shape.ndim - 1]}), V, ints.range(0, 1),
                   floats.range(0, 1), ints.range(1, 1), floats.range(1, 1));
    return next;
}

void Generator::step(const int32_t* ids, int n, int pos0, std::vector<float>& logits) {
    for (int done = 0; done < n;) {  // pieces end at multiples of the chunk, as the server cuts them
        const int k = prefill_piece(pos0 + done, pos0 + n, chunk_);
        logits = forward_cached(model_, *acts_, *cache_, 0, ids + done, k, pos0 + done);
        done += k;
    }
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SampleOptions& opt,
                                         const std::function<bool(int32_t)>& on_token,
                                         std::vector<float>* logprobs) {
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
    std::vector<float> logits, raw;
    std::vector<int32_t> out;
    TokenCounts counts(ctx, opt);
    step(ctx.data(), int(ctx.size()), 0, logits);
    int pos = int(ctx.size());
    // greedy without log-probabilities: the decode steps' choices are made on the device
    const bool on_device = greedy_on_device(opt) && !logprobs;
    const int V = opt.vocab_real > 0 ? std::min(opt.vocab_real, int(logits.size())) : int(logits.size());
    int32_t chosen = -1;  // the device's choice for this step, or -1: sample the logits
    for (int i = 0; i < opt.max_new_tokens; i++) {
        if (opt.vocab_real > 0 && size_t(opt.vocab_real) < logits.size())
            logits.resize(size_t(opt.vocab_real));
        if (logprobs) raw = logits;  // sampling overwrites them
        const int32_t next = chosen >= 0 ? chosen : counts.sample(logits, rng);
        out.push_back(next);
        if (logprobs) logprobs->push_back(token_logprob(raw, next, 0).logprob);
        const bool ended = on_token && !on_token(next);
        const bool stop =
            ended || std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), next) != opt.stop_tokens.end();
        if (stop || i + 1 == opt.max_new_tokens) break;
        ctx.push_back(next);
        if (pos == n_ctx) {  // full: rebuild the cache from the most recent half of the context
            const int keep = n_ctx / 2;
            std::vector<int32_t> tail(ctx.end() - keep, ctx.end());
            step(tail.data(), keep, 0, logits);
            chosen = -1;
            pos = keep;
        } else if (on_device) {
            chosen = greedy_step(next, pos, V);
            pos++;
        } else {
            step(&next, 1, pos, logits);
            pos++;
        }
    }
    return out;
}

}  // namespace anvil
