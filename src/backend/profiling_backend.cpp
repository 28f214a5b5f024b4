#include "backend/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

namespace anvil {

namespace {

// FLOPs of one call of a matrix product named "matmul_xxx NxK>M" (the backward does two products)
double matmul_flops(const std::string& name) {
    long n = 0, k = 0, m = 0;
    if (!name.starts_with("matmul") ||
        std::sscanf(name.c_str() + name.find(' '), " %ldx%ld>%ld", &n, &k, &m) != 3)
        return 0.0;
    return 2.0 * double(n) * double(k) * double(m) * (name.starts_with("matmul_bwd") ? 2 : 1);
}

}  // namespace

nlohmann::json ProfilingBackend::report_json() const {
    std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0.0;
    for (const auto& r : rows) total += r.second.seconds;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [name, s] : rows) {
        nlohmann::json r = {{"op", name},
                            {"calls", s.calls},
                            {"total_ms", s.seconds * 1e3},
                            {"ms_per_call", s.seconds * 1e3 / double(s.calls)},
                            {"share", total > 0 ? s.seconds / total : 0.0}};
        if (const double f = matmul_flops(name); f > 0) r["gflops"] = f * double(s.calls) / s.seconds / 1e9;
        if (s.bytes > 0) r["gb_per_s"] = s.bytes / s.seconds / 1e9;
        out.push_back(r);
    }
    return out;
}

std::string ProfilingBackend::report() const {
    const nlohmann::json rows = report_json();
    std::string out = fmt::format("{:<32} {:>7} {:>10} {:>9} {:>6} {:>8} {:>8}\n", "op", "calls", "total ms",
                                  "ms/call", "share", "GFLOP/s", "GB/s");
    double total = 0.0;
    for (const auto& r : rows) {
        total += r["total_ms"].get<double>();
        out += fmt::format("{:<32} {:>7} {:>10.1f} {:>9.3f} {:>5.1f}% {:>8} {:>8}\n",
                           r["op"].get<std::string>(), r["calls"].get<int64_t>(), r["total_ms"].get<double>(),
                           r["ms_per_call"].get<double>(), 100.0 * r["share"].get<double>(),
                           r.contains("gflops") ? fmt::format("{:.1f}", r["gflops"].get<double>()) : "",
                           r.contains("gb_per_s") ? fmt::format("{:.1f}", r["gb_per_s"].get<double>()) : "");
    }
    out += fmt::format("{:<32} {:>7} {:>10.1f}\n", "total", "", total);
    return out;
}

}  // namespace anvil
