// One optimizer step's forward/backward over its micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batcher.h"
#include "model/gpt2.h"

namespace anvil {

struct StepBuffers {
    std::vector<int32_t> tokens, targets;  // (accum, B, T)
    std::vector<float> losses;             // (B, T)
};

struct StepResult {
    double loss = 0.0;    // mean over the step's target tokens (0 when there are none)
    int64_t targets = 0;  // target tokens in the step
};

// Zeroes the gradients, then runs forward and backward on micro-batches step*accum .. step*accum+accum-1 of
// `batcher`. The loss is the mean over every target token of the step (each micro-batch's gradient is
// scaled by 1/targets-in-step), so accumulation gives the same gradient as one large batch.
StepResult accumulate_gradients(GPT2& model, Batcher& batcher, int64_t step, int accum, int B, int T,
                                StepBuffers& buf);

}  // namespace anvil
