#include "monitor/sysinfo.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace anvil {

CpuTimes cpu_times() {
    std::ifstream f("/proc/stat");
    std::string cpu;
    uint64_t v[10] = {};
    f >> cpu;
    for (auto& x : v) f >> x;
    CpuTimes t;
    for (uint64_t x : v) t.total += x;
    t.busy = t.total - v[3] - v[4];  // idle, iowait
    return t;
}

static double status_mb(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::string(key).size()) / 1024.0;
    return 0;
}

double process_rss_mb() {
    return status_mb("VmRSS:");
}
double process_peak_rss_mb() {
    return status_mb("VmHWM:");
}

}  // namespace anvil
