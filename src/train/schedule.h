// Learning-rate schedule: linear warmup over `warmup` steps (step s gets lr*(s+1)/warmup), then one of
//   constant  lr;
//   cosine    from lr down to lr*min_lr_frac at the last step (nanoGPT's, llm.c's);
//   linear    the same ends joined by a straight line (llm.c's);
//   wsd       warmup-stable-decay (llm.c's, arXiv 2405.18392): lr until the last decay_frac of the steps,
//             then down to lr*min_lr_frac at the last step along 1 - sqrt(ratio).
// Steps are 0-based; the ratio r runs from 0 at the first decaying step to 1 at the last one.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace anvil {

enum class LrShape { Constant, Cosine, Linear, Wsd };

// cosine, linear, constant or wsd; anything else is an error naming --lr-schedule.
inline LrShape parse_lr_shape(const std::string& name) {
    if (name == "cosine") return LrShape::Cosine;
    if (name == "linear") return LrShape::Linear;
    if (name == "constant") return LrShape::Constant;
    if (name == "wsd") return LrShape::Wsd;
    fail("--lr-schedule {}: use cosine, linear, constant or wsd", name);
}

// A step of a run, named by its number: steps count from 1, as metrics.jsonl, the progress line,
// checkpoint-N, trainer_state.json's "step" (the steps completed) and AdamW's bias correction count them.
// index() is how many steps came before it: the batch the data order gives it (data/batcher.h, the
// prefetcher) and its place in the learning-rate schedule (LrSchedule::at).
struct Step {
    int64_t number = 1;
    int64_t index() const { return number - 1; }
};

struct LrSchedule {
    float lr = 3e-4f;
    float min_lr_frac = 0.1f;
    int warmup = 0;
    int total = 1;
    LrShape shape = LrShape::Cosine;
    float decay_frac = 0.2f;  // wsd: the share of the steps that decays

    // the learning rate of the step with this index (Step::index)
    float at(int64_t step) const {
        if (step < warmup) return lr * float(step + 1) / float(warmup);
        if (shape == LrShape::Constant) return lr;
        // the first decaying step: after warmup (and, for wsd, after the stable part)
        int first = warmup;
        if (shape == LrShape::Wsd) {
            const int stable_end = total - int(std::lround(double(decay_frac) * total));
            if (step < stable_end) return lr;
            first = std::max(first, stable_end);
        }
        const int span = total - first;
        const float r = span > 1 ? std::min(1.0f, float(step - first) / float(span - 1)) : 1.0f;
        float coeff;  // 1 at the first decaying step, 0 at the last
        switch (shape) {
            case LrShape::Cosine:
                coeff = 0.5f * (1.0f + std::cos(3.14159265358979f * r));
                break;
            case LrShape::Linear:
                coeff = 1.0f - r;
                break;
            default:
                coeff = 1.0f - std::sqrt(r);
                break;
        }
        const float min_lr = lr * min_lr_frac;
        return min_lr + coeff * (lr - min_lr);
    }
};

}  // namespace anvil
