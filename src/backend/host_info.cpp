#include "backend/host_info.h"

#include <cstdlib>
#include <fstream>
#include <thread>

extern "C" char* openblas_get_config(void);

namespace anvil {

CpuInfo cpu_info() {
    CpuInfo c;
    c.logical_cores = int(std::thread::hardware_concurrency());
    std::ifstream f("/proc/cpuinfo");
    std::string line, flags;
    double mhz = 0;
    while (std::getline(f, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
        const std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
        if (key == "model name" && c.model.empty()) c.model = val;
        if (key == "flags" && flags.empty()) flags = " " + val + " ";
        if (key == "cpu MHz" && mhz == 0) mhz = std::atof(val.c_str());
    }
    auto has = [&](const char* fl) { return flags.find(std::string(" ") + fl + " ") != std::string::npos; };
    if (has("avx512f"))
        c.simd = "AVX-512", c.fp32_flops_per_cycle = 64;
    else if (has("avx2") && has("fma"))
        c.simd = "AVX2+FMA", c.fp32_flops_per_cycle = 32;
    else if (has("avx"))
        c.simd = "AVX", c.fp32_flops_per_cycle = 16;
    else if (has("sse4_2"))
        c.simd = "SSE4.2", c.fp32_flops_per_cycle = 8;
    else
        c.simd = "none";
    // the nominal clock ("@ 2.50GHz") rather than the momentary one
    const auto at = c.model.find("@ ");
    c.ghz = at != std::string::npos ? std::atof(c.model.c_str() + at + 2) : mhz / 1000.0;
    std::ifstream m("/proc/meminfo");
    while (std::getline(m, line))
        if (line.rfind("MemTotal:", 0) == 0) c.ram_bytes = uint64_t(std::atoll(line.c_str() + 9)) * 1024;
    c.blas = openblas_get_config();
    return c;
}

}  // namespace anvil
