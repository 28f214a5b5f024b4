// anvil doctor and anvil bench: what the machine has and what it can do.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "monitor/doctor.h"
#include "monitor/hwbench.h"
#include "train/run_setup.h"

#ifdef ANVIL_WITH_CUDA
#include "backend/cuda/cuda_info.h"
#endif

namespace anvil::cli {

Command add_doctor(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "doctor", "check the GPU and CPU anvil would use; exit 0 when the device is usable");
    struct Opts {
        std::string device = "auto";
        bool json = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--device", o->device, "the device to check: auto, cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_flag("--json", o->json, "print the report as JSON");
    return {sub, [o]() {
                const DoctorReport r = run_doctor(o->device);
                if (o->json)
                    std::printf("%s\n", json_text(r.json, 2).c_str());
                else
                    std::printf("%s", r.text.c_str());
                return r.usable ? 0 : 1;
            }};
}

Command add_bench(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("bench", "measure the device's matrix-product rates and bandwidths");
    struct Opts {
        std::string device = "auto", json;
        int threads = 0, gpu = 0;
        bool quick = false;
        double price = 0;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--device", o->device, "auto, cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_option("--gpu", o->gpu, "CUDA device index")->check(kNonNegative);
    sub->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    sub->add_flag("--quick", o->quick, "smaller problems, fewer repeats");
    sub->add_option("--price-per-hour", o->price, "what the machine costs per hour, for cost per PFLOP")
        ->check(kNonNegative);
    sub->add_option("--json", o->json, "also write the results as JSON to this file (- for stdout only)");
    return {sub, [o]() {
                const Device dev = parse_device(o->device);
                HwBenchReport r;
                if (dev == Device::CPU) {
                    r = cpu_hw_bench(o->threads, o->quick);
                } else {
#ifdef ANVIL_WITH_CUDA
                    r = cuda_hw_bench(o->gpu, o->quick);
#endif
                }
                const nlohmann::json j = bench_to_json(r, o->price);
                if (o->json == "-") {
                    std::printf("%s\n", json_text(j, 2).c_str());
                } else {
                    std::printf("%s", bench_table(r, o->price).c_str());
                    if (!o->json.empty()) write_file_atomic(o->json, json_text(j, 2) + "\n");
                }
                return 0;
            }};
}

}  // namespace anvil::cli
