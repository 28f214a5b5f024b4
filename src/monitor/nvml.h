// NVML (NVIDIA's management library), loaded at run time with dlopen so the binary runs where it is absent.
// Only the calls anvil uses are resolved; a missing library or symbol makes available() false with a reason.
#pragma once

#include <cstdint>
#include <string>

namespace anvil {

struct GpuSample {
    bool valid = false;
    double util_pct = 0, mem_used_mb = 0, mem_total_mb = 0, power_w = 0, temp_c = 0, sm_clock_mhz = 0;
};

class Nvml {
public:
    Nvml();
    ~Nvml();
    Nvml(const Nvml&) = delete;
    Nvml& operator=(const Nvml&) = delete;

    bool available() const { return ok_; }
    const std::string& why_not() const { return why_; }  // when not available
    int device_count() const;
    std::string device_name(int index) const;
    std::string driver_version() const;
    GpuSample sample(int index) const;

private:
    void* lib_ = nullptr;
    bool ok_ = false;
    std::string why_;
    struct Api;
    Api* api_ = nullptr;
};

}  // namespace anvil
