// What `anvil doctor` and `anvil bench` ask of the CUDA side.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "monitor/hwbench.h"

namespace anvil {

// One object per device (name, compute capability, memory, SMs, driver/runtime CUDA versions, cuBLASLt,
// cuDNN and NCCL versions found at run time). `problem` gets why no device is usable, or stays empty.
nlohmann::json cuda_device_report(std::string* problem);
// Matrix-product rates (fp32, tf32, bf16, fp16, fp8 where supported) through cuBLASLt, device-to-device
// copy bandwidth, host-to-device bandwidth from pinned and pageable memory.
HwBenchReport cuda_hw_bench(int device, bool quick);

}  // namespace anvil
