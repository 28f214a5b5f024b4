// Everything a training run holds, built from its options: the output directory, tokenizer, data, backend,
// model and optimizer, fresh, from --init or from a --resume checkpoint. Also checkpoint writing.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/trainer.h"

namespace anvil {

struct RunSetup {
    RunDirLock lock;                             // declared first: held until everything else is gone
    TrainOptions opts;                           // resolved (out dir, data path, sequence length)
    std::unique_ptr<Backend> backend;            // declared first: outlives everything allocated on it
    std::unique_ptr<ProfilingBackend> profiler;  // wraps `backend` with --profile
    std::unique_ptr<Tokenizer> tok;
    Dataset data;
    std::unique_ptr<GPT2> model;
    std::unique_ptr<AdamW> opt;
    int start_step = 0;
    std::vector<std::string> batch_search;  // what --batch auto tried
};

// Resolves and loads; `o` is updated in place with the resolved values.
RunSetup setup_run(TrainOptions& o);
// The checkpoint directory to resume from: DIR itself if it holds trainer_state.json, else the newest
// checkpoint-N or final inside it.
std::string resolve_checkpoint(const std::string& dir);
// Writes a full training checkpoint (model files, tokenizer, optimizer state, trainer_state.json) to
// out/name atomically, then drops checkpoint-N directories beyond --keep-checkpoints.
void save_checkpoint(const RunSetup& run, int step, const std::string& name);
Device parse_device(const std::string& name);

}  // namespace anvil
