// The server's /metrics in Prometheus' text format (version 0.0.4): requests by endpoint and status, prompt
// and generated tokens, generations by how they ended, time-to-first-token and inter-token latency
// histograms, forwards, those that decoded and the rows they carried; queue length, running sequences and
// KV-cache use are read from the scheduler when scraped, open connections from the transport.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "serve/scheduler.h"

namespace anvil::serve {

// Cumulative buckets of a latency in seconds.
class Histogram {
public:
    static constexpr std::array<double, 12> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                       0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
    void observe(double seconds);
    // "name_bucket{le=...} n" lines, then _sum and _count
    std::string text(const std::string& name, const std::string& help) const;

private:
    std::array<uint64_t, kBounds.size()> counts_{};
    uint64_t count_ = 0;
    double sum_ = 0.0;
};

class Metrics final : public SchedulerObserver {
public:
    void on_first_token(double s) override;
    void on_next_token(double s) override;
    void on_pass(int decode_rows, int prompt_rows) override;
    void on_preempt() override;
    void on_admit(int positions) override;
    void on_cached(int positions) override;
    void on_request(const std::string& endpoint, int status);
    // A generation over, for its client: how it ended (stop, length, abandoned: the client left, cancelled,
    // error), its prompt's tokens and those it produced.
    void on_generation(const std::string& reason, int64_t prompt_tokens, int64_t generated);
    // Everything, with the scheduler's load, the cache's size and the open HTTP connections.
    std::string text(const Scheduler::Load& load, double kv_cache_bytes, int connections) const;

private:
    mutable std::mutex m_;
    Histogram ttft_, itl_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    std::map<std::string, uint64_t> finished_;
    uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, passes_ = 0, steps_ = 0, rows_ = 0, preemptions_ = 0;
    uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace anvil::serve
