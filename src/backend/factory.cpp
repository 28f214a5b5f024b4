// The one place that knows every backend: make_backend picks one by device.
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

#include <nlohmann/json.hpp>

#ifdef ANVIL_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_probe.h"
#endif

namespace anvil {

bool cuda_built() {
#ifdef ANVIL_WITH_CUDA
    return true;
#else
    return false;
#endif
}

bool cuda_available() {
#ifdef ANVIL_WITH_CUDA
    return cuda_device_count() > 0;
#else
    return false;
#endif
}

nlohmann::json gpu_device_report(std::string* problem) {
#ifdef ANVIL_WITH_CUDA
    return cuda_device_report(problem);
#else
    *problem = "this anvil binary was built without the CUDA backend (nvcc was not found when it was built)";
    return nlohmann::json::array();
#endif
}

GpuRates gpu_measure([[maybe_unused]] int device, [[maybe_unused]] bool quick) {
#ifdef ANVIL_WITH_CUDA
    return cuda_measure(device, quick);
#else
    fail(
        "--device cuda: this anvil was built without the CUDA backend; rebuild where nvcc is installed (make "
        "CUDA=ON), or use --device cpu");
#endif
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
    if (opts.device == Device::CPU) return std::make_unique<CpuBackend>(opts.threads);
#ifdef ANVIL_WITH_CUDA
    return make_cuda_backend(opts);
#else
    fail(
        "--device cuda: this anvil binary was built without the CUDA backend; rebuild with nvcc on the PATH "
        "(cmake -DANVIL_CUDA=ON) or use --device cpu");
#endif
}

}  // namespace anvil
