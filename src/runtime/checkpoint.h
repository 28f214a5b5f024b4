// The training checkpoint's format, written and read here only. A checkpoint directory is a model directory
// (model/model_io.h: config.json, model.safetensors, the tokenizer's files; a LoRA run's: its PEFT adapter,
// whose base stays where it is) plus the training state: optimizer.safetensors (AdamW moments of the
// trainable parameters as "exp_avg.NAME" and "exp_avg_sq.NAME", F32, whole), fp8_state.safetensors (FP8
// delayed scaling's amax histories, where the run keeps them) and trainer_state.json (the step,
// every option, the data's path and fingerprint, the fp16 loss scale, ...: what train/ puts there), which
// also keeps the checkpoint's manifest under "files": every other file's size and CRC-32 (io/checksum.h), so
// a truncated or damaged checkpoint is found before it is read. Directories are written under a temporary
// name and renamed into place whole; a save that fails (a full disk) removes what it wrote and leaves the
// previous checkpoints as they were.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "data/tokenizer.h"
#include "model/model.h"
#include "model/model_io.h"

namespace anvil {

// What a checkpoint holds, the weights and moments of the store's entries whole and in f32 (a job gathers
// its pieces first).
struct CheckpointContents {
    const Model* model = nullptr;
    const Tokenizer* tok = nullptr;
    std::string lora_base;        // a LoRA run's base model directory: the adapter alone is saved
    nlohmann::json config_extra;  // config.json's anvil_* keys (full models)
    SaveFormat format;
    std::function<void(size_t, float*)> weights;          // entry i's weights
    std::function<void(size_t, float*, float*)> moments;  // trainable entry i's AdamW m and v
    nlohmann::json state;                                 // trainer_state.json
};
// Writes `dir` whole: under a temporary name, renamed into place (an older `dir` replaced). On failure the
// temporary directory is removed and the error says the checkpoints already written are untouched.
void write_checkpoint(const std::string& dir, const CheckpointContents& c);

// What --resume reads, once: the checkpoint directory, its trainer_state.json and its model config.
struct ResumePoint {
    std::string dir;
    nlohmann::json state;
    ModelConfig config;    // of the model being trained (a LoRA run's: its base's)
    bool adapter = false;  // the checkpoint holds a LoRA adapter; the base is the run's --init
};
// `resume_arg` itself when it holds trainer_state.json (an error if it is damaged), else the newest undamaged
// checkpoint of the run directory `resume_arg`: a damaged newer one is named on stderr and skipped for the
// one before it. When there is no checkpoint at all: nullopt if `optional` (--resume auto starts the run),
// else an error.
std::optional<ResumePoint> find_resume_point(const std::string& resume_arg, bool optional);

// Reads the moments of every trainable entry into `set(i, m, v)`: entry i's tensor-parallel piece
// (ParamSpec::shape), whatever the world size, sharding or tensor parallelism of the run that wrote them.
void read_optimizer_state(const std::string& dir, const ParamStore& store,
                          const std::function<void(size_t, const float*, const float*)>& set);
// FP8 delayed scaling's histories (Model::fp8_state, kept in fp8_state.safetensors) into `m`: false where the
// model keeps none or the checkpoint has none (it was written without delayed scaling); an error where their
// shape differs.
bool read_fp8_state(const std::string& dir, Model& m);

}  // namespace anvil
