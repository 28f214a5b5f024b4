#include "monitor/hwbench.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/host_info.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

namespace {
using Clock = std::chrono::steady_clock;

template <typename F>
double median_seconds(F&& f, int reps) {
    f();  // warm-up
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        const auto t0 = Clock::now();
        f();
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

double sgemm_tflops(int n, int reps) {
    std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
    Rng rng(1);
    for (auto& x : a) x = float(rng.normal());  // random data: a matrix of zeros runs faster than real work
    for (auto& x : b) x = float(rng.normal());
    const double s = median_seconds(
        [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                        0.0f, c.data(), n);
        },
        reps);
    return 2.0 * n * double(n) * n / s / 1e12;
}
}  // namespace

// Dense datasheet figures (NVIDIA product briefs): FP32, TF32, BF16, FP16, FP8 tensor TFLOP/s without
// sparsity; memory bandwidth; PCIe bandwidth per direction (x16: Gen4 32 GB/s, Gen5 64 GB/s).
double datasheet_tflops(const GpuDatasheet& d, const std::string& precision) {
    if (precision == "bf16") return d.bf16;
    if (precision == "fp16") return d.fp16;
    if (precision == "tf32") return d.tf32;
    if (precision == "fp8") return d.fp8;
    return d.fp32;
}

const GpuDatasheet* find_datasheet(const std::string& name) {
    static const GpuDatasheet table[] = {
        {"H200", 67, 494.7, 989.4, 989.4, 1978.9, 4800, 64},
        {"H100 NVL", 60, 417.5, 835, 835, 1670, 3900, 64},
        {"H100 PCIe", 51, 378, 756, 756, 1513, 2000, 64},
        {"H100", 67, 494.7, 989.4, 989.4, 1978.9, 3350, 64},  // SXM5
        {"A100-SXM4-80GB", 19.5, 156, 312, 312, 0, 2039, 32},
        {"A100-SXM4-40GB", 19.5, 156, 312, 312, 0, 1555, 32},
        {"A100 80GB PCIe", 19.5, 156, 312, 312, 0, 1935, 32},
        {"A100-PCIE-40GB", 19.5, 156, 312, 312, 0, 1555, 32},
        {"L40S", 91.6, 183, 362, 362, 733, 864, 32},
        {"L4", 30.3, 60, 121, 121, 242.5, 300, 32},
        {"A10", 31.2, 62.5, 125, 125, 0, 600, 32},
        // GeForce: the tensor cores' rates with f32 accumulation (what training uses), half the
        // f16-accumulate figure
        {"RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008, 32},
        {"RTX 3090", 35.6, 35.6, 71, 71, 0, 936, 32},
    };
    for (const auto& d : table)
        if (name.find(d.match) != std::string::npos) return &d;
    return nullptr;
}

HwBenchReport gpu_hw_bench(int device, bool quick) {
    const GpuRates g = gpu_measure(device, quick);
    HwBenchReport r;
    r.device_kind = "cuda";
    r.device_name = g.device_name;
    const GpuDatasheet* ds = find_datasheet(g.device_name);
    for (const GpuRate& x : g.rates) {
        double ref = 0;
        if (ds && x.name.starts_with("matmul_")) ref = datasheet_tflops(*ds, x.name.substr(7));
        if (ds && x.name == "copy_d2d") ref = ds->mem_gbps;
        if (ds && x.name.starts_with("h2d_")) ref = ds->pcie_gbps;
        r.results.push_back({x.name, x.unit, x.measured, ref, "datasheet", x.detail});
    }
    return r;
}

HwBenchReport cpu_hw_bench(int threads, bool quick) {
    const CpuInfo info = cpu_info();
    if (threads <= 0) threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    HwBenchReport r;
    r.device_kind = "cpu";
    r.device_name = info.model;
    const int n = quick ? 1024 : 2048;
    BenchResult mm{"matmul_fp32",
                   "TFLOP/s",
                   sgemm_tflops(n, quick ? 3 : 7),
                   0,
                   "nominal",
                   fmt::format("sgemm {}x{}x{}, {} threads, OpenBLAS", n, n, n, threads)};
    mm.reference = double(threads) * info.ghz * info.fp32_flops_per_cycle / 1e3;  // assumes two FMA units
    r.results.push_back(mm);
    // memory bandwidth: a parallel copy, counting bytes read plus written
    const size_t bytes = size_t(quick ? 64 : 256) << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const double s = median_seconds(
        [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int t = 0; t < threads; t++) {
                const size_t chunk = bytes / size_t(threads), off = size_t(t) * chunk;
                std::memcpy(dst.data() + off, src.data() + off, t + 1 == threads ? bytes - off : chunk);
            }
        },
        quick ? 3 : 7);
    r.results.push_back({"copy_d2d", "GB/s", 2.0 * double(bytes) / s / 1e9, 0, "",
                         fmt::format("memcpy of {} MiB in RAM, {} threads", bytes >> 20, threads)});
    return r;
}

