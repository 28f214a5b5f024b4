// `anvil bench`: the machine's own ceilings (matrix-product rate per precision, copy bandwidth,
// host-to-device bandwidth), each beside its datasheet (GPU) or nominal (CPU) figure, with cost per unit of
// performance.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil {

struct BenchResult {
    std::string
        name;  // matmul_fp32, matmul_tf32, matmul_bf16, matmul_fp16, matmul_fp8, copy_d2d, h2d_pinned, ...
    std::string unit;  // TFLOP/s or GB/s
    double measured = 0;
    double reference = 0;        // 0 = none known
    std::string reference_kind;  // "datasheet" or "nominal"
    std::string detail;          // shape, size
};

struct HwBenchReport {
    std::string device_kind;  // cpu or cuda
    std::string device_name;
    std::vector<BenchResult> results;
};

HwBenchReport cpu_hw_bench(int threads, bool quick);
// The GPU's (backend.h's gpu_measure), each rate beside its datasheet figure where the card is in the table.
HwBenchReport gpu_hw_bench(int device, bool quick);

// Published dense figures for common NVIDIA cards (TFLOP/s without sparsity; GB/s).
struct GpuDatasheet {
    const char* match;  // substring of the CUDA device name
    double fp32, tf32, bf16, fp16, fp8, mem_gbps, pcie_gbps;
};
const GpuDatasheet* find_datasheet(const std::string& device_name);
// The dense TFLOP/s of a precision ("fp32", "tf32", "bf16", "fp16", "fp8") on the sheet.
double datasheet_tflops(const GpuDatasheet& d, const std::string& precision);

nlohmann::json bench_to_json(const HwBenchReport& r, double price_per_hour);
std::string bench_table(const HwBenchReport& r, double price_per_hour);

// The MFU denominator in FLOP/s: the measured matmul rate for `precision` (fp32, bf16, ...) in a JSON file
// written by `anvil bench --json`; throws naming the file if it has none.
double peak_from_bench_json(const std::string& path, const std::string& precision);
// A short fp32 BLAS measurement on the CPU backend's threads (about 0.3 s).
double quick_cpu_peak_flops();

}  // namespace anvil
