// A model loaded to run, not to train: `anvil eval`, `generate`, `serve`, `quantize`, `convert` and
// `lora merge` start here. The backend a device flag names; the model directory a user path names (a run
// directory, a checkpoint, an adapter on its base), its tokenizer and prompt template, its weights (int8
// where quantized) and adapter.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "model/model.h"

namespace anvil {

// --device: cpu, cuda, or auto (CUDA when a usable GPU is visible, else the CPU).
Device parse_device(const std::string& name);
// The backend options for --device/--threads/--attention, on GPU `gpu` (a job's local rank).
BackendOptions backend_options(const std::string& device, int threads, const std::string& attention,
                               int gpu = 0);
// --precision bf16 on the CPU: f32 tensors with the linear layers' products in bf16 through oneDNN (PyTorch's
// CPU autocast), switched on for `be`; an error naming what to install when the build lacks oneDNN.
void enable_cpu_bf16_products(Backend& be);
std::unique_ptr<Backend> make_run_backend(const std::string& device, int threads,
                                          const std::string& attention, int gpu = 0);

// A model directory loaded for evaluation or generation.
struct InferenceOptions {
    std::string model_dir;        // a model directory, a run directory (its final/) or a checkpoint's parent
    std::string adapter;          // a PEFT LoRA adapter on it
    std::string tokenizer;        // override the checkpoint's
    std::string prompt_template;  // override the one the model was trained with
    std::string device = "auto";  // CUDA when a usable GPU is visible, else the CPU
    int threads = 0;
    // fp32 (the default), bf16 or fp16: the model's tensors on CUDA; on the CPU bf16 is f32 tensors with the
    // linear layers' products in bf16 (oneDNN, PyTorch's CPU autocast) and fp16 is refused.
    std::string precision = "fp32";
    // A command that only moves weights (quantize, merge, convert): a model saved without tokenizer files
    // loads with no tokenizer (InferenceSetup::tok null) instead of an error.
    bool weights_only = false;
};
struct InferenceSetup {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Model> model;
    PromptTemplate prompt = PromptTemplate::Alpaca;  // (with a tokenizer)
    std::string template_setting;                    // the template as configured: a name, or "auto"
    std::string base_dir, adapter_dir;               // where the weights came from
};
InferenceSetup setup_inference(const InferenceOptions& o);

}  // namespace anvil
