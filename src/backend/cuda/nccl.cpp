// NCCL for the CUDA backend's collectives, loaded at run time (libnccl.so.2 from the CUDA toolkit or the
// system), so anvil links and runs without it until a multi-GPU job asks for it. Rank 0's unique id reaches
// the other ranks through the caller's host broadcast (MPI). Collectives run on a stream of their own, after
// an event on the compute stream; wait_all_on_device() makes the compute stream wait for them on the device
// (the host goes on queueing; wait_all() has the host wait too) and hands their completion event to a
// watchdog thread, which ends the job (ncclCommAbort, then CollectiveSetup::abort) when one is not complete
// within the deadline or NCCL reports an asynchronous error, wherever the host is then.
#include <dlfcn.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/watchdog.h"

#if ANVIL_HAVE_NCCL_H
#include <nccl.h>
#endif

namespace anvil {

#if ANVIL_HAVE_NCCL_H
namespace {

// The entry points anvil uses, looked up in the loaded library.
struct NcclApi {
    void* lib = nullptr;
    ncclResult_t (*get_version)(int*) = nullptr;
    ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
    ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
    // NCCL 2.14+: a non-blocking init whose progress can be polled against the deadline (null when older)
    ncclResult_t (*comm_init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
    ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) = nullptr;
    ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                           cudaStream_t) = nullptr;
    ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t) = nullptr;
    ncclResult_t (*group_start)() = nullptr;
    ncclResult_t (*group_end)() = nullptr;
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*) = nullptr;
    ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
    ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
    const char* (*get_error_string)(ncclResult_t) = nullptr;

    NcclApi() {
        for (const char* name : {"libnccl.so.2", "libnccl.so"})
            if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
        ANVIL_CHECK(
            lib,
            "data parallelism on CUDA needs NCCL, and libnccl.so.2 cannot be loaded ({}); install it "
            "(apt-get install libnccl2, or NVIDIA's nccl package) or put the CUDA toolkit's lib directory "
            "on LD_LIBRARY_PATH",
            dlerror());
        bind(get_version, "ncclGetVersion");
        bind(get_unique_id, "ncclGetUniqueId");
        bind(comm_init_rank, "ncclCommInitRank");
        bind(all_reduce, "ncclAllReduce");
        bind(reduce, "ncclReduce");
        bind(broadcast, "ncclBroadcast");
        bind(group_start, "ncclGroupStart");
        bind(group_end, "ncclGroupEnd");
        bind(comm_get_async_error, "ncclCommGetAsyncError");
        bind(comm_abort, "ncclCommAbort");
        bind(comm_destroy, "ncclCommDestroy");
        bind(get_error_string, "ncclGetErrorString");
        comm_init_rank_config =
            reinterpret_cast<decltype(comm_init_rank_config)>(dlsym(lib, "ncclCommInitRankConfig"));
    }
    template <class F>
    void bind(F& f, const char* name) {
        f = reinterpret_cast<F>(dlsym(lib, name));
        ANVIL_CHECK(f, "libnccl.so.2 has no {}: too old an NCCL; install NCCL 2.12 or newer", name);
    }
    // ncclInProgress is how a non-blocking communicator says "queued".
    void check(ncclResult_t r, const char* what) const {
        ANVIL_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL: {} failed: {}", what,
                    get_error_string(r));
    }
};

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::F32:
            return ncclFloat32;
        case DType::BF16:
            return ncclBfloat16;
        case DType::F16:
            return ncclFloat16;
        default:
            fail("NCCL collectives on {} tensors", dtype_name(t));
    }
}

