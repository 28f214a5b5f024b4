// AdamW state for the trainable entries of a parameter store: first and second moments (f32) and, when a
// parameter's dtype is not f32, an f32 master copy. Each in one arena laid out like the store's gradients;
// a frozen entry has none of them.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/param_store.h"

namespace anvil {

class AdamW {
public:
    // Weight decay `wd` applies to the entries whose spec says so (matrices and embeddings).
    AdamW(ParamStore& store, float wd);
    // One update of every trainable entry. norm_sq is the device scalar from Backend::global_norm_sq.
    void step(const AdamWArgs& args, Tensor norm_sq);
    void reset_moments();  // zero m and v (after trial steps)
    bool has_master() const { return master_.size() > 0; }
    float weight_decay() const { return wd_; }
    // The optimizer's view of entry i of the store (i must be trainable): moments, master copy.
    Tensor m(size_t i) const { return m_[slot(i)]; }
    Tensor v(size_t i) const { return v_[slot(i)]; }
    // The f32 weights the optimizer updates (the master copy when there is one) of any entry.
    void weights_f32(size_t i, float* dst) const;
    // Sets the master copy of entry i from f32 values (no-op without one): loading and initialising feed
    // the unrounded values here while the store gets them rounded.
    void set_master(size_t i, const float* f32);

private:
    size_t slot(size_t i) const;
    ParamStore& store_;
    float wd_;
    Arena m_, v_, master_;
    std::vector<size_t> slot_of_;  // store index -> optimizer slot (npos when frozen)
    std::vector<ParamSlot> slots_;
};

}  // namespace anvil
