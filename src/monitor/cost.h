// Money: --price-per-hour takes dollars per hour or a preset name for a common cloud GPU.
#pragma once

#include <string>

namespace anvil {

// "2.49" -> 2.49; "h100" -> the preset; "" -> 0. Throws naming the flag for anything else.
double parse_price_per_hour(const std::string& spec);
// The presets, one line each, for --help and the README.
std::string price_presets();

struct CostEstimate {
    double so_far = 0;       // $ for the wall time so far
    double per_million = 0;  // $ per million trained tokens so far
    double projected = 0;    // $ at the last step, at the current pace
    double projected_s = 0;  // seconds left to the last step
};
CostEstimate estimate_cost(double price_per_hour, double elapsed_s, double tokens, double step_s,
                           int steps_left);

}  // namespace anvil
