// Data parallelism on the model seam. Every rank holds the whole model and trains on its own rows of the
// global batch; the gradients are summed over the ranks as the backward produces them, one all-reduce per
// layer (a bucket), started from BackwardHooks as soon as that layer's gradients are final on the step's last
// micro-batch, in the same order on every rank, and waited for before the optimizer. With the loss
// normalised by the target count of the whole global batch (total_targets), the summed gradient is the one
// a single process would compute on all the rows, so every rank takes the same optimizer step.
//
// On the CPU the collectives are MPI's non-blocking ones on the gradient memory itself, moved on between
// layers (Comm::progress), so they overlap with the rest of the backward. On a GPU they are the backend's
// (NCCL, f32/bf16/f16 gradients) on a stream of their own, each started after its layer's backward kernels.
//
// ZeRO-1 (a sharded AdamW): each rank owns a range of the optimizer's layout, which is one run of the
// gradient arena (zero_bounds). As each layer's backward completes, its gradients are summed on the rank(s)
// owning them, one reduce per owner, overlapping with the rest of the backward like the all-reduces (together
// a reduce-scatter); the global norm is summed from the ranges; each rank updates its range; an all-gather
// then gives every rank every updated weight (through the gradient memory, no longer needed). Any gradient
// dtype: on a GPU, bf16/f16 gradients with f32 master weights sharded like the moments.
//
// With tensor parallelism (--tensor-parallel) the replicas are the ranks holding the same piece of the model
// (ProcessGrid::dp): the gradients are summed over them; the loss and the stop vote go over the whole job;
// the global norm counts a split entry's squares over the tensor-parallel group and a whole entry's once.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "train/tensor_parallel.h"

namespace anvil {

class DataParallel final : public BackwardHooks {
public:
    // Throws when the store's gradients cannot be reduced (MPI on the CPU takes f32; a GPU needs NCCL).
    // `opt` sharded over the ranks: ZeRO-1. `even_alone`: go through the collectives with one rank too, and
    // with `zero_alone` through ZeRO-1's (the GPU tests run the NCCL path so).
    DataParallel(const ProcessGrid& grid, ParamStore& store, const AdamW& opt, bool even_alone = false,
                 bool zero_alone = false);
    int rank() const { return comm_.rank(); }  // among the replicas

    // The step's target count summed over the ranks (before its forward: the loss is normalised by it).
    int64_t total_targets(int64_t mine);
    // The step's loss sum over the ranks; the same all-reduce carries every rank's vote to stop after this
    // step (vote_stop, cast before the step; a signal reached that rank), read back with stop_agreed().
    double total_loss(double mine);
    void vote_stop(bool stop) { stop_vote_ = stop; }
    bool stop_agreed() const { return stop_agreed_; }

    // Before each micro-batch's backward: only the last one's hooks reduce the gradients.
    void arm(bool last_micro_batch) { armed_ = last_micro_batch; }
    void on_layer_grads_ready(int layer) override;
    // Waits for every bucket: the gradients are then summed over the ranks (ZeRO-1: this rank's range of
    // them). With FP8 delayed scaling's state given (set_fp8_state), the replicas' amax histories are then
    // made one: each value the largest any replica holds, so every replica scales the next step alike, each
    // use's amax that of the whole batch (as one process with every replica's rows would find it), and a
    // checkpoint's histories are every replica's.
    void finish();
    void set_fp8_state(Tensor state) { fp8_state_ = state; }
    // The squared global norm of the summed gradients into the device scalar `out`.
    void global_norm_sq(Tensor out);
    // After the optimizer's update: ZeRO-1 gives every rank every rank's updated weights.
    void after_update();
    bool zero() const { return zero_; }
    // ZeRO-1: every rank's range of the moments (and of the f32 master weights, when the optimizer keeps
    // them; else `master_all` is left empty), gathered into the optimizer's whole layout (a checkpoint).
    void gather_state(std::vector<float>& m_all, std::vector<float>& v_all, std::vector<float>& master_all);

    // Seconds the last finish() spent waiting (communication the backward did not hide), and the bytes one
    // step's all-reduces carry per rank.
    double exposed_s() const { return exposed_s_; }
    size_t bucket_bytes() const { return bytes_; }
    int buckets() const { return int(buckets_.size()); }

private:
    struct Bucket {
        std::vector<Tensor> spans;  // runs of the gradient arena
        std::vector<int> roots;     // each span's: -1 all-reduce it; else reduce it to that rank (ZeRO-1)
        std::string what;           // "the gradient all-reduce of layer 3"
    };
    Bucket& bucket(int layer) { return buckets_[size_t(layer + 1)]; }  // [0]: outside the layers

    // the norm of the gradients in `grads`, summed on the device, on the host
    double norm_sq_of(Tensor scratch, const std::vector<Tensor>& grads);

    Comm& world_;
    Comm& comm_;  // the replicas
    Comm* tp_;    // the tensor-parallel group, or null
    ParamStore& store_;
    const AdamW& opt_;
    bool zero_ = false;
    Tensor grads_;                // ZeRO-1: the gradient arena as one flat tensor
    std::vector<size_t> bounds_;  // ZeRO-1: rank r owns elements [bounds_[r], bounds_[r+1]) of grads_
    std::vector<Bucket> buckets_;
    std::vector<Tensor> split_grads_, whole_grads_;  // tensor parallel: this rank's gradients (ZeRO-1: range)
    std::vector<Comm::Pending> pending_;
    std::unique_ptr<DeviceCollectives> device_;  // NCCL on a GPU; null on the CPU (MPI on host memory)
    bool armed_ = false, stop_vote_ = false, stop_agreed_ = false;
    double exposed_s_ = 0.0;
    size_t bytes_ = 0;
    Tensor fp8_state_;  // Model::fp8_state, or empty
};

// ZeRO-1: where each rank's range of the optimizer's layout lies in the gradient arena, as size()+1 element
// offsets (0 first, the arena's size last): rank r owns [b[r], b[r+1]). The layout counts f32 floats and
// the arena holds the gradients in their own dtype (one for all), so an entry's offsets differ between them;
// a range is mapped entry by entry, padding going with the entry after it. Rank r's AdamW pieces lie inside
// its run, and the runs tile the arena.
std::vector<size_t> zero_bounds(const ParamStore& store, const AdamW& opt);

}  // namespace anvil
