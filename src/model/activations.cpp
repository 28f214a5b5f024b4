#include "model/activations.h"

#include "backend/backend.h"

namespace anvil {

Recompute parse_recompute(const std::string& s) {
    if (s == "off") return Recompute::Off;
    if (s == "selective") return Recompute::Selective;
    if (s == "full") return Recompute::Full;
    fail("--recompute: \"{}\" is not off, selective or full", s);
}

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::Selective:
            return "selective";
        case Recompute::Full:
            return "full";
        default:
            return "off";
    }
}

ActNames::ActNames() {
    for (const char* n : {"tokens", "targets", "losses", "logits", "lengths", "rows"}) id(n);
}

ActId ActNames::id(const std::string& name) {
    const auto [it, added] = index_.emplace(name, uint32_t(names_.size()));
    if (added) names_.push_back(name);
    return ActId(it->second);
}

bool ActPlan::block_set(Keep keep) const {
    return in_block_ && recompute_ == Recompute::Full && (keep == Keep::Saved || keep == Keep::Recomputable);
}

bool ActPlan::shared(Keep keep) const {
    switch (keep) {
        case Keep::Saved:
            return !training() || block_set(keep);
        case Keep::Output:  // one per layer whenever training, so the blocks' recomputation can start from it
            return !training();
        case Keep::Recomputable:
            return !training() || recompute_ == Recompute::Selective || block_set(keep);
        default:
            return true;
    }
}

void ActPlan::add_slot(ActId id, Shape full, bool bt, DType dtype, Keep keep, const std::string& share,
                       int max_b) {
    if (keep == Keep::Backward && !training()) return;
    ANVIL_ASSERT(id.index() < slots_.size());
    const std::string& name = names_->name(id);
    if (const Slot& s = slots_[id.index()]; s.present) {
        // a buffer every layer names the same (scratch): one slot, one shape
        ANVIL_ASSERT(shared(keep) && table_.entries()[s.buffer].shape == full);
        return;
    }
    size_t buffer;
    if (shared(keep)) {
        // the k-th kept buffer of every block shares a slot (blocks of one shape share them all)
        const std::string key =
            block_set(keep) ? fmt::format("block#{}:{}:{}", block_ordinal_++, full.str(), dtype_name(dtype))
            : share.empty() ? name
                            : share;
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
    slots_[id.index()] = Slot{true, bt, buffer, bt ? (max_b > 0 ? max_b : B_) : 0};
}

void ActPlan::add(ActId id, std::initializer_list<int64_t> rest, DType dtype, Keep keep,
                  const std::string& share) {
    Shape s{B_, T_};
    for (int64_t d : rest) s.dims[size_t(s.ndim++)] = d;
    add_slot(id, s, true, dtype, keep, share);
}

void ActPlan::add_chunked(ActId id, int max_b, std::initializer_list<int64_t> rest, DType dtype, Keep keep) {
    ANVIL_ASSERT(max_b > 0 && max_b <= B_);
    Shape s{max_b, T_};
    for (int64_t d : rest) s.dims[size_t(s.ndim++)] = d;
    add_slot(id, s, true, dtype, keep, "", max_b);
}

void ActPlan::add_flat(ActId id, int64_t elems, DType dtype, Keep keep, const std::string& share) {
    add_slot(id, Shape{elems}, false, dtype, keep, share);
}

Activations::Activations(Allocator& alloc, const ActPlan& plan)
    : B_(plan.B_),
      T_(plan.T_),
      mode_(plan.mode_),
      recompute_(plan.recompute_),
      arena_(alloc, plan.table_),
      names_(plan.names_),
      slots_(plan.slots_) {}

const ActPlan::Slot& Activations::slot(ActId id) const {
    ANVIL_CHECK(has(id), "activations: no buffer \"{}\" in this plan",
                id.index() < names_->size() ? names_->name(id) : "(unknown)");
    return slots_[id.index()];
}

int Activations::capacity(ActId id) const {
    const ActPlan::Slot& s = slot(id);
    return s.bt ? s.max_b : 0;
}

Activations::~Activations() = default;

bool Activations::run_recorded(Backend& be, const std::vector<int64_t>& key,
                               const std::function<void()>& work) {
    auto it = recorded_.find(key);
    if (it == recorded_.end()) {
        if (recorded_.size() == kMaxRecorded) {  // enough shapes: the rest run as they are
            work();
            return false;
        }
        it = recorded_.emplace(key, Recorded{}).first;
    }
    Recorded& r = it->second;
    if (r.rec) {
        if (r.rec->replay()) return ++replays_, true;
        r.rec.reset(), r.runs = 0;  // stale (the backend moved a buffer it names): run, then record again
    }
    if (!r.refused && ++r.runs >= 2) {
        r.rec = be.record(work);
        r.refused = !r.rec;
        if (r.rec && r.rec->replay()) return ++replays_, true;
        r.rec.reset();
    }
    work();
    return false;
}

Tensor Activations::get(ActId id, int B, int T) const {
    const ActPlan::Slot& s = slot(id);
    Tensor t = arena_[s.buffer];
    if (!s.bt) return t;
    ANVIL_CHECK(B <= B_ && T <= T_, "batch ({}, {}) is larger than the reserved ({}, {})", B, T, B_, T_);
    ANVIL_CHECK(B <= s.max_b,
                "activations: \"{}\" holds {} sequences at a time (the loss is taken in chunks), not {}",
                names_->name(id), s.max_b, B);
    t.shape.dims[0] = B;
    t.shape.dims[1] = T;
    return t;
}

}  // namespace anvil
