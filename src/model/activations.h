// Activation memory: layers name the buffers they need while a model plans a pass (ActPlan); one Arena then
// holds them all (Activations), and each call gets views sized to its batch. Nothing is allocated in a step.
//
// What a buffer must survive decides whether layers share it:
//   Saved         the backward reads it: one per layer when training, shared by every layer otherwise
//   Recomputable  like Saved, but with --recompute the backward recomputes it: then one shared buffer
//   Scratch       used and dropped within one layer's forward: always shared
//   Backward      the backward's working buffers: only when training, shared
// A shared buffer is keyed by its `share` name (a layer's buffers are named per layer, "transformer.h.3.
// ln_1.out", and shared by kind, "norm.out"), so two norms of one block share one output buffer under
// recomputation and still have separate ones when each must be kept.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "core/arena.h"

namespace anvil {

enum class ActMode : uint8_t {
    Train,   // forward and backward
    Eval,    // forward only (losses, logits): every layer shares its buffers
    Decode,  // forward only, with a KV cache: attention keeps nothing for a backward
};

enum class Keep : uint8_t { Saved, Recomputable, Scratch, Backward };

class ActPlan {
public:
    ActPlan(int max_B, int max_T, ActMode mode, bool recompute)
        : B_(max_B), T_(max_T), mode_(mode), recompute_(recompute) {}
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    bool recompute() const { return recompute_; }

    // A buffer of shape (B, T, rest...) called `name`; `share` (default: name) keys it when it is shared.
    // Naming a shared buffer again (every layer's scratch) is the same buffer.
    void add(const std::string& name, std::initializer_list<int64_t> rest, DType dtype, Keep keep,
             const std::string& share = "");
    // A buffer of a fixed number of elements (attention's saved statistics, scratch).
    void add_flat(const std::string& name, int64_t elems, DType dtype, Keep keep, const std::string& share = "");

private:
    friend class Activations;
    struct Slot {
        bool bt;  // the first two dims are (B, T)
        size_t buffer;
    };
    bool shared(Keep keep) const;
    void add_slot(const std::string& name, Shape full, bool bt, DType dtype, Keep keep, const std::string& share);
    int B_, T_;
    ActMode mode_;
    bool recompute_;
    TensorTable table_;
    std::unordered_map<std::string, size_t> shared_;  // share key -> buffer
    std::unordered_map<std::string, Slot> slots_;
};

class Activations {
public:
    Activations(Allocator& alloc, const ActPlan& plan);
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    bool recompute() const { return recompute_; }
    size_t bytes() const { return arena_.bytes(); }
    bool has(const std::string& name) const { return slots_.count(name) > 0; }
    // The buffer `name` seen as (B, T, rest...) (its first B*T*rest elements), or whole for a flat buffer.
    Tensor get(const std::string& name, int B, int T) const;

private:
    int B_, T_;
    ActMode mode_;
    bool recompute_;
    Arena arena_;
    std::unordered_map<std::string, ActPlan::Slot> slots_;
};

}  // namespace anvil