nlohmann::json bench_to_json(const HwBenchReport& r, double price) {
    nlohmann::json res = nlohmann::json::array();
    for (const auto& b : r.results) {
        nlohmann::json j = {
            {"name", b.name}, {"unit", b.unit}, {"measured", b.measured}, {"detail", b.detail}};
        if (b.reference > 0) {
            j["reference"] = b.reference;
            j["reference_kind"] = b.reference_kind;
            j["ratio"] = b.measured / b.reference;
        }
        if (price > 0 && b.unit == "TFLOP/s" && b.measured > 0)
            j["usd_per_pflop"] = price / (b.measured * 3600.0 / 1000.0);  // $ per 10^15 FLOPs at this rate
        res.push_back(j);
    }
    nlohmann::json out = {{"device", {{"kind", r.device_kind}, {"name", r.device_name}}}, {"results", res}};
    if (price > 0) out["price_per_hour"] = price;
    return out;
}

std::string bench_table(const HwBenchReport& r, double price) {
    std::string s =
        fmt::format("{} ({})\n{:<14} {:>12} {:>12} {:>7}  {}{}\n", r.device_name, r.device_kind, "measure",
                    "measured", "reference", "ratio", price > 0 ? "$/PFLOP   " : "", "detail");
    for (const auto& b : r.results) {
        const std::string ref =
            b.reference > 0 ? fmt::format("{:.1f} {}", b.reference, b.reference_kind.substr(0, 3)) : "-";
        const std::string ratio =
            b.reference > 0 ? fmt::format("{:.0f}%", 100 * b.measured / b.reference) : "-";
        const std::string cost = price > 0 && b.unit == "TFLOP/s" && b.measured > 0
                                     ? fmt::format("{:<10.4f}", price / (b.measured * 3.6))
                                     : (price > 0 ? std::string(10, ' ') : "");
        s += fmt::format("{:<14} {:>8.2f} {:<4}{:>11} {:>7}  {}{}\n", b.name, b.measured,
                         b.unit == "TFLOP/s" ? "TF/s" : "GB/s", ref, ratio, cost, b.detail);
    }
    return s;
}

double peak_from_bench_json(const std::string& path, const std::string& precision) {
    const nlohmann::json j = read_json_file(path, "give --bench a file written by anvil bench --json");
    const std::string want = "matmul_" + precision;
    if (j.contains("results"))
        for (const auto& r : j["results"])
            if (r.value("name", std::string()) == want) return r.value("measured", 0.0) * 1e12;
    fail("--bench {}: no {} result; run anvil bench --json on the device you train on", path, want);
}

// The best of three 2048^3 products: a peak, so a noisy moment must not inflate MFU.
double quick_cpu_peak_flops() {
    double best = 0;
    for (int i = 0; i < 3; i++) best = std::max(best, sgemm_tflops(2048, 1));
    return best * 1e12;
}

}  // namespace anvil
