#include "serve/scheduler.h"

#include <algorithm>
#include <limits>

namespace anvil::serve {

const char* finish_name(Finish f) {
    switch (f) {
        case Finish::None:
            return "none";
        case Finish::Stop:
            return "stop";
        case Finish::Length:
            return "length";
        case Finish::Cancelled:
            return "cancelled";
        case Finish::Error:
            return "error";
    }
    return "?";
}

// ---- Sequence -------------------------------------------------------------------------------------------

Sequence::Sequence(std::vector<int32_t> prompt, const SampleOptions& opt, const LogprobRequest& lp)
    : prompt_(std::move(prompt)),
      opt_(opt),
      lp_(lp),
      rng_(opt.seed),
      submitted_(Clock::now()),
      ctx_(prompt_),
      counts_(prompt_, opt_) {}

Sequence::Update Sequence::wait(size_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait_for(lk, timeout, [&] { return tokens_.size() > seen || finish_ != Finish::None; });
    Update u;
    if (tokens_.size() > seen) u.tokens.assign(tokens_.begin() + std::ptrdiff_t(seen), tokens_.end());
    if (logprobs_.size() > seen) u.logprobs.assign(logprobs_.begin() + std::ptrdiff_t(seen), logprobs_.end());
    u.finish = finish_;
    u.error = error_;
    return u;
}

void Sequence::push(int32_t id, TokenLogprob lp) {
    {
        std::lock_guard<std::mutex> lk(m_);
        tokens_.push_back(id);
        if (lp_.top >= 0) logprobs_.push_back(std::move(lp));
    }
    cv_.notify_all();
}

std::vector<TokenLogprob> Sequence::prompt_logprobs() const {
    std::lock_guard<std::mutex> lk(m_);
    return prompt_lp_;
}

void Sequence::end(Finish f, std::string error) {
    {
        std::lock_guard<std::mutex> lk(m_);
        if (finish_ != Finish::None) return;
        finish_ = f;
        error_ = std::move(error);
    }
    cv_.notify_all();
}

// ---- Scheduler ------------------------------------------------------------------------------------------

Scheduler::Scheduler(Model& model, const SchedulerOptions& o, SchedulerObserver* observer)
    : model_(model), opt_(o), observer_(observer) {
    ANVIL_CHECK(o.slots > 0 && o.max_queue >= 0 && o.prefill_chunk >= 0,
                "scheduler: {} slots, a queue of {}, prefill chunks of {}", o.slots, o.max_queue,
                o.prefill_chunk);
    const int n_ctx = model.config().n_ctx, context_pages = KvCache::pages_for(n_ctx, o.kv_page);
    ANVIL_CHECK(o.kv_pages == 0 || o.kv_pages >= context_pages,
                "scheduler: {} KV-cache pages hold less than one context of {} positions ({} pages)",
                o.kv_pages, n_ctx, context_pages);
    const int pages = o.kv_pages > 0 ? o.kv_pages : o.slots * context_pages;
    cache_ = model.make_cache(n_ctx, o.slots, pages, o.kv_page);
    cache_bytes_ = model.cache_page_bytes(o.kv_page) * size_t(pages);
    pool_ = std::make_unique<PagePool>(pages, o.kv_page, o.prefix_caching);
    chunk_ = prefill_chunk_size(o.prefill_chunk, n_ctx);
    // a pass's rows: every slot decoding, and the prompt pieces that start within a chunk's budget, the last
    // one whole
    const int max_rows = o.slots + (o.prefill_chunk > 0 ? 2 * chunk_ - 1 : chunk_);
    acts_ = model.make_activations(max_rows, 1, ActMode::Decode);
    // per row: a target id and its log-probability, the likeliest ids and theirs: scores_[0] to [3]
    TensorTable scores;
    scores.add("targets", {max_rows}, DType::I32);
    scores.add("lp", {max_rows}, DType::F32);
    scores.add("top_ids", {max_rows * LogprobRequest::kMaxTop}, DType::I32);
    scores.add("top_lp", {max_rows * LogprobRequest::kMaxTop}, DType::F32);
    scores_ = Arena(model.backend(), scores);
    for (int s = o.slots - 1; s >= 0; s--) free_slots_.push_back(s);
}

Scheduler::~Scheduler() = default;

std::shared_ptr<Sequence> Scheduler::submit(std::vector<int32_t> prompt, const SampleOptions& opt,
                                            const LogprobRequest& lp) {
    ANVIL_CHECK(!prompt.empty() && int(prompt.size()) < model_.config().n_ctx,
                "scheduler: a prompt of {} tokens for a context of {}", prompt.size(), model_.config().n_ctx);
    ANVIL_CHECK(lp.top <= LogprobRequest::kMaxTop, "scheduler: {} top log-probabilities asked, at most {}",
                lp.top, LogprobRequest::kMaxTop);
    auto s = std::make_shared<Sequence>(std::move(prompt), opt, lp);
    {
        std::lock_guard<std::mutex> lk(m_);
        if (stop_) return nullptr;
        // room: the free slots (the next step's prefills) and the queue behind them
        if (int(waiting_.size()) >= opt_.slots - running_count_ + opt_.max_queue) return nullptr;
        waiting_.push_back(s);
    }
    cv_.notify_all();
    return s;
}

Scheduler::Load Scheduler::load() const {
    std::lock_guard<std::mutex> lk(m_);
    return {running_count_, int(waiting_.size()), opt_.slots, pages_used_, pool_->pages(), pages_cached_};
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lk(m_);
        stop_ = true;
    }
    cv_.notify_all();
}

