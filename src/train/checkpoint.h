// Training checkpoints. A checkpoint directory is a model directory (model/model_io.h: config.json,
// model.safetensors, the tokenizer's files) plus the training state: optimizer.safetensors (AdamW moments
// of the trainable parameters as "exp_avg.NAME" and "exp_avg_sq.NAME", F32) and trainer_state.json (the
// step, every option, the data's path and fingerprint, the fp16 loss scale). Directories are written under
// a temporary name and renamed into place whole.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "model/model.h"
#include "train/optimizer.h"

namespace anvil {

struct RunSetup;
struct LossScaler;

// The checkpoint directory to resume from: DIR itself if it holds trainer_state.json, else the newest
// checkpoint-N or final inside it. `flag` names the option in errors.
std::string resolve_checkpoint(const std::string& dir, const char* flag = "--resume");

// What --resume reads, once: the checkpoint directory, its trainer_state.json and its model config.
struct ResumePoint {
    std::string dir;
    nlohmann::json state;
    ModelConfig config;    // of the model being trained (a LoRA run's: its base's)
    bool adapter = false;  // the checkpoint holds a LoRA adapter; the base is the run's --init
};
ResumePoint read_resume_point(const std::string& resume_arg);

// The moments of every trainable entry, whole (tensor-parallel pieces gathered): moments(i, m, v) fills entry
// i's (ParamSpec::full_shape()).
void write_optimizer_state(const std::string& dir, const ParamStore& store,
                           const std::function<void(size_t, float*, float*)>& moments);
// Reads the moments of every trainable entry; a sharded optimizer keeps its own range and a tensor-parallel
// piece its part, whatever the world size, sharding or tensor parallelism of the run that wrote them.
void load_optimizer_state(const std::string& dir, const ParamStore& store, AdamW& opt);

// Writes a full training checkpoint of `run` at `step` to OUT/name atomically, then drops checkpoint-N
// directories beyond --keep-checkpoints. Every rank of a job calls it: the replicas check that their weights
// agree, tensor-parallel groups gather their pieces, then rank 0 writes (trainer_state.json records the world
// size; the options, --tensor-parallel).
void save_checkpoint(const RunSetup& run, int step, const std::string& name);
// The loss scaler's state as trainer_state.json keeps it, and back.
nlohmann::json scaler_to_json(const LossScaler& s);
void scaler_from_json(const nlohmann::json& state, LossScaler& s);

}  // namespace anvil
