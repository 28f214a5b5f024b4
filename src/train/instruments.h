// What a training run reports about itself beyond the loss: MFU against a stated peak, the hardware sampler
// (GPU through NVML, the host through /proc), peak memory, and cost. For a job of several ranks the rates
// passed in are the job's, the peak and the price every rank's device together.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/model.h"
#include "monitor/sampler.h"
#include "train/options.h"

namespace anvil {

class RunInstruments {
public:
    RunInstruments(const TrainOptions& o, const Model& model, int ranks = 1);

    double mfu(double tokens_per_s) const {
        return peak_ > 0 ? flops_per_token_ * tokens_per_s / peak_ : 0.0;
    }
    const std::string& peak_source() const { return peak_source_; }
    // Adds mfu, memory, the latest hardware sample and cost to a metrics.jsonl record.
    void add_step(nlohmann::json& rec, double tokens_per_s, double elapsed_s, double tokens, double step_s,
                  int steps_left) const;
    // " | MFU 41% | $0.12 (est. $1.20)" for the progress line.
    std::string progress(double tokens_per_s, double elapsed_s, double tokens, double step_s,
                         int steps_left) const;
    void add_summary(nlohmann::json& summary, double tokens_per_s, double elapsed_s, double tokens) const;

private:
    const Model& model_;
    double flops_per_token_, peak_ = 0, price_ = 0;
    std::string peak_source_;
    std::unique_ptr<Sampler> sampler_;
};

}  // namespace anvil