void Scheduler::run() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(m_);
            cv_.wait(lk, [&] { return stop_ || !waiting_.empty() || !running_.empty(); });
            if (stop_) break;
        }
        for (size_t i = running_.size(); i-- > 0;)
            if (running_[i]->cancelled_) retire(i, Finish::Cancelled);
        grow();
        admit();
        reuse_prefixes();
        // one forward an iteration (--prefill-chunk 0: more of prompts alone till every admitted one is in)
        for (bool first = true; pass(first) && opt_.prefill_chunk == 0; first = false) {
        }
    }
    for (size_t i = running_.size(); i-- > 0;) retire(i, Finish::Cancelled);
    std::lock_guard<std::mutex> lk(m_);
    for (auto& s : waiting_) s->end(Finish::Cancelled);
    waiting_.clear();
}

// A sequence's slot and pages back to the pool (the load updated); it is no longer running.
void Scheduler::release(Sequence& s) {
    free_slots_.push_back(s.slot_);
    pool_->release(s.pages_);
    cache_->set_pages(s.slot_, {});
    s.slot_ = -1;
    s.pages_.clear();
    s.published_ = 0;
    running_.erase(
        std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == &s; }));
    publish_load();
}

// `pages` available pages onto the end of s's table.
void Scheduler::lend(Sequence& s, int pages) {
    for (int k = 0; k < pages; k++) s.pages_.push_back(pool_->take());
    cache_->set_pages(s.slot_, s.pages_);
}

// The pages s has filled since it last looked go to the prefix cache, each after the one before it; a page
// whose contents another sequence published first is swapped for that one.
void Scheduler::publish_pages(Sequence& s) {
    const int page = pool_->page();
    bool swapped = false;
    for (int k = s.published_; (k + 1) * page <= s.pos_; k++) {
        int32_t& p = s.pages_[size_t(k)];
        const int32_t parent = k > 0 ? s.pages_[size_t(k - 1)] : -1;
        const int32_t kept = pool_->publish(
            p, parent, std::span<const int32_t>(s.ctx_).subspan(size_t(k * page), size_t(page)));
        swapped |= kept != p;
        p = kept;
        s.published_ = k + 1;
    }
    if (swapped) cache_->set_pages(s.slot_, s.pages_);
}

