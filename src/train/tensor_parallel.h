// The job's ranks as a grid of data-parallel replicas of tensor-parallel groups (Megatron's layout): with
// --tensor-parallel K, ranks r = d * K + t (consecutive ranks, one node's GPUs, form a group) hold piece t of
// every block's split layers, and replica d trains on the data-parallel rows of rank d. The tensor-parallel
// sums the model asks for (layers.h's TpReducer) go over the group's communicator: MPI on the CPU, NCCL on a
// GPU. Checkpoints gather the pieces into whole tensors (ordinary Hugging Face files) and a load takes its
// piece back, so a run resumes with any K.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "dist/comm.h"
#include "model/layers.h"
#include "model/param_store.h"

namespace anvil {

struct ProcessGrid {
    Comm* world = nullptr;
    Comm* dp = nullptr;  // this rank's replicas (the ranks holding the same piece); the world without TP
    Comm* tp = nullptr;  // this rank's tensor-parallel group; null without TP
    std::unique_ptr<Comm> own_dp, own_tp;
    int tp_size() const { return tp ? tp->size() : 1; }
};

// Splits `world` into groups of `tp_size` consecutive ranks (1: no groups, dp is the world). Throws naming
// --tensor-parallel when the world does not divide or a group would be one process.
ProcessGrid make_grid(Comm& world, int tp_size);

// The backend's collectives (NCCL on a GPU) over `c`'s ranks, its bootstrap shared over `c`; `who` names the
// user in errors ("data parallelism").
std::unique_ptr<DeviceCollectives> make_device_collectives(Comm& c, Backend& be, const char* who);

// The model's tensor-parallel sums over `tp` on `be`'s memory (NCCL on a GPU, formed here).
std::shared_ptr<TpReducer> make_tp_reducer(Comm& tp, Backend& be);

// Every rank of `tp` passes its piece (the spec's shape, f32) of entry `s`; `whole` receives the whole
// tensor (s.full_shape()) on every rank.
void gather_whole(Comm& tp, const ParamSpec& s, const float* piece, std::vector<float>& whole);

}  // namespace anvil
