// The host the CPU backend runs on: CPU model, cores, SIMD level, memory, BLAS configuration.
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

}  // namespace anvil
