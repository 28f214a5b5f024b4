#include "model/activations.h"

namespace anvil {

bool ActPlan::shared(Keep keep) const {
    switch (keep) {
        case Keep::Saved:
            return !training();
        case Keep::Recomputable:
            return !training() || recompute_;
        default:
            return true;
    }
}

void ActPlan::add_slot(const std::string& name, Shape full, bool bt, DType dtype, Keep keep,
                       const std::string& share) {
    if (keep == Keep::Backward && !training()) return;
    if (const auto it = slots_.find(name); it != slots_.end()) {
        // a buffer every layer names the same (scratch): one slot, one shape
        ANVIL_ASSERT(shared(keep) && table_.entries()[it->second.buffer].shape == full);
        return;
    }
    size_t buffer;
    if (shared(keep)) {
        const std::string key = share.empty() ? name : share;
        const auto it = shared_.find(key);
        if (it != shared_.end()) {
            const TableEntry& e = table_.entries()[it->second];
            ANVIL_ASSERT(e.shape == full && e.dtype == dtype);  // one shared buffer, one shape
            buffer = it->second;
        } else {
            buffer = table_.add(key, full, dtype);
            shared_.emplace(key, buffer);
        }
    } else {
        buffer = table_.add(name, full, dtype);
    }
    slots_.emplace(name, Slot{bt, buffer});
}

void ActPlan::add(const std::string& name, std::initializer_list<int64_t> rest, DType dtype, Keep keep,
                  const std::string& share) {
    Shape s{B_, T_};
    for (int64_t d : rest) s.dims[size_t(s.ndim++)] = d;
    add_slot(name, s, true, dtype, keep, share);
}

void ActPlan::add_flat(const std::string& name, int64_t elems, DType dtype, Keep keep, const std::string& share) {
    add_slot(name, Shape{elems}, false, dtype, keep, share);
}

Activations::Activations(Allocator& alloc, const ActPlan& plan)
    : B_(plan.B_),
      T_(plan.T_),
      mode_(plan.mode_),
      recompute_(plan.recompute_),
      arena_(alloc, plan.table_),
      slots_(plan.slots_) {}

Tensor Activations::get(const std::string& name, int B, int T) const {
    const auto it = slots_.find(name);
    ANVIL_CHECK(it != slots_.end(), "activations: no buffer \"{}\" in this plan", name);
    Tensor t = arena_[it->second.buffer];
    if (!it->second.bt) return t;
    ANVIL_CHECK(B <= B_ && T <= T_, "batch ({}, {}) is larger than the reserved ({}, {})", B, T, B_, T_);
    t.shape.dims[0] = B;
    t.shape.dims[1] = T;
    return t;
}

}  // namespace anvil
