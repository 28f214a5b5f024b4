// LoRA (Hu et al., 2021) as Hugging Face PEFT defines it: a targeted linear layer's output gains
// s * (dropout(x) A^T) B^T, A (r, in) Kaiming-uniform and B (out, r) zero at the start, s = alpha / r
// (alpha / sqrt(r) with rsLoRA). Every other parameter is frozen: no gradient, no optimizer state, and the
// backward skips the frozen weights' gradient products. Adapters are read and written in PEFT's format
// (adapter_config.json + adapter_model.safetensors) and can be merged into the base weights.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/layers.h"

namespace anvil {

struct LoraOptions {
    int rank = 0;  // 0: no adapters
    float alpha = 8.0f;
    float dropout = 0.0f;
    bool rslora = false;
    std::vector<std::string> targets;  // module-name suffixes, PEFT's matching ("c_proj": every *.c_proj)
    bool enabled() const { return rank > 0; }
    float scaling() const;
};

// The adapter on one linear layer. Its A and B are trainable entries of the model's store.
class LoraAdapter final : public LinearAdapter {
public:
    // on the linear layer `layer` (its buffers are named after it)
    LoraAdapter(ParamRegistry& reg, const std::string& layer, size_t a, size_t b, int in, int out,
                const LoraOptions& o, int id);
    void plan(ActPlan& plan) const override;
    void forward(const Pass& p, Tensor out, Tensor in) const override;
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const override;

private:
    Tensor dropped(const Pass& p, Tensor in) const;  // dropout(in) while training, else in
    const ParamRegistry* reg_;
    size_t a_, b_;
    int in_, out_, rank_, id_;
    float scaling_, dropout_;
    ActId h_, y_, x_, dh_, dx_;  // s * x A^T (kept), the update, dropout(x), and their gradients
};

// Registers A and B for every linear layer a target names (errors list the layer names when one names
// none, or when the rank does not fit a layer) and freezes every other parameter. `attach` is called once
// the store exists; it puts the adapters on the layers.
std::function<void()> add_lora(ParamRegistry& reg, const std::vector<Linear*>& linears, const LoraOptions& o);

// PEFT's files. The adapter's tensors are the store's entries called "<layer>.lora_A.weight" /
// ".lora_B.weight"; in the file they carry PEFT's "base_model.model." prefix.
void write_peft_adapter(const std::string& dir, const class Model& model, const std::string& base_path,
                        const std::function<void(size_t, float*)>& weight_f32);
struct PeftAdapter {
    LoraOptions lora;
    std::string base_model;  // base_model_name_or_path
};
// adapter_config.json of an adapter directory, checked (peft_type LORA, the fields anvil needs, a layout the
// family can use); errors name the file and the field.
PeftAdapter read_peft_config(const std::string& dir, const class Model* family_of = nullptr);
// Loads A and B of every adapter of `model` from DIR/adapter_model.safetensors; shapes must match the base.
void load_peft_weights(const std::string& dir, class Model& model,
                       const std::function<void(size_t, const float*)>& on_f32 = {});
// W += s (B A)^T (Conv1D) or s B A (nn.Linear) for every adapter, in the store: the model then computes the
// same without adapters.
void merge_lora(class Model& model);

}  // namespace anvil
