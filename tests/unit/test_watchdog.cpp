// The collectives' watchdog (src/backend/watchdog.h): what NCCL's device-side waits rely on for their
// deadline. Completion tests here are flags instead of CUDA events.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "backend/watchdog.h"

namespace anvil {
namespace {

using namespace std::chrono_literals;

// What the watchdog fired with, waited for from the test's thread.
struct Fired {
    std::mutex mu;
    std::string why;
    int times = 0;
    Watchdog::Hooks hooks(std::function<std::string()> transport = {}) {
        Watchdog::Hooks h;
        h.transport_error = std::move(transport);
        h.fire = [this](const std::string& w) {
            std::lock_guard<std::mutex> lock(mu);
            why = w;
            times++;
        };
        return h;
    }
    // The message, once fired within `limit`; "" if it never was.
    std::string wait(std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < end) {
            {
                std::lock_guard<std::mutex> lock(mu);
                if (times) return why;
            }
            std::this_thread::sleep_for(2ms);
        }
        return "";
    }
};

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
        if (cond()) return true;
        std::this_thread::sleep_for(2ms);
    }
    return cond();
}

TEST(Watchdog, RetiresWhatCompletesAndNeverFires) {
    Fired fired;
    std::atomic<int> retired{0};
    std::atomic<bool> done[3] = {false, false, false};
    {
        Watchdog dog(1.0, fired.hooks(), 2ms);
        for (int i = 0; i < 3; i++)
            dog.watch(
                "all-reduce " + std::to_string(i), [&done, i] { return done[i].load(); }, [&] { retired++; });
        EXPECT_EQ(dog.outstanding(), 3u);
        done[1] = true;
        // an item leaves the list under the watchdog's lock and its retire runs after, outside it
        EXPECT_TRUE(eventually([&] { return dog.outstanding() == 2 && retired.load() == 1; }));
        done[0] = true;
        done[2] = true;
        EXPECT_TRUE(eventually([&] { return dog.outstanding() == 0 && retired.load() == 3; }));
        std::this_thread::sleep_for(1100ms);  // past the deadline: nothing is left to time
    }
    EXPECT_EQ(fired.times, 0) << fired.why;
}

TEST(Watchdog, FiresOnceNamingTheOldestStalledCollective) {
    Fired fired;
    std::atomic<bool> first_done{false};
    Watchdog dog(0.15, fired.hooks(), 2ms);
    const auto t0 = std::chrono::steady_clock::now();
    dog.watch("the all-reduce of layer 3", [&] { return first_done.load(); });
    dog.watch("the all-reduce of layer 2", [] { return false; });
    dog.watch("the all-reduce of layer 1", [] { return false; });
    first_done = true;  // completes in time: not the one to name
    const std::string why = fired.wait(5000ms);
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(
        why,
        "the all-reduce of layer 2 did not complete within 0.15 s (--comm-timeout): another rank has died, "
        "stalled or is not taking part");
    EXPECT_GE(after, 0.15);
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(fired.times, 1);
}

TEST(Watchdog, FiresOnATransportErrorBeforeTheDeadline) {
    Fired fired;
    std::atomic<bool> broken{false};
    Watchdog dog(600, fired.hooks([&] { return broken ? std::string("NCCL: remote process exited") : ""; }),
                 2ms);
    dog.watch("the weight all-gather (ZeRO-1)", [] { return false; });
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(fired.times, 0);
    broken = true;
    EXPECT_EQ(fired.wait(5000ms), "the weight all-gather (ZeRO-1) failed: NCCL: remote process exited");
}

TEST(Watchdog, RunsItsSetUpOnItsOwnThreadAndStopsWithCollectivesOutstanding) {
    Fired fired;
    std::atomic<bool> ran_elsewhere{false};
    const std::thread::id me = std::this_thread::get_id();
    Watchdog::Hooks h = fired.hooks();
    h.on_thread = [&] { ran_elsewhere = std::this_thread::get_id() != me; };
    const auto t0 = std::chrono::steady_clock::now();
    {
        Watchdog dog(600, std::move(h), 1000ms);  // a long period: the destructor must not wait it out
        dog.watch("a collective never done", [] { return false; });
        EXPECT_TRUE(eventually([&] { return ran_elsewhere.load(); }));
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.9);
    EXPECT_EQ(fired.times, 0);
}

}  // namespace
}  // namespace anvil
