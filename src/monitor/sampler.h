// A background sampler: every interval it reads the GPU (through NVML, when a CUDA device is in use and
// NVML is present) and the host (CPU busy share, process memory). The trainer writes the latest sample with
// each logged step and the averages in the summary.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "monitor/nvml.h"
#include "monitor/sysinfo.h"

namespace anvil {

struct MonitorSample {
    double cpu_util_pct = 0, rss_mb = 0;
    GpuSample gpu;
};

class Sampler {
public:
    // gpu_index < 0: host only.
    Sampler(int gpu_index, double interval_s = 0.5);
    ~Sampler();
    Sampler(const Sampler&) = delete;
    Sampler& operator=(const Sampler&) = delete;

    MonitorSample latest() const;
    // Takes a sample now (the summary does, so even a run shorter than one interval has one).
    void sample_now();
    // Fields for metrics.jsonl / summary.json: latest() or the averages over the run so far.
    nlohmann::json latest_json() const;
    nlohmann::json averages_json() const;
    bool gpu() const { return gpu_index_ >= 0 && nvml_.available(); }
    const std::string& gpu_unavailable_reason() const { return nvml_.why_not(); }

private:
    void run();
    Nvml nvml_;
    int gpu_index_;
    double interval_;
    std::mutex take_mu_;  // one sample at a time: prev_ is the start of the next sample's CPU interval
    CpuTimes prev_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    MonitorSample last_, sum_;
    int64_t n_ = 0;
    std::thread thread_;
};

}  // namespace anvil
