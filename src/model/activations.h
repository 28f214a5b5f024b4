// Activation memory: layers name the buffers they need while a model plans a pass (ActPlan); one Arena then
// holds them all (Activations), and each call gets views sized to its batch. Nothing is allocated in a step.
//
// What a buffer must survive decides whether layers share it:
//   Saved         the backward reads it: one per layer when training, shared by every layer otherwise
//   Recomputable  like Saved, but --recompute selective recomputes it in the backward: then one shared buffer
//   Output        a block's output, the next block's input: one per layer when training, in every mode
//   Scratch       used and dropped within one layer's forward: always shared
//   Backward      the backward's working buffers: only when training, shared
// Layers name their buffers once, when they are built (ActNames::id), and keep the typed handle (ActId) it
// returns: a plan and a step index an array by it and never look a name up. The batch's own buffers (tokens,
// targets, losses, logits) have fixed handles (act::tokens ...).
//
// A shared buffer is keyed by its `share` name (a layer's buffers are named per layer, "transformer.h.3.
// ln_1.out", and shared by kind, "norm.out"), so two norms of one block share one output buffer under
// recomputation and still have separate ones when each must be kept.
//
// --recompute full (activation checkpointing, as torch.utils.checkpoint per block): a block keeps only its
// output; the backward runs the block's forward again from its input, just before the block's backward. So
// the Saved and Recomputable buffers a block plans (between begin_block and end_block) are one set for all
// blocks: the k-th such buffer of every block shares one slot (keyed by k, shape and dtype), and only the
// block whose backward runs next holds them.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/arena.h"

namespace anvil {

class Backend;
class Recording;

// A handle to an activation buffer, valid in every plan of the model that made it.
class ActId {
public:
    constexpr ActId() = default;
    constexpr explicit ActId(uint32_t i) : i_(i) {}
    constexpr uint32_t index() const { return i_; }

private:
    static constexpr uint32_t kNone = UINT32_MAX;
    uint32_t i_ = kNone;
};

// The batch's buffers, which every model's plan holds: tokens and targets (B, T) i32 (-1 = ignore), losses
// (B, T) f32, logits (B, T, V) (or fewer sequences at a time when the loss is taken in chunks).
// A decode step of one-token rows (ForwardPass::row_slot) also has rows: (B, 1, 2) i32, its B slots then its
// B positions, on the backend, where the ops read them.
namespace act {
inline constexpr ActId tokens{0}, targets{1}, losses{2}, logits{3}, lengths{4}, rows{5};
}

// The names of a model's activation buffers, each with its handle (made once, while layers are built).
class ActNames {
public:
    ActNames();                         // holds the batch's buffers (act::tokens ...)
    ActId id(const std::string& name);  // the handle of `name`, made on its first use
    const std::string& name(ActId id) const { return names_[id.index()]; }
    size_t size() const { return names_.size(); }

private:
    std::vector<std::string> names_;
    std::unordered_map<std::string, uint32_t> index_;
};

enum class ActMode : uint8_t {
    Train,   // forward and backward
    Eval,    // forward only (losses, logits): every layer shares its buffers
    Decode,  // forward only, with a KV cache: attention keeps nothing for a backward
};

enum class Keep : uint8_t { Saved, Recomputable, Output, Scratch, Backward };

// What the backward recomputes instead of keeping (--recompute).
enum class Recompute : uint8_t {
    Off,
    Selective,  // the block norms' outputs and the MLP activation (cheap elementwise passes)
    Full,       // every block from its input (one more forward of the blocks)
};
Recompute parse_recompute(const std::string& s);  // "off", "selective", "full"; throws naming --recompute
const char* recompute_name(Recompute r);

class ActPlan {
public:
    // `recompute` applies when training; otherwise nothing is kept for a backward anyway.
    ActPlan(const ActNames& names, int max_B, int max_T, ActMode mode, Recompute recompute)
        : names_(&names),
          B_(max_B),
          T_(max_T),
          mode_(mode),
          recompute_(mode == ActMode::Train ? recompute : Recompute::Off),
          slots_(names.size()) {}
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    bool recompute() const { return recompute_ == Recompute::Selective; }
    // A block plans its buffers between these (DecoderModel::plan): what full recomputation shares.
    void begin_block() { in_block_ = true, block_ordinal_ = 0; }
    void end_block() { in_block_ = false; }

