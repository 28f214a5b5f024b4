// AdamW state for the trainable entries of a parameter store: first and second moments (f32) and, when a
// parameter's dtype is not f32, an f32 master copy. The state is laid out as one f32 vector (the layout):
// the trainable entries in store order, each aligned like an arena entry (for f32 gradients the layout is the
// gradient arena's). A frozen entry has no state.
//
// ZeRO-1 (a shard of W > 1): rank r keeps and updates only floats [begin(r), begin(r+1)) of the layout; an
// entry that straddles two ranks is updated in two pieces. Its moments then take 1/W of the memory.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/param_store.h"

namespace anvil {

struct OptShard {
    int rank = 0, world = 1;
};

class AdamW {
public:
    // Weight decay `wd` applies to the entries whose spec says so (matrices and embeddings).
    AdamW(ParamStore& store, float wd, OptShard shard = {});
    // One update of this rank's part of every trainable entry. norm_sq is the device scalar of the squared
    // global gradient norm (Backend::global_norm_sq).
    void step(const AdamWArgs& args, Tensor norm_sq);
    void reset_moments();  // zero m and v (after trial steps)
    bool has_master() const { return master_.size() > 0; }
    size_t state_bytes() const { return m_.bytes() + v_.bytes() + master_.bytes(); }  // this rank's
    float weight_decay() const { return wd_; }
    // The f32 weights the optimizer updates (the master copy when there is one) of any entry.
    void weights_f32(size_t i, float* dst) const;
    // Sets the master copy of entry i from f32 values (no-op without one): loading and initialising feed
    // the unrounded values here while the store gets them rounded.
    void set_master(size_t i, const float* f32);

    // The layout and this rank's range of it.
    const OptShard& shard() const { return shard_; }
    bool sharded() const { return shard_.world > 1; }
    size_t layout_floats() const { return n_; }
    size_t begin(int rank) const;             // rank's first float; begin(world) == layout_floats()
    std::vector<size_t> range_sizes() const;  // floats of each rank's range
    size_t offset(size_t i) const;            // entry i's first float in the layout (i trainable)
    Tensor m_range() const;                   // this rank's moments, (begin(rank+1) - begin(rank)) f32
    Tensor v_range() const;
    Tensor master_range() const;  // has_master(): this rank's f32 master weights, laid out like m_range()
    // Entry i's moments from host f32 values of its whole shape: the part in this rank's range.
    void set_moments(size_t i, const float* m, const float* v);
    // Entry i's moments into host f32 (whole shape); the entry must lie in this rank's range (always so
    // unsharded).
    void moments(size_t i, float* m, float* v) const;
    // This rank's pieces: parameter and gradient views with their layout offset (ZeRO-1 copies them).
    struct Piece {
        size_t first;  // layout float of the piece's first element
        size_t entry;  // the store entry it is part of
        Tensor param, grad;
    };
    const std::vector<Piece>& pieces() const { return pieces_; }

private:
    size_t slot(size_t i) const;
    // Entry i's first layout float, and the floats [a, b) of it in this rank's range (empty when a >= b).
    struct Part {
        size_t first, a, b;
    };
    Part part(size_t i) const;
    ParamStore& store_;
    float wd_;
    OptShard shard_;
    size_t n_ = 0, lo_ = 0, hi_ = 0;
    Arena m_, v_, master_;         // each one tensor: floats [lo_, hi_) of the layout
    std::vector<size_t> slot_of_;  // store index -> position in offsets_ (npos when frozen)
    std::vector<size_t> offsets_;  // layout float offset of each trainable entry
    std::vector<ParamSlot> slots_;
    std::vector<Piece> pieces_;
};

}  // namespace anvil
