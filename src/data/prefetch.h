// A background loader: a worker thread builds the batches of the coming steps while the current one
// trains, into a ring of `depth` step-sized host buffers (page-locked when the backend is CUDA). The
// trainer takes step s's batches with acquire(s), which reports how long it had to wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "data/batcher.h"

namespace anvil {

struct StepBatch {
    const int32_t* tokens = nullptr;   // (accum, B, T)
    const int32_t* targets = nullptr;  // (accum, B, T), -1 = ignored
    int64_t target_count = 0;          // targets that are not -1
    // (accum, B, T) each position's record length (--neftune-alpha), or none
    const int32_t* lengths = nullptr;
};

// What a Prefetcher serves: steps first_step, first_step+1, ..., each `accum` micro-batches of (B, T).
struct PrefetchPlan {
    int B = 0, T = 0, accum = 1;
    int64_t first_step = 0;
    int depth = 4;         // steps built ahead (>= 2)
    bool lengths = false;  // each position's record length too (Batcher::fill's; --neftune-alpha)
};

class Prefetcher {
public:
    Prefetcher(Batcher batcher, Backend& backend, const PrefetchPlan& plan);
    ~Prefetcher();
    Prefetcher(const Prefetcher&) = delete;
    Prefetcher& operator=(const Prefetcher&) = delete;

    // Step `step`'s batches; steps are taken in order. `waited_s` gets the time spent blocked.
    StepBatch acquire(int64_t step, double* waited_s);
    // The buffers of the last acquired step may be refilled.
    void release();

private:
    void run();
    struct Slot {
        Buffer tokens, targets, lengths;  // lengths: empty unless asked for
        int64_t step = -1, target_count = 0;
        bool ready = false;
    };
    Batcher batcher_;
    int B_, T_, accum_;
    std::vector<Slot> slots_;
    int64_t next_fill_;   // next step the worker builds
    int64_t taken_ = -1;  // step handed to the trainer, not yet released
    bool stop_ = false;
    std::exception_ptr error_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::thread worker_;
};

}  // namespace anvil
