#include "backend/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

namespace anvil {

std::string ProfilingBackend::report() const {
    std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0.0;
    for (const auto& r : rows) total += r.second.seconds;
    std::string out = fmt::format("{:<32} {:>7} {:>10} {:>9} {:>6} {:>8}\n", "op", "calls", "total ms",
                                  "ms/call", "share", "GFLOP/s");
    for (const auto& [name, s] : rows) {
        std::string rate;
        long n = 0, k = 0, m = 0;
        if (name.starts_with("matmul") &&
            std::sscanf(name.c_str() + name.find(' '), " %ldx%ld>%ld", &n, &k, &m) == 3) {
            const double flops =
                2.0 * double(n) * double(k) * double(m) * (name.starts_with("matmul_bwd") ? 2 : 1);
            rate = fmt::format("{:.1f}", flops * double(s.calls) / s.seconds / 1e9);
        }
        out +=
            fmt::format("{:<32} {:>7} {:>10.1f} {:>9.3f} {:>5.1f}% {:>8}\n", name, s.calls, s.seconds * 1e3,
                        s.seconds * 1e3 / double(s.calls), total > 0 ? 100.0 * s.seconds / total : 0.0, rate);
    }
    out += fmt::format("{:<32} {:>7} {:>10.1f}\n", "total", "", total * 1e3);
    return out;
}

}  // namespace anvil
