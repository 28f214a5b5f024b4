// anvil doctor and anvil bench: what the machine has and what it can do.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "monitor/doctor.h"
#include "monitor/hwbench.h"
#include "runtime/inference.h"

namespace anvil::cli {

Command add_doctor(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "doctor", "check the GPU and CPU anvil would use; exit 0 when the device is usable");
    struct Opts {
        std::string device = "auto", json;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--device", o->device, "the device to check: auto, cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    add_json_flag(sub, o->json);
    return {sub, [o]() {
                const DoctorReport r = run_doctor(o->device);
                emit_result(o->json, r.json, r.text);
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
    add_json_flag(sub, o->json);
    return {sub, [o]() {
                const Device dev = parse_device(o->device);
                HwBenchReport r;
                if (dev == Device::CPU) {
                    r = cpu_hw_bench(o->threads, o->quick);
                } else {
                    std::string problem;
                    gpu_device_report(&problem);
                    ANVIL_CHECK(
                        problem.empty(),
                        "--device cuda: no usable CUDA device ({}); run anvil doctor, or use --device cpu",
                        problem);
                    r = gpu_hw_bench(o->gpu, o->quick);
                }
                emit_result(o->json, bench_to_json(r, o->price), bench_table(r, o->price));
                return 0;
            }};
}

}  // namespace anvil::cli
