// AdamW state: first and second moments (f32), plus f32 master weights when the parameters the ops see
// are lower precision. Each in one allocation with the parameters' table.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/gpt2.h"

namespace anvil {

class AdamW {
public:
    // Weight decay `wd` applies to tensors of two or more dimensions only (nanoGPT's grouping).
    AdamW(GPT2& model, float wd);
    // One update of every parameter. norm_sq is the device scalar from Backend::global_norm_sq.
    void step(const AdamWArgs& args, Tensor norm_sq);
    void reset_moments();  // zero m and v (after trial steps)
    bool has_master() const { return master_.size() > 0; }
    // The f32 weights the optimizer updates: the master copy when the parameters are bf16/fp16.
    std::vector<std::vector<float>> weights_to_host() const;
    // Loads f32 weights into the master copy (and, rounded, into the parameters).
    void weights_from_host(const std::vector<std::vector<float>>& host);
    const Arena& m() const { return m_; }
    const Arena& v() const { return v_; }
    float weight_decay() const { return wd_; }

private:
    GPT2& model_;
    float wd_;
    Arena m_, v_, master_;
    std::vector<ParamSlot> slots_;
};

}  // namespace anvil
