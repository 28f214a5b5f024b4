// The process's CPU use and memory over time (the host's description is backend/host_info.h).
#pragma once

#include <cstdint>
#include <string>

namespace anvil {

// Totals from /proc/stat and this process's resident memory from /proc/self/status.
struct CpuTimes {
    uint64_t busy = 0, total = 0;
};
CpuTimes cpu_times();
double process_rss_mb();       // VmRSS
double process_peak_rss_mb();  // VmHWM

}  // namespace anvil
