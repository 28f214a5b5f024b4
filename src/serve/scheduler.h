// Continuous batching. One thread owns the model (run() on the caller's: the main thread, where the backend's
// thread pool and per-thread floating-point modes were set up). Each iteration is one batched forward of
// one-token rows, each row a position in its sequence's KV-cache slot (model.h's row_slot): the next token of
// every running sequence, and beside them up to a chunk of prompt positions of the newly admitted requests
// (the pieces of several prompts, a row per position, rows of one slot at consecutive positions). So the
// weights are read once an iteration however many requests are in flight or arriving. A request joins the
// decoding rows the iteration after its prompt is in; finished or cancelled ones leave at once and free their
// slot. The KV cache is a pool of pages (model/kv_cache.h) sized by the caller, lent as sequences grow (as
// vLLM lends them): a request is admitted when a slot is free and the free pages hold its prompt and first
// token, and a decoding sequence takes a page each time it fills one. When none is free, the sequence
// admitted last is preempted: its pages go back, and it waits at the head of the queue to be prefilled again
// from its prompt and the tokens it has made so far (recomputation), then decodes on where it was, its
// sampling untouched. With prefix caching (serve/page_pool.h), every page a sequence fills is kept under its
// contents, and a request whose context begins with the same whole pages (a shared system prompt, an earlier
// turn of the chat, its own context after a preemption) is given them, when admitted or while it prefills
// (from a request admitted with it that fills them first), and prefills only the rest. Requests
// wait in a bounded queue, oldest first, and past it submit() refuses them.
//
// Tokens only: text and stop strings are data/text_stream.h's, the HTTP side server.cpp's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/generate.h"
#include "model/model.h"
#include "serve/page_pool.h"

namespace anvil::serve {

using Clock = std::chrono::steady_clock;

enum class Finish : uint8_t { None, Stop, Length, Cancelled, Error };
const char* finish_name(Finish f);  // "stop", "length", ...

// What the scheduler reports as it works (the server's /metrics); called on the scheduler's thread.
class SchedulerObserver {
public:
    virtual ~SchedulerObserver() = default;
    virtual void on_first_token(double seconds_since_submit) = 0;
    virtual void on_next_token(double seconds_since_previous) = 0;
    // once a forward: the decoding sequences' rows it carried and the prompt positions beside them
    virtual void on_pass(int decode_rows, int prompt_rows) = 0;
    // a running sequence lost its KV-cache pages to an older one (it is prefilled again later)
    virtual void on_preempt() {}
    // a request admitted (again, after a preemption) with `positions` to put in the cache
    virtual void on_admit(int /*positions*/) {}
    // a sequence took `positions` of them from the prefix cache (pages another sequence filled), when
    // admitted or while it prefills
    virtual void on_cached(int /*positions*/) {}
};

// One request, shared by the scheduler (which appends tokens) and the waiter (which reads them).
class Sequence {
public:
    Sequence(std::vector<int32_t> prompt, const SampleOptions& opt, const LogprobRequest& lp = {});

    struct Update {
        std::vector<int32_t> tokens;         // the new ones since the last wait()
        std::vector<TokenLogprob> logprobs;  // theirs, when asked for
        Finish finish = Finish::None;        // != None: no more will come
        std::string error;                   // with Finish::Error
    };
    // Blocks until a token past `seen` exists, the sequence has ended, or `timeout` passed.
    Update wait(size_t seen, std::chrono::milliseconds timeout);
    // The client left or has what it wants (a stop string): the scheduler frees the slot before its next
    // step.
    void cancel() { cancelled_ = true; }
    const std::vector<int32_t>& prompt() const { return prompt_; }
    // With LogprobRequest::prompt, once the first token has come (or the sequence ended after its prompt):
    // prompt token k's (k >= 1) at k - 1.
    std::vector<TokenLogprob> prompt_logprobs() const;

private:
    friend class Scheduler;
    void push(int32_t id, TokenLogprob lp);
    void end(Finish f, std::string error = {});

    const std::vector<int32_t> prompt_;
    const SampleOptions opt_;
    const LogprobRequest lp_;
    Rng rng_;
    std::atomic<bool> cancelled_{false};
    Clock::time_point submitted_, last_token_;
    // scheduler-side state: the tokens of its positions (the prompt, then each token as it is fed), positions
    // in the cache (while prefilling, of ctx_ so far; after a preemption ctx_ is prefilled again), tokens
    // sampled
    std::vector<int32_t> ctx_;
    int slot_ = -1, pos_ = 0, produced_ = 0;
    std::vector<int32_t> pages_;  // the KV-cache pages it holds, first position first
    int published_ = 0;           // its first pages offered to the prefix cache
    bool decoding() const { return produced_ > 0 && pos_ >= int(ctx_.size()); }  // its context is in
    int32_t next_ = -1;   // the sampled token the next step feeds
    TokenCounts counts_;  // the tokens sampled, for the penalties
    // LogprobRequest::prompt: prompt positions 0..scored() - 1 are scored (position j's logits score token
    // j + 1; only this thread adds to prompt_lp_, so it reads the size without the lock)
    size_t scored() const { return prompt_lp_.size(); }
    bool scoring() const { return lp_.prompt && scored() + 1 < prompt_.size(); }

