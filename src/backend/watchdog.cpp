#include "backend/watchdog.h"

#include <fmt/format.h>

namespace anvil {

Watchdog::Watchdog(double timeout_s, Hooks hooks, std::chrono::milliseconds period)
    : timeout_s_(timeout_s), hooks_(std::move(hooks)), period_(period), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void Watchdog::watch(std::string what, std::function<bool()> done, std::function<void()> retire) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back({std::move(what), std::move(done), std::move(retire), std::chrono::steady_clock::now()});
}

size_t Watchdog::outstanding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
}

void Watchdog::run() {
    if (hooks_.on_thread) hooks_.on_thread();
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
        if (items_.empty()) continue;
        std::vector<std::function<void()>> retired;
        std::string why;
        const auto now = std::chrono::steady_clock::now();
        for (size_t i = 0; i < items_.size();) {
            Item& it = items_[i];
            if (it.done()) {
                if (it.retire) retired.push_back(std::move(it.retire));
                items_.erase(items_.begin() + std::ptrdiff_t(i));
                continue;
            }
            // the oldest is first: it names the stall
            if (why.empty() && std::chrono::duration<double>(now - it.since).count() > timeout_s_)
                why = fmt::format(
                    "{} did not complete within {:g} s (--comm-timeout): another rank has died, "
                    "stalled or is not taking part",
                    it.what, timeout_s_);
            i++;
        }
        if (why.empty() && !items_.empty() && hooks_.transport_error) {
            const std::string e = hooks_.transport_error();
            if (!e.empty()) why = fmt::format("{} failed: {}", items_.front().what, e);
        }
        lock.unlock();
        for (auto& r : retired) r();
        if (!why.empty()) {
            hooks_.fire(why);  // ends the job; a hook that returns (tests) stops the watching
            lock.lock();
            items_.clear();
            return;
        }
        lock.lock();
    }
}

}  // namespace anvil