// What load() reports of the scheduler thread's state.
void Scheduler::publish_load() {
    std::lock_guard<std::mutex> lk(m_);
    running_count_ = int(running_.size());
    pages_used_ = pool_->held();
    pages_cached_ = pool_->cached();
}

// The sequence leaves before its waiter hears it ended, so a client that has its last token never sees it
// still running.
void Scheduler::retire(size_t i, Finish f, std::string error) {
    const std::shared_ptr<Sequence> s = running_[i];
    release(*s);
    s->end(f, std::move(error));
}

// Running sequence i gives its pages back and waits at the head of the queue; prefilled again, it holds the
// prompt and every token fed since (all it sampled but the last, which it feeds next), so it decodes on where
// it was.
void Scheduler::preempt(size_t i) {
    const std::shared_ptr<Sequence> s = running_[i];
    s->pos_ = 0;
    release(*s);
    {
        std::lock_guard<std::mutex> lk(m_);
        waiting_.push_front(s);
    }
    if (observer_) observer_->on_preempt();
}

// Pages for the positions an admitted sequence fills before it decodes: what it prefills and its first fed
// token.
int Scheduler::pages_to_admit(const Sequence& s) const {
    return KvCache::pages_for(std::min(model_.config().n_ctx, int(s.ctx_.size()) + 1), opt_.kv_page);
}

// The whole pages of s's context it may take from the prefix cache: all of them once it has sampled (its
// next token is known), else all but its last position, whose logits give the first token; none while its
// prompt's log-probabilities are still to be computed.
int Scheduler::pages_to_match(const Sequence& s) const {
    if (s.scoring()) return 0;
    return (int(s.ctx_.size()) - (s.produced_ > 0 ? 0 : 1)) / opt_.kv_page;
}

// Every decoding sequence, oldest first, gets a page for the position it fills next if it has none; when the
// pool is empty, the sequence admitted last is preempted (perhaps the one asking).
void Scheduler::grow() {
    for (size_t i = 0; i < running_.size(); i++) {
        Sequence& s = *running_[i];
        if (!s.decoding()) continue;  // prefilling: its pages came with it
        const size_t need = size_t(KvCache::pages_for(s.pos_ + 1, opt_.kv_page));
        while (s.pages_.size() < need && i < running_.size()) {
            if (pool_->available() == 0) {
                preempt(running_.size() - 1);
            } else {
                lend(s, 1);
            }
        }
    }
    publish_load();
}

// Waiting requests, oldest first, take a free slot, the cached pages their context begins with and pages for
// the rest of their prefill, while both last and (with others running) a hundredth of the pool stays free for
// them to grow into; the rest of their context goes in from the next pass on.
void Scheduler::admit() {
    const int reserve = pool_->pages() / 100;
    while (!free_slots_.empty()) {
        std::shared_ptr<Sequence> s;
        {
            std::lock_guard<std::mutex> lk(m_);
            if (waiting_.empty()) break;
            s = waiting_.front();  // only this thread takes from the front
        }
        std::vector<int32_t> found;
        if (!s->cancelled_) {
            found = pool_->match(s->ctx_, pages_to_match(*s));
            const int keep = running_.empty() ? 0 : reserve;
            const int need = pages_to_admit(*s) - int(found.size());
            if (need + keep > pool_->available() - pool_->unheld(found)) break;
        }
        {
            std::lock_guard<std::mutex> lk(m_);
            waiting_.pop_front();
        }
        if (s->cancelled_) {
            s->end(Finish::Cancelled);
            continue;
        }
        s->slot_ = free_slots_.back();
        free_slots_.pop_back();
        pool_->hold(found);
        s->pages_ = found;
        s->published_ = int(found.size());
        s->pos_ = int(found.size()) * opt_.kv_page;
        lend(*s, pages_to_admit(*s) - int(found.size()));
        if (observer_) {
            observer_->on_admit(int(s->ctx_.size()));
            if (s->pos_ > 0) observer_->on_cached(s->pos_);
        }
        running_.push_back(s);
        publish_load();
    }
}

