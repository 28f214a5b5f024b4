// Checkpoint directories.
//
// A model directory is what Hugging Face's GPT2LMHeadModel.from_pretrained(dir) loads: config.json (HF
// GPT-2 keys) and model.safetensors (HF tensor names, Conv1D (in, out) layouts, F32). A training
// checkpoint adds optimizer.safetensors (AdamW moments under "exp_avg." and "exp_avg_sq." + the parameter's
// name) and trainer_state.json (step, data position, options). Directories are written to a temporary
// name and renamed into place.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/gpt2.h"
#include "train/optimizer.h"

namespace anvil {

// config.json of a model directory, validated.
GPTConfig read_model_config(const std::string& dir, nlohmann::json* raw = nullptr);
// Loads model.safetensors from `dir` into `model`. Accepts names with or without the "transformer." prefix,
// ignores the attention-mask buffers older checkpoints carry and a tied lm_head.weight; every parameter must
// be present with the config's shape.
void load_model_weights(const std::string& dir, GPT2& model);
// The same tensors as f32 host arrays in params_info() order, without a model (for master weights).
std::vector<std::vector<float>> read_model_weights(const std::string& dir, const GPT2& model);
// Writes config.json and model.safetensors into `dir` (which must exist). `extra` holds anvil's own
// config keys (the tokenizer).
// `weights`: f32 host arrays to write (the optimizer's master copy); empty = the model's parameters.
void write_model_files(const std::string& dir, const GPT2& model, const nlohmann::json& extra,
                       const std::vector<std::vector<float>>& weights = {});
void write_optimizer_state(const std::string& dir, const GPT2& model, const AdamW& opt);
void load_optimizer_state(const std::string& dir, const GPT2& model, AdamW& opt);

}  // namespace anvil
