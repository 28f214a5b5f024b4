// One optimizer step's forward/backward over its micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "data/prefetch.h"
#include "model/gpt2.h"

namespace anvil {

// Host memory the per-token losses are copied into without stopping the host (page-locked on CUDA).
class LossBuffer {
public:
    float* reserve(Backend& be, size_t n);  // at least n floats; reallocates when it must grow
private:
    Buffer buf_;
    size_t n_ = 0;
};

struct StepResult {
    double loss = 0.0;    // mean over the step's target tokens (0 when there are none)
    int64_t targets = 0;  // target tokens in the step
};

// Zeroes the gradients, then runs forward and backward on the step's `accum` micro-batches. The loss is the
// mean over every target token of the step (each micro-batch's gradient is scaled by 1/targets-in-step),
// so accumulation gives the same gradient as one large batch. The per-token losses of every micro-batch are
// copied into `losses` as the device gets to them; the step waits for the device once, at its end, to add
// them up. `loss_scale` multiplies the gradients (fp16 loss scaling); the loss reported is unscaled.
StepResult accumulate_gradients(GPT2& model, const StepBatch& batch, int accum, int B, int T,
                                LossBuffer& losses, float loss_scale = 1.0f);

// Builds step `step`'s micro-batches from `batcher` into tokens/targets (for callers without a Prefetcher).
StepBatch fill_step(Batcher& batcher, int64_t step, int accum, int B, int T, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets);

}  // namespace anvil