// A prefilling sequence takes the whole pages of its context that others filled since it was admitted (a
// request admitted beside another with the same system prompt, say) in place of its own, not yet filled or
// filled in part, and its prefill skips them. Its own published pages are the first of those found.
void Scheduler::reuse_prefixes() {
    const int page = pool_->page();
    for (const auto& sp : running_) {
        Sequence& s = *sp;
        if (s.pos_ >= int(s.ctx_.size())) continue;  // its context is in
        const std::vector<int32_t> found = pool_->match(s.ctx_, pages_to_match(s));
        const int now = int(found.size()) * page;
        if (now <= s.pos_) continue;
        ANVIL_CHECK(std::equal(s.pages_.begin(), s.pages_.begin() + s.published_, found.begin()),
                    "scheduler: slot {}'s published pages are not the prefix cache's", s.slot_);
        for (size_t k = size_t(s.published_); k < found.size(); k++) {
            pool_->hold({&found[k], 1});
            pool_->release({&s.pages_[k], 1});
            s.pages_[k] = found[k];
        }
        if (observer_) observer_->on_cached(now - s.pos_);
        s.pos_ = now;
        s.published_ = int(found.size());
        cache_->set_pages(s.slot_, s.pages_);
    }
}

// A pass's rows, in order: the decoding sequences' (rows 0..n_decode), then the prompt pieces'.
struct Scheduler::PassRows {
    std::vector<int> slot, pos, logit_rows;
    std::vector<int32_t> tok;
    // what each logit row's logits are for, in their order: sampling sequence `seq`'s next token (score < 0),
    // or scoring the prompt token after its position `score`
    struct Use {
        size_t seq;  // index into running_
        int score;
    };
    std::vector<Use> uses;
    size_t n_decode = 0;  // the first uses decode (the others end or score their prompt here)
    std::vector<std::pair<size_t, int>>
        moved;  // (index in running_, its prompt positions in the cache after)
};

// A pass's scored rows, computed on the device: row k's log-probability of the prompt token after its
// position (lp[k]) and the K likeliest (ids and values at k K ..). Empty when no row of the pass scores.
struct Scheduler::Scores {
    int K = 0;
    std::vector<float> lp, top_lp;
    std::vector<int32_t> ids;
};

// A row for every sequence whose prompt is in the cache (it has sampled a token): that token, at its next
// position.
void Scheduler::add_decode_rows(PassRows& r) const {
    for (size_t i = 0; i < running_.size(); i++) {
        const Sequence& s = *running_[i];
        if (!s.decoding()) continue;
        r.logit_rows.push_back(int(r.tok.size()));
        r.slot.push_back(s.slot_), r.pos.push_back(s.pos_), r.tok.push_back(s.next_);
        r.uses.push_back({i, -1});
    }
    r.n_decode = r.uses.size();
}

