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
// ZeRO-1 (a sharded AdamW): after the backward one reduce-scatter leaves each rank the summed gradients of
// its own range of the optimizer's layout; the global norm is summed from the ranges; each rank updates its
// range; an all-gather then gives every rank every updated weight (through the gradient memory, no longer
// needed).
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
    // `opt` sharded over the ranks: ZeRO-1. `even_alone`: go through the collectives with one rank too (the
    // GPU tests run the NCCL path so).
    DataParallel(const ProcessGrid& grid, ParamStore& store, const AdamW& opt, bool even_alone = false);
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
    // them).
    void finish();
    // The squared global norm of the summed gradients into the device scalar `out`.
    void global_norm_sq(Tensor out);
    // After the optimizer's update: ZeRO-1 gives every rank every rank's updated weights.
    void after_update();
    bool zero() const { return zero_; }
    // ZeRO-1: every rank's range of the moments, gathered into the optimizer's whole layout (a checkpoint).
    void gather_moments(std::vector<float>& m_all, std::vector<float>& v_all);

    // Seconds the last finish() spent waiting (communication the backward did not hide), and the bytes one
    // step's all-reduces carry per rank.
    double exposed_s() const { return exposed_s_; }
    size_t bucket_bytes() const { return bytes_; }
    int buckets() const { return int(buckets_.size()); }

private:
    struct Bucket {
        std::vector<Tensor> spans;  // runs of the gradient arena
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
    Tensor flat_;                 // ZeRO-1: the gradient arena as one f32 vector (its first layout_floats())
    std::vector<size_t> counts_;  // ZeRO-1: floats of each rank's range
    std::vector<Bucket> buckets_;
    std::vector<Tensor> split_grads_, whole_grads_;  // tensor parallel: this rank's gradients (ZeRO-1: range)
    std::vector<Comm::Pending> pending_;
    std::unique_ptr<DeviceCollectives> device_;  // NCCL on a GPU; null on the CPU (MPI on host memory)
    bool armed_ = false, stop_vote_ = false, stop_agreed_ = false;
    double exposed_s_ = 0.0;
    size_t bytes_ = 0;
};

}  // namespace anvil
