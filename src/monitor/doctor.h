// `anvil doctor`: is the configured device usable, and if not, why and what to do; what the machine has.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace anvil {

struct DoctorReport {
    nlohmann::json json;
    std::string text;
    bool usable = false;  // the device asked for (cpu, cuda, auto) can run anvil
};

DoctorReport run_doctor(const std::string& device);

}  // namespace anvil