// Prompts advance by whole pieces, each ending at a multiple of the chunk (as the Generator cuts a prompt),
// until the pass's budget of chunk_ prompt positions is spent (the piece that starts within it runs whole, so
// at most 2 chunk_ - 1 rows). First the prompts whose rest fits in half the budget, oldest first, so a short
// prompt is not held behind a long one's pieces; then the others, oldest first, with at least half the budget
// left to them. With --prefill-chunk 0, the whole prompts that fit chunk_ together, oldest first. A prompt
// whose last piece is in the pass has its last row's logits, and so has every row whose prompt token after it
// is to be scored (a pass has logits for all its rows at most).
void Scheduler::add_prompt_pieces(PassRows& r) const {
    const bool whole = opt_.prefill_chunk == 0;
    const size_t rows0 = r.tok.size();
    const auto used = [&] { return int(r.tok.size() - rows0); };
    std::vector<bool> done(running_.size(), false);
    // sequence i's pieces while there is budget (and, for a whole prompt, while it fits)
    const auto advance = [&](size_t i) {
        const Sequence& s = *running_[i];
        const int n = int(s.ctx_.size());
        int at = s.pos_;  // pos_: the prompt positions in the cache so far
        for (int k; at < n && used() < chunk_; at += k) {
            k = prefill_piece(at, n, chunk_);
            if (whole && used() + k > chunk_) break;
            for (int j = at; j < at + k; j++) {
                if (s.scoring() && size_t(j) >= s.scored() && size_t(j) + 1 < s.prompt_.size())
                    r.logit_rows.push_back(int(r.tok.size())), r.uses.push_back({i, j});
                r.slot.push_back(s.slot_), r.pos.push_back(j), r.tok.push_back(s.ctx_[size_t(j)]);
            }
        }
        done[i] = true;
        if (at == s.pos_) return;
        r.moved.emplace_back(i, at);
        // a prompt's end samples the first token; a preempted sequence's has its next token already
        if (at == n && s.produced_ == 0)
            r.logit_rows.push_back(int(r.tok.size()) - 1), r.uses.push_back({i, -1});
    };
    if (!whole)
        for (size_t i = 0; i < running_.size(); i++) {
            const Sequence& s = *running_[i];
            const int rest = int(s.ctx_.size()) - s.pos_;
            if (rest > 0 && used() + rest <= chunk_ / 2) advance(i);
        }
    for (size_t i = 0; i < running_.size() && used() < chunk_; i++)
        if (!done[i]) advance(i);
}

// One forward: (decode) every decoding sequence's next token, and the prompt pieces the budget allows; each
// logit row samples its sequence's next token. Returns whether any prompt position ran.
bool Scheduler::pass(bool decode) {
    PassRows r;
    if (decode) add_decode_rows(r);
    add_prompt_pieces(r);
    if (r.tok.empty()) return false;
    std::vector<std::pair<size_t, Finish>> ended;  // (index in running_, why)
    std::string error;
    Backend& be = model_.backend();
    const int B = int(r.tok.size()), n = int(r.uses.size());
    try {
        cache_->sync();
        const Tensor tokens = acts_->get(act::tokens, B, 1);
        be.upload(tokens, r.tok.data());
        model_.forward(*acts_,
                       rows_pass(tokens, cache_.get(), r.slot.data(), r.pos.data(), r.logit_rows.data(), n));
        const Tensor logits = acts_->get(act::logits, n, 1);
        const size_t V = n > 0 ? size_t(logits.numel() / n) : 0;
        // the greedy rows' choices come back as ids; the rows that sample on the host come back whole, a run
        // of them at a time, one after another in `sampled` (row k at at[k]); the scored ones as a few values
        const std::vector<int32_t> chosen = greedy_rows(r, logits);
        const auto on_host = [&](int k) { return r.uses[size_t(k)].score < 0 && chosen[size_t(k)] < 0; };
        std::vector<size_t> at(static_cast<size_t>(n));
        size_t used = 0;  // of host_logits_
        for (int k0 = 0; k0 < n;) {
            if (!on_host(k0)) {
                k0++;
                continue;
            }
            int k1 = k0 + 1;
            while (k1 < n && on_host(k1)) k1++;
            for (int k = k0; k < k1; k++) at[size_t(k)] = used + size_t(k - k0) * V;
            const Tensor run = logits.range(size_t(k0) * V, size_t(k1 - k0) * V);
            if (host_raw_.size() < run.nbytes()) host_raw_.resize(run.nbytes());  // grown, never shrunk
            if (host_logits_.size() < used + size_t(run.numel()))
                host_logits_.resize(used + size_t(run.numel()));
            be.download(host_raw_.data(), run);
            convert_to_f32(host_logits_.data() + used, host_raw_.data(), run.dtype, size_t(run.numel()));
            used += size_t(run.numel());
            k0 = k1;
        }
        const Scores scores = score_rows(r, logits);
        if (observer_) observer_->on_pass(int(r.n_decode), B - int(r.n_decode));
        for (size_t k = 0; k < r.n_decode; k++) {
            Sequence& s = *running_[r.uses[k].seq];
            s.ctx_.push_back(s.next_);
            s.pos_++;
            publish_pages(s);
        }
        for (const auto& [i, at] : r.moved) {
            running_[i]->pos_ = at;
            publish_pages(*running_[i]);
        }
        for (size_t k = 0; k < r.uses.size(); k++) {
            const PassRows::Use u = r.uses[k];
            if (u.score >= 0) {
                score_prompt(*running_[u.seq], u.score, scores, k);
                continue;
            }
            Sequence& s = *running_[u.seq];
            Finish fin;
            if (chosen[k] >= 0) {
                fin = s.opt_.max_new_tokens == 0 ? Finish::Length : take(s, chosen[k], {});
            } else {
                const auto first = host_logits_.begin() + std::ptrdiff_t(at[k]);
                host_row_.assign(first, first + std::ptrdiff_t(V));  // (sampling overwrites it)
                fin = sample_into(s, host_row_);
            }
            if (fin != Finish::None) ended.emplace_back(u.seq, fin);
        }
    } catch (const std::exception& e) {  // every sequence of the pass ends with the error
        ended.clear();
        error = e.what();
        for (size_t k = 0; k < r.n_decode; k++) ended.emplace_back(r.uses[k].seq, Finish::Error);
        for (const auto& mv : r.moved) ended.emplace_back(mv.first, Finish::Error);
    }
    std::sort(ended.begin(), ended.end());  // retired from the back, so the indices stay valid
    for (size_t k = ended.size(); k-- > 0;) retire(ended[k].first, ended[k].second, error);
    return r.tok.size() > r.n_decode;
}