class NcclCollectives final : public DeviceCollectives {
public:
    NcclCollectives(const CollectiveSetup& s, cudaStream_t compute, int device)
        : setup_(s), compute_(compute) {
        CUDA_CHECK(cudaSetDevice(device));
        ncclUniqueId id{};
        if (s.rank == 0) api_.check(api_.get_unique_id(&id), "ncclGetUniqueId");
        s.broadcast_from_rank0(&id, sizeof id);
        init(id);
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
        api_.get_version(&version_);
        Watchdog::Hooks hooks;
        hooks.on_thread = [device] { (void)cudaSetDevice(device); };
        hooks.transport_error = [this]() -> std::string {
            ncclResult_t async = ncclSuccess;
            if (comm_) api_.comm_get_async_error(comm_, &async);
            return async == ncclSuccess || async == ncclInProgress
                       ? std::string()
                       : fmt::format("NCCL: {}", api_.get_error_string(async));
        };
        hooks.fire = [this](const std::string& why) {
            if (comm_) api_.comm_abort(comm_);  // NCCL's kernels give up, so the device is free again
            setup_.abort(why);
        };
        watchdog_ = std::make_unique<Watchdog>(setup_.timeout_s, std::move(hooks));
    }
    ~NcclCollectives() override {
        watchdog_.reset();  // before the communicator it watches goes
        if (comm_) api_.comm_destroy(comm_);
        (void)cudaEventDestroy(queued_);
        for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
        (void)cudaStreamDestroy(stream_);
    }
    std::string describe() const override {
        return fmt::format("NCCL {}.{}.{}", version_ / 10000, version_ / 100 % 100, version_ % 100);
    }
    void allreduce_sum_start(Tensor t, const char* what) override {
        after_compute(what);
        enqueued(
            api_.all_reduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), ncclSum, comm_, stream_));
    }
    void reduce_sum_start(Tensor t, int root, const char* what) override {
        after_compute(what);
        enqueued(api_.reduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), ncclSum, root, comm_,
                             stream_));
    }
    // NCCL's all-gather wants equal blocks; ZeRO's ranges differ by an alignment, so each block is a
    // broadcast from its rank, the broadcasts grouped into one launch.
    void allgather_blocks_start(Tensor flat, const std::vector<size_t>& counts, const char* what) override {
        ANVIL_CHECK(int(counts.size()) == setup_.size, "{}: {} blocks for {} ranks", what, counts.size(),
                    setup_.size);
        after_compute(what);
        char* at = static_cast<char*>(flat.data);
        api_.check(api_.group_start(), what);
        for (int r = 0; r < setup_.size; r++) {
            const size_t n = counts[size_t(r)];
            if (n) api_.check(api_.broadcast(at, at, n, nccl_type(flat.dtype), r, comm_, stream_), what);
            at += n * dtype_size(flat.dtype);
        }
        enqueued(api_.group_end());
    }
    void wait_all_on_device() override {
        if (!pending_) return;
        const cudaEvent_t done = free_event();
        CUDA_CHECK(cudaEventRecord(done, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(compute_, done, 0));
        // an error other than "not ready" is the context's, and the host's next CUDA call reports it
        watchdog_->watch(
            what_, [done] { return cudaEventQuery(done) != cudaErrorNotReady; },
            [this, done] {
                std::lock_guard<std::mutex> lock(events_mu_);
                free_.push_back(done);
            });
        last_ = done;
        pending_ = false;
    }
    void wait_all() override {
        wait_all_on_device();
        if (!last_) return;
        // Only this thread records events, so `last_` marks the newest collective even if the watchdog has
        // already handed it back. A stall holds this wait up until the watchdog ends the job.
        CUDA_CHECK(cudaEventSynchronize(last_));
        last_ = nullptr;
    }

private:
    // The collective about to be queued on NCCL's stream starts after the work queued so far on the compute
    // stream (which wrote its data).
    void after_compute(const char* what) {
        CUDA_CHECK(cudaEventRecord(queued_, compute_));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
        what_ = what;
        pending_ = true;
    }
    // An event no collective still being watched uses (made when none is free).
    cudaEvent_t free_event() {
        std::lock_guard<std::mutex> lock(events_mu_);
        if (!free_.empty()) {
            const cudaEvent_t e = free_.back();
            free_.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
        return e;
    }
    // A non-blocking communicator may still be queueing the collective (ncclInProgress): NCCL wants it queued
    // before the next call, so wait for that (bounded by the deadline).
    void enqueued(ncclResult_t r) {
        api_.check(r, what_.c_str());
        if (r != ncclInProgress) return;
        poll([&] {
            ncclResult_t state = ncclInProgress;
            api_.comm_get_async_error(comm_, &state);
            return state == ncclSuccess;
        });
    }
    // The communicator; non-blocking where NCCL has it, so a rank that never joins ends the job at the
    // deadline.
    void init(const ncclUniqueId& id) {
        if (!api_.comm_init_rank_config) {
            api_.check(api_.comm_init_rank(&comm_, setup_.size, id, setup_.rank), "ncclCommInitRank");
            return;
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        api_.check(api_.comm_init_rank_config(&comm_, setup_.size, id, setup_.rank, &config),
                   "ncclCommInitRankConfig");
        what_ = "forming the NCCL communicator";
        ncclResult_t state = ncclInProgress;
        poll([&] {  // an error ends the poll too, and the job
            api_.comm_get_async_error(comm_, &state);
            return state == ncclSuccess;
        });
    }
    // Polls `done` until it holds; ends the job on an NCCL error or past the deadline.
    template <class Done>
    void poll(Done done) {
        const auto t0 = std::chrono::steady_clock::now();
        while (!done()) {
            ncclResult_t async = ncclSuccess;
            api_.comm_get_async_error(comm_, &async);
            const bool failed = async != ncclSuccess && async != ncclInProgress;
            const double waited =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (failed || waited > setup_.timeout_s) {
                api_.comm_abort(comm_);
                comm_ = nullptr;
                setup_.abort(failed
                                 ? fmt::format("{} failed in NCCL: {}", what_, api_.get_error_string(async))
                                 : fmt::format("{} did not complete within {} s (--comm-timeout): another "
                                               "rank has died, stalled or is not taking part",
                                               what_, int(setup_.timeout_s)));
                fail("{}: the job was not ended", what_);  // abort() does not return
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    NcclApi api_;
    CollectiveSetup setup_;
    cudaStream_t compute_, stream_ = nullptr;
    cudaEvent_t queued_ = nullptr, last_ = nullptr;  // last_: the newest completion event, until wait_all()
    std::mutex events_mu_;
    std::vector<cudaEvent_t> events_, free_;  // every completion event made; those free for reuse
    ncclComm_t comm_ = nullptr;
    int version_ = 0;
    std::string what_;
    bool pending_ = false;
    std::unique_ptr<Watchdog> watchdog_;  // last: its thread uses the members above
};

}  // namespace

std::unique_ptr<DeviceCollectives> CudaBackend::make_collectives(const CollectiveSetup& setup) {
    return std::make_unique<NcclCollectives>(setup, ctx_.stream, device_);
}
#else
std::unique_ptr<DeviceCollectives> CudaBackend::make_collectives(const CollectiveSetup&) {
    fail(
        "data parallelism on CUDA needs NCCL, and this anvil was built without nccl.h; install NCCL's "
        "headers "
        "(they come with the CUDA toolkit, or apt-get install libnccl-dev) and rebuild");
}
#endif

}  // namespace anvil
