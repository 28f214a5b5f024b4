// The host: CPU model, cores, SIMD level, memory, BLAS; and the process's CPU use and memory over time.
#pragma once

#include <cstdint>
#include <string>

namespace anvil {

struct CpuInfo {
    std::string model;
    int logical_cores = 0;
    std::string simd;              // "AVX-512", "AVX2+FMA", "AVX", "SSE4.2", or "none"
    int fp32_flops_per_cycle = 0;  // per core, assuming two vector FMA units (AVX-512: 64, AVX2: 32)
    double ghz = 0;                // nominal clock from the model string or /proc/cpuinfo
    uint64_t ram_bytes = 0;
    std::string blas;  // OpenBLAS's configuration string
};
CpuInfo cpu_info();

// Totals from /proc/stat and this process's resident memory from /proc/self/status.
struct CpuTimes {
    uint64_t busy = 0, total = 0;
};
CpuTimes cpu_times();
double process_rss_mb();       // VmRSS
double process_peak_rss_mb();  // VmHWM

}  // namespace anvil
