#include "monitor/sampler.h"

#include <chrono>

namespace anvil {

Sampler::Sampler(int gpu_index, double interval_s)
    : gpu_index_(gpu_index), interval_(interval_s), prev_(cpu_times()) {
    thread_ = std::thread([this] { run(); });
}

Sampler::~Sampler() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Sampler::run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::duration<double>(interval_), [&] { return stop_; })) {
        lk.unlock();
        sample_now();
        lk.lock();
    }
}

void Sampler::sample_now() {
    std::lock_guard<std::mutex> take(take_mu_);
    MonitorSample s;
    const CpuTimes now = cpu_times();
    s.cpu_util_pct =
        now.total > prev_.total ? 100.0 * double(now.busy - prev_.busy) / double(now.total - prev_.total) : 0;
    prev_ = now;
    s.rss_mb = process_rss_mb();
    if (gpu()) s.gpu = nvml_.sample(gpu_index_);
    std::lock_guard<std::mutex> lk(mu_);
    last_ = s;
    sum_.cpu_util_pct += s.cpu_util_pct;
    sum_.rss_mb += s.rss_mb;
    sum_.gpu.util_pct += s.gpu.util_pct;
    sum_.gpu.mem_used_mb += s.gpu.mem_used_mb;
    sum_.gpu.power_w += s.gpu.power_w;
    sum_.gpu.temp_c += s.gpu.temp_c;
    sum_.gpu.sm_clock_mhz += s.gpu.sm_clock_mhz;
    sum_.gpu.valid = s.gpu.valid;
    n_++;
}

MonitorSample Sampler::latest() const {
    std::lock_guard<std::mutex> lk(mu_);
    return last_;
}

namespace {
nlohmann::json to_json(const MonitorSample& s) {
    nlohmann::json j = {{"cpu_util", s.cpu_util_pct}, {"rss_mb", s.rss_mb}};
    if (s.gpu.valid) {
        j["gpu_util"] = s.gpu.util_pct;
        j["gpu_mem_mb"] = s.gpu.mem_used_mb;
        j["gpu_power_w"] = s.gpu.power_w;
        j["gpu_temp_c"] = s.gpu.temp_c;
        j["gpu_sm_clock_mhz"] = s.gpu.sm_clock_mhz;
    }
    return j;
}
}  // namespace

nlohmann::json Sampler::latest_json() const {
    return to_json(latest());
}

nlohmann::json Sampler::averages_json() const {
    std::lock_guard<std::mutex> lk(mu_);
    if (n_ == 0) return to_json(last_);
    MonitorSample a = sum_;
    const double n = double(n_);
    a.cpu_util_pct /= n;
    a.rss_mb /= n;
    a.gpu.util_pct /= n;
    a.gpu.mem_used_mb /= n;
    a.gpu.power_w /= n;
    a.gpu.temp_c /= n;
    a.gpu.sm_clock_mhz /= n;
    nlohmann::json j = to_json(a);
    j["samples"] = n_;
    return j;
}

}  // namespace anvil
