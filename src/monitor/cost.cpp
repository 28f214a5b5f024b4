#include "monitor/cost.h"

#include <cstdlib>

#include "core/error.h"
#include "monitor/cards.h"

namespace anvil {

double parse_price_per_hour(const std::string& spec) {
    if (spec.empty()) return 0.0;
    char* end = nullptr;
    const double v = std::strtod(spec.c_str(), &end);
    if (end != spec.c_str() && *end == '\0') {
        ANVIL_CHECK(v >= 0, "--price-per-hour {}: must not be negative", spec);
        return v;
    }
    if (const CardKind* c = find_card(spec)) return c->usd_per_hour;
    fail("--price-per-hour {}: give dollars per hour or a preset ({})", spec, price_presets());
}

std::string price_presets() {
    std::string s;
    for (const CardKind& c : card_kinds())
        s += fmt::format("{}{} ${:.2f}/h ({})", s.empty() ? "" : ", ", c.kind, c.usd_per_hour, c.name);
    return s + "; " + kPriceSource;
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
