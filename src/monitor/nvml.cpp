#include "monitor/nvml.h"

#include <dlfcn.h>

namespace anvil {

// The NVML C ABI, as published in nvml.h (declared here so no header is needed to build).
namespace {
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {
    unsigned int gpu, memory;
};
struct nvmlMemory_t {
    unsigned long long total, free, used;
};
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
}  // namespace

struct Nvml::Api {
    nvmlReturn_t (*init)();
    nvmlReturn_t (*shutdown)();
    nvmlReturn_t (*count)(unsigned int*);
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t*);
    nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
    nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t*);
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
    nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*);
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*);
    nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*);
    nvmlReturn_t (*driver)(char*, unsigned int);
};

Nvml::Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
        why_ = "libnvidia-ml.so.1 not found (no NVIDIA driver installed)";
        return;
    }
    api_ = new Api{};
    auto sym = [&](const char* n, auto& fn) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib_, n));
        if (!fn && why_.empty()) why_ = std::string("NVML lacks ") + n;
    };
    sym("nvmlInit_v2", api_->init);
    sym("nvmlShutdown", api_->shutdown);
    sym("nvmlDeviceGetCount_v2", api_->count);
    sym("nvmlDeviceGetHandleByIndex_v2", api_->handle);
    sym("nvmlDeviceGetName", api_->name);
    sym("nvmlDeviceGetUtilizationRates", api_->util);
    sym("nvmlDeviceGetMemoryInfo", api_->memory);
    sym("nvmlDeviceGetPowerUsage", api_->power);
    sym("nvmlDeviceGetTemperature", api_->temperature);
    sym("nvmlDeviceGetClockInfo", api_->clock);
    sym("nvmlSystemGetDriverVersion", api_->driver);
    if (!why_.empty()) return;
    const nvmlReturn_t r = api_->init();
    if (r != 0) {
        why_ = "nvmlInit failed (error " + std::to_string(r) + "); is the NVIDIA driver loaded?";
        return;
    }
    ok_ = true;
}

Nvml::~Nvml() {
    if (ok_) api_->shutdown();
    delete api_;
    if (lib_) dlclose(lib_);
}

int Nvml::device_count() const {
    unsigned int n = 0;
    return ok_ && api_->count(&n) == 0 ? int(n) : 0;
}

std::string Nvml::device_name(int index) const {
    nvmlDevice_t d;
    char buf[96] = {};
    if (!ok_ || api_->handle(unsigned(index), &d) != 0 || api_->name(d, buf, sizeof buf) != 0) return "?";
    return buf;
}

std::string Nvml::driver_version() const {
    char buf[96] = {};
    return ok_ && api_->driver(buf, sizeof buf) == 0 ? buf : "";
}

GpuSample Nvml::sample(int index) const {
    GpuSample s;
    nvmlDevice_t d;
    if (!ok_ || api_->handle(unsigned(index), &d) != 0) return s;
    nvmlUtilization_t u{};
    nvmlMemory_t m{};
    unsigned int mw = 0, temp = 0, clk = 0;
    if (api_->util(d, &u) == 0) s.util_pct = u.gpu;
    if (api_->memory(d, &m) == 0) {
        s.mem_used_mb = double(m.used) / (1 << 20);
        s.mem_total_mb = double(m.total) / (1 << 20);
    }
    if (api_->power(d, &mw) == 0) s.power_w = mw / 1000.0;
    if (api_->temperature(d, kTemperatureGpu, &temp) == 0) s.temp_c = temp;
    if (api_->clock(d, kClockSm, &clk) == 0) s.sm_clock_mhz = clk;
    s.valid = true;
    return s;
}

}  // namespace anvil
