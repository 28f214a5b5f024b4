// Learning-rate schedule: linear warmup over `warmup` steps (step s gets lr*(s+1)/warmup), then either
// constant or cosine decay from lr to lr*min_lr_frac at the last step (nanoGPT's schedule). Steps 0-based.
#pragma once

#include <cmath>
#include <string>

namespace anvil {

struct LrSchedule {
    float lr = 3e-4f;
    float min_lr_frac = 0.1f;
    int warmup = 0;
    int total = 1;
    bool cosine = true;

    float at(int step) const {
        if (step < warmup) return lr * float(step + 1) / float(warmup);
        if (!cosine) return lr;
        const int span = total - warmup;
        const float ratio = span > 1 ? float(step - warmup) / float(span - 1) : 1.0f;
        const float coeff = 0.5f * (1.0f + std::cos(3.14159265358979f * (ratio > 1.0f ? 1.0f : ratio)));
        const float min_lr = lr * min_lr_frac;
        return min_lr + coeff * (lr - min_lr);
    }
};

}  // namespace anvil
