// --batch auto: the largest micro-batch that fits is found by real allocations and real steps (forward,
// backward, optimizer), then the fastest of those that divide the global batch is kept; the global batch is
// reached through gradient accumulation. Trial steps run at learning rate 0 and the optimizer moments are
// cleared after, so the run is the one an explicit --batch/--grad-accum would give.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "train/trainer.h"

namespace anvil {

struct AutoBatch {
    int micro = 0, accum = 0;
    std::vector<std::string> log;  // one line per micro-batch tried
};

// Trial steps through `trainer` (its model must have no activations reserved); leaves none reserved.
AutoBatch find_batch_size(Trainer& trainer, const TokenView& data, int T, int global_batch, bool shuffle,
                          uint64_t seed);

}  // namespace anvil
