#include "monitor/doctor.h"

#include "backend/backend.h"
#include "backend/host_info.h"
#include "core/version.h"
#include "monitor/nvml.h"

namespace anvil {

DoctorReport run_doctor(const std::string& device) {
    DoctorReport r;
    r.json["anvil"] = version_string();
    r.text += fmt::format("anvil {}\n", version_string());
    const CpuInfo c = cpu_info();
    r.json["cpu"] = {{"model", c.model},
                     {"logical_cores", c.logical_cores},
                     {"simd", c.simd},
                     {"ram_gib", double(c.ram_bytes) / double(1ull << 30)},
                     {"blas", c.blas}};
    r.text += fmt::format("CPU: {}, {} logical cores, {}, {:.1f} GiB RAM\n", c.model, c.logical_cores, c.simd,
                          double(c.ram_bytes) / double(1ull << 30));
    r.text += fmt::format("BLAS: {}\n", c.blas);

    // GPU: what the driver says (NVML), then what this binary can do with it.
    Nvml nvml;
    nlohmann::json gpu = {{"cuda_built", cuda_built()}};
    if (nvml.available()) {
        gpu["driver"] = nvml.driver_version();
        gpu["nvml_devices"] = nvml.device_count();
    } else {
        gpu["driver"] = nullptr;
        gpu["nvml"] = nvml.why_not();
    }
    std::string problem;
    bool cuda_ok = false;
    const nlohmann::json devices = gpu_device_report(&problem);
    if (cuda_built()) gpu["devices"] = devices;
    cuda_ok = problem.empty() && !devices.empty();
    for (const auto& d : devices)
        r.text += fmt::format(
            "GPU {}: {}, compute capability {}, {:.1f} GiB, {} SMs; driver {} (CUDA {}), runtime {}, "
            "cuBLASLt {}, "
            "cuDNN {}, NCCL {}\n",
            d.value("index", 0), d.value("name", ""), d.value("compute_capability", ""),
            d.value("memory_gib", 0.0), d.value("sm_count", 0),
            gpu.value("driver", nlohmann::json("?")).is_string() ? gpu["driver"].get<std::string>() : "?",
            d.value("driver_cuda", ""), d.value("runtime", ""), d.value("cublaslt", ""), d.value("cudnn", ""),
            d.value("nccl", ""));
    if (!cuda_ok) {
        std::string what = problem;
        if (!nvml.available()) what += "; no NVIDIA driver was found (" + nvml.why_not() + ")";
        std::string advice;
        if (!cuda_built())
            advice = "install the CUDA toolkit (nvcc) and rebuild: make CUDA=ON";
        else if (!nvml.available())
            advice = "install the NVIDIA driver, or train on the CPU with --device cpu";
        else
            advice = "check nvidia-smi and CUDA_VISIBLE_DEVICES, or train on the CPU with --device cpu";
        gpu["problem"] = what;
        gpu["what_to_do"] = advice;
        r.text += fmt::format("GPU: not usable: {}.\n  What to do: {}.\n", what, advice);
    }
    r.json["gpu"] = gpu;
    if (device == "cuda")
        r.usable = cuda_ok;
    else
        r.usable = true;  // cpu, or auto (which falls back to the CPU)
    const std::string chosen = device == "auto" ? (cuda_ok ? "cuda" : "cpu") : device;
    r.json["device"] = {{"requested", device}, {"selected", chosen}, {"usable", r.usable}};
    r.text += fmt::format("Device {}: {}\n", device == "auto" ? "auto -> " + chosen : device,
                          r.usable ? "usable" : "NOT usable");
    return r;
}

}  // namespace anvil
