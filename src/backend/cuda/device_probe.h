// The CUDA side of `anvil doctor` and `anvil bench` (backend.h's gpu_device_report and gpu_measure call
// these).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"

namespace anvil {

nlohmann::json cuda_device_report(std::string* problem);
GpuRates cuda_measure(int device, bool quick);

}  // namespace anvil