// Samples the token after `logits` (V), hands it to the waiter and says whether that ended the sequence (the
// caller retires it).
Finish Scheduler::sample_into(Sequence& s, std::vector<float>& logits) {
    const SampleOptions& o = s.opt_;
    if (o.max_new_tokens == 0) return Finish::Length;  // the prompt's log-probabilities were all it wanted
    if (o.vocab_real > 0 && size_t(o.vocab_real) < logits.size()) logits.resize(size_t(o.vocab_real));
    TokenLogprob lp;
    std::vector<float> raw;
    if (s.lp_.top >= 0) raw = logits;  // sampling overwrites them
    const int32_t next = s.counts_.sample(logits, s.rng_);
    if (s.lp_.top >= 0) lp = token_logprob(raw, next, s.lp_.top);
    return take(s, next, std::move(lp));
}

Finish Scheduler::take(Sequence& s, int32_t next, TokenLogprob lp) {
    const SampleOptions& o = s.opt_;
    const Clock::time_point now = Clock::now();
    if (observer_) {
        if (s.produced_ == 0)
            observer_->on_first_token(std::chrono::duration<double>(now - s.submitted_).count());
        else
            observer_->on_next_token(std::chrono::duration<double>(now - s.last_token_).count());
    }
    s.last_token_ = now;
    s.produced_++;
    Finish fin = Finish::None;
    if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next) != o.stop_tokens.end()) {
        fin = Finish::Stop;  // the end-of-text or end-of-turn token itself is not part of the answer
    } else {
        s.push(next, std::move(lp));
        if (s.produced_ >= o.max_new_tokens || s.pos_ >= model_.config().n_ctx) fin = Finish::Length;
    }
    s.next_ = next;
    return fin;
}

