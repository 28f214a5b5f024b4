// Activation memory: layers name the buffers they need while a model plans a pass (ActPlan); one Arena then
// holds them all (Activations), and each call gets views sized to its batch. Nothing is allocated in a step.
//
// What a buffer must survive decides whether layers share it:
//   Saved         the backward reads it: one per layer when training, shared by every layer otherwise
//   Recomputable  like Saved, but --recompute selective recomputes it in the backward: then one shared buffer
//   Output        a block's output, the next block's input: one per layer when training, in every mode
//   Scratch       used and dropped within one layer's forward: always shared
//   Backward      the backward's working buffers: only when training, shared
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
    ActPlan(int max_B, int max_T, ActMode mode, Recompute recompute)
        : B_(max_B),
          T_(max_T),
          mode_(mode),
          recompute_(mode == ActMode::Train ? recompute : Recompute::Off) {}
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    bool recompute() const { return recompute_ == Recompute::Selective; }
    // A block plans its buffers between these (DecoderModel::plan): what full recomputation shares.
    void begin_block() { in_block_ = true, block_ordinal_ = 0; }
    void end_block() { in_block_ = false; }

    // A buffer of shape (B, T, rest...) called `name`; `share` (default: name) keys it when it is shared.
    // Naming a shared buffer again (every layer's scratch) is the same buffer.
    void add(const std::string& name, std::initializer_list<int64_t> rest, DType dtype, Keep keep,
             const std::string& share = "");
    // A buffer of a fixed number of elements (attention's saved statistics, scratch).
    void add_flat(const std::string& name, int64_t elems, DType dtype, Keep keep,
                  const std::string& share = "");
    // A (max_b, T, rest...) buffer for a pass that uses it max_b sequences at a time (max_b <= max_B): the
    // logits when the loss is taken in chunks.
    void add_chunked(const std::string& name, int max_b, std::initializer_list<int64_t> rest, DType dtype,
                     Keep keep);

private:
    friend class Activations;
    struct Slot {
        bool bt;  // the first two dims are (B, T)
        size_t buffer;
        int max_b = 0;  // bt: the sequences it holds
    };
    bool shared(Keep keep) const;
    bool block_set(Keep keep) const;  // one of the block buffers full recomputation shares
    void add_slot(const std::string& name, Shape full, bool bt, DType dtype, Keep keep,
                  const std::string& share, int max_b = 0);
    int B_, T_;
    ActMode mode_;
    Recompute recompute_;
    bool in_block_ = false;
    int block_ordinal_ = 0;
    TensorTable table_;
    std::unordered_map<std::string, size_t> shared_;  // share key -> buffer
    std::unordered_map<std::string, Slot> slots_;
};

// What a forward leaves its backward beside the buffers (which hold the values): the pass's batch, positions
// and randomness, and where its loss left off. The activations own it, so a model holds weights and
// configuration only, and passes on separate activations do not meet.
struct Tape {
    int B = 0, T = 0, pos0 = 0;
    uint64_t seed = 0;  // the pass's randomness (dropout masks), drawn again by its backward
    bool grad_logits =
        false;  // the logits hold d(loss)/d(logits) (a forward with dloss != 0): backward may run
    bool head_done = false;  // the loss was taken in chunks, each through the head's backward already
};

class Activations {
public:
    Activations(Allocator& alloc, const ActPlan& plan);
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    ActMode mode() const { return mode_; }
    bool training() const { return mode_ == ActMode::Train; }
    // --recompute selective: norms and activations recomputed in the backward
    bool recompute() const { return recompute_ == Recompute::Selective; }
    // --recompute full: each block's forward runs again before its backward
    bool recompute_blocks() const { return recompute_ == Recompute::Full; }
    size_t bytes() const { return arena_.bytes(); }
    bool has(const std::string& name) const { return slots_.count(name) > 0; }
    // The sequences a (B, T, ...) buffer holds at once: max_B(), or fewer for a chunked one.
    int capacity(const std::string& name) const;
    // The buffer `name` seen as (B, T, rest...) (its first B*T*rest elements), or whole for a flat buffer.
    Tensor get(const std::string& name, int B, int T) const;
    // The last forward's record, which its backward reads (and clears).
    Tape& tape() { return tape_; }
    const Tape& tape() const { return tape_; }

private:
    Tape tape_;
    int B_, T_;
    ActMode mode_;
    Recompute recompute_;
    Arena arena_;
    std::unordered_map<std::string, ActPlan::Slot> slots_;
};

}  // namespace anvil
