// Everything a training run holds, built from its options: the output directory (locked), tokenizer, data,
// backend, model and optimizer, fresh, from --init or from a --resume checkpoint.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "data/batcher.h"
#include "data/choices.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/model.h"
#include "runtime/checkpoint.h"
#include "runtime/inference.h"
#include "runtime/run_dir.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/options.h"
#include "train/tensor_parallel.h"
#include "train/trainer.h"

namespace anvil {

struct RunSetup {
    Comm* comm = nullptr;                        // the job's processes (size 1: this one alone)
    ProcessGrid grid;                            // its data-parallel replicas and tensor-parallel groups
    RunDirLock lock;                             // rank 0's; held until everything else is gone
    TrainOptions opts;                           // resolved (out dir, data path, sequence length, batch)
    std::unique_ptr<Backend> backend;            // outlives everything allocated on it
    std::unique_ptr<ProfilingBackend> profiler;  // wraps `backend` with --profile
    std::unique_ptr<Tokenizer> tok;
    Dataset data;
    std::vector<ChoiceItem> choices;  // --eval-choices
    std::unique_ptr<Model> model;
    std::unique_ptr<AdamW> opt;
    std::unique_ptr<DataParallel> dp;  // with more than one rank
    std::unique_ptr<Trainer> trainer;
    int64_t start_step = 0;
    std::vector<std::string> batch_search;  // what --batch auto tried
    // --eval-every's lowest validation loss so far, its step (0: none yet), the evaluations since and the
    // checkpoint that holds it (--keep-best); kept in trainer_state.json, so a resumed run goes on from it
    struct Best {
        double loss = 0.0;
        int64_t step = 0;
        int evals_since = 0;
        std::string dir;
    } best;
};

// runs/YYYYmmdd-HHMMSS: the run directory when --out does not name one.
std::string default_out_dir();

// Resolves and loads; `o` is updated in place with the resolved values. `resume` is the checkpoint to
// continue (read once by the caller), or null. Every rank of `comm` calls it: rank 0 alone owns the run
// directory; the ranks check that they were given the same options and see the same data.
RunSetup setup_run(TrainOptions& o, const ResumePoint* resume, Comm& comm);

// The training split's batches for data-parallel rank `rank` of `world` (data/batcher.h), augmented per epoch
// with --augment (the training examples move out of run.data into it).
Batcher training_batcher(RunSetup& run, int rank, int world);

// A new model's configuration from the shape flags (--arch, --layers, --dim, ...) for a tokenizer of
// `tok_vocab` ids (--vocab pads it; large vocabularies are padded to a multiple of 64 when it is not given).
ModelConfig new_model_config(const TrainOptions& o, int tok_vocab);

// The model options a training run's flags give (--precision, --recompute, --logits-chunk, dropout, NEFTune,
// LoRA) on `device`; resolves --precision auto in `o`.
ModelOptions training_model_options(TrainOptions& o, Device device, const LoraOptions& lora);

// The backend for a training run's options (runtime/inference.h's, and --attn-fwd-rows and --gemm-tune), on
// GPU `gpu` (the job's local rank).
std::unique_ptr<Backend> make_run_backend(const TrainOptions& o, int gpu);

}  // namespace anvil
