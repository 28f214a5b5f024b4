#include "monitor/cost.h"

#include <cstdlib>

#include "core/error.h"

namespace anvil {

namespace {
// On-demand list prices per GPU at Lambda Cloud in 2024 (they change; pass your own figure).
struct Preset {
    const char* name;
    double usd;
    const char* what;
};
constexpr Preset kPresets[] = {
    {"h100", 2.99, "H100 SXM"},
    {"h100-pcie", 2.49, "H100 PCIe"},
    {"a100", 1.79, "A100 SXM 80GB"},
    {"a10", 0.75, "A10"},
};
}  // namespace

double parse_price_per_hour(const std::string& spec) {
    if (spec.empty()) return 0.0;
    char* end = nullptr;
    const double v = std::strtod(spec.c_str(), &end);
    if (end != spec.c_str() && *end == '\0') {
        ANVIL_CHECK(v >= 0, "--price-per-hour {}: must not be negative", spec);
        return v;
    }
    for (const auto& p : kPresets)
        if (spec == p.name) return p.usd;
    fail("--price-per-hour {}: give dollars per hour or a preset ({})", spec, price_presets());
}

std::string price_presets() {
    std::string s;
    for (const auto& p : kPresets)
        s += fmt::format("{}{} ${:.2f}/h ({})", s.empty() ? "" : ", ", p.name, p.usd, p.what);
    return s + "; Lambda on-demand list prices, 2024";
}

CostEstimate estimate_cost(double price, double elapsed_s, double tokens, double step_s, int steps_left) {
    CostEstimate c;
    c.so_far = price * elapsed_s / 3600.0;
    c.per_million = tokens > 0 ? c.so_far / (tokens / 1e6) : 0.0;
    c.projected_s = step_s * steps_left;
    c.projected = c.so_far + price * c.projected_s / 3600.0;
    return c;
}

}  // namespace anvil
