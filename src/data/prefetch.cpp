#include "data/prefetch.h"

#include <chrono>

#include "core/error.h"

namespace anvil {

Prefetcher::Prefetcher(Batcher batcher, Backend& backend, const PrefetchPlan& plan)
    : batcher_(std::move(batcher)),
      B_(plan.B),
      T_(plan.T),
      accum_(plan.accum),
      slots_(size_t(plan.depth)),
      next_fill_(plan.first_step) {
    ANVIL_ASSERT(plan.depth >= 2);
    const size_t bytes = size_t(plan.accum) * size_t(plan.B) * size_t(plan.T) * sizeof(int32_t);
    for (Slot& s : slots_) {
        s.tokens = backend.alloc_host(bytes);
        s.targets = backend.alloc_host(bytes);
        if (plan.lengths) s.lengths = backend.alloc_host(bytes);
    }
    worker_ = std::thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
}

void Prefetcher::run() {
    const size_t per = size_t(B_) * size_t(T_);
    for (;;) {
        Slot* slot = nullptr;
        int64_t step;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] {
                if (stop_) return true;
                return !slots_[size_t(next_fill_) % slots_.size()]
                            .ready;  // ready until the trainer releases it
            });
            if (stop_) return;
            step = next_fill_++;
            slot = &slots_[size_t(step) % slots_.size()];
        }
        int64_t count = 0;
        try {
            auto* tok = static_cast<int32_t*>(slot->tokens.data());
            auto* tgt = static_cast<int32_t*>(slot->targets.data());
            auto* len = static_cast<int32_t*>(slot->lengths.data());
            for (int m = 0; m < accum_; m++)
                batcher_.fill(step * accum_ + m, tok + size_t(m) * per, tgt + size_t(m) * per,
                              len ? len + size_t(m) * per : nullptr);
            for (size_t i = 0; i < per * size_t(accum_); i++) count += tgt[i] >= 0;
        } catch (...) {
            std::lock_guard<std::mutex> lk(mu_);
            error_ = std::current_exception();
            stop_ = true;
            cv_.notify_all();
            return;
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            slot->step = step;
            slot->target_count = count;
            slot->ready = true;
        }
        cv_.notify_all();
    }
}

StepBatch Prefetcher::acquire(int64_t step, double* waited_s) {
    const auto t0 = std::chrono::steady_clock::now();
    Slot& s = slots_[size_t(step) % slots_.size()];
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return (s.ready && s.step == step) || error_; });
    if (error_) std::rethrow_exception(error_);
    ANVIL_ASSERT(taken_ < 0);
    taken_ = step;
    if (waited_s) *waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return StepBatch{static_cast<const int32_t*>(s.tokens.data()),
                     static_cast<const int32_t*>(s.targets.data()), s.target_count,
                     static_cast<const int32_t*>(s.lengths.data())};
}

void Prefetcher::release() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        ANVIL_ASSERT(taken_ >= 0);
        slots_[size_t(taken_) % slots_.size()].ready = false;
        taken_ = -1;
    }
    cv_.notify_all();
}

}  // namespace anvil
