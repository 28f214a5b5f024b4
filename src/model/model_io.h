// Model directories as Hugging Face writes and reads them: config.json plus model.safetensors, or a sharded
// checkpoint (model.safetensors.index.json naming the file of every tensor). Loading streams one tensor at a
// time from the memory-mapped files straight into its parameter's dtype; nothing holds a whole-model copy.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"

namespace anvil {

// config.json of a model directory, validated; `raw` (optional) receives the JSON (anvil's own keys too).
ModelConfig read_model_config(const std::string& dir, nlohmann::json* raw = nullptr);

// Loads every parameter of `model` from `dir`. Names follow the model (model.canonical_name accepts a
// family's aliases); every parameter must be present with its shape; a tensor that is neither a parameter
// nor ignorable (model.ignorable_tensor) is an error naming it. A tensor-parallel model takes its piece of
// each split tensor. F32, BF16 and F16 sources convert to the
// parameter's dtype. `on_f32` (optional) sees each parameter's values in f32 before rounding (master
// weights).
void load_model_weights(const std::string& dir, Model& model,
                        const std::function<void(size_t, const float*)>& on_f32 = {});

// (rows, cols) -> (cols, rows), row-major: GPT-2's Conv1D weights, stored (in, out), to every other
// format's (out, in) and back.
void transpose(const float* in, float* out, int64_t rows, int64_t cols);

// How a model directory is written: the tensors' dtype (F32, BF16 or F16) and the largest shard. A model
// larger than one shard is written as Hugging Face does: model-00001-of-0000N.safetensors ... plus
// model.safetensors.index.json naming each tensor's file.
struct SaveFormat {
    DType dtype = DType::F32;
    uint64_t max_shard_bytes = uint64_t(5) << 30;  // transformers' default max_shard_size, 5 GB
};

// Writes config.json and the weights into `dir` (which must exist). `extra` holds anvil's own config keys;
// `weight_f32(i, dst)` fills parameter i's f32 values (the optimizer's master copy), default: the parameters
// themselves. Tensors are written whole: for a tensor-parallel piece, weight_f32 gives the gathered tensor.
void write_model_dir(const std::string& dir, const Model& model, const nlohmann::json& extra,
                     const std::function<void(size_t, float*)>& weight_f32 = {},
                     const SaveFormat& format = {});

}  // namespace anvil
