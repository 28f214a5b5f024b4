// A thread that watches collectives queued on a device without the host waiting for them (PyTorch's NCCL
// watchdog, in anvil's terms). The host queues a collective, makes later work wait for it on the device,
// hands the watchdog a test of its completion and goes on queueing; the watchdog polls every test. One not
// complete `timeout_s` after it was handed over, or an error of the transport (`transport_error`, e.g. NCCL's
// asynchronous error), ends the job through `fire`, naming the collective, wherever the host is then
// (queueing or blocked in a device synchronisation the stalled collective holds up).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace anvil {

class Watchdog {
public:
    struct Hooks {
        // An error of the transport as a whole, or "" (called from the watchdog's thread).
        std::function<std::string()> transport_error;
        // Ends the job; must not return (called from the watchdog's thread, once).
        std::function<void(const std::string& why)> fire;
        // Runs first on the watchdog's thread, if given (e.g. selects the device the tests query).
        std::function<void()> on_thread;
    };
    Watchdog(double timeout_s, Hooks hooks, std::chrono::milliseconds period = std::chrono::milliseconds(20));
    ~Watchdog();  // stops the thread; collectives still watched are no longer timed
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // Times `what` from now. `done` says whether it has completed (called on the watchdog's thread until it
    // returns true); `retire` runs once it has (e.g. hands its event back for reuse).
    void watch(std::string what, std::function<bool()> done, std::function<void()> retire = {});
    // How many are watched and not yet seen complete.
    size_t outstanding() const;

private:
    struct Item {
        std::string what;
        std::function<bool()> done;
        std::function<void()> retire;
        std::chrono::steady_clock::time_point since;
    };
    void run();

    const double timeout_s_;
    const Hooks hooks_;
    const std::chrono::milliseconds period_;
    mutable std::mutex mu_;
    std::condition_variable wake_;
    std::vector<Item> items_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace anvil
