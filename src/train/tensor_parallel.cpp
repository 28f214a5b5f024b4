#include "train/tensor_parallel.h"

#include "backend/collectives.h"
#include "core/error.h"

namespace anvil {

ProcessGrid make_grid(Comm& world, int K) {
    const int W = world.size();
    ANVIL_CHECK(K >= 1, "--tensor-parallel {}: give the number of ranks that split each model (1: none)", K);
    ANVIL_CHECK(K == 1 || W > 1,
                "--tensor-parallel {}: tensor parallelism splits a model over {} processes; launch them with "
                "mpirun -np {} (or srun -n {})",
                K, K, K, K);
    ANVIL_CHECK(
        W % K == 0,
        "--tensor-parallel {}: the job's {} ranks do not split into groups of {}; launch a multiple of {} "
        "processes (mpirun -np {})",
        K, W, K, K, (W / K + 1) * K);
    ProcessGrid g;
    g.world = g.dp = &world;
    if (K == 1) return g;
    const int rank = world.rank();
    // the group's ranks are consecutive; a replica is the ranks holding the same piece
    g.own_tp = world.split(rank / K, rank % K);
    g.own_dp = world.split(rank % K, rank / K);
    g.tp = g.own_tp.get();
    g.dp = g.own_dp.get();
    return g;
}

namespace {

// MPI on host memory: the CPU backend's tensors are host memory.
class HostTpReducer final : public TpReducer {
public:
    explicit HostTpReducer(Comm& c) : comm_(c) {}
    void sum(Tensor t, const char* what) override {
        ANVIL_CHECK(t.dtype == DType::F32,
                    "tensor parallelism over MPI sums f32 activations; use --precision fp32");
        comm_.allreduce_sum(t.f32(), size_t(t.numel()), what);
    }

private:
    Comm& comm_;
};

// NCCL on device memory: started after the kernels that wrote t, waited for on the device before any that
// read it (the host goes on queueing; NCCL's watchdog keeps the deadline).
class DeviceTpReducer final : public TpReducer {
public:
    explicit DeviceTpReducer(std::unique_ptr<DeviceCollectives> c) : coll_(std::move(c)) {}
    void sum(Tensor t, const char* what) override {
        coll_->allreduce_sum_start(t, what);
        coll_->wait_all_on_device();
    }

private:
    std::unique_ptr<DeviceCollectives> coll_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_device_collectives(Comm& c, Backend& be, const char* who) {
    CollectiveSetup cs;
    cs.rank = c.rank();
    cs.size = c.size();
    cs.timeout_s = c.timeout();
    const std::string what = fmt::format("the NCCL unique id's broadcast ({})", who);
    cs.broadcast_from_rank0 = [&c, what](void* data, size_t bytes) {
        c.broadcast(data, bytes, 0, what.c_str());
    };
    cs.abort = [&c](const std::string& why) { c.abort(why); };
    std::unique_ptr<DeviceCollectives> d = be.make_collectives(cs);
    ANVIL_CHECK(d, "{}: the {} backend has no collectives", who, device_name(be.device()));
    return d;
}

std::shared_ptr<TpReducer> make_tp_reducer(Comm& tp, Backend& be) {
    if (be.device() == Device::CPU) return std::make_shared<HostTpReducer>(tp);
    return std::make_shared<DeviceTpReducer>(make_device_collectives(tp, be, "tensor parallelism"));
}

void gather_whole(Comm& tp, const ParamSpec& s, const float* piece, std::vector<float>& whole) {
    const size_t n = size_t(s.shape.numel());
    whole.assign(size_t(s.full_shape().numel()), 0.0f);
    if (!s.shard.split()) {
        std::copy_n(piece, n, whole.data());
        return;
    }
    std::vector<float> all(n * size_t(tp.size()));
    tp.allgather(piece, n * sizeof(float), all.data(), "the gathering of a tensor-parallel checkpoint");
    for (int r = 0; r < tp.size(); r++) put_shard(s, r, all.data() + size_t(r) * n, whole.data());
}

}  // namespace anvil