    mutable std::mutex m_;
    std::condition_variable cv_;
    std::vector<int32_t> tokens_;
    std::vector<TokenLogprob> logprobs_, prompt_lp_;  // the waiter reads them under m_
    Finish finish_ = Finish::None;
    std::string error_;
};

struct SchedulerOptions {
    int slots = 16;  // sequences decoded together: the KV cache's slots
    // KV-cache pages of kv_page positions the slots share (at least a context's); 0: a whole context for
    // every slot
    int kv_pages = 0;
    int kv_page = KvCache::kDefaultPage;
    // Pages a sequence fills are kept (until the pool needs them) and given to later requests whose context
    // begins with the same tokens.
    bool prefix_caching = true;
    int max_queue = 64;  // requests waiting for a slot; past it submit() refuses
    // Prompt positions an iteration (chunked prefill): admitted prompts advance by whole chunks of this many
    // (cut as the Generator cuts them) until the budget is spent, in the iteration's forward beside the
    // decoding rows, so a long prompt slows the running sequences by one chunk's rows at a time. 0: every
    // admitted prompt whole, in that forward and as many more as they need.
    int prefill_chunk = kPrefillChunk;
    // Greedy rows (greedy_on_device, no log-probabilities) take the backend's choice (token_logprobs' top 1)
    // instead of their logits: always on a device, where it saves the copy back; on the CPU only when this
    // asks (its log-sum-exp costs more than the host's scan at a few rows, the tests cover the path with it)
    bool device_greedy_on_cpu = false;
};

class Scheduler {
public:
    Scheduler(Model& model, const SchedulerOptions& o, SchedulerObserver* observer = nullptr);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a request; nullptr when the queue is full. The prompt must fit the context with room for one
    // token (the caller checks and says so).
    std::shared_ptr<Sequence> submit(std::vector<int32_t> prompt, const SampleOptions& opt,
                                     const LogprobRequest& lp = {});

    struct Load {
        int running = 0, queued = 0, slots = 0;
        int pages_used = 0, pages = 0;  // the KV cache's pages lent to running sequences, of all
        int pages_cached = 0;           // pages nobody holds that keep a prefix for later requests
        bool idle() const { return running == 0 && queued == 0; }
    };
    Load load() const;
    const SchedulerOptions& options() const { return opt_; }
    size_t cache_bytes() const { return cache_bytes_; }  // the KV-cache pool
    int cache_pages() const { return pool_->pages(); }

    // Serves until stop(): on return, every request still running or waiting has ended as cancelled.
    void run();
    void stop();

private:
    struct PassRows;
    void admit();
    void reuse_prefixes();
    void grow();
    void preempt(size_t i);
    void release(Sequence& s);
    void lend(Sequence& s, int pages);
    void publish_pages(Sequence& s);
    void publish_load();
    bool pass(bool decode);
    void add_decode_rows(PassRows& r) const;
    void add_prompt_pieces(PassRows& r) const;
    Finish sample_into(Sequence& s, std::vector<float>& logits);
    Finish take(Sequence& s, int32_t next, TokenLogprob lp);  // the sampled token into s
    // The device's greedy choice for every logit row whose sequence takes it (greedy_on_device, no log-
    // probabilities), over the first V columns, else -1: those rows' logits need not come back
    std::vector<int32_t> greedy_rows(const PassRows& r, Tensor logits);
    struct Scores;
    Scores score_rows(const PassRows& r, Tensor logits);
    void score_prompt(Sequence& s, int pos, const Scores& sc, size_t row);
    void retire(size_t i, Finish f, std::string error = {});

    Model& model_;
    const SchedulerOptions opt_;
    SchedulerObserver* observer_;
    std::unique_ptr<KvCache> cache_;
    size_t cache_bytes_ = 0;
    int chunk_ = 0;  // prompt positions per pass (opt_.prefill_chunk, or the context when that is 0)
    std::unique_ptr<Activations> acts_;  // a pass's rows: every slot's, and the prompt pieces'
    // the host's copies of a pass's sampled logits, kept from pass to pass: at 64 rows of GPT-2's vocabulary
    // a fresh 12.8 MB a pass cost its page faults and zeroing every step (CPU serving at 64 in flight ran at
    // a fifth of 16's rate)
    std::vector<uint8_t> host_raw_;
    std::vector<float> host_logits_, host_row_;
    Arena
        scores_;  // a pass's scored rows on the device: targets, log-probabilities, the likeliest ids, theirs
    int pages_to_admit(const Sequence& s) const;
    int pages_to_match(const Sequence& s) const;
    std::vector<int> free_slots_;
    std::unique_ptr<PagePool> pool_;
    std::vector<std::shared_ptr<Sequence>> running_;  // scheduler thread only

    mutable std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Sequence>> waiting_;
    int running_count_ = 0;                  // running_.size(), readable under m_
    int pages_used_ = 0, pages_cached_ = 0;  // readable under m_
    bool stop_ = false;
};

}  // namespace anvil::serve