    // A buffer of shape (B, T, rest...); `share` (default: its name) keys it when it is shared. Adding a
    // shared buffer again (every layer's scratch) is the same buffer.
    void add(ActId id, std::initializer_list<int64_t> rest, DType dtype, Keep keep,
             const std::string& share = "");
    // A buffer of a fixed number of elements (attention's saved statistics, scratch).
    void add_flat(ActId id, int64_t elems, DType dtype, Keep keep, const std::string& share = "");
    // A (max_b, T, rest...) buffer for a pass that uses it max_b sequences at a time (max_b <= max_B): the
    // logits when the loss is taken in chunks.
    void add_chunked(ActId id, int max_b, std::initializer_list<int64_t> rest, DType dtype, Keep keep);

private:
    friend class Activations;
    struct Slot {
        bool present = false;  // planned (a mode plans only what it uses)
        bool bt = false;       // the first two dims are (B, T)
        size_t buffer = 0;
        int max_b = 0;  // bt: the sequences it holds
    };
    bool shared(Keep keep) const;
    bool block_set(Keep keep) const;  // one of the block buffers full recomputation shares
    void add_slot(ActId id, Shape full, bool bt, DType dtype, Keep keep, const std::string& share,
                  int max_b = 0);
    const ActNames* names_;
    int B_, T_;
    ActMode mode_;
    Recompute recompute_;
    bool in_block_ = false;
    int block_ordinal_ = 0;
    TensorTable table_;
    std::unordered_map<std::string, size_t> shared_;  // share key -> buffer
    std::vector<Slot> slots_;                         // by ActId
};

// What a forward leaves its backward beside the buffers (which hold the values): the pass's batch, positions
// and randomness, and where its loss left off. The activations own it, so a model holds weights and
// configuration only, and passes on separate activations do not meet.
struct Tape {
    Tensor tokens;  // the batch (B, T): the embeddings' backward reads it, and its shape is the pass's
    int pos0 = 0;
    uint64_t seed = 0;  // the pass's randomness (dropout masks), drawn again by its backward
    bool grad_logits =
        false;  // the logits hold d(loss)/d(logits) (a forward with dloss != 0): backward may run
    bool head_done = false;  // the loss was taken in chunks, each through the head's backward already
};

class Activations {
public:
    Activations(Allocator& alloc, const ActPlan& plan);
    ~Activations();  // (the recordings' type is complete in activations.cpp)
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    // --recompute selective: norms and activations recomputed in the backward
    bool recompute() const { return recompute_ == Recompute::Selective; }
    // --recompute full: each block's forward runs again before its backward
    bool recompute_blocks() const { return recompute_ == Recompute::Full; }
    size_t bytes() const { return arena_.bytes(); }
    bool has(ActId id) const { return id.index() < slots_.size() && slots_[id.index()].present; }
    // The sequences a (B, T, ...) buffer holds at once: max_B(), or fewer for a chunked one.
    int capacity(ActId id) const;
    // The buffer seen as (B, T, rest...) (its first B*T*rest elements), or whole for a flat buffer.
    Tensor get(ActId id, int B, int T) const;
    // The last forward's record, which its backward reads (and clears).
    Tape& tape() { return tape_; }
    const Tape& tape() const { return tape_; }

    // A pass whose device work depends only on `key` (its shape, and the memory it names beside these buffers
    // and the weights: a KV cache) runs as it is the first time (the libraries choose and allocate what they
    // need), is recorded (Backend::record) and replayed the second time, and replayed after; where the
    // backend records nothing it runs as it is. What changes between replays must travel in device memory
    // (tokens, the rows' slots and positions). True when it replayed.
    bool run_recorded(Backend& be, const std::vector<int64_t>& key, const std::function<void()>& work);
    size_t replays() const { return replays_; }  // passes replayed so far

private:
    struct Recorded {
        int runs = 0;
        bool refused = false;  // the backend records nothing for it
        std::unique_ptr<Recording> rec;
    };
    static constexpr size_t kMaxRecorded = 256;  // shapes kept (a server's batch sizes)
    std::map<std::vector<int64_t>, Recorded> recorded_;
    size_t replays_ = 0;
    Tape tape_;
    int B_, T_;
    ActMode mode_;
    Recompute recompute_;
    Arena arena_;
    const ActNames* names_;             // the planning model's (errors name a buffer)
    std::vector<ActPlan::Slot> slots_;  // by ActId
    const ActPlan::Slot& slot(ActId id) const;
};

}  // namespace anvil
