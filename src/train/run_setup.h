// Everything a training run holds, built from its options: the output directory (locked), tokenizer, data,
// backend, model and optimizer, fresh, from --init or from a --resume checkpoint; and the same model loading
// for `anvil eval` and `anvil generate` (setup_inference).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "data/choices.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/options.h"
#include "train/run_dir.h"
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
    int start_step = 0;
    std::vector<std::string> batch_search;  // what --batch auto tried
    // --eval-every's lowest validation loss so far, its step (0: none yet), the evaluations since and the
    // checkpoint that holds it (--keep-best); kept in trainer_state.json, so a resumed run goes on from it
    struct Best {
        double loss = 0.0;
        int step = 0, evals_since = 0;
        std::string dir;
    } best;
};

// Resolves and loads; `o` is updated in place with the resolved values. `resume` is the checkpoint to
// continue (read once by the caller), or null. Every rank of `comm` calls it: rank 0 alone owns the run
// directory; the ranks check that they were given the same options and see the same data.
RunSetup setup_run(TrainOptions& o, const ResumePoint* resume, Comm& comm);

Device parse_device(const std::string& name);
// The backend for --device/--threads/--attention; a CUDA backend on GPU `gpu` (a job's local rank).
std::unique_ptr<Backend> make_run_backend(const std::string& device, int threads,
                                          const std::string& attention, int gpu = 0);
// The same from a training run's options (also --attn-fwd-rows and --gemm-tune).
std::unique_ptr<Backend> make_run_backend(const TrainOptions& o, int gpu);

// A model directory loaded for evaluation or generation.
struct InferenceOptions {
    std::string model_dir;        // a model directory, a run directory (its final/) or a checkpoint's parent
    std::string adapter;          // a PEFT LoRA adapter on it
    std::string tokenizer;        // override the checkpoint's
    std::string prompt_template;  // override the one the model was trained with
    std::string device = "auto";  // CUDA when a usable GPU is visible, else the CPU
    int threads = 0;
};
struct InferenceSetup {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Model> model;
    PromptTemplate prompt = PromptTemplate::Alpaca;
    std::string base_dir, adapter_dir;  // where the weights came from
};
InferenceSetup setup_inference(const InferenceOptions& o);
// A model directory from a user path: the directory itself if it has config.json (or is an adapter), else a
// run directory's final/ or newest checkpoint.
std::string resolve_model_dir(const std::string& path);
// A PEFT adapter directory (adapter_config.json, no config.json of its own).
bool is_adapter_dir(const std::string& dir);

}  // namespace anvil
