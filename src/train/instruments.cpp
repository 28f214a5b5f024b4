#include "train/instruments.h"

#include "monitor/cost.h"
#include "monitor/hwbench.h"
#include "monitor/sysinfo.h"

namespace anvil {

RunInstruments::RunInstruments(const TrainOptions& o, const Model& model, int ranks)
    : model_(model),
      flops_per_token_(model.config().flops_per_token(o.seq)),
      price_(parse_price_per_hour(o.price_per_hour) * ranks) {
    const Backend& be = model.backend();
    const bool gpu = be.device() == Device::CUDA;
    // the peak of the precision the products run in (--precision), not of the device's best one
    const std::string precision = precision_name(model.dtype());
    if (o.peak_tflops > 0) {
        peak_ = o.peak_tflops * 1e12;
        peak_source_ = "--peak-tflops";
    } else if (!o.bench.empty()) {
        peak_ = peak_from_bench_json(o.bench, precision);
        peak_source_ = "measured " + precision + " matmul rate in " + o.bench;
    } else if (gpu) {
        if (const GpuDatasheet* d = find_datasheet(be.device_name())) {
            peak_ = datasheet_tflops(*d, precision) * 1e12;
            peak_source_ = "datasheet " + precision + " rate of the " + std::string(d->match);
        }
    } else {
        peak_ = quick_cpu_peak_flops();
        peak_source_ = "fp32 BLAS rate measured at start";
        if (o.precision == "bf16") peak_source_ += " (the bf16 products' MFU is against it)";
    }
    if (ranks > 1 && peak_ > 0) {  // the job's peak: every rank's device
        peak_ *= ranks;
        peak_source_ += fmt::format(", x {} ranks", ranks);
    }
    sampler_ = std::make_unique<Sampler>(gpu ? 0 : -1, o.monitor_interval);
}

void RunInstruments::add_step(nlohmann::json& rec, double tps, double elapsed, double tokens, double step_s,
                              int left) const {
    if (peak_ > 0) rec["mfu"] = mfu(tps);
    rec["peak_mem_mb"] = double(model_.backend().memory_peak()) / (1 << 20);
    const nlohmann::json sample = sampler_->latest_json();  // a named object: items() must not outlive it
    for (const auto& [k, v] : sample.items()) rec[k] = v;
    if (price_ > 0) {
        const CostEstimate c = estimate_cost(price_, elapsed, tokens, step_s, left);
        rec["cost_usd"] = c.so_far;
        rec["usd_per_mtok"] = c.per_million;
        rec["projected_cost_usd"] = c.projected;
    }
}

std::string RunInstruments::progress(double tps, double elapsed, double tokens, double step_s,
                                     int left) const {
    std::string s;
    if (peak_ > 0) s += fmt::format(" | MFU {:.0f}%", 100 * mfu(tps));
    if (price_ > 0) {
        const CostEstimate c = estimate_cost(price_, elapsed, tokens, step_s, left);
        s += fmt::format(" | ${:.2f} (${:.3f}/Mtok, ~${:.2f} at end)", c.so_far, c.per_million, c.projected);
    }
    return s;
}

void RunInstruments::add_summary(nlohmann::json& summary, double tps, double elapsed, double tokens) const {
    if (peak_ > 0) {
        summary["mfu"] = mfu(tps);
        summary["peak_tflops"] = peak_ / 1e12;
        summary["peak_source"] = peak_source_;
    }
    summary["peak_mem_mb"] = double(model_.backend().memory_peak()) / (1 << 20);
    summary["peak_rss_mb"] = process_peak_rss_mb();
    sampler_->sample_now();
    summary["monitor"] = sampler_->averages_json();
    if (price_ > 0) {
        const CostEstimate c = estimate_cost(price_, elapsed, tokens, 0, 0);
        summary["price_per_hour"] = price_;
        summary["cost_usd"] = c.so_far;
        summary["cost_per_million_tokens"] = c.per_million;
    }
}

}  // namespace anvil