std::vector<int32_t> Scheduler::greedy_rows(const PassRows& r, Tensor logits) {
    const int n = int(r.uses.size()), Vp = n > 0 ? int(logits.numel() / n) : 0;
    std::vector<int32_t> chosen(size_t(n), -1);
    if (model_.backend().device() == Device::CPU && !opt_.device_greedy_on_cpu) return chosen;
    int V = 0;  // the first greedy row's vocabulary; a row over another one samples on the host
    std::vector<bool> greedy(size_t(n), false);
    for (size_t k = 0; k < r.uses.size(); k++) {
        if (r.uses[k].score >= 0) continue;
        const Sequence& s = *running_[r.uses[k].seq];
        const int vr = s.opt_.vocab_real > 0 && s.opt_.vocab_real < Vp ? s.opt_.vocab_real : Vp;
        if (!greedy_on_device(s.opt_) || s.lp_.top >= 0 || (V != 0 && vr != V)) continue;
        V = vr;
        greedy[k] = true;
    }
    if (V == 0) return chosen;
    // the top 1 of every logit row in the scored rows' buffers, which score_rows fills after (so the targets
    // are zeroed again each pass)
    const Tensor tg = scores_[0].range(0, size_t(n));
    model_.backend().zero(tg);
    std::vector<int32_t> all(static_cast<size_t>(n));
    model_.backend().argmax_rows(all.data(), logits, V, tg, scores_[1].range(0, size_t(n)),
                                 scores_[2].range(0, size_t(n)), scores_[3].range(0, size_t(n)));
    for (size_t k = 0; k < size_t(n); k++)
        if (greedy[k]) chosen[k] = all[k];
    return chosen;
}

Scheduler::Scores Scheduler::score_rows(const PassRows& r, Tensor logits) {
    Scores sc;
    const int n = int(r.uses.size()), Vp = n > 0 ? int(logits.numel() / n) : 0;
    std::vector<int32_t> targets(size_t(n), 0);  // 0 for the rows that sample (their values are not read)
    int V = 0;
    for (size_t k = 0; k < r.uses.size(); k++) {
        if (r.uses[k].score < 0) continue;
        const Sequence& s = *running_[r.uses[k].seq];
        targets[k] = s.prompt_[size_t(r.uses[k].score) + 1];
        sc.K = std::max(sc.K, s.lp_.top);
        const int vr = s.opt_.vocab_real > 0 && s.opt_.vocab_real < Vp ? s.opt_.vocab_real : Vp;
        ANVIL_CHECK(V == 0 || V == vr, "scheduler: rows of one pass score over {} and {} tokens", V, vr);
        V = vr;
    }
    if (V == 0) return sc;
    Backend& be = model_.backend();
    const int K = sc.K;
    const Tensor tg = scores_[0].range(0, size_t(n)), lp = scores_[1].range(0, size_t(n)),
                 ids = scores_[2].range(0, size_t(n * K)).view({n, K}),
                 top = scores_[3].range(0, size_t(n * K)).view({n, K});
    be.upload(tg, targets.data());
    be.token_logprobs(lp, ids, top, logits, tg, V);
    sc.lp = be.download_f32(lp);
    sc.top_lp = be.download_f32(top);
    sc.ids.resize(size_t(n * K));
    if (K > 0) be.download(sc.ids.data(), ids);
    return sc;
}

// Prompt token pos + 1's log-probability, from position pos's row of the pass. Positions come in order, each
// once: a pass adds rows from scored() on.
void Scheduler::score_prompt(Sequence& s, int pos, const Scores& sc, size_t row) {
    ANVIL_CHECK(size_t(pos) == s.scored(), "scheduler: prompt position {} scored after {}", pos, s.scored());
    TokenLogprob lp;
    lp.token = s.prompt_[size_t(pos) + 1];
    lp.logprob = sc.lp[row];
    for (int i = 0; i < std::max(s.lp_.top, 0); i++)
        lp.top.emplace_back(sc.ids[row * size_t(sc.K) + size_t(i)],
                            sc.top_lp[row * size_t(sc.K) + size_t(i)]);
    {
        std::lock_guard<std::mutex> lk(s.m_);
        s.prompt_lp_.push_back(std::move(lp));
    }
}

}  // namespace anvil::serve
