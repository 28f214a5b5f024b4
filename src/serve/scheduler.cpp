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

Sequence::Sequence(std::vector<int32_t> prompt, const SampleOptions& opt)
    : prompt_(std::move(prompt)), opt_(opt), rng_(opt.seed), submitted_(Clock::now()) {}

Sequence::Update Sequence::wait(size_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait_for(lk, timeout, [&] { return tokens_.size() > seen || finish_ != Finish::None; });
    Update u;
    if (tokens_.size() > seen) u.tokens.assign(tokens_.begin() + std::ptrdiff_t(seen), tokens_.end());
    u.finish = finish_;
    u.error = error_;
    return u;
}

void Sequence::push(int32_t id) {
    {
        std::lock_guard<std::mutex> lk(m_);
        tokens_.push_back(id);
    }
    cv_.notify_all();
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
    const int n_ctx = model.config().n_ctx;
    cache_ = model.make_cache(n_ctx, o.slots);
    cache_bytes_ = model.cache_slot_bytes(n_ctx) * size_t(o.slots);
    chunk_ = prefill_chunk_size(o.prefill_chunk, n_ctx);
    // a row per prompt position: the pieces that start within a chunk's budget, the last one whole
    prefill_acts_ = model.make_activations(o.prefill_chunk > 0 ? 2 * chunk_ - 1 : chunk_, 1, ActMode::Decode);
    decode_acts_ = model.make_activations(o.slots, 1, ActMode::Decode);
    for (int s = o.slots - 1; s >= 0; s--) free_slots_.push_back(s);
}

Scheduler::~Scheduler() = default;

std::shared_ptr<Sequence> Scheduler::submit(std::vector<int32_t> prompt, const SampleOptions& opt) {
    ANVIL_CHECK(!prompt.empty() && int(prompt.size()) < model_.config().n_ctx,
                "scheduler: a prompt of {} tokens for a context of {}", prompt.size(), model_.config().n_ctx);
    auto s = std::make_shared<Sequence>(std::move(prompt), opt);
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
    return {running_count_, int(waiting_.size()), opt_.slots};
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
        admit();
        prefill_some();
        if (running_.empty()) continue;
        try {
            decode_step();
        } catch (const std::exception& e) {
            for (size_t i = running_.size(); i-- > 0;) retire(i, Finish::Error, e.what());
        }
    }
    for (size_t i = running_.size(); i-- > 0;) retire(i, Finish::Cancelled);
    std::lock_guard<std::mutex> lk(m_);
    for (auto& s : waiting_) s->end(Finish::Cancelled);
    waiting_.clear();
}

// The sequence leaves (its slot freed, the load updated) before its waiter hears it ended, so a client that
// has its last token never sees it still running.
void Scheduler::retire(size_t i, Finish f, std::string error) {
    const std::shared_ptr<Sequence> s = running_[i];
    free_slots_.push_back(s->slot_);
    s->slot_ = -1;
    running_.erase(running_.begin() + std::ptrdiff_t(i));
    {
        std::lock_guard<std::mutex> lk(m_);
        running_count_ = int(running_.size());
    }
    s->end(f, std::move(error));
}

// Waiting requests take the free slots; their prompts are prefilled from the next prefill_some() on.
void Scheduler::admit() {
    while (!free_slots_.empty()) {
        std::shared_ptr<Sequence> s;
        {
            std::lock_guard<std::mutex> lk(m_);
            if (waiting_.empty()) break;
            s = std::move(waiting_.front());
            waiting_.pop_front();
        }
        if (s->cancelled_) {
            s->end(Finish::Cancelled);
            continue;
        }
        s->slot_ = free_slots_.back();
        free_slots_.pop_back();
        running_.push_back(s);
        std::lock_guard<std::mutex> lk(m_);
        running_count_ = int(running_.size());
    }
}

// The oldest unfinished prompts advance by whole chunks, each piece ending at a multiple of the chunk (as the
// Generator cuts a prompt), until this step's budget of positions is spent (the piece that starts within it
// runs whole); with --prefill-chunk 0, every admitted prompt whole. The pieces run packed, one forward a pass
// (prefill_pass). A prompt whose last piece ran samples its first token (which may end it).
void Scheduler::prefill_some() {
    const bool whole = opt_.prefill_chunk == 0;
    while (prefill_pass() && whole) {
    }
}

