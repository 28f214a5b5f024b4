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

// "2G", "512M", "1.5GiB", "1000000" -> bytes; `flag` names the option in errors. A size of 0 is an error
// unless `zero_ok` (a flag whose 0 turns something off).
uint64_t parse_bytes(const std::string& s, const char* flag, bool zero_ok = false);

}  // namespace anvil