// One forward of the pieces that start within chunk_ positions (so at most 2 chunk_ - 1 rows; with whole
// prompts, those that fit chunk_): each position a row in its sequence's cache slot, so the pieces of several
// prompts share the weights' reads. Returns whether any position ran.
bool Scheduler::prefill_pass() {
    const bool whole = opt_.prefill_chunk == 0;
    std::vector<int> slot, pos, logit_rows;
    std::vector<int32_t> tok;
    std::vector<std::pair<size_t, int>>
        moved;                 // (index in running_, the prompt positions in the cache after)
    std::vector<size_t> last;  // the sequences whose prompt this pass finishes
    for (size_t i = 0; i < running_.size() && int(tok.size()) < chunk_; i++) {
        Sequence& s = *running_[i];
        const int n = int(s.prompt_.size());
        int at = s.pos_;  // pos_: the prompt positions in the cache so far
        for (int k; at < n && int(tok.size()) < chunk_; at += k) {
            k = prefill_piece(at, n, chunk_);
            if (whole && int(tok.size()) + k > chunk_) break;  // a whole prompt: in a pass where it fits
            for (int j = at; j < at + k; j++)
                slot.push_back(s.slot_), pos.push_back(j), tok.push_back(s.prompt_[size_t(j)]);
        }
        if (at == s.pos_) continue;
        moved.emplace_back(i, at);
        if (at == n) logit_rows.push_back(int(tok.size()) - 1), last.push_back(i);
    }
    if (tok.empty()) return false;
    struct Ended {
        size_t i;
        Finish f;
        std::string error;
    };
    std::vector<Ended> ended;
    Backend& be = model_.backend();
    const int B = int(tok.size()), n = int(last.size());
    try {
        be.upload(prefill_acts_->get("tokens", B, 1), tok.data());
        model_.forward(*prefill_acts_,
                       rows_pass(B, cache_.get(), slot.data(), pos.data(), logit_rows.data(), n));
        for (const auto& [i, at] : moved) running_[i]->pos_ = at;
        if (n > 0) {
            const std::vector<float> all = be.download_f32(prefill_acts_->get("logits", n, 1));
            const size_t V = all.size() / size_t(n);
            std::vector<float> logits;
            for (size_t r = 0; r < last.size(); r++) {
                logits.assign(all.begin() + std::ptrdiff_t(r * V), all.begin() + std::ptrdiff_t((r + 1) * V));
                const Finish fin = sample_into(*running_[last[r]], logits);
                if (fin != Finish::None) ended.push_back({last[r], fin, {}});
            }
        }
    } catch (const std::exception& e) {  // every sequence of the pass ends with the error
        ended.clear();
        for (const auto& mv : moved) ended.push_back({mv.first, Finish::Error, e.what()});
    }
    for (size_t k = ended.size(); k-- > 0;) retire(ended[k].i, ended[k].f, std::move(ended[k].error));
    return true;
}

// Samples the token after `logits` (V), hands it to the waiter and says whether that ended the sequence (the
// caller retires it).
Finish Scheduler::sample_into(Sequence& s, std::vector<float>& logits) {
    const SampleOptions& o = s.opt_;
    if (o.vocab_real > 0 && size_t(o.vocab_real) < logits.size()) logits.resize(size_t(o.vocab_real));
    const int32_t next = sample_token(logits, o, s.rng_);
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
        s.push(next);
        if (s.produced_ >= o.max_new_tokens || s.pos_ >= model_.config().n_ctx) fin = Finish::Length;
    }
    s.next_ = next;
    return fin;
}

// One token for every sequence whose prompt is in the cache (it has sampled a token), in one batched forward.
void Scheduler::decode_step() {
    Backend& be = model_.backend();
    std::vector<size_t> rows;  // indices into running_
    for (size_t i = 0; i < running_.size(); i++)
        if (running_[i]->produced_ > 0) rows.push_back(i);
    if (rows.empty()) return;
    const int B = int(rows.size());
    const size_t n = size_t(B);
    std::vector<int> slot(n), pos(n);
    std::vector<int32_t> tokens(n);
    for (size_t b = 0; b < n; b++) {
        const Sequence& s = *running_[rows[b]];
        slot[b] = s.slot_;
        pos[b] = s.pos_;
        tokens[b] = s.next_;
    }
    be.upload(decode_acts_->get("tokens", B, 1), tokens.data());
    model_.forward(*decode_acts_, rows_pass(B, cache_.get(), slot.data(), pos.data()));
    const std::vector<float> all = be.download_f32(decode_acts_->get("logits", B, 1));
    if (observer_) observer_->on_step(B);
    const size_t V = all.size() / n;
    std::vector<float> logits;
    std::vector<std::pair<size_t, Finish>> ended;
    for (size_t b = 0; b < n; b++) {
        Sequence& s = *running_[rows[b]];
        s.pos_++;
        logits.assign(all.begin() + std::ptrdiff_t(b * V), all.begin() + std::ptrdiff_t((b + 1) * V));
        const Finish fin = sample_into(s, logits);
        if (fin != Finish::None) ended.emplace_back(rows[b], fin);
    }
    for (size_t k = ended.size(); k-- > 0;) retire(ended[k].first, ended[k].second);
}

}  // namespace anvil::serve
